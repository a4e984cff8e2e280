//! An endpoint's adaptive concurrency limit, pure: how many attempts in
//! flight an endpoint has earned from its own behaviour. The caller
//! passes the clock in; `crate::isolation` holds one per endpoint.
//!
//! Loss-based like TCP's congestion window (and Netflix's AIMD limit),
//! with a latency signal measured against the endpoint's *own* baseline:
//!
//! - **Grow** by one for each timely answer while the endpoint uses at
//!   least half its limit (so it doubles every round trip, TCP's slow
//!   start), up to `max`. An endpoint that does not use its limit does
//!   not inflate it.
//! - **Halve** (not below 1) when more than a quarter of a round of
//!   attempts (the next `limit` attempts started, between [`MIN_SAMPLES`]
//!   and [`ROUND_SAMPLES`]) were bad, judged once all of them are: no answer (timeout, connection or TLS error), an overload
//!   answer (502/503/504, 429), an answer later than
//!   [`Limiter::late_after`], or an attempt *still in flight* past that
//!   threshold ([`Limiter::check`], counted once). So a hang is seen within
//!   a few round trips, not when its timeout ends: a slot held by a hung
//!   request cannot be taken back. Rounds follow each other without
//!   overlap: one cut per round at most, as TCP cuts once per window.
//! - Rounds go by *start order*, not by when samples arrive: a flaky
//!   endpoint whose occasional hangs hold most slots answers in bursts,
//!   and its hangs are judged late exactly while its good answers are
//!   starved by them. Counted as they arrive, 5% of hangs look like a
//!   trend; counted with the attempts they started among, they are 5%.
//! - **Baseline**: the endpoint's usual latency, an average over time
//!   that follows faster answers within a fraction of a second
//!   ([`BASELINE_FALL`]) and slower ones over seconds ([`BASELINE_RISE`]).
//!   A sudden slow-down is caught first; an endpoint slow for good ("slow
//!   is not dead") earns its limit back at its new pace within seconds.
//!
//! A fast application error (a quick 500 or 404) is an answer: the
//! endpoint is up. It counts like any other timely answer here.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::breaker::Signal;

/// An answer later than `LATE_FACTOR` × the baseline plus [`LATE_SLACK`]
/// is late, and so is an attempt still in flight that long.
pub const LATE_FACTOR: u32 = 3;
/// Absolute slack on the late threshold, so a fast endpoint's (1 ms)
/// scheduling noise on a busy machine is not mistaken for a slow-down.
pub const LATE_SLACK: Duration = Duration::from_millis(50);
/// A round of samples with more than this share bad halves the limit.
pub const BAD_SHARE: f64 = 0.25;
/// The fewest samples a round is judged on.
pub const MIN_SAMPLES: usize = 4;
/// The most samples a round holds (a round of a large limit).
pub const ROUND_SAMPLES: usize = 20;
/// The baseline's time constant towards slower answers: a slow-down is
/// late for a few seconds before it becomes the endpoint's normal.
pub const BASELINE_RISE: Duration = Duration::from_secs(10);
/// Its time constant towards faster answers: a recovery is believed at once.
pub const BASELINE_FALL: Duration = Duration::from_millis(200);

/// The limit's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitPolicy {
    /// Where a new endpoint starts: it has not shown yet what it can take.
    pub initial: usize,
    /// The most it can earn: the worker's concurrency, or a hard ceiling.
    pub max: usize,
}

impl LimitPolicy {
    /// A new endpoint starts at one attempt in flight: a slot held by a
    /// request that hangs cannot be taken back until its timeout, so an
    /// endpoint that hangs from its first request holds one slot, not a
    /// quarter of them (a quarter of 16 hung is a quarter of the worker
    /// gone for the neighbours). A healthy one doubles from there every
    /// round trip: 16 slots within five.
    pub fn for_max(max: usize) -> Self {
        LimitPolicy {
            initial: 1,
            max: max.max(1),
        }
    }
}

