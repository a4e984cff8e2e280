//! A delivery's hold on its endpoint: a [`Pass`] while it is attempted, a
//! [`Parked`] place while it waits for its turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tracing::{info, warn};

use super::{Admission, DeferReason, Endpoint, State, PARK_TIMEOUT, PARK_WAIT};

/// How often a parked delivery looks whether its endpoint stalled.
const STALL_CHECK: Duration = Duration::from_millis(100);
use crate::policy::{Gate, Signal, Transition};
use crate::telemetry;

/// Leave to attempt a delivery: holds one of the endpoint's concurrency
/// permits until dropped. Report the attempt with [`Pass::finish`]; a pass
/// dropped unreported (shutdown) reports nothing.
pub struct Pass {
    ep: Arc<Endpoint>,
    _permit: OwnedSemaphorePermit,
    probe: bool,
    started: Instant,
    reported: bool,
}

/// Takes the breaker's answer for real (a probe, if half-open) and the
/// rate's turn (unless `reserved` already), and lets the delivery go.
pub(super) fn go(
    ep: &Arc<Endpoint>,
    st: &mut State,
    permit: OwnedSemaphorePermit,
    now: Instant,
    reserved: bool,
) -> Admission {
    let probe = match st.breaker.gate(now, &ep.limits.breaker, true) {
        Gate::Wait(wait, why) => return ep.deferral(st, now, wait, why.into()),
        Gate::Probe => true,
        Gate::Pass => false,
    };
    if let (Some(rate), false) = (ep.limits.rate, reserved) {
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
            st.breaker
                .record(now, &self.ep.limits.breaker, signal, self.probe)
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
            st.breaker.release_probe();
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

    /// Waits, in arrival order, for a concurrency permit of the endpoint
    /// and then for its rate turn. Ends in `Go`, or in `Defer` when the
    /// endpoint stalled ([`PARK_TIMEOUT`]), its breaker opened or paused it
    /// meanwhile, or its rate turn is far.
    pub async fn wait(mut self) -> Admission {
        let permit = match self.permit.take() {
            Some(p) => p,
            None => match self.acquire().await {
                Ok(p) => p,
                Err(deferred) => return deferred,
            },
        };
        let turn = match self.rate_turn() {
            Ok(turn) => turn,
            Err(deferred) => return deferred,
        };
        if let Some(t) = turn {
            tokio::time::sleep(t).await;
        }
        let mut st = self.ep.state();
        go(&self.ep, &mut st, permit, Instant::now(), turn.is_some())
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
                return Err(self.ep.deferral(&mut st, now, wait, DeferReason::Busy));
            }
        }
    }

    /// Takes the rate's next turn if it is near: `Ok(Some(wait))` (taken),
    /// `Ok(None)` (no wait; `go` takes it), or `Err` with the deferral.
    fn rate_turn(&self) -> Result<Option<Duration>, Admission> {
        let now = Instant::now();
        let mut st = self.ep.state();
        if let Gate::Wait(wait, why) = st.breaker.gate(now, &self.ep.limits.breaker, false) {
            return Err(self.ep.deferral(&mut st, now, wait, why.into()));
        }
        let Some(rate) = self.ep.limits.rate else {
            return Ok(None);
        };
        match st.pacer.wait(now) {
            w if w.is_zero() => Ok(None),
            w if w > PARK_WAIT => Err(self.ep.deferral(&mut st, now, w, DeferReason::Rate)),
            _ => Ok(Some(st.pacer.reserve(now, rate))),
        }
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
