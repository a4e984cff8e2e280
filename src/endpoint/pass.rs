//! A delivery's hold on its endpoint: a [`Pass`] while it is attempted, a
//! [`Parked`] place while it waits for its turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tracing::{info, warn};

use super::state::{rate_wait_at, DeferReason, Endpoint, State, PARK_TIMEOUT, PARK_WAIT};

/// How often a parked delivery looks whether its endpoint stalled.
const STALL_CHECK: Duration = Duration::from_millis(100);
use crate::policy::{Gate, Signal, Transition};
use crate::telemetry;

/// What to do with a delivery before its attempt.
pub enum Admission {
    /// Attempt it now and report the result through the pass.
    Go(Pass),
    /// Give the concurrency slot back and [`Parked::wait`].
    Park(Parked),
    /// Republish it to come back after `wait` (at least; the worker adds
    /// jitter and backoff, see [`defer_delay`]). No attempt is spent.
    Defer { wait: Duration, reason: DeferReason },
}

/// The deferral for `wait` (see [`Endpoint::deferral`]).
pub(super) fn defer(
    ep: &Endpoint,
    st: &mut State,
    now: Instant,
    wait: Duration,
    reason: DeferReason,
) -> Admission {
    let (wait, reason) = ep.deferral(st, now, wait, reason);
    Admission::Defer { wait, reason }
}

/// Leave to attempt a delivery: holds one of the endpoint's concurrency
/// permits until dropped. Report the attempt with [`Pass::finish`]; a pass
/// dropped unreported (shutdown) reports nothing.
pub struct Pass {
    ep: Arc<Endpoint>,
    _permit: OwnedSemaphorePermit,
    probe: bool,
    /// The breaker's generation when it started.
    generation: u64,
    started: Instant,
    reported: bool,
}

/// Takes the breaker's answer for real (a probe, if half-open) and the
/// rate's turn, and lets the delivery go.
pub(super) fn go(
    ep: &Arc<Endpoint>,
    st: &mut State,
    permit: OwnedSemaphorePermit,
    now: Instant,
) -> Admission {
    let probe = match st.breaker.gate(now, &ep.limits.breaker, true) {
        Gate::Wait(wait, why) => return defer(ep, st, now, wait, why.into()),
        Gate::Probe => true,
        Gate::Pass => false,
    };
    if let Some(rate) = ep.limits.rate {
        st.pacer.reserve(now, rate);
    }
    if st.in_flight == 0 {
        st.progress = now;
    }
    st.in_flight += 1;
    let label = ep.label.clone();
    metrics::counter!(telemetry::ENDPOINT_ATTEMPTS, "endpoint" => label.clone()).increment(1);
    metrics::gauge!(telemetry::ENDPOINT_IN_FLIGHT, "endpoint" => label).increment(1.0);
    if probe {
        breaker_gauge(ep, 1.0);
    }
    Admission::Go(Pass {
        ep: ep.clone(),
        _permit: permit,
        probe,
        generation: st.breaker.generation(),
        started: now,
        reported: false,
    })
}

impl Pass {
    /// Marks the start of the attempt itself (after any wait for a
    /// concurrency slot), for the endpoint's latency average.
    pub fn start(&mut self) {
        self.started = Instant::now();
    }

    /// Whether this attempt is a half-open breaker's probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Reports what the attempt said about the endpoint: the breaker, the
    /// latency average and the endpoint's progress. Logs a breaker that
    /// opened or closed.
    pub fn finish(mut self, signal: Signal) {
        self.reported = true;
        let now = Instant::now();
        let took = now.saturating_duration_since(self.started);
        let transition = {
            let mut st = self.ep.state();
            st.latency = Some(st.latency.map_or(took, |l| (l * 4 + took) / 5));
            st.progress = now;
            let (p, gen) = (&self.ep.limits.breaker, self.generation);
            st.breaker.record(now, p, signal, self.probe, gen)
        };

        if let Some(t) = transition {
            report(&self.ep, t);
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut st = self.ep.state();
        st.in_flight = st.in_flight.saturating_sub(1);
        if self.probe && !self.reported {
            st.breaker.release_probe(self.generation);
        }
        let label = self.ep.label.clone();
        metrics::gauge!(telemetry::ENDPOINT_IN_FLIGHT, "endpoint" => label).decrement(1.0);
    }
}

/// One log line and the metrics for a breaker that opened or closed.
fn report(ep: &Endpoint, t: Transition) {
    match t {
        Transition::Opened { for_, reason } => {
            warn!(endpoint = %ep.key, %reason, open_for = ?for_, "circuit breaker opened");
            breaker_gauge(ep, 2.0);
            transition_counter(ep, "open");
        }
        Transition::Closed => {
            info!(endpoint = %ep.key, "circuit breaker closed");
            breaker_gauge(ep, 0.0);
            transition_counter(ep, "closed");
        }
    }
}

fn breaker_gauge(ep: &Endpoint, v: f64) {
    metrics::gauge!(telemetry::ENDPOINT_BREAKER, "endpoint" => ep.label.clone()).set(v);
}

fn transition_counter(ep: &Endpoint, to: &'static str) {
    let label = ep.label.clone();
    metrics::counter!(telemetry::ENDPOINT_TRANSITIONS, "endpoint" => label, "to" => to)
        .increment(1);
}

/// A delivery waiting for its endpoint, holding one of the worker's
/// parking places (and no concurrency slot) until [`Parked::wait`] ends.
pub struct Parked {
    ep: Arc<Endpoint>,
    _place: OwnedSemaphorePermit,
    /// Already taken when only the rate made it wait.
    permit: Option<OwnedSemaphorePermit>,
}

impl Parked {
    pub(super) fn new(
        ep: Arc<Endpoint>,
        st: &mut State,
        place: OwnedSemaphorePermit,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        st.parked += 1;
        metrics::gauge!(telemetry::PARKED).increment(1.0);
        metrics::gauge!(telemetry::ENDPOINT_PARKED, "endpoint" => ep.label.clone()).increment(1.0);
        Parked {
            ep,
            _place: place,
            permit,
        }
    }

