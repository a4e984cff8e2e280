//! What the probes of one backend say, as pure bookkeeping: which probes
//! are out, and whether the backend is stalled. No clock is read here; the
//! caller passes the time, so the tests drive it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

/// Probes tracked at once. A stalled backend keeps its probes for as long
/// as it is stalled; past this many the oldest are forgotten (one that
/// still comes back counts as a success all the same).
const MAX_OUT: usize = 64;

/// One backend's probes in flight and its state.
#[derive(Debug)]
pub struct Book {
    next: u64,
    /// Sequence number → when it was sent (monotonic and wall time).
    out: BTreeMap<u64, (Instant, SystemTime)>,
    /// A probe not back this long after it was sent is overdue: its delay
    /// plus the grace.
    limit: Duration,
    state: State,
    /// The round trip of the last tracked probe that came back.
    last_rtt: Option<Duration>,
}

/// A backend's state as the probes tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No probe has come back or gone overdue yet.
    Unknown,
    /// A probe came back in time; since this wall time.
    Routing { since: SystemTime },
    /// A probe sent at `since` (wall time) is overdue, and none has come
    /// back since: routing stopped at or before then.
    Stalled { since: SystemTime, at: Instant },
}

/// What one event changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// The backend stalled: the probe sent at `sent` is `overdue` past
    /// its delay plus grace.
    Stalled {
        sent: SystemTime,
        waited: Duration,
    },
    /// A probe came back after a stall that lasted `lasted` (from when it
    /// was reported).
    Cleared {
        lasted: Duration,
    },
    /// The first probe came back (from `Unknown`).
    Routing,
}

impl Book {
    /// `limit`: a probe's delay plus the grace.
    pub fn new(limit: Duration) -> Self {
        Book {
            next: 0,
            out: BTreeMap::new(),
            limit,
            state: State::Unknown,
            last_rtt: None,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn is_stalled(&self) -> bool {
        matches!(self.state, State::Stalled { .. })
    }

    /// Records a probe sent now; returns its sequence number.
    pub fn sent(&mut self, now: Instant, wall: SystemTime) -> u64 {
        self.next += 1;
        self.out.insert(self.next, (now, wall));
        while self.out.len() > MAX_OUT {
            self.out.pop_first();
        }
        self.next
    }

    /// A probe came back: it and every older one are no longer out (they
    /// went the same way, so one back means the path works). Returns its
    /// round trip when it was tracked, and what changed.
    ///
    /// When it ends a stall, the probes still out were sent during that
    /// stall, and the backend releases them one after another: each is
    /// judged from now, not from when it was sent. Otherwise the next one,
    /// already overdue, reported a second stall between two probes coming
    /// back 30 ms apart (CI: a worker sent `stalled` and `recovered` again
    /// right after another worker's `recovered` had freed the lease).
    pub fn back(&mut self, seq: u64, now: Instant, wall: SystemTime) -> (Option<Duration>, Change) {
        let rtt = self.out.get(&seq).map(|(sent, _)| now - *sent);
        self.last_rtt = rtt.or(self.last_rtt);
        // Keep only the probes sent after this one.
        self.out = self.out.split_off(&(seq + 1));
        let change = match self.state {
            State::Stalled { at, .. } => {
                for sent in self.out.values_mut() {
                    *sent = (now, wall);
                }
                Change::Cleared {
                    lasted: now.saturating_duration_since(at),
                }
            }
            State::Unknown => Change::Routing,
            State::Routing { .. } => return (rtt, Change::None),
        };
        self.state = State::Routing { since: wall };
        (rtt, change)
    }

    /// Whether the oldest probe out is overdue: the backend stalls.
    pub fn check(&mut self, now: Instant) -> Change {
        if self.is_stalled() {
            return Change::None;
        }
        let Some((sent, wall)) = self.out.values().next().copied() else {
            return Change::None;
        };
        let waited = now.saturating_duration_since(sent);
        if waited <= self.limit {
            return Change::None;
        }
        self.state = State::Stalled {
            since: wall,
            at: now,
        };
        Change::Stalled { sent: wall, waited }
    }

    /// Takes another worker's word that the backend is stalled since
    /// `since`: this one's own probes then clear it, or confirm it without
    /// reporting it again. Returns whether that changed anything.
    pub fn assume_stalled(&mut self, since: SystemTime, now: Instant) -> bool {
        if self.is_stalled() {
            return false;
        }
        self.state = State::Stalled { since, at: now };
        true
    }

    /// A new connection: the probes out went to the old one's queue, which
    /// is gone, so they can no longer come back. The state is kept: a
    /// stall is cleared only by a probe that comes back.
    pub fn forget_out(&mut self) {
        self.out.clear();
    }

    /// The round trip of the last tracked probe back.
    pub fn last_round_trip(&self) -> Option<Duration> {
        self.last_rtt
    }

    /// Probes out now.
    pub fn out(&self) -> usize {
        self.out.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_probe_back_in_time_means_routing() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        let seq = b.sent(t0, w0);
        assert_eq!(b.check(t0 + 5 * S), Change::None);
        let (rtt, change) = b.back(seq, t0 + S, w0 + S);
        assert_eq!((rtt, change), (Some(S), Change::Routing));
        assert_eq!(b.state(), State::Routing { since: w0 + S });
        assert_eq!(b.out(), 0);
        let seq = b.sent(t0 + 5 * S, w0);
        assert_eq!(b.back(seq, t0 + 6 * S, w0).1, Change::None);
    }

    #[test]
    fn an_overdue_probe_stalls_once_and_one_back_clears() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        let first = b.sent(t0, w0);
        b.sent(t0 + 5 * S, w0 + 5 * S);
        assert_eq!(b.check(t0 + 11 * S), Change::None, "not past the limit");
        let change = b.check(t0 + 12 * S);
        assert_eq!(
            change,
            Change::Stalled {
                sent: w0,
                waited: 12 * S
            }
        );
        assert!(b.is_stalled());
        assert_eq!(b.check(t0 + 30 * S), Change::None, "reported once");
        // The first one comes back late: the path works again.
        let (rtt, change) = b.back(first, t0 + 40 * S, w0 + 40 * S);
        assert_eq!(rtt, Some(40 * S));
        assert_eq!(change, Change::Cleared { lasted: 28 * S });
        assert_eq!(b.out(), 1, "the later probe is still out");
    }

    #[test]
    fn the_probes_held_by_a_stall_are_judged_from_its_end() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        let first = b.sent(t0, w0);
        b.sent(t0 + 5 * S, w0 + 5 * S);
        assert!(matches!(b.check(t0 + 12 * S), Change::Stalled { .. }));
        // The stall ends: the first probe is back; the second, overdue
        // too, is on its way right behind it.
        let end = (t0 + 17 * S, w0 + 17 * S);
        assert!(matches!(
            b.back(first, end.0, end.1).1,
            Change::Cleared { .. }
        ));
        assert_eq!(b.check(end.0 + S), Change::None, "not a second stall");
        // Lost for good, it stalls again, a limit after the stall's end.
        assert_eq!(b.check(end.0 + 11 * S), Change::None);
        assert_eq!(
            b.check(end.0 + 12 * S),
            Change::Stalled {
                sent: end.1,
                waited: 12 * S
            }
        );
    }

