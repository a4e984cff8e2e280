//! When a channel's acks go alone for good: the ack task (`acks.rs`)
//! watches its settled prefix, and when acks keep going alone above a tag
//! that stays open (a hung attempt, a wait in the worker, a settle), it
//! tells the feed, which replaces the lane's consumer (`rotation.rs`). The
//! fresh channel's acks go in runs again; the old one keeps the open tag.
//! Without it a lane-mate of a hung endpoint paid one quorum-queue command
//! per ack for as long as the attempt hung. [`Floor`] is the pure part.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long the settled prefix may stay put, with acks above it going
/// alone, before the feed is told: longer than deliveries finish out of
/// order in a flowing lane (a few ms), shorter than a hung attempt, a wait
/// in the worker or a settle.
pub(super) const STUCK_AFTER: Duration = Duration::from_millis(100);

/// The ack task tells the feed at most this often: a retired consumer's
/// prefix stays put (by design) until its slowest delivery is settled.
pub(super) const TELL_EVERY: Duration = Duration::from_secs(1);

/// How long the settled prefix stayed put (pure: the time is passed in).
#[derive(Debug)]
pub(super) struct Floor {
    at: u64,
    since: Instant,
    told: Option<Instant>,
}

impl Floor {
    pub(super) fn new(now: Instant) -> Self {
        Floor {
            at: 0,
            since: now,
            told: None,
        }
    }

    /// After an ack turn that left the prefix at `floor`: whether to tell
    /// the feed now. Yes when an ack went alone above it (`alone`), it has
    /// not moved for [`STUCK_AFTER`], and the feed was not told within
    /// [`TELL_EVERY`].
    pub(super) fn turn(&mut self, floor: u64, alone: bool, now: Instant) -> bool {
        if floor != self.at {
            (self.at, self.since) = (floor, now);
        }
        let stuck = now.saturating_duration_since(self.since) >= STUCK_AFTER;
        let quiet = self
            .told
            .is_none_or(|t| now.saturating_duration_since(t) >= TELL_EVERY);
        let tell = alone && stuck && quiet;
        if tell {
            self.told = Some(now);
        }
        tell
    }
}

/// The feed's ear for one channel: set `flag` and wake the pump
/// (`rotate`), which then calls `Feed::rotate`.
#[derive(Clone, Debug)]
pub(super) struct Stuck {
    pub(super) flag: Arc<AtomicBool>,
    pub(super) rotate: Arc<Notify>,
}

impl Stuck {
    pub(super) fn tell(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.rotate.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_alone_above_a_prefix_put_for_long_tell_the_feed_once_a_second() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut f = Floor::new(t0);
        // The prefix moved; an ack went alone soon after: a delivery that
        // finished a little late, not a stuck one.
        assert!(!f.turn(2, false, t0 + ms(50)));
        assert!(!f.turn(2, true, t0 + ms(100)));
        // Still at 2 past STUCK_AFTER: tell, not again within TELL_EVERY,
        // then again.
        assert!(f.turn(2, true, t0 + ms(50) + STUCK_AFTER));
        assert!(!f.turn(2, true, t0 + ms(500)));
        assert!(f.turn(2, true, t0 + ms(60) + STUCK_AFTER + TELL_EVERY));
        // No ack alone: nothing to tell, however long.
        let later = t0 + 5 * TELL_EVERY;
        assert!(!f.turn(2, false, later));
        // The prefix moves: quiet for STUCK_AFTER again.
        assert!(!f.turn(9, true, later + ms(1)));
        assert!(f.turn(9, true, later + ms(1) + STUCK_AFTER));
    }
}
