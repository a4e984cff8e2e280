//! When a release reads a parking queue again (`unpark.rs`). Pure: time
//! is passed in.
//!
//! One read after a release can leave freed notifications behind, and
//! nothing else would read them until the next release or the worker's
//! restart (a 10-minute breaker pause, or forever for an operator's
//! resume):
//! - Workers read a queue at once as competing consumers. A read that
//!   starts while another holds the queue's messages unacked finds none
//!   ready and ends; the other read stops at the count it began with, or
//!   at a notification parked after it began, and gives back what it had
//!   taken beyond that when it closes its channel.
//! - A worker that has not applied the resume yet parks after the reads
//!   began; its own read covers that only if it is not ended early as
//!   above.
//! - On a loaded broker a read's first delivery can take longer than its
//!   idle limit.
//!
//! So each release's queues are read again [`AGAIN_AFTER`], which finds
//! an empty queue at the cost of one passive declare, and moves a still
//! paused endpoint's notifications to the queue's tail (the price: two more
//! passes over a lane's still-paused backlog per release).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// When, after a release, its queues are read again.
pub(super) const AGAIN_AFTER: [Duration; 2] = [Duration::from_secs(3), Duration::from_secs(15)];

/// The reads still to come, by when they are due.
#[derive(Debug, Default)]
pub(super) struct Rereads {
    due: BTreeMap<Instant, BTreeSet<String>>,
}

impl Rereads {
    /// Plans the reads again of a release's `queues`, read at `now`.
    pub(super) fn released(&mut self, now: Instant, queues: &BTreeSet<String>) {
        if queues.is_empty() {
            return;
        }
        for after in AGAIN_AFTER {
            let at = self.due.entry(now + after).or_default();
            at.extend(queues.iter().cloned());
        }
    }

    /// When the next read again is due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.due.keys().next().copied()
    }

    /// The queues whose read again is due at `now`, taken from the plan.
    pub(super) fn take_due(&mut self, now: Instant) -> BTreeSet<String> {
        let later = match now.checked_add(Duration::from_nanos(1)) {
            Some(after) => self.due.split_off(&after),
            None => BTreeMap::new(),
        };
        std::mem::replace(&mut self.due, later)
            .into_values()
            .flatten()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_release_is_read_again_after_each_delay_and_then_no_more() {
        let t0 = Instant::now();
        let mut r = Rereads::default();
        r.released(t0, &set(&["p.park.1"]));
        assert_eq!(r.next(), Some(t0 + AGAIN_AFTER[0]));
        assert!(r.take_due(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(r.take_due(t0 + AGAIN_AFTER[0]), set(&["p.park.1"]));
        assert_eq!(r.next(), Some(t0 + AGAIN_AFTER[1]));
        assert_eq!(r.take_due(t0 + AGAIN_AFTER[1]), set(&["p.park.1"]));
        assert_eq!(r.next(), None);
        assert!(r.take_due(t0 + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn releases_close_together_merge_what_falls_due_together() {
        let t0 = Instant::now();
        let mut r = Rereads::default();
        r.released(t0, &set(&["p.park.1"]));
        r.released(t0 + Duration::from_secs(1), &set(&["p.park.2"]));
        r.released(t0 + Duration::from_secs(1), &BTreeSet::new());
        // Late: both first reads again are due at once.
        let late = t0 + Duration::from_secs(5);
        assert_eq!(r.take_due(late), set(&["p.park.1", "p.park.2"]));
        assert_eq!(r.next(), Some(t0 + AGAIN_AFTER[1]));
        assert_eq!(r.take_due(late + Duration::from_secs(60)).len(), 2);
        assert_eq!(r.next(), None);
    }
}
