//! What a worker tells of its endpoints ([`Endpoints::views`]): each one's
//! state, limit and recent activity, for the reports `redeliver endpoint
//! list` merges, and the outcomes the shared failing-since clock has not
//! seen yet.

use std::time::{Duration, Instant};

use super::activity::{Counts, Delta, Failure};
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
    /// Outcomes since the last call that took them (see [`Endpoints::views`]).
    pub delta: Delta,
}

impl Endpoints {
    /// Every endpoint with a delivery within `seen_within`; with
    /// `take_deltas`, their outcomes since the last such call are handed
    /// over (and forgotten here). `now_ms` is the wall clock.
    pub fn views(&self, now_ms: u64, seen_within: Duration, take_deltas: bool) -> Vec<View> {
        let now = Instant::now();
        let entries: Vec<_> = {
            let reg = self.map.lock().unwrap_or_else(|p| p.into_inner());
            reg.endpoints
                .values()
                .map(|e| (e.ep.clone(), now.saturating_duration_since(e.seen)))
                .collect()
        };
        let mut out = Vec::with_capacity(entries.len());
        for (ep, ago) in entries {
            let mut st = ep.state();
            let delta = match take_deltas {
                true => st.activity.take_delta(),
                false => Delta::default(),
            };
            if ago > seen_within && delta.is_empty() {
                continue;
            }
            let parked = st.queue.len() + st.reserved;
            out.push(View {
                key: ep.key.clone(),
                target: Target::parse(&ep.key).ok(),
                seen_ms: now_ms.saturating_sub(ago.as_millis() as u64),
                in_flight: st.limiter.in_flight(),
                limit: ep.own_limit(&st),
                breaker_open: !matches!(st.breaker.state(), BreakerState::Closed),
                counts: st.activity.counts(now_ms),
                last_success_ms: st.activity.last_success_ms(),
                last_failure: st.activity.last_failure().cloned(),
                waiting: parked as u64 + st.activity.waiting(now_ms),
                delta,
            });
        }
        out
    }
}
