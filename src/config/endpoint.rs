//! Per-endpoint isolation settings: the flags' values, which a `[[route]]`
//! overrides for its URLs. The state they govern lives in `crate::endpoint`.

use std::time::Duration;

use crate::config::Route;
use crate::policy::{BreakerPolicy, Rate};

/// Endpoints a worker tracks by default (`--max-endpoints`); the least
/// recently used are forgotten beyond it.
pub const DEFAULT_MAX_ENDPOINTS: usize = 10_000;
/// Deliveries a worker parks at most by default (`--max-parked`).
pub const DEFAULT_MAX_PARKED: usize = 256;
/// `--max-age` by default: Stripe retries for up to 3 days, and a payment
/// result older than that is a matter for people, not for retries.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3 * 86_400);

/// How the worker shares itself among endpoints (flags `--endpoint-*`,
/// `--breaker-*`, `--max-endpoints`, `--max-parked`).
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSettings {
    /// Most attempts in flight to one endpoint; `None`: a quarter of the
    /// worker's concurrency (see [`EndpointSettings::concurrency_for`]).
    pub concurrency: Option<usize>,
    /// Most attempts per interval to one endpoint; `None`: no limit.
    pub rate: Option<Rate>,
    pub breaker: BreakerPolicy,
    pub max_endpoints: usize,
    /// Deliveries waiting for their endpoint (not holding a concurrency
    /// slot); beyond this they are deferred through the delay backend.
    pub max_parked: usize,
}

impl Default for EndpointSettings {
    fn default() -> Self {
        EndpointSettings {
            concurrency: None,
            rate: None,
            breaker: BreakerPolicy::default(),
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
            max_parked: DEFAULT_MAX_PARKED,
        }
    }
}

/// The limits in force for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EndpointLimits {
    pub concurrency: usize,
    pub rate: Option<Rate>,
    pub breaker: BreakerPolicy,
}

impl EndpointSettings {
    /// A quarter of `worker` by default, at least 1: one hanging receiver
    /// then holds at most a quarter of the slots, whatever else it does.
    pub fn concurrency_for(&self, worker: usize) -> usize {
        self.concurrency
            .unwrap_or(worker / 4)
            .clamp(1, worker.max(1))
    }

    /// The route's settings over the flags'.
    pub fn limits(&self, worker_concurrency: usize, route: Option<&Route>) -> EndpointLimits {
        let own = |f: fn(&Route) -> Option<usize>| route.and_then(f);
        let mut breaker = self.breaker;
        if let Some(f) = route.and_then(|r| r.breaker_failures) {
            breaker.failures = f;
        }
        EndpointLimits {
            concurrency: own(|r| r.concurrency)
                .unwrap_or_else(|| self.concurrency_for(worker_concurrency))
                .max(1),
            rate: route.and_then(|r| r.rate).or(self.rate),
            breaker,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_overrides_the_flags_and_the_default_is_a_quarter() {
        let s = EndpointSettings::default();
        assert_eq!(s.concurrency_for(32), 8);
        assert_eq!(s.concurrency_for(2), 1);
        let flags = EndpointSettings {
            concurrency: Some(64),
            rate: Some("10/s".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(flags.concurrency_for(32), 32, "never above the worker's");
        let route = Route {
            url_prefix: "https://a.example/".into(),
            concurrency: Some(2),
            rate: Some("5/min".parse().unwrap()),
            breaker_failures: Some(0),
            ..Default::default()
        };
        let l = flags.limits(32, Some(&route));
        assert_eq!((l.concurrency, l.rate), (2, route.rate));
        assert!(!l.breaker.enabled());
        let l = flags.limits(32, None);
        assert_eq!((l.concurrency, l.rate), (32, flags.rate));
        assert!(l.breaker.enabled());
    }
}