/// One attempt in flight, from [`Limiter::start`] to [`Limiter::finish`]
/// or [`Limiter::abandon`].
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// A round of attempts: the tickets from `first`, up to `size` of them.
#[derive(Clone, Copy, Debug)]
struct Round {
    first: u64,
    size: usize,
    members: usize,
    /// Members whose outcome is known (or that said nothing).
    resolved: usize,
    samples: usize,
    bad: usize,
}

/// One endpoint's adaptive limit; see the module's doc.
#[derive(Clone, Debug)]
pub struct Limiter {
    limit: f64,
    max: f64,
    baseline: Option<Duration>,
    /// When the baseline last learned.
    learned: Instant,
    /// Attempts in flight not yet judged late, in start (= ticket) order:
    /// ticket, start, and the attempts in flight when it started (itself
    /// included). Sorted, so found by binary search; a deque, so no
    /// allocation per attempt.
    fresh: VecDeque<(u64, Instant, usize)>,
    in_flight: usize,
    /// Attempts in flight judged late.
    stuck: usize,
    next: u64,
    /// Rounds of attempts by start order, oldest first, not yet judged.
    rounds: VecDeque<Round>,
    /// The last answer, or when the endpoint went from idle to busy.
    progress: Instant,
}

impl Limiter {
    pub fn new(p: LimitPolicy, now: Instant) -> Self {
        let max = p.max.max(1) as f64;
        Limiter {
            limit: (p.initial.max(1) as f64).min(max),
            max,
            baseline: None,
            learned: now,
            fresh: VecDeque::new(),
            in_flight: 0,
            stuck: 0,
            next: 0,
            rounds: VecDeque::new(),
            progress: now,
        }
    }

    /// Attempts the endpoint may have in flight now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Attempts in flight now that were judged late.
    pub fn stuck(&self) -> usize {
        self.stuck
    }

