//! A delivery's hold on its endpoint while it is attempted: a [`Pass`],
//! which reports what the attempt said about the endpoint to its breaker
//! and its adaptive limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::activity::Outcome;
use super::reason::DeferReason;
use super::state::{wake_front, Endpoint, State};
use crate::policy::{Gate, Signal, Ticket, Transition};
use crate::telemetry;

/// How much one answer moves an endpoint's application-error share.
const APP_ERROR_WEIGHT: f64 = 0.05;

/// Leave to attempt a delivery: counts as in flight to its endpoint until
/// dropped. Report the attempt with [`Pass::finish`]; a pass dropped
/// unreported (shutdown) reports nothing.
pub struct Pass {
    ep: Arc<Endpoint>,
    /// Its place in the endpoint's limiter, until reported.
    ticket: Option<Ticket>,
    probe: bool,
    /// The breaker's generation when it started.
    generation: u64,
    started: Instant,
    reported: bool,
}

/// Takes the breaker's answer for real (a probe, if half-open) and the
/// rate's turn, and lets the delivery go; `Err` with the deferral (its
/// wait and reason) when the breaker says no after all.
pub(super) fn go(
    ep: &Arc<Endpoint>,
    st: &mut State,
    now: Instant,
) -> Result<Pass, (Duration, DeferReason)> {
    let probe = match st.breaker.gate(now, &ep.limits.breaker, true) {
        Gate::Wait(wait, why) => return Err(ep.deferral(st, now, wait, why.into())),
        Gate::Probe => true,
        Gate::Pass => false,
    };
    if let Some(rate) = ep.limits.rate {
        st.pacer.reserve(now, rate);
    }
    let ticket = Some(st.limiter.start(now));
    let label = ep.label.clone();
    metrics::counter!(telemetry::ENDPOINT_ATTEMPTS, "endpoint" => label.clone()).increment(1);
    metrics::gauge!(telemetry::ENDPOINT_IN_FLIGHT, "endpoint" => label).increment(1.0);
    if probe {
        breaker_gauge(ep, 1.0);
    }
    Ok(Pass {
        ep: ep.clone(),
        ticket,
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
    /// adaptive limit, the latency average and the application-error
    /// share; and what it came to, for its recent activity. Logs a breaker
    /// that opened or closed.
    pub fn finish(mut self, signal: Signal, outcome: &Outcome) {
        self.reported = true;
        let now = Instant::now();
        let took = now.saturating_duration_since(self.started);
        let transition = {
            let mut st = self.ep.state();
            st.activity
                .record(crate::clock::now_ms().max(0) as u64, outcome);
            st.latency.add(took);
            if let Some(t) = self.ticket.take() {
                if st.limiter.finish(now, t, took, signal) {
                    self.ep.show_limit(&mut st);
                }
            }
            app_errors(&self.ep, &mut st, signal);
            let (p, gen) = (&self.ep.limits.breaker, self.generation);
            st.breaker
                .record_started(now, self.started, p, signal, self.probe, gen)
        };

        if let Some(t) = transition {
            report(&self.ep, t);
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        {
            let mut st = self.ep.state();
            if let Some(t) = self.ticket.take() {
                st.limiter.abandon(t);
            }
            if self.probe && !self.reported {
                st.breaker.release_probe(self.generation);
            }
            // The first parked delivery may go.
            wake_front(&st);
        }
        let label = self.ep.label.clone();
        metrics::gauge!(telemetry::ENDPOINT_IN_FLIGHT, "endpoint" => label).decrement(1.0);
    }
}

/// The endpoint's moving share of answers that were application errors,
/// for operators: it gates nothing.
fn app_errors(ep: &Endpoint, st: &mut State, signal: Signal) {
    let x = match signal {
        Signal::AppError => 1.0,
        Signal::Alive => 0.0,
        _ => return,
    };
    st.app_errors += (x - st.app_errors) * APP_ERROR_WEIGHT;
    // Written when it moved by a point: no gauge write per healthy answer.
    if (st.app_errors - st.shown_app_errors).abs() >= 0.01 {
        st.shown_app_errors = st.app_errors;
        let label = ep.label.clone();
        metrics::gauge!(telemetry::ENDPOINT_APP_ERRORS, "endpoint" => label).set(st.app_errors);
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