    /// Waits, in arrival order, for a concurrency permit of the endpoint,
    /// then for its rate turn, then for a worker slot from `take_slot`
    /// (dropping what it returns gives the slot back). The rate turn is
    /// taken only with the slot in hand, so deliveries that waited for
    /// slots never start together above the rate. Ends in `Go` with the
    /// slot, or in `Defer` (without one) when the endpoint stalled
    /// ([`PARK_TIMEOUT`]), its breaker opened or paused it meanwhile, or
    /// its rate turn is far.
    pub async fn wait<S, F, Fut>(mut self, mut take_slot: F) -> (Admission, Option<S>)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = S>,
    {
        let permit = match self.permit.take() {
            Some(p) => p,
            None => match self.acquire().await {
                Ok(p) => p,
                Err(deferred) => return (deferred, None),
            },
        };
        loop {
            if let Err(deferred) = self.until_turn().await {
                return (deferred, None);
            }
            let slot = take_slot().await;
            let now = Instant::now();
            let mut st = self.ep.state();
            if !rate_wait_at(&self.ep, &st, now).is_zero() {
                // Another delivery took this turn meanwhile.
                continue;
            }
            return (go(&self.ep, &mut st, permit, now), Some(slot));
        }
    }

    /// Waits for a concurrency permit, looking every [`STALL_CHECK`]
    /// whether the endpoint stalled (no attempt finished for
    /// [`PARK_WAIT`]): then, or after [`PARK_TIMEOUT`], it gives up and
    /// defers, so a hanging receiver's deliveries do not sit in the
    /// parking places the other endpoints need.
    async fn acquire(&self) -> Result<OwnedSemaphorePermit, Admission> {
        let started = Instant::now();
        let mut acquire = std::pin::pin!(self.ep.permits.clone().acquire_owned());
        loop {
            let closed = tokio::select! {
                p = &mut acquire => match p {
                    Ok(p) => return Ok(p),
                    Err(_) => true,
                },
                _ = tokio::time::sleep(STALL_CHECK) => false,
            };
            let now = Instant::now();
            let mut st = self.ep.state();
            let estimate = self.ep.park_estimate(&st, now);
            if closed || estimate > PARK_WAIT || now.duration_since(started) >= PARK_TIMEOUT {
                let wait = estimate.max(PARK_WAIT);
                return Err(defer(&self.ep, &mut st, now, wait, DeferReason::Busy));
            }
        }
    }

    /// Sleeps until the endpoint's rate allows an attempt, if that is near
    /// ([`PARK_WAIT`]); `Err` with the deferral otherwise, or when its
    /// breaker is open or it is paused.
    async fn until_turn(&self) -> Result<(), Admission> {
        let wait = {
            let now = Instant::now();
            let mut st = self.ep.state();
            let breaker = &self.ep.limits.breaker;
            if let Gate::Wait(wait, why) = st.breaker.gate(now, breaker, false) {
                return Err(defer(&self.ep, &mut st, now, wait, why.into()));
            }
            match rate_wait_at(&self.ep, &st, now) {
                w if w > PARK_WAIT => {
                    return Err(defer(&self.ep, &mut st, now, w, DeferReason::Rate))
                }
                w => w,
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut st = self.ep.state();
        st.parked = st.parked.saturating_sub(1);
        metrics::gauge!(telemetry::PARKED).decrement(1.0);
        let label = self.ep.label.clone();
        metrics::gauge!(telemetry::ENDPOINT_PARKED, "endpoint" => label).decrement(1.0);
    }
}
