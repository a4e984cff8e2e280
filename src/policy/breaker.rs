//! The per-endpoint circuit breaker, pure: what an attempt says about its
//! endpoint ([`signal`]), and the breaker's state machine ([`Breaker`]).
//! The caller passes the clock in; `crate::isolation` holds one per
//! endpoint and carries its answers out.
//!
//! - **Closed**: attempts go through. It opens after `failures`
//!   consecutive failures (consecutive by when the attempts *started*: a
//!   failure of an attempt older than one that since answered is not part
//!   of a run, so hangs that started together and time out together do
//!   not look like an outage on an endpoint that answers), or when at least `ratio` of the attempts in a
//!   `window` failed, once that window saw `min_requests`. A failure says
//!   the endpoint is *down or overloaded*: no answer (connection or TLS
//!   error, timeout) or a 502, 503 or 504. A complete answer with any
//!   other status (a quick 500, 404, 400) is the notification's outcome,
//!   not the endpoint's: it follows its own retry schedule and never
//!   opens the breaker.
//! - **Open** for `open`, doubled each time a probe fails, up to
//!   `max_open`: no attempt goes to the endpoint.
//! - **Half-open**: up to `probes` attempts at once go through. A probe
//!   proves the endpoint, not its notification: any answer that is not a
//!   failure (a 500 or 404 too) closes the breaker; a failure opens it
//!   again, for longer.
//!
//! Apart from the state, a 429, or a 503 with `Retry-After`, **pauses**
//! the endpoint for that long (a 429 without one for [`DEFAULT_PAUSE`]):
//! the receiver said when to come back.

use std::time::{Duration, Instant};

pub use super::signal::{signal, Signal, DEFAULT_PAUSE};

/// The breaker's settings (flags `--breaker-*`, or a `[[route]]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerPolicy {
    /// Consecutive failures that open it; 0 turns the breaker off (pauses
    /// for `Retry-After` still apply).
    pub failures: u32,
    /// The failure ratio in one window that opens it.
    pub ratio: f64,
    pub window: Duration,
    /// Attempts a window needs before its ratio counts.
    pub min_requests: u32,
    /// How long it first stays open.
    pub open: Duration,
    /// The longest it stays open after repeated failed probes.
    pub max_open: Duration,
    /// Attempts let through at once while half-open.
    pub probes: u32,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failures: 10,
            ratio: 0.7,
            window: Duration::from_secs(30),
            min_requests: 20,
            open: Duration::from_secs(5),
            max_open: Duration::from_secs(300),
            probes: 1,
        }
    }
}

impl BreakerPolicy {
    pub fn enabled(&self) -> bool {
        self.failures > 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: u32 },
}

/// Whether an attempt may go to the endpoint now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Pass,
    /// Half-open: this attempt is a probe; report its result.
    Probe,
    /// Not before this long: the breaker is open, the endpoint paused, or
    /// its probes are all out.
    Wait(Duration, WaitReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    Open,
    Paused,
    Probing,
}

/// A change of state worth one log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    Opened { for_: Duration, reason: String },
    Closed,
}

#[derive(Clone, Debug)]
pub struct Breaker {
    state: State,
    consecutive: u32,
    /// When the latest-started attempt that answered started.
    answered_from: Option<Instant>,
    /// Start, attempts and failures of the current window.
    window: (Instant, u32, u32),
    /// Openings since it last closed: each doubles the open time.
    trips: u32,
    paused_until: Option<Instant>,
    /// Goes up each time it opens. An attempt reports the generation it
    /// started in; one that started before the last opening (a hanging
    /// attempt that times out after it half-opened) is not a probe and
    /// must not reopen or close it.
    generation: u64,
    /// When it first opened since it last closed: how long the endpoint
    /// has been down, for parking its backlog (`crate::control::breakers`).
    opened_at: Option<Instant>,
    /// When it last closed after being open.
    closed_at: Option<Instant>,
    /// The generation whose probe candidate went out (see
    /// [`Breaker::take_candidate`]).
    candidate: Option<u64>,
}

impl Breaker {
    pub fn new(now: Instant) -> Self {
        Breaker {
            state: State::Closed,
            consecutive: 0,
            answered_from: None,
            window: (now, 0, 0),
            trips: 0,
            paused_until: None,
            generation: 0,
            opened_at: None,
            closed_at: None,
            candidate: None,
        }
    }

    /// While open, one delivery per opening may be sent to wait for the
    /// half-open (deferred, not parked), to come back as the probe: an
    /// endpoint whose backlog is parked for its breaker gets a probe with
    /// no new traffic at all, and at most one copy circulates per opening.
    pub fn take_candidate(&mut self) -> bool {
        let open = matches!(self.state, State::Open { .. });
        if !open || self.candidate == Some(self.generation) {
            return false;
        }
        self.candidate = Some(self.generation);
        true
    }

    /// Since when it has been open or half-open without closing.
    pub fn open_since(&self) -> Option<Instant> {
        self.opened_at
    }

    /// When it last closed after being open.
    pub fn closed_at(&self) -> Option<Instant> {
        self.closed_at
    }

    /// Opens a closed breaker for `open`, as a first trip: another worker
    /// found the endpoint down long enough to park its backlog, and this
    /// one must probe it before attempting (`crate::control::breakers`).
    pub fn trip(&mut self, now: Instant, p: &BreakerPolicy) -> bool {
        if self.state != State::Closed || !p.enabled() {
            return false;
        }
        self.open(now, p);
        true
    }

