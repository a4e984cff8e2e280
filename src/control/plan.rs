//! What a worker writes to the shared state, decided from the book and
//! the outcomes its endpoints saw since the last tick. Pure: time is
//! passed in; the caller appends the records (`follow.rs`).
//!
//! - **Failing since.** The first failure with no success after it is
//!   written once (the first such record sets the start); counts follow,
//!   batched, until the book has [`MIN_FAILURES`], then only every
//!   "hysteresis" (a twentieth of `--disable-after`, at most a day).
//! - **Recovered.** A success ends the failing, but is written only when
//!   the failing is older than the hysteresis: a receiver that fails 90%
//!   of the time costs a record or two per hysteresis, not two per success.
//! - **Automatic disable**, when a failure is seen `--disable-after` past
//!   the failing's start, with [`MIN_FAILURES`] or more since. The worker
//!   first claims it; the stream's order makes the first claim win, and
//!   only the winner writes the disable: one record, however many workers
//!   decide at once. Held off while most of this worker's endpoints fail
//!   (`hold_disables`): then its own network is the likelier culprit.
//! - **An expired pause** is closed with a resume named after it, for the
//!   history; the pause stopped holding at its time regardless.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::book::{Book, KeyState, Mode, EXPIRED};
use super::record::{Change, Record};
use super::state::CLAIM_TTL_MS;
use crate::isolation::activity::Delta;
use crate::message::target::Target;

/// An endpoint is disabled only once it had this many failed attempts in
/// the span: a quiet endpoint's odd failure is no reason.
pub const MIN_FAILURES: u64 = 10;
pub use crate::config::DEFAULT_DISABLE_AFTER;
/// Unwritten failures of an endpoint no longer seen are dropped after this.
const FORGET_UNWRITTEN_MS: u64 = 86_400_000;

/// How a worker plans.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSettings {
    /// `None`: never disable by itself.
    pub disable_after: Option<Duration>,
    /// `None`: never park a backlog for its breaker (`super::breakers`).
    pub breaker_park_after: Option<Duration>,
    /// This worker's share of a small spread (ms), so that workers which
    /// see the same thing at once rarely write it twice.
    pub spread_ms: u64,
}

impl PlanSettings {
    /// The hysteresis (ms): how precise "failing since" is kept.
    pub fn hysteresis_ms(&self) -> u64 {
        let after = self.disable_after.unwrap_or(DEFAULT_DISABLE_AFTER);
        (after.as_millis() as u64 / 20).clamp(1, 86_400_000)
    }
}

/// What one tick plans from.
pub struct Inputs<'a> {
    pub now_ms: u64,
    pub book: &'a Book,
    /// Each endpoint's outcomes since the last tick, and its last success.
    pub deltas: &'a [(Target, Delta, Option<u64>)],
    /// Most of this worker's endpoints fail: no new automatic disable.
    pub hold_disables: bool,
}

/// Failures seen here but not yet written, and this worker's claims.
#[derive(Debug, Default)]
pub struct Carry {
    keys: HashMap<Target, Unwritten>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Unwritten {
    failures: u64,
    first_ms: Option<u64>,
    written_ms: u64,
    touched_ms: u64,
    /// A success seen within the hysteresis of the failing's start, to
    /// write once the hysteresis is over (unless a later one is).
    unsent_ok: Option<u64>,
    /// When this worker last claimed a disable; the failing start it wrote
    /// a disable for, and when (written again if it did not take).
    claimed_ms: Option<u64>,
    disabled: Option<(u64, u64)>,
}

/// A disable written but not seen in the book after this long is written
/// again (its confirm may have been lost); a repeat changes nothing.
const DISABLE_AGAIN_MS: u64 = 10_000;

/// The records this worker should write now.
pub fn plan(i: &Inputs, carry: &mut Carry, s: &PlanSettings, me: &str) -> Vec<Record> {
    let mut out = vec![];
    // Paused or disabled (or a pause not closed yet): no clock runs, and
    // what was held back from before starts nothing after. A breaker's
    // pause is the exception: its endpoint is down, and its probes count.
    carry
        .keys
        .retain(|t, _| i.book.get(t).is_none_or(|k| k.control.clock_runs()));
    for (target, delta, local_success) in i.deltas {
        let k = current(i.book, target, i.now_ms);
        if k.is_some_and(|k| !k.control.clock_runs()) {
            continue;
        }
        let u = carry.keys.entry(target.clone()).or_default();
        u.touched_ms = i.now_ms;
        let seen = Seen {
            delta,
            local_success: *local_success,
        };
        out.extend(endpoint(i, target, k, &seen, u, s, me));
    }
    out.extend(late_recoveries(i.now_ms, i.book, carry, s, me));
    out.extend(claimed_disables(i.now_ms, i.book, carry, me));
    let h = s.hysteresis_ms();
    carry.keys.retain(|_, u| {
        let recent = i.now_ms < u.touched_ms + FORGET_UNWRITTEN_MS;
        let pending = u.failures > 0 || u.unsent_ok.is_some() || u.claimed_ms.is_some();
        recent && (pending || i.now_ms < u.written_ms + h)
    });
    out.extend(expired_pauses(i.now_ms, i.book, s, me));
    out
}

/// What this worker saw of one endpoint.
struct Seen<'a> {
    delta: &'a Delta,
    local_success: Option<u64>,
}

