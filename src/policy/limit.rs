//! An endpoint's adaptive concurrency limit, pure: how many attempts in
//! flight an endpoint has earned from its own behaviour. The caller
//! passes the clock in; `crate::endpoint` holds one per endpoint.
//!
//! Loss-based like TCP's congestion window (and Netflix's AIMD limit),
//! with a latency signal measured against the endpoint's *own* baseline:
//!
//! - **Grow** by one for each timely answer while the endpoint uses at
//!   least half its limit (so it doubles every round trip, TCP's slow
//!   start), up to `max`. An endpoint that does not use its limit does
//!   not inflate it.
//! - **Halve** (not below 1) at the end of a window in which more than a
//!   quarter of the attempts were bad: no answer (timeout, connection or
//!   TLS error), an overload answer (502/503/504, 429), an answer later
//!   than [`Limiter::late_after`], or an attempt *still in flight* past
//!   that threshold ([`Limiter::check`], counted once); and at the end of
//!   any window without a single answer while attempts are stuck. So a
//!   hang is seen within a few round trips, not when its timeout ends: a
//!   slot held by a hung request cannot be taken back.
//! - **Baseline**: the endpoint's usual latency, an average over time
//!   that follows faster answers within a fraction of a second
//!   ([`BASELINE_FALL`]) and slower ones over seconds ([`BASELINE_RISE`]).
//!   A sudden slow-down is caught first; an endpoint slow for good ("slow
//!   is not dead") earns its limit back at its new pace within seconds.
//!
//! A fast application error (a quick 500 or 404) is an answer: the
//! endpoint is up. It counts like any other timely answer here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::breaker::Signal;

/// An answer later than `LATE_FACTOR` × the baseline plus [`LATE_SLACK`]
/// is late, and so is an attempt still in flight that long.
pub const LATE_FACTOR: u32 = 3;
/// Absolute slack on the late threshold, so a fast endpoint's (1 ms)
/// scheduling noise on a busy machine is not mistaken for a slow-down.
pub const LATE_SLACK: Duration = Duration::from_millis(50);
/// The shortest window over which the share of bad attempts is judged;
/// a window is at least two baselines long, so a slow endpoint's window
/// sees its answers.
pub const WINDOW: Duration = Duration::from_millis(100);
/// A window with more than this share of bad attempts halves the limit.
pub const BAD_SHARE: f64 = 0.25;
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
    /// A new endpoint starts at a quarter of `max`, between 1 and 4: an
    /// endpoint that hangs from its first request holds at most that, and
    /// a healthy one doubles from there every round trip.
    pub fn for_max(max: usize) -> Self {
        let max = max.max(1);
        LimitPolicy {
            initial: (max / 4).clamp(1, 4),
            max,
        }
    }
}

/// One attempt in flight, from [`Limiter::start`] to [`Limiter::finish`]
/// or [`Limiter::abandon`].
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    good: u32,
    bad: u32,
    /// Every answer, timely or late.
    answers: u32,
}

impl Window {
    fn new(start: Instant) -> Self {
        Window {
            start,
            good: 0,
            bad: 0,
            answers: 0,
        }
    }
}

/// One endpoint's adaptive limit; see the module's doc.
#[derive(Clone, Debug)]
pub struct Limiter {
    limit: f64,
    max: f64,
    baseline: Option<Duration>,
    /// When the baseline last learned.
    learned: Instant,
    /// Attempts in flight not yet judged late, by start (= ticket) order,
    /// with the attempts in flight when each started (itself included).
    fresh: BTreeMap<u64, (Instant, usize)>,
    in_flight: usize,
    /// Attempts in flight judged late.
    stuck: usize,
    next: u64,
    window: Window,
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
            fresh: BTreeMap::new(),
            in_flight: 0,
            stuck: 0,
            next: 0,
            window: Window::new(now),
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
        self.fresh.insert(self.next, (now, self.in_flight));
        Ticket(self.next)
    }

    /// An attempt ended without saying anything about the endpoint
    /// (shutdown, or an address the worker refused).
    pub fn abandon(&mut self, t: Ticket) {
        self.end(&t);
    }

    /// Takes the attempt out of flight: its load when it started, or
    /// `None` if it had been judged late (and counted) already.
    fn end(&mut self, t: &Ticket) -> Option<usize> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let fresh = self.fresh.remove(&t.0).map(|(_, load)| load);
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
            (Signal::Nothing, _) => {}
            (Signal::Failure | Signal::Pause(_), Some(_)) => self.window.bad += 1,
            (Signal::Failure | Signal::Pause(_), None) => {}
            (Signal::Alive | Signal::AppError, load) => self.answered(now, took, load),
        }
        self.roll(now);
        self.limit() != before
    }

    /// Counts every attempt still in flight past [`Limiter::late_after`]
    /// as bad, once, and closes the window if it is over. Returns whether
    /// the limit changed.
    pub fn check(&mut self, now: Instant) -> bool {
        let before = self.limit();
        if let Some(late) = self.late_after() {
            while let Some((&id, &(at, _))) = self.fresh.first_key_value() {
                if now.saturating_duration_since(at) <= late {
                    break;
                }
                self.fresh.remove(&id);
                self.stuck += 1;
                self.window.bad += 1;
            }
        }
        self.roll(now);
        self.limit() != before
    }

    /// A complete answer: progress, and a lesson for the baseline; timely,
    /// it is good and may grow the limit. `load`: the attempts in flight
    /// when it started, `None` if it was judged late (and counted) then.
    fn answered(&mut self, now: Instant, took: Duration, load: Option<usize>) {
        self.progress = now;
        self.window.answers += 1;
        let late = self.late_after().is_some_and(|l| took > l);
        self.learn(now, took);
        let Some(load) = load else { return };
        if late {
            self.window.bad += 1;
            return;
        }
        self.window.good += 1;
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

    /// Ends the window once it is over: more than [`BAD_SHARE`] bad
    /// halves the limit.
    fn roll(&mut self, now: Instant) {
        let len = WINDOW.max(self.baseline.unwrap_or_default() * 2);
        if now.saturating_duration_since(self.window.start) < len {
            return;
        }
        let Window {
            good, bad, answers, ..
        } = self.window;
        let mostly_bad = bad > 0 && f64::from(bad) > BAD_SHARE * f64::from(good + bad);
        let silent = answers == 0 && self.stuck > 0;
        if mostly_bad || silent {
            self.limit = (self.limit / 2.0).max(1.0);
        }
        self.window = Window::new(now);
    }
}

#[cfg(test)]
#[path = "limit_tests.rs"]
mod tests;
