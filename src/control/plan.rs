//! What a worker writes to the shared state, decided from the book and
//! the outcomes its endpoints saw since the last tick. Pure: time is
//! passed in; the caller appends the records ([`super::follow`]).
//!
//! - **Failing since.** The first failure with no success after it is
//!   written once (the book keeps the earliest); counts follow, batched,
//!   until the book has [`MIN_FAILURES`], then only every "hysteresis"
//!   (a twentieth of `--disable-after`).
//! - **Recovered.** A success ends the failing, but is written only when
//!   the failing is older than the hysteresis: a receiver that fails 90%
//!   of the time costs a record or two per hysteresis, not two per success.
//! - **Automatic disable**, when a failure is seen `--disable-after` past
//!   the failing's start, with [`MIN_FAILURES`] or more since: one record,
//!   its id made of the target and the failing's start, so a second
//!   worker's identical decision changes nothing.
//! - **An expired pause** is closed with a resume (id from the pause's),
//!   for the history; the pause stopped holding at its time regardless.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::book::{Book, KeyState, Mode, EXPIRED};
use super::record::{Change, Record};
use crate::endpoint::activity::Delta;
use crate::message::target::Target;

/// An endpoint is disabled only once it had this many failed attempts in
/// the span: a quiet endpoint's odd failure is no reason.
pub const MIN_FAILURES: u64 = 10;
pub use crate::config::DEFAULT_DISABLE_AFTER;

/// How a worker plans.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSettings {
    /// `None`: never disable by itself.
    pub disable_after: Option<Duration>,
    /// This worker's share of a small spread (ms), so that workers which
    /// see the same thing at once rarely write it twice.
    pub spread_ms: u64,
}

/// Failures seen here but not yet written, per target.
#[derive(Debug, Default)]
pub struct Carry {
    keys: HashMap<Target, Unwritten>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Unwritten {
    failures: u64,
    first_ms: Option<u64>,
    written_ms: u64,
}

impl PlanSettings {
    /// The hysteresis (ms): how precise "failing since" is kept.
    pub fn hysteresis_ms(&self) -> u64 {
        let after = self.disable_after.unwrap_or(DEFAULT_DISABLE_AFTER);
        (after.as_millis() as u64 / 20).max(1)
    }
}

/// The records this worker should write now. `deltas` are its endpoints'
/// outcomes since the last tick; `local_success` their last successes.
pub fn plan(
    now_ms: u64,
    book: &Book,
    deltas: &[(Target, Delta, Option<u64>)],
    carry: &mut Carry,
    s: &PlanSettings,
    me: &str,
) -> Vec<Record> {
    let mut out = vec![];
    for (target, delta, local_success) in deltas {
        let k = book.get(target);
        if k.is_some_and(|k| k.control != Mode::Active) {
            // Paused or disabled (or a pause not closed yet): no clock runs.
            carry.keys.remove(target);
            continue;
        }
        let u = carry.keys.entry(target.clone()).or_default();
        out.extend(endpoint(now_ms, target, k, delta, *local_success, u, s, me));
    }
    let h = s.hysteresis_ms();
    carry
        .keys
        .retain(|_, u| u.failures > 0 || now_ms < u.written_ms + h);
    out.extend(expired_pauses(now_ms, book, s, me));
    out
}

/// One endpoint's records: recovered, failing, disable.
#[allow(clippy::too_many_arguments)]
fn endpoint(
    now_ms: u64,
    target: &Target,
    k: Option<&KeyState>,
    delta: &Delta,
    local_success: Option<u64>,
    u: &mut Unwritten,
    s: &PlanSettings,
    me: &str,
) -> Vec<Record> {
    let h = s.hysteresis_ms();
    let mut out = vec![];
    let mut since = k.and_then(|k| k.failing_since_ms);
    let mut shared = k.map_or(0, |k| k.failures);
    if let Some(ok) = delta.last_success_ms {
        if since.is_some_and(|s| ok >= s.saturating_add(h)) {
            let change = Change::Recovered {
                target: target.clone(),
                success_ms: ok,
            };
            out.push(Record::new(now_ms, me, change));
            (since, shared) = (None, 0);
        }
        // Failures held back from before this success no longer count.
        *u = Unwritten {
            written_ms: u.written_ms,
            ..Unwritten::default()
        };
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
        *u = Unwritten {
            written_ms: now_ms,
            ..Unwritten::default()
        };
    }
    // Only on a failure seen now: a quiet endpoint is never disabled.
    if delta.failures > 0 {
        let last_ok = local_success.max(k.and_then(|k| k.last_success_ms));
        let start = since.map(|s| last_ok.map_or(s, |ok| s.max(ok + 1)));
        let n = shared + u.failures;
        out.extend(disable_due(now_ms, target, start, n, s, me));
    }
    out
}

/// The automatic disable, if the failing began `--disable-after` ago and
/// had [`MIN_FAILURES`].
fn disable_due(
    now_ms: u64,
    target: &Target,
    start: Option<u64>,
    n: u64,
    s: &PlanSettings,
    me: &str,
) -> Option<Record> {
    let (after, start) = (s.disable_after?, start?);
    let due = start + after.as_millis() as u64 + s.spread_ms;
    (now_ms >= due && n >= MIN_FAILURES).then(|| auto_disable(now_ms, target, start, n, me))
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