/// One endpoint's records: recovered, failing, a claim on its disable.
fn endpoint(
    i: &Inputs,
    target: &Target,
    k: Option<&KeyState>,
    seen: &Seen,
    u: &mut Unwritten,
    s: &PlanSettings,
    me: &str,
) -> Vec<Record> {
    let (now_ms, delta, h) = (i.now_ms, seen.delta, s.hysteresis_ms());
    let mut out = vec![];
    let mut since = k.and_then(|k| k.failing_since_ms);
    let mut shared = k.map_or(0, |k| k.failures);
    if let Some(ok) = delta.last_success_ms {
        match since {
            Some(s) if ok >= s.saturating_add(h) => {
                out.push(recovered(now_ms, target, ok, me));
                (since, shared, u.unsent_ok) = (None, 0, None);
            }
            // Within the hysteresis: written once it is over.
            Some(s) if ok >= s => u.unsent_ok = Some(ok),
            _ => {}
        }
        // Failures held back from before this success no longer count.
        (u.failures, u.first_ms) = (0, None);
    }
    u.failures += delta.failures;
    if delta.failures > 0 {
        u.first_ms = u.first_ms.or(delta.first_failure_ms);
    }
    let due = since.is_none() || shared < MIN_FAILURES || now_ms >= u.written_ms + h;
    if u.failures > 0 && due {
        let start = since.or(u.first_ms).unwrap_or(now_ms);
        let change = Change::Failing {
            target: target.clone(),
            since_ms: start,
            failures: u.failures,
        };
        out.push(Record::new(now_ms, me, change));
        (since, shared) = (Some(start), shared + u.failures);
        (u.failures, u.first_ms, u.written_ms) = (0, None, now_ms);
    }
    // Only on a failure seen now: a quiet endpoint is never disabled.
    if delta.failures > 0 && !i.hold_disables {
        let last_ok = seen.local_success.max(k.and_then(|k| k.last_success_ms));
        let judged = Judged {
            start: since.map(|s| last_ok.map_or(s, |ok| s.max(ok + 1))),
            book_since: k.and_then(|k| k.failing_since_ms),
            failures: shared + u.failures,
        };
        out.extend(claim_due(now_ms, target, k, &judged, u, s, me));
    }
    out
}

/// The failing as this worker judges it.
struct Judged {
    /// Its start, after any success this worker saw.
    start: Option<u64>,
    /// Its start as the book has it (what a claim and a disable name).
    book_since: Option<u64>,
    failures: u64,
}

/// A claim on the automatic disable, if the failing began
/// `--disable-after` ago with [`MIN_FAILURES`], nobody holds a fresh claim
/// on it, and this worker did not claim it lately.
fn claim_due(
    now_ms: u64,
    target: &Target,
    k: Option<&KeyState>,
    j: &Judged,
    u: &mut Unwritten,
    s: &PlanSettings,
    me: &str,
) -> Option<Record> {
    let (after, start, since) = (s.disable_after?, j.start?, j.book_since?);
    let due = start + after.as_millis() as u64 + s.spread_ms;
    if now_ms < due || j.failures < MIN_FAILURES {
        return None;
    }
    let held = k
        .and_then(|k| k.claim.as_ref())
        .is_some_and(|c| c.since_ms == since && now_ms < c.at_ms + CLAIM_TTL_MS);
    if held || u.claimed_ms.is_some_and(|at| now_ms < at + CLAIM_TTL_MS) {
        return None;
    }
    u.claimed_ms = Some(now_ms);
    let change = Change::Claim {
        target: target.clone(),
        failing_since_ms: since,
    };
    Some(Record::new(now_ms, me, change))
}