    #[test]
    fn a_newer_probe_back_forgets_older_ones_that_were_lost() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        b.sent(t0, w0);
        let second = b.sent(t0 + 5 * S, w0);
        b.back(second, t0 + 6 * S, w0);
        assert_eq!(b.out(), 0);
        assert_eq!(b.check(t0 + 60 * S), Change::None);
    }

    #[test]
    fn a_stall_taken_from_another_worker_is_cleared_by_a_probe_back() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        assert!(b.assume_stalled(w0, t0));
        assert!(!b.assume_stalled(w0, t0), "once");
        let seq = b.sent(t0, w0);
        assert_eq!(b.check(t0 + 20 * S), Change::None, "not reported again");
        assert!(matches!(
            b.back(seq, t0 + 21 * S, w0).1,
            Change::Cleared { .. }
        ));
    }

    #[test]
    fn a_new_connection_keeps_the_stall_until_a_probe_comes_back() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        b.sent(t0, w0);
        assert!(matches!(b.check(t0 + 12 * S), Change::Stalled { .. }));
        b.forget_out();
        assert!(b.is_stalled());
        let seq = b.sent(t0 + 20 * S, w0);
        assert_eq!(b.check(t0 + 40 * S), Change::None, "already reported");
        assert!(matches!(
            b.back(seq, t0 + 41 * S, w0).1,
            Change::Cleared { .. }
        ));
    }

    #[test]
    fn an_untracked_probe_back_still_clears_and_the_book_stays_bounded() {
        let (t0, w0) = (Instant::now(), SystemTime::now());
        let mut b = Book::new(11 * S);
        for i in 0..200 {
            b.sent(t0 + i * S, w0);
        }
        assert_eq!(b.out(), MAX_OUT);
        assert!(matches!(b.check(t0 + 500 * S), Change::Stalled { .. }));
        let (rtt, change) = b.back(1, t0 + 501 * S, w0);
        assert_eq!(rtt, None, "forgotten");
        assert!(matches!(change, Change::Cleared { .. }));
    }
}
