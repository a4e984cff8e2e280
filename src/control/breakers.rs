//! Parking the backlog of an endpoint whose breaker has been open long
//! (`--breaker-park-after`). Pure: time and this worker's breakers are
//! passed in; `follow.rs` appends the records.
//!
//! - **Park.** A worker whose breaker for an endpoint has been open (or
//!   half-open) for the threshold, without closing, pauses its target for
//!   at most [`PARK_FOR`]. Every worker then parks its notifications as
//!   for an operator's pause: no circulation through the delay backend.
//!   The pause's id starts with `breaker:`, and it applies only to an
//!   active target, so it never overrides an operator's decision.
//! - **Probe.** While it lasts, each worker's own breaker lets a delivery
//!   through as its probe (`crate::worker::admit`), on the breaker's
//!   schedule, and sends one per opening to wait for the half-open (a
//!   candidate, marked so that no worker parks it): a probe needs no new
//!   traffic.
//! - **Release.** A worker whose breaker closed after the pause began
//!   writes the resume (`probed:<pause id>`), which releases the backlog at
//!   once; every worker then closes its own breaker for the endpoint.
//! - **Cap.** Should every probe be lost (a worker killed with its
//!   candidate), the pause ends after [`PARK_FOR`] and the backlog is tried
//!   again; a new pause waits until the breaker has stayed open the
//!   threshold after that.
//! - **Not for one worker's trouble**: see [`parks`].

use std::time::Duration;

use super::book::{Book, BREAKER_PAUSE, PROBED};
use super::record::{Change, Record};
use super::state::{breaker_pause_id, KeyState, Mode};
use crate::isolation::{BreakerSeen, CLOCK_SLACK_MS};

/// How long a breaker's pause lasts at most.
pub const PARK_FOR: Duration = Duration::from_secs(600);
pub use crate::config::SUGGESTED_BREAKER_PARK_AFTER;

/// What one tick plans from.
pub struct Inputs<'a> {
    pub now_ms: u64,
    pub book: &'a Book,
    /// This worker's breakers that have opened.
    pub seen: &'a [BreakerSeen],
    /// `--breaker-park-after`.
    pub after: Duration,
    /// Most of this worker's endpoints fail: its own network is the
    /// likelier culprit, so it parks nothing for the others.
    pub hold: bool,
}

/// The pauses and resumes this worker's breakers call for.
pub fn plan(i: &Inputs, me: &str) -> Vec<Record> {
    i.seen
        .iter()
        .filter_map(|b| {
            let k = i.book.get(&b.target);
            match (k.map_or(&Mode::Active, |k| &k.control), b.open_since_ms) {
                (Mode::Active, Some(since)) => {
                    parks(i, k, b, since).then(|| park(i.now_ms, b, since, me))
                }
                (Mode::Paused { id, since_ms, .. }, None)
                    if id.starts_with(BREAKER_PAUSE)
                        && b.closed_ms.is_some_and(|c| c + CLOCK_SLACK_MS >= *since_ms) =>
                {
                    let change = Change::Resume {
                        target: b.target.clone(),
                    };
                    Some(Record::with_id(
                        format!("{PROBED}{id}"),
                        i.now_ms,
                        me,
                        change,
                    ))
                }
                _ => None,
            }
        })
        .collect()
}

/// Whether an active endpoint whose breaker opened at `since` is parked
/// now: open the threshold, and as long since its last change (an expiry
/// gives the backlog that long to be tried); no success another worker
/// reported since it opened (it is not down for everyone); this worker's
/// own network not in doubt; no operator's pause or disable of a wider
/// target (an origin above a route's prefix) in force over it.
fn parks(i: &Inputs, k: Option<&KeyState>, b: &BreakerSeen, since: u64) -> bool {
    let after = ms(i.after);
    let last = k.and_then(|k| k.history.last()).map_or(0, |e| e.at_ms);
    let ok_since = k
        .and_then(|k| k.last_success_ms)
        .is_some_and(|s| s >= since);
    let covered = i.book.keys().any(|w| {
        w.target != b.target && w.target.covers(&b.target) && w.control.in_force(i.now_ms)
    });
    // A probe's resume came after it opened, and closes it: this view of
    // the breaker is older than the book (the stream would refuse the
    // pause anyway).
    let probed = k.is_some_and(|k| k.probed_after(since));
    i.now_ms >= since.saturating_add(after)
        && i.now_ms >= last.saturating_add(after)
        && !ok_since
        && !probed
        && !i.hold
        && !covered
}

fn park(now_ms: u64, b: &BreakerSeen, since: u64, me: &str) -> Record {
    let open = Duration::from_millis(now_ms.saturating_sub(since) / 1000 * 1000);
    let change = Change::Pause {
        target: b.target.clone(),
        reason: Some(format!(
            "circuit breaker open for {}: parked until a probe succeeds",
            humantime::format_duration(open)
        )),
        until_ms: Some(now_ms + ms(PARK_FOR)),
    };
    let id = breaker_pause_id(&b.target, since);
    Record::with_id(id, now_ms, me, change)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "breakers_tests.rs"]
mod tests;
