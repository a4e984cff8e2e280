//! What a worker tells of its endpoints: each one's state, limit and
//! recent activity ([`Endpoints::views`]), for the reports `redeliver
//! endpoint list` merges, and the outcomes the shared failing clock has
//! not seen yet ([`Endpoints::deltas`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::activity::{Counts, Delta, Failure};
use super::state::Endpoint;
use super::Endpoints;
use crate::message::target::Target;
use crate::policy::State as BreakerState;

/// One endpoint as this worker sees it.
#[derive(Clone, Debug)]
pub struct View {
    /// Its isolation key: `scheme://host:port`, or a route's URL prefix.
    pub key: String,
    /// The key as an operator names it (`None` if it does not parse).
    pub target: Option<Target>,
    /// Its last delivery, wall clock (ms).
    pub seen_ms: u64,
    pub in_flight: usize,
    /// Its own limit: the adaptive one under the ceiling.
    pub limit: usize,
    pub breaker_open: bool,
    pub counts: Counts,
    pub last_success_ms: Option<u64>,
    pub last_failure: Option<Failure>,
    /// Parked here, and sent back to wait (deferred, or a retry) and not
    /// due yet.
    pub waiting: u64,
}

impl Endpoints {
    /// Every endpoint with a delivery within `seen_within`. `now_ms` is
    /// the wall clock.
    pub fn views(&self, now_ms: u64, seen_within: Duration) -> Vec<View> {
        let mut out = vec![];
        for (ep, ago) in self.entries() {
            if ago > seen_within {
                continue;
            }
            let mut st = ep.state();
            let parked = st.queue.len() + st.reserved;
            out.push(View {
                key: ep.key.clone(),
                target: ep.target.clone(),
                seen_ms: now_ms.saturating_sub(ago.as_millis() as u64),
                in_flight: st.limiter.in_flight(),
                limit: ep.own_limit(&st),
                breaker_open: !matches!(st.breaker.state(), BreakerState::Closed),
                counts: st.activity.counts(now_ms),
                last_success_ms: st.activity.last_success_ms(),
                last_failure: st.activity.last_failure().cloned(),
                waiting: parked as u64 + st.activity.waiting(now_ms),
            });
        }
        out
    }

    /// The outcomes each endpoint saw since the last call (handed over,
    /// and forgotten here), with its last success: for the shared
    /// failing clock. Only endpoints that saw something.
    pub fn deltas(&self) -> Vec<(Target, Delta, Option<u64>)> {
        let mut out = vec![];
        for (ep, _) in self.entries() {
            let Some(target) = &ep.target else { continue };
            let mut st = ep.state();
            let delta = st.activity.take_delta();
            if !delta.is_empty() {
                out.push((target.clone(), delta, st.activity.last_success_ms()));
            }
        }
        out
    }

    /// The endpoints and how long ago each had a delivery, out of the
    /// registry's lock.
    pub(super) fn entries(&self) -> Vec<(Arc<Endpoint>, Duration)> {
        let now = Instant::now();
        let reg = self.map.lock().unwrap_or_else(|p| p.into_inner());
        reg.endpoints
            .values()
            .map(|e| (e.ep.clone(), now.saturating_duration_since(e.seen)))
            .collect()
    }
}