/// The disables this worker's claims won: once each, and again should
/// one not reach the book (a lost confirm).
fn claimed_disables(now_ms: u64, book: &Book, carry: &mut Carry, me: &str) -> Vec<Record> {
    let mut out = vec![];
    for k in book.keys().filter(|k| !k.is_stale(now_ms)) {
        let Some(c) = &k.claim else { continue };
        let mine = c.by == me && k.failing_since_ms == Some(c.since_ms);
        if !mine || !k.control.clock_runs() {
            continue;
        }
        let u = carry.keys.entry(k.target.clone()).or_default();
        let written = u
            .disabled
            .is_some_and(|(since, at)| since == c.since_ms && now_ms < at + DISABLE_AGAIN_MS);
        if written {
            continue;
        }
        (u.disabled, u.touched_ms) = (Some((c.since_ms, now_ms)), now_ms);
        let n = k.failures + u.failures;
        out.push(auto_disable(now_ms, &k.target, c.since_ms, n, me));
    }
    out
}

/// The successes held back within a failing's hysteresis, once it is
/// over: a failing that had one never stands as older than it.
fn late_recoveries(
    now_ms: u64,
    book: &Book,
    carry: &mut Carry,
    s: &PlanSettings,
    me: &str,
) -> Vec<Record> {
    let mut out = vec![];
    for (target, u) in carry.keys.iter_mut() {
        let Some(ok) = u.unsent_ok else { continue };
        let since = current(book, target, now_ms).and_then(|k| k.failing_since_ms);
        match since {
            Some(s0) if ok >= s0 && now_ms >= s0.saturating_add(s.hysteresis_ms()) => {
                out.push(recovered(now_ms, target, ok, me));
                u.unsent_ok = None;
            }
            Some(s0) if ok >= s0 => {}
            _ => u.unsent_ok = None,
        }
    }
    out
}

fn recovered(now_ms: u64, target: &Target, ok: u64, me: &str) -> Record {
    let change = Change::Recovered {
        target: target.clone(),
        success_ms: ok,
    };
    Record::new(now_ms, me, change)
}

/// The book's state of `target`, unless stale (see [`KeyState::is_stale`]):
/// a stale one is judged as new, as the fold will make it.
fn current<'a>(book: &'a Book, target: &Target, now_ms: u64) -> Option<&'a KeyState> {
    book.get(target).filter(|k| !k.is_stale(now_ms))
}

/// The one automatic disable for a target failing since `since_ms`.
fn auto_disable(now_ms: u64, target: &Target, since_ms: u64, n: u64, me: &str) -> Record {
    let at = UNIX_EPOCH + Duration::from_millis(since_ms);
    let reason = format!(
        "auto: no success since {} ({n} attempts)",
        humantime::format_rfc3339_seconds(at.max(SystemTime::UNIX_EPOCH))
    );
    let change = Change::Disable {
        target: target.clone(),
        reason: Some(reason),
        failing_since_ms: Some(since_ms),
    };
    Record::with_id(format!("auto:{target}:{since_ms}"), now_ms, me, change)
}

/// A resume for each pause whose time is up and that nobody closed yet.
fn expired_pauses(now_ms: u64, book: &Book, s: &PlanSettings, me: &str) -> Vec<Record> {
    book.keys()
        .filter_map(|k| match &k.control {
            Mode::Paused {
                until_ms: Some(until),
                id,
                ..
            } if now_ms >= until + s.spread_ms => {
                let change = Change::Resume {
                    target: k.target.clone(),
                };
                Some(Record::with_id(
                    format!("{EXPIRED}{id}"),
                    now_ms,
                    me,
                    change,
                ))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