    /// The endpoint's usual latency, once it answered.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
    }

    /// When an answer (or an attempt in flight) counts as late; `None`
    /// until the endpoint first answered.
    pub fn late_after(&self) -> Option<Duration> {
        self.baseline.map(|b| b * LATE_FACTOR + LATE_SLACK)
    }

    /// How long the endpoint has gone without an answer while it had
    /// attempts in flight (zero when idle).
    pub fn silent_for(&self, now: Instant) -> Duration {
        match self.in_flight {
            0 => Duration::ZERO,
            _ => now.saturating_duration_since(self.progress),
        }
    }

    /// An attempt starts now.
    pub fn start(&mut self, now: Instant) -> Ticket {
        if self.in_flight == 0 {
            self.progress = now;
        }
        self.in_flight += 1;
        self.next += 1;
        self.fresh.push_back((self.next, now, self.in_flight));
        self.join_round(self.next);
        Ticket(self.next)
    }

    /// An attempt ended without saying anything about the endpoint
    /// (shutdown, or an address the worker refused).
    pub fn abandon(&mut self, t: Ticket) {
        if self.end(&t).is_some() {
            self.resolve(t.0, None);
        }
    }

    /// Takes the attempt out of flight: its load when it started, or
    /// `None` if it had been judged late (and counted) already.
    fn end(&mut self, t: &Ticket) -> Option<usize> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let fresh = match self.fresh.binary_search_by_key(&t.0, |f| f.0) {
            Ok(i) => self.fresh.remove(i).map(|(_, _, load)| load),
            Err(_) => None,
        };
        if fresh.is_none() {
            self.stuck = self.stuck.saturating_sub(1);
        }
        fresh
    }

    /// An attempt that took `took` ended with `signal`. Returns whether
    /// the limit changed.
    pub fn finish(&mut self, now: Instant, t: Ticket, took: Duration, signal: Signal) -> bool {
        let before = self.limit();
        // `None`: judged late while in flight, and counted then.
        let load = self.end(&t);
        match (signal, load) {
            (Signal::Nothing, Some(_)) => self.resolve(t.0, None),
            (Signal::Nothing, None) => {}
            (Signal::Failure | Signal::Pause(_), Some(_)) => self.resolve(t.0, Some(true)),
            (Signal::Failure | Signal::Pause(_), None) => {}
            (Signal::Alive | Signal::AppError, load) => self.answered(now, t.0, took, load),
        }
        self.limit() != before
    }

    /// Counts every attempt still in flight past [`Limiter::late_after`]
    /// as a bad sample, once. Returns whether the limit changed.
    pub fn check(&mut self, now: Instant) -> bool {
        let before = self.limit();
        if let Some(late) = self.late_after() {
            while let Some(&(id, at, _)) = self.fresh.front() {
                if now.saturating_duration_since(at) <= late {
                    break;
                }
                self.fresh.pop_front();
                self.stuck += 1;
                self.resolve(id, Some(true));
            }
        }
        self.limit() != before
    }

    /// A complete answer: progress, and a lesson for the baseline; timely,
    /// it is good and may grow the limit. `load`: the attempts in flight
    /// when it started, `None` if it was judged late (and counted) then.
    fn answered(&mut self, now: Instant, id: u64, took: Duration, load: Option<usize>) {
        self.progress = now;
        let late = self.late_after().is_some_and(|l| took > l);
        self.learn(now, took);
        let Some(load) = load else { return };
        self.resolve(id, Some(late));
        if late {
            return;
        }
        // Only an endpoint that used its limit earns more: as many in
        // flight when this one started, or when it ended (itself included).
        if load.max(self.in_flight + 1) as f64 >= self.limit / 2.0 {
            self.limit = (self.limit + 1.0).min(self.max);
        }
    }

    /// Moves the baseline towards `took`, by the share of the time since it
    /// last learned over [`BASELINE_FALL`] or [`BASELINE_RISE`]: a burst of
    /// late answers moves it no more than one would.
    fn learn(&mut self, now: Instant, took: Duration) {
        let dt = now.saturating_duration_since(self.learned).as_secs_f64();
        self.learned = now;
        self.baseline = Some(match self.baseline {
            None => took,
            Some(b) => {
                let tau = if took < b {
                    BASELINE_FALL
                } else {
                    BASELINE_RISE
                };
                let share = 1.0 - (-dt / tau.as_secs_f64()).exp();
                let (b, x) = (b.as_secs_f64(), took.as_secs_f64());
                Duration::from_secs_f64(b + (x - b) * share)
            }
        });
    }

    /// Puts attempt `id` in the open round, or opens one (sized by the
    /// limit now) when the last is full.
    fn join_round(&mut self, id: u64) {
        match self.rounds.back_mut() {
            Some(r) if r.members < r.size => r.members += 1,
            _ => self.rounds.push_back(Round {
                first: id,
                size: (self.limit as usize).clamp(MIN_SAMPLES, ROUND_SAMPLES),
                members: 1,
                resolved: 0,
                samples: 0,
                bad: 0,
            }),
        }
    }

    /// Records attempt `id`'s outcome in its round (`Some(true)`: bad;
    /// `None`: it said nothing), and judges the round once full and
    /// resolved: more than [`BAD_SHARE`] bad halves the limit.
    fn resolve(&mut self, id: u64, bad: Option<bool>) {
        let i = self.rounds.partition_point(|r| r.first <= id);
        let Some(r) = i.checked_sub(1).and_then(|i| self.rounds.get_mut(i)) else {
            return;
        };
        r.resolved += 1;
        if let Some(b) = bad {
            r.samples += 1;
            r.bad += usize::from(b);
        }
        if r.members < r.size || r.resolved < r.members {
            return;
        }
        let r = *r;
        self.rounds.remove(i - 1);
        if r.bad as f64 > BAD_SHARE * r.samples as f64 {
            self.limit = (self.limit / 2.0).max(1.0);
        }
    }
}

#[cfg(test)]
#[path = "limit_tests.rs"]
mod tests;