    /// Closes it whatever its state: another worker's probe proved the
    /// endpoint. Attempts under way report to a generation that is over.
    pub fn close(&mut self, now: Instant) -> bool {
        if self.state == State::Closed {
            return false;
        }
        self.generation += 1;
        self.closed(now);
        true
    }

    fn closed(&mut self, now: Instant) {
        self.state = State::Closed;
        self.trips = 0;
        self.consecutive = 0;
        self.opened_at = None;
        self.closed_at = Some(now);
    }

    fn open(&mut self, now: Instant, p: &BreakerPolicy) -> Duration {
        self.trips += 1;
        self.generation += 1;
        self.opened_at.get_or_insert(now);
        let for_ = open_for(p, self.trips);
        self.state = State::Open { until: now + for_ };
        self.window = (now, 0, 0);
        for_
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The generation an attempt starting now reports with.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Asks to attempt now; a `Probe` answer is counted until reported
    /// ([`Breaker::record`]) or given back ([`Breaker::release_probe`]).
    /// `take`: false only looks, taking no probe.
    pub fn gate(&mut self, now: Instant, p: &BreakerPolicy, take: bool) -> Gate {
        if let Some(until) = self.paused_until.filter(|u| *u > now) {
            return Gate::Wait(until - now, WaitReason::Paused);
        }
        if let State::Open { until } = self.state {
            if now < until {
                return Gate::Wait(until - now, WaitReason::Open);
            }
            self.state = State::HalfOpen { probing: 0 };
        }
        match self.state {
            State::HalfOpen { probing } if probing >= p.probes.max(1) => {
                // Ask again after a fraction of the open time: a probe is
                // under way and will settle it.
                Gate::Wait(p.open / 2, WaitReason::Probing)
            }
            State::HalfOpen { probing } if take => {
                self.state = State::HalfOpen {
                    probing: probing + 1,
                };
                Gate::Probe
            }
            State::HalfOpen { .. } => Gate::Probe,
            _ => Gate::Pass,
        }
    }

    /// A probe of `generation` that was taken but not attempted (shut
    /// down, deferred).
    pub fn release_probe(&mut self, generation: u64) {
        if generation != self.generation {
            return;
        }
        if let State::HalfOpen { probing } = &mut self.state {
            *probing = probing.saturating_sub(1);
        }
    }

    /// Records an attempt's signal; `probe`: it was let through as one;
    /// `generation`: [`Breaker::generation`] when it started. Results of
    /// attempts that started before the last opening are ignored.
    pub fn record(
        &mut self,
        now: Instant,
        p: &BreakerPolicy,
        signal: Signal,
        probe: bool,
        generation: u64,
    ) -> Option<Transition> {
        self.record_started(now, now, p, signal, probe, generation)
    }

    /// [`Breaker::record`] for an attempt that started at `started`.
    pub fn record_started(
        &mut self,
        now: Instant,
        started: Instant,
        p: &BreakerPolicy,
        signal: Signal,
        probe: bool,
        generation: u64,
    ) -> Option<Transition> {
        if generation != self.generation {
            return None;
        }
        if probe {
            self.release_probe(generation);
        }
        match signal {
            Signal::Nothing => None,
            Signal::Pause(d) => {
                let until = now + d.min(p.max_open);
                self.paused_until = Some(self.paused_until.map_or(until, |u| u.max(until)));
                self.alive(now, started, p)
            }
            // An answer, whatever its status: the endpoint is up.
            Signal::Alive | Signal::AppError => self.alive(now, started, p),
            Signal::Failure if !p.enabled() => None,
            Signal::Failure => self.failure(now, started, p),
        }
    }

    /// Starts a new window when the current one is over.
    fn roll(&mut self, now: Instant, p: &BreakerPolicy) {
        if now.duration_since(self.window.0) >= p.window {
            self.window = (now, 0, 0);
        }
    }

    fn alive(&mut self, now: Instant, started: Instant, p: &BreakerPolicy) -> Option<Transition> {
        self.consecutive = 0;
        self.answered_from = Some(self.answered_from.map_or(started, |a| a.max(started)));
        self.roll(now, p);
        self.window.1 += 1;
        let was_half_open = matches!(self.state, State::HalfOpen { .. });
        if was_half_open {
            self.closed(now);
            return Some(Transition::Closed);
        }
        None
    }

    fn failure(&mut self, now: Instant, started: Instant, p: &BreakerPolicy) -> Option<Transition> {
        // Older than an attempt that answered since: not part of a run.
        if self.answered_from.is_none_or(|a| started >= a) {
            self.consecutive += 1;
        }
        self.roll(now, p);
        self.window.1 += 1;
        self.window.2 += 1;
        let (_, requests, failed) = self.window;
        let reason = match self.state {
            State::Open { .. } => return None,
            State::HalfOpen { .. } => "a probe failed".to_string(),
            State::Closed if self.consecutive >= p.failures => {
                format!("{} consecutive failures", self.consecutive)
            }
            State::Closed
                if requests >= p.min_requests
                    && f64::from(failed) >= p.ratio * f64::from(requests) =>
            {
                format!("{failed} of {requests} attempts failed")
            }
            State::Closed => return None,
        };
        let for_ = self.open(now, p);
        Some(Transition::Opened { for_, reason })
    }
}

/// `open`, doubled for each trip after the first, capped at `max_open`.
fn open_for(p: &BreakerPolicy, trips: u32) -> Duration {
    let factor = 2u32.saturating_pow(trips.saturating_sub(1).min(20));
    p.open.saturating_mul(factor).min(p.max_open.max(p.open))
}

#[cfg(test)]
#[path = "breaker_tests.rs"]
mod tests;
