//! What the shared state needs of this worker's breakers, to park the
//! backlog of an endpoint down for long (`crate::control::breakers`):
//! how long each has been open, whether a paused delivery may go through
//! as a probe, and closing one when another worker's probe proved its
//! endpoint. Nothing here writes to the broker.

use std::time::{Duration, Instant};

use super::Endpoints;
use crate::message::target::Target;
use crate::policy::Gate;

/// One endpoint's breaker as this worker has it, wall clock (ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerSeen {
    pub target: Target,
    /// Open (or half-open) since then, without closing.
    pub open_since_ms: Option<u64>,
    /// When it last closed after being open.
    pub closed_ms: Option<u64>,
}

/// Clocks of two workers may differ this much: a breaker that closed this
/// long before a pause was written (by another worker's clock) still
/// counts as its probe.
pub const CLOCK_SLACK_MS: u64 = 2_000;

/// What a delivery does that meets its endpoint parked for its breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeTurn {
    /// Attempt it: the breaker is half-open with its probe free (this is
    /// the probe), or closed since the pause (a probe here proved the
    /// endpoint; the resume is on its way).
    Go,
    /// The one delivery of this opening sent to wait for the half-open
    /// (the admission defers it), marked so that no worker parks it.
    Candidate,
    /// Park it with the backlog.
    Park,
}

impl Endpoints {
    /// The endpoints whose breaker has opened at least once.
    pub fn breakers(&self, now_ms: u64) -> Vec<BreakerSeen> {
        let now = Instant::now();
        let wall = |at: Instant| now_ms.saturating_sub(ms(now.saturating_duration_since(at)));
        let mut out = vec![];
        for (ep, _) in self.entries() {
            let Some(target) = &ep.target else { continue };
            let st = ep.state();
            let (open, closed) = (st.breaker.open_since(), st.breaker.closed_at());
            if open.is_some() || closed.is_some() {
                out.push(BreakerSeen {
                    target: target.clone(),
                    open_since_ms: open.map(wall),
                    closed_ms: closed.map(wall),
                });
            }
        }
        out
    }

    /// What a delivery to `url` does whose endpoint was parked for its
    /// breaker at `paused_ms` (wall clock): see [`ProbeTurn`]. A closed
    /// breaker that has not closed since the pause (this worker had not
    /// seen the endpoint fail) is opened here, so that every worker probes
    /// on its own breaker's schedule and none attempts a parked endpoint
    /// at full rate.
    pub fn probe_turn(&self, url: &url::Url, paused_ms: u64) -> ProbeTurn {
        let route = self.routes.find(url);
        let now = Instant::now();
        let ep = self.endpoint(url, route, now);
        let policy = &ep.limits.breaker;
        let mut st = ep.state();
        let wall = u64::try_from(crate::clock::now_ms()).unwrap_or(0);
        let closed_ms = st
            .breaker
            .closed_at()
            .map(|c| wall.saturating_sub(ms(now.saturating_duration_since(c))));
        let proven = closed_ms.is_some_and(|c| c + CLOCK_SLACK_MS >= paused_ms);
        if st.breaker.state() == crate::policy::State::Closed && proven {
            return ProbeTurn::Go;
        }
        if st.breaker.trip(now, policy) {
            tracing::info!(endpoint = %ep.key, "circuit breaker opened: the endpoint is parked for its breaker");
        }
        if st.breaker.gate(now, policy, false) == Gate::Probe {
            ProbeTurn::Go
        } else if st.breaker.take_candidate() {
            ProbeTurn::Candidate
        } else {
            ProbeTurn::Park
        }
    }

    /// Closes the breaker of `target`'s endpoint: a probe of another
    /// worker closed its own, and the parked backlog is being released.
    pub fn close_breaker(&self, target: &Target) -> bool {
        let now = Instant::now();
        let mut closed = false;
        for (ep, _) in self.entries() {
            if ep.target.as_ref() == Some(target) && ep.state().breaker.close(now) {
                tracing::info!(endpoint = %ep.key, "circuit breaker closed: another worker's probe succeeded");
                closed = true;
            }
        }
        closed
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "breakers_tests.rs"]
mod tests;
