//! What one endpoint did lately, as operators see it (`redeliver endpoint
//! list`) and as the shared failing-since clock learns it
//! (`crate::control`): attempts, successes and failures over the last five
//! minutes, the last success and the last failure, the notifications
//! waiting on it, and the outcomes not yet told to the shared state.
//!
//! Pure, and cheap enough to update under the endpoint's lock on every
//! attempt: a few counters, and an error string only on a failure. Times
//! are wall-clock milliseconds, passed in, because they leave the process
//! in reports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The window the counts cover, in minutes.
pub const WINDOW_MINUTES: u64 = 5;
/// A failure's error is kept up to this many characters.
const MAX_ERROR: usize = 200;

/// One endpoint's recent activity.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    /// One bucket per minute of the window, by minute number modulo the size.
    buckets: [Bucket; WINDOW_MINUTES as usize],
    last_success_ms: Option<u64>,
    last_failure: Option<Failure>,
    /// Notifications sent back to wait (deferred or retried), by when they
    /// are due, rounded up: per second for the next minute, per minute for
    /// the next hour, per ten minutes beyond. So an endpoint with hours of
    /// retries waiting keeps a few hundred entries, not one per message.
    waiting: BTreeMap<u64, u64>,
    delta: Delta,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bucket {
    minute: u64,
    counts: Counts,
}

/// Attempts over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub attempts: u64,
    pub successes: u64,
    pub failures: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.attempts += o.attempts;
        self.successes += o.successes;
        self.failures += o.failures;
    }
}

/// A failed attempt: when, and its status or error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub at_ms: u64,
    pub status: Option<u16>,
    pub error: Option<String>,
}

/// What one attempt came to, for its endpoint's record.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub success: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// When its retry is due, if it was sent back to wait.
    pub retry_due_ms: Option<u64>,
}

/// The outcomes since the shared state's planner last took them: the
/// latest success, and the failures after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub last_success_ms: Option<u64>,
    /// Failures after `last_success_ms` (all of them when there is none).
    pub failures: u64,
    pub first_failure_ms: Option<u64>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.last_success_ms.is_none() && self.failures == 0
    }
}

impl Activity {
    /// Counts one attempt at `now_ms`.
    pub fn record(&mut self, now_ms: u64, o: &Outcome) {
        let b = self.bucket(now_ms);
        b.counts.attempts += 1;
        if o.success {
            b.counts.successes += 1;
            self.last_success_ms = Some(now_ms);
            self.delta = Delta {
                last_success_ms: Some(now_ms),
                ..Delta::default()
            };
        } else {
            b.counts.failures += 1;
            self.last_failure = Some(Failure {
                at_ms: now_ms,
                status: o.status,
                error: o
                    .error
                    .as_ref()
                    .map(|e| e.chars().take(MAX_ERROR).collect()),
            });
            self.delta.failures += 1;
            self.delta.first_failure_ms.get_or_insert(now_ms);
        }
        if let Some(due) = o.retry_due_ms {
            self.wait_until(now_ms, due);
        }
    }

    /// The current minute's bucket, emptied if it held an older minute.
    fn bucket(&mut self, now_ms: u64) -> &mut Bucket {
        let minute = now_ms / 60_000;
        let b = &mut self.buckets[(minute % WINDOW_MINUTES) as usize];
        if b.minute != minute {
            *b = Bucket {
                minute,
                counts: Counts::default(),
            };
        }
        b
    }

    /// Counts a notification sent back to wait until `due_ms`.
    pub fn wait_until(&mut self, now_ms: u64, due_ms: u64) {
        let ahead = due_ms.saturating_sub(now_ms);
        let step = match ahead {
            0..=60_000 => 1_000,
            60_001..=3_600_000 => 60_000,
            _ => 600_000,
        };
        *self
            .waiting
            .entry(due_ms.div_ceil(step) * step)
            .or_default() += 1;
        // A bound, whatever the delays: the soonest go first.
        while self.waiting.len() > 1_000 {
            self.waiting.pop_first();
        }
    }

    /// Notifications sent back to wait that are not due yet; forgets the
    /// ones that are.
    pub fn waiting(&mut self, now_ms: u64) -> u64 {
        self.waiting = self.waiting.split_off(&(now_ms + 1));
        self.waiting.values().sum()
    }

    /// Attempts over the last [`WINDOW_MINUTES`] minutes.
    pub fn counts(&self, now_ms: u64) -> Counts {
        let now = now_ms / 60_000;
        let mut sum = Counts::default();
        for b in &self.buckets {
            if b.minute + WINDOW_MINUTES > now && b.minute <= now {
                sum += b.counts;
            }
        }
        sum
    }

    pub fn last_success_ms(&self) -> Option<u64> {
        self.last_success_ms
    }

    pub fn last_failure(&self) -> Option<&Failure> {
        self.last_failure.as_ref()
    }

    /// The outcomes since the last call.
    pub fn take_delta(&mut self) -> Delta {
        std::mem::take(&mut self.delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(status: u16) -> Outcome {
        Outcome {
            success: false,
            status: Some(status),
            error: Some(format!("HTTP {status}")),
            retry_due_ms: None,
        }
    }

    fn ok() -> Outcome {
        Outcome {
            success: true,
            status: Some(200),
            error: None,
            retry_due_ms: None,
        }
    }

    #[test]
    fn counts_cover_five_minutes_and_forget_older_ones() {
        let mut a = Activity::default();
        let t0 = 1_000 * 60_000;
        a.record(t0, &ok());
        a.record(t0 + 1, &fail(500));
        a.record(t0 + 4 * 60_000, &fail(503));
        let c = a.counts(t0 + 4 * 60_000);
        assert_eq!((c.attempts, c.successes, c.failures), (3, 1, 2));
        // Five minutes on, the first minute has left the window.
        let c = a.counts(t0 + 5 * 60_000);
        assert_eq!((c.attempts, c.failures), (1, 1));
        a.record(t0 + 6 * 60_000, &ok());
        assert_eq!(a.counts(t0 + 6 * 60_000).attempts, 2);
        assert_eq!(a.last_failure().unwrap().status, Some(503));
        assert_eq!(a.last_success_ms(), Some(t0 + 6 * 60_000));
    }

    #[test]
    fn the_delta_holds_the_latest_success_and_the_failures_after_it() {
        let mut a = Activity::default();
        a.record(10, &fail(500));
        a.record(20, &ok());
        a.record(30, &fail(500));
        a.record(40, &fail(500));
        let d = a.take_delta();
        assert_eq!(d.last_success_ms, Some(20));
        assert_eq!((d.failures, d.first_failure_ms), (2, Some(30)));
        assert!(a.take_delta().is_empty(), "taken");
        a.record(50, &fail(500));
        let d = a.take_delta();
        assert_eq!(
            (d.last_success_ms, d.failures, d.first_failure_ms),
            (None, 1, Some(50))
        );
    }

    #[test]
    fn waiting_counts_what_is_not_due_yet_in_a_bounded_map() {
        let mut a = Activity::default();
        let now = 1_000_000;
        a.wait_until(now, now + 500);
        a.wait_until(now, now + 30_000);
        a.wait_until(now, now + 6 * 3_600_000);
        assert_eq!(a.waiting(now), 3);
        assert_eq!(a.waiting(now + 31_000), 1);
        for i in 0..100_000 {
            a.wait_until(now, now + i * 1_000);
        }
        assert!(a.waiting.len() <= 1_000);
    }
}
