//! One endpoint's limits and state, shared by the admission (`mod.rs`)
//! and the passes (`pass.rs`): why a delivery is deferred, how long a
//! parked one would wait, and the schedule deferred ones are spread over.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::config::EndpointLimits;
use crate::policy::{Breaker, Pacer, WaitReason};
use crate::telemetry;

/// A parked delivery is expected to get its turn within this long, or it
/// is deferred instead: parking is for short waits.
pub const PARK_WAIT: Duration = Duration::from_secs(1);
/// A parked delivery that waited this long is deferred after all (its
/// endpoint stalled after it was parked).
pub const PARK_TIMEOUT: Duration = Duration::from_secs(5);
/// How far ahead a busy endpoint's deferrals are spread at most.
pub const MAX_SCHEDULE: Duration = Duration::from_secs(300);

/// Why a delivery was deferred without an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    /// The endpoint's breaker is open.
    Open,
    /// The endpoint asked for a pause (429, or 503 with `Retry-After`).
    Paused,
    /// The breaker is half-open and its probes are out.
    Probing,
    /// The endpoint is at its concurrency cap with a long wait, or no
    /// parking place was free.
    Busy,
    /// The endpoint's rate allows no turn soon.
    Rate,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::Open => "breaker-open",
            DeferReason::Paused => "paused",
            DeferReason::Probing => "probing",
            DeferReason::Busy => "busy",
            DeferReason::Rate => "rate",
        }
    }
}

impl From<WaitReason> for DeferReason {
    fn from(w: WaitReason) -> Self {
        match w {
            WaitReason::Open => DeferReason::Open,
            WaitReason::Paused => DeferReason::Paused,
            WaitReason::Probing => DeferReason::Probing,
        }
    }
}

/// One endpoint's limits and state.
pub struct Endpoint {
    /// `scheme://host:port`, or the route's URL prefix: for log lines.
    pub(super) key: String,
    /// Its metrics label (bounded, see [`Endpoints::label`]).
    pub(super) label: String,
    pub(super) limits: EndpointLimits,
    pub(super) permits: Arc<Semaphore>,
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    pub(super) breaker: Breaker,
    pub(super) pacer: Pacer,
    /// Moving average of attempt durations, once one finished.
    pub(super) latency: Option<Duration>,
    /// The last time an attempt finished, or the endpoint became busy.
    pub(super) progress: Instant,
    pub(super) in_flight: usize,
    pub(super) parked: usize,
    pub(super) used: Instant,
    /// Until when the deliveries deferred as busy or rate-limited are
    /// expected to keep the endpoint occupied (see [`Endpoint::deferral`]).
    pub(super) deferred_until: Option<Instant>,
}

impl Endpoint {
    pub(super) fn new(key: String, label: String, limits: EndpointLimits, now: Instant) -> Self {
        let state = State {
            breaker: Breaker::new(now),
            pacer: Pacer::default(),
            latency: None,
            progress: now,
            in_flight: 0,
            parked: 0,
            used: now,
            deferred_until: None,
        };
        Endpoint {
            key,
            label,
            limits,
            permits: Arc::new(Semaphore::new(limits.concurrency)),
            state: Mutex::new(state),
        }
    }

    /// The state, even if a holder panicked: it is counters only.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer for a delivery that must wait `wait` or more, counted in
    /// the metrics. A delivery deferred because the endpoint is busy or at
    /// its rate gets the next free place in the endpoint's schedule: one
    /// every `spacing` (its rate's interval, or its average attempt time
    /// over its concurrency) after those deferred before it, up to
    /// [`MAX_SCHEDULE`] ahead. So a backlog comes back at about the pace the
    /// endpoint can take it, instead of all at once and deferred again.
    pub(super) fn deferral(
        &self,
        st: &mut State,
        now: Instant,
        wait: Duration,
        reason: DeferReason,
    ) -> (Duration, DeferReason) {
        let label = self.label.clone();
        metrics::counter!(telemetry::ENDPOINT_DEFERRED, "endpoint" => label, "reason" => reason.as_str())
            .increment(1);
        if !matches!(reason, DeferReason::Busy | DeferReason::Rate) {
            return (wait, reason);
        }
        let per = st
            .latency
            .unwrap_or_else(|| now.saturating_duration_since(st.progress));
        let cap = u32::try_from(self.limits.concurrency.max(1)).unwrap_or(u32::MAX);
        let spacing = (per / cap).max(self.limits.rate.map_or(Duration::ZERO, |r| r.interval()));
        let earliest = now + wait;
        let slot = st.deferred_until.map_or(earliest, |u| u.max(earliest));
        // Never sooner than it could go (a `1/h` rate waits its hour).
        let slot = slot.min(earliest.max(now + MAX_SCHEDULE));
        st.deferred_until = Some(slot + spacing);
        (slot - now, reason)
    }

    /// How long a delivery parked now would wait for its turn: the queue
    /// ahead of it at the average latency, or at its rate, and at least how
    /// long the endpoint has made no progress at all (a hanging receiver).
    /// So no endpoint holds more parking places than it can serve in
    /// [`PARK_WAIT`].
    pub(super) fn park_estimate(&self, st: &State, now: Instant) -> Duration {
        let per = st.latency.unwrap_or_default();
        let queued = u32::try_from(st.parked + 1).unwrap_or(u32::MAX);
        let cap = u32::try_from(self.limits.concurrency.max(1)).unwrap_or(u32::MAX);
        let by_rate = self.limits.rate.map_or(Duration::ZERO, |r| {
            st.pacer.wait(now) + r.interval().saturating_mul(queued - 1)
        });
        (per.saturating_mul(queued) / cap)
            .max(by_rate)
            .max(now.saturating_duration_since(st.progress))
    }
}

/// How long until the endpoint's rate allows an attempt (zero: no rate).
pub(super) fn rate_wait_at(ep: &Endpoint, st: &State, now: Instant) -> Duration {
    match ep.limits.rate {
        Some(_) => st.pacer.wait(now),
        None => Duration::ZERO,
    }
}
