//! Where a delivery its endpoint cannot take now waits: in the worker, or
//! through the delay backend. Pure; the worker carries it out
//! (`worker/wait.rs`).
//!
//! A deferral through the delay backend is a confirmed publish, a store
//! write on the broker and, later, a second delivery: about five times
//! what a whole healthy delivery costs the broker (BENCHMARKS.md, phase 9).
//! Most of a bad endpoint's waits are short: a `Retry-After` of a second
//! or two, a breaker's first open time (5 s by default), a turn at a busy
//! endpoint. For those the delivery stays where it is, unacked in the
//! worker, and asks its endpoint again when the wait is over; the broker
//! does nothing. A worker killed meanwhile leaves it unacked, so the broker
//! hands it to another worker: nothing can be lost, as with a delivery in
//! flight.
//!
//! Waiting is bounded three ways, past which the delivery is deferred
//! through the broker as before: one wait at most [`TURN_MAX`] (a long
//! wait is an endpoint that is down, not one that is busy), all of one
//! delivery's waits at most [`TOTAL_MAX`] (an unacked message pins the
//! quorum queue's log, so a flood of other traffic is not held on disk
//! for long), and the worker's room (`--max-waiting` deliveries and
//! [`BYTES_MAX`] of bodies).

use std::time::Duration;

/// The longest single wait taken in the worker.
pub const TURN_MAX: Duration = Duration::from_secs(5);
/// The longest one delivery waits in the worker, all its waits together.
pub const TOTAL_MAX: Duration = Duration::from_secs(10);
/// The shortest wait: an endpoint that asks for less is asked again after
/// this, not in a spin.
pub const TURN_MIN: Duration = Duration::from_millis(10);
/// Bodies waiting in one worker, at most.
pub const BYTES_MAX: usize = 64 << 20;

/// Where a deferred delivery waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPlan {
    /// Here, unacked, for this long; then its endpoint is asked again.
    InWorker(Duration),
    /// Through the delay backend (confirmed before the ack).
    Republish,
}

/// The plan for a delivery its endpoint defers for `wait`, which already
/// waited `waited` in this worker. While the worker stops, nothing waits in
/// it (a stopping worker's unacked deliveries would be redelivered at once,
/// to an endpoint that still cannot take them). `jitter` in `[0, 1)` spreads
/// deliveries paused together by up to a tenth of their wait, so they do
/// not all ask again at once.
pub fn plan(wait: Duration, waited: Duration, stopping: bool, jitter: f64) -> WaitPlan {
    if stopping || wait > TURN_MAX {
        return WaitPlan::Republish;
    }
    let turn = wait.max(TURN_MIN) + wait.mul_f64(0.1 * jitter.clamp(0.0, 1.0));
    match waited.saturating_add(turn) > TOTAL_MAX {
        true => WaitPlan::Republish,
        false => WaitPlan::InWorker(turn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_short_wait_is_taken_in_the_worker_with_its_jitter() {
        assert_eq!(plan(S, Duration::ZERO, false, 0.0), WaitPlan::InWorker(S));
        assert_eq!(
            plan(S, Duration::ZERO, false, 0.5),
            WaitPlan::InWorker(Duration::from_millis(1_050))
        );
        assert_eq!(
            plan(TURN_MAX, 3 * S, false, 0.0),
            WaitPlan::InWorker(TURN_MAX)
        );
    }

    #[test]
    fn a_tiny_wait_is_not_a_spin() {
        let p = plan(Duration::from_millis(1), Duration::ZERO, false, 0.0);
        assert_eq!(p, WaitPlan::InWorker(TURN_MIN));
    }

    #[test]
    fn a_long_wait_goes_through_the_broker() {
        let long = TURN_MAX + Duration::from_millis(1);
        assert_eq!(plan(long, Duration::ZERO, false, 0.0), WaitPlan::Republish);
        assert_eq!(
            plan(60 * S, Duration::ZERO, false, 0.0),
            WaitPlan::Republish
        );
    }

    #[test]
    fn waits_add_up_to_at_most_the_total() {
        assert_eq!(plan(2 * S, 8 * S, false, 0.0), WaitPlan::InWorker(2 * S));
        assert_eq!(plan(2 * S, 8 * S, false, 0.5), WaitPlan::Republish);
        assert_eq!(plan(S, 9_500 * S / 1000, false, 0.0), WaitPlan::Republish);
    }

    #[test]
    fn nothing_waits_in_a_stopping_worker() {
        assert_eq!(plan(S, Duration::ZERO, true, 0.0), WaitPlan::Republish);
    }

    #[test]
    fn jitter_out_of_range_is_clamped() {
        let p = plan(S, Duration::ZERO, false, 7.0);
        assert_eq!(p, WaitPlan::InWorker(Duration::from_millis(1_100)));
    }
}
