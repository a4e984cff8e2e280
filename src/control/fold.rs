//! How one record changes one target's state: the rules every worker
//! applies in the same order ([`super::book`] walks the stream). Pure.
//!
//! - An operator's pause, resume, disable and enable set the target's
//!   mode, with a history entry, and start its failing clock afresh. A
//!   resume of what is not paused, an enable of what is not disabled and a
//!   second disable change nothing and leave no entry. A disable wins over
//!   a pause: a pause of a disabled target changes nothing.
//! - A worker's decisions apply only while what they judged still stands:
//!   the resume that closes an expired or probed pause only that pause
//!   (its id says which), a breaker's pause only an active target, an
//!   automatic disable only the failing it measured, and only while
//!   nothing else holds the target.
//! - `failing` and `recovered` move the shared failing clock.

use super::record::{Change, Record};
use super::state::{breaker_opened_ms, Claim, Entry, KeyState, Mode, CLAIM_TTL_MS};

/// The id prefix of the resume that ends an expired pause.
pub const EXPIRED: &str = "expired:";
/// A worker's pause of an endpoint whose breaker has been open long
/// (`super::breakers`): it applies only to an active target, and leaves
/// the failing clock running.
pub use super::state::BREAKER_PAUSE;
/// The id prefix of the resume a worker writes when its probe closed the
/// breaker of such a pause; like an expiry's, it ends only that pause.
pub use super::state::PROBED;

/// Applies `r` to `k`; `true` when the mode changed.
pub(super) fn apply(k: &mut KeyState, r: &Record) -> bool {
    if k.is_stale(r.at_ms) {
        *k = KeyState::new(k.target.clone());
    }
    k.updated_ms = k.updated_ms.max(r.at_ms);
    match &r.change {
        Change::Failing {
            since_ms, failures, ..
        } => failing(k, *since_ms, *failures),
        Change::Recovered { success_ms, .. } => recovered(k, *success_ms),
        Change::Claim {
            failing_since_ms, ..
        } => claim(k, r, *failing_since_ms),
        _ => return operator(k, r),
    }
    false
}

fn operator(k: &mut KeyState, r: &Record) -> bool {
    let entry = |what: &str, reason: &Option<String>, until_ms| Entry {
        at_ms: r.at_ms,
        what: what.into(),
        by: r.by.clone(),
        reason: reason.clone(),
        until_ms,
        id: r.id.clone(),
    };
    let disabled = matches!(k.control, Mode::Disabled { .. });
    match &r.change {
        Change::Pause {
            reason, until_ms, ..
        } if !disabled && pause_stands(k, &r.id) => {
            let mode = Mode::Paused {
                since_ms: r.at_ms,
                until_ms: *until_ms,
                reason: reason.clone(),
                by: r.by.clone(),
                id: r.id.clone(),
            };
            let e = entry("paused", reason, *until_ms);
            match r.id.starts_with(BREAKER_PAUSE) {
                true => k.keep_clock(mode, e),
                false => k.set(mode, e),
            }
        }
        Change::Resume { .. } if closes_pause(&k.control, &r.id) => {
            let what = match (r.id.starts_with(EXPIRED), r.id.starts_with(PROBED)) {
                (true, _) => "pause expired",
                (_, true) => "resumed by a probe",
                _ => "resumed",
            };
            let e = entry(what, &None, None);
            match k.control.clock_runs() {
                true => k.keep_clock(Mode::Active, e),
                false => k.set(Mode::Active, e),
            }
        }
        Change::Disable {
            reason,
            failing_since_ms,
            ..
        } if !disabled && judged_failing_stands(k, *failing_since_ms) => {
            let mode = Mode::Disabled {
                since_ms: r.at_ms,
                reason: reason.clone(),
                by: r.by.clone(),
            };
            k.set(mode, entry("disabled", reason, None));
        }
        Change::Enable { .. } if disabled => {
            k.set(Mode::Active, entry("enabled", &None, None));
        }
        _ => return false,
    }
    true
}

/// An operator's pause always applies (but to a disabled target); a
/// breaker's only to an active target, and not when a probe's resume came
/// after its breaker opened (that resume closed it).
fn pause_stands(k: &KeyState, id: &str) -> bool {
    if !id.starts_with(BREAKER_PAUSE) {
        return true;
    }
    let closed = breaker_opened_ms(id).is_some_and(|opened| k.probed_after(opened));
    k.control == Mode::Active && !closed
}

/// An operator's resume ends any pause; a worker's (`expired:<id>`,
/// `probed:<id>`) only the pause it saw expire or probed.
fn closes_pause(mode: &Mode, resume_id: &str) -> bool {
    let Mode::Paused { id, .. } = mode else {
        return false;
    };
    let scoped = resume_id.strip_prefix(EXPIRED);
    match scoped.or_else(|| resume_id.strip_prefix(PROBED)) {
        Some(ended) => ended == id,
        None => true,
    }
}

/// An operator's disable always applies; an automatic one only while the
/// target is active and still failing since the time it judged.
fn judged_failing_stands(k: &KeyState, judged: Option<u64>) -> bool {
    match judged {
        None => true,
        Some(since) => k.control.clock_runs() && k.failing_since_ms == Some(since),
    }
}

/// The first claim on the current failing wins; a stale one gives way.
fn claim(k: &mut KeyState, r: &Record, since_ms: u64) {
    if !k.control.clock_runs() || k.failing_since_ms != Some(since_ms) {
        return;
    }
    let open = k
        .claim
        .as_ref()
        .is_none_or(|c| c.since_ms != since_ms || r.at_ms >= c.at_ms.saturating_add(CLAIM_TTL_MS));
    if open {
        k.claim = Some(Claim {
            since_ms,
            by: r.by.clone(),
            at_ms: r.at_ms,
        });
    }
}

/// A worker's failures. While a target is paused or disabled no attempt is
/// made; a report from before the change says nothing now. The first
/// report of a failing sets its start; later ones add their count.
fn failing(k: &mut KeyState, since_ms: u64, failures: u64) {
    if !k.control.clock_runs() {
        return;
    }
    match k.failing_since_ms {
        Some(_) => k.failures = k.failures.saturating_add(failures),
        None => {
            // Not before the last success another worker reported.
            let after = k.last_success_ms.map_or(0, |s| s + 1);
            k.failing_since_ms = Some(since_ms.max(after));
            k.failures = failures;
        }
    }
}

/// A worker's success ends the failing, unless it is older than it.
fn recovered(k: &mut KeyState, success_ms: u64) {
    k.last_success_ms = Some(k.last_success_ms.map_or(success_ms, |s| s.max(success_ms)));
    if k.failing_since_ms.is_some_and(|since| success_ms >= since) {
        k.failing_since_ms = None;
        k.failures = 0;
        k.claim = None;
    }
}
