//! Per-endpoint isolation settings: the flags' values, which a `[[route]]`
//! overrides for its URLs. The state they govern lives in `crate::isolation`.

use std::time::Duration;

use crate::config::Route;
use crate::policy::{BreakerPolicy, LimitPolicy, Rate};

/// Endpoints a worker tracks by default (`--max-endpoints`); the least
/// recently used are forgotten beyond it.
pub const DEFAULT_MAX_ENDPOINTS: usize = 10_000;
/// Deliveries a worker parks at most by default (`--max-parked`).
pub const DEFAULT_MAX_PARKED: usize = 256;
/// Deferred deliveries a worker keeps waiting in itself at most by default
/// (`--max-waiting`).
pub const DEFAULT_MAX_WAITING: usize = 4096;
/// `--max-age` by default: Stripe retries for up to 3 days, and a payment
/// result older than that is a matter for people, not for retries.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3 * 86_400);

/// `--disable-after` by default: Svix disables an endpoint whose every
/// attempt failed for 5 days.
pub const DEFAULT_DISABLE_AFTER: Duration = Duration::from_secs(5 * 86_400);

/// The suggested `--breaker-park-after`: past the breaker's first few
/// openings (5, 10, 20 s), so a short outage still circulates, but well
/// before a backlog of deferrals costs the broker much. Not the default
/// (off): in one CI run of the chaos outage on 4.3.6 with parking on,
/// 101 notifications were delivered twice against the scenario's bound
/// of 48 (nothing lost), not explained yet (docs/lanes.md).
pub const SUGGESTED_BREAKER_PARK_AFTER: Duration = Duration::from_secs(60);

/// The shared endpoint state's settings (`crate::control`).
#[derive(Clone, Debug, PartialEq)]
pub struct ControlSettings {
    /// Disable an endpoint with no successful attempt for this long (and
    /// enough failed ones); `None`: never by itself (`--disable-after off`).
    pub disable_after: Option<Duration>,
    /// Park the backlog of an endpoint whose breaker has been open this
    /// long (`crate::control::breakers`); `None`: never
    /// (`--breaker-park-after off`).
    pub breaker_park_after: Option<Duration>,
}

impl Default for ControlSettings {
    fn default() -> Self {
        ControlSettings {
            disable_after: Some(DEFAULT_DISABLE_AFTER),
            breaker_park_after: None,
        }
    }
}

/// How the worker shares itself among endpoints (flags `--endpoint-*`,
/// `--breaker-*`, `--max-endpoints`, `--max-parked`, `--max-waiting`).
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSettings {
    /// A hard ceiling on attempts in flight to one endpoint; `None`: the
    /// worker's concurrency. Below it the limit is adaptive.
    pub concurrency: Option<usize>,
    /// Per-endpoint isolation on (the default): an adaptive limit per
    /// endpoint and max-min fair shares under contention. Off (`--isolation
    /// off`): only the ceiling, rates and `Retry-After` pauses remain, and
    /// the breaker is off too.
    pub isolation: bool,
    /// Most attempts per interval to one endpoint; `None`: no limit.
    pub rate: Option<Rate>,
    pub breaker: BreakerPolicy,
    pub max_endpoints: usize,
    /// Deliveries waiting for their endpoint (not holding a concurrency
    /// slot); beyond this they are deferred through the delay backend.
    pub max_parked: usize,
    /// Deliveries deferred for a short wait that wait in the worker,
    /// unacked, instead of a round trip through the delay backend
    /// (`crate::policy::wait`); 0: always through the backend.
    pub max_waiting: usize,
}

impl Default for EndpointSettings {
    fn default() -> Self {
        EndpointSettings {
            concurrency: None,
            isolation: true,
            rate: None,
            breaker: BreakerPolicy::default(),
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
            max_parked: DEFAULT_MAX_PARKED,
            max_waiting: DEFAULT_MAX_WAITING,
        }
    }
}

/// The limits in force for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EndpointLimits {
    /// The hard ceiling on attempts in flight.
    pub concurrency: usize,
    /// Where the adaptive limit starts and the most it earns; `None`:
    /// isolation is off, the ceiling is the limit.
    pub adaptive: Option<LimitPolicy>,
    pub rate: Option<Rate>,
    pub breaker: BreakerPolicy,
}

impl EndpointSettings {
    /// The ceiling: `--endpoint-concurrency`, or the whole worker. The
    /// adaptive limit below it is what keeps a hanging receiver small.
    pub fn concurrency_for(&self, worker: usize) -> usize {
        self.concurrency.unwrap_or(worker).clamp(1, worker.max(1))
    }

    /// The route's settings over the flags'.
    pub fn limits(&self, worker_concurrency: usize, route: Option<&Route>) -> EndpointLimits {
        let own = |f: fn(&Route) -> Option<usize>| route.and_then(f);
        let mut breaker = self.breaker;
        if let Some(f) = route.and_then(|r| r.breaker_failures) {
            breaker.failures = f;
        }
        if !self.isolation {
            breaker.failures = 0;
        }
        let concurrency = own(|r| r.concurrency)
            .unwrap_or_else(|| self.concurrency_for(worker_concurrency))
            .max(1);
        EndpointLimits {
            concurrency,
            // Starts at one (see `LimitPolicy::for_max`), up to the
            // ceiling: a ceiling says "at most", not "start there".
            adaptive: self.isolation.then(|| LimitPolicy {
                initial: LimitPolicy::for_max(worker_concurrency)
                    .initial
                    .min(concurrency),
                max: concurrency,
            }),
            rate: route.and_then(|r| r.rate).or(self.rate),
            breaker,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_overrides_the_flags_and_the_default_ceiling_is_the_worker() {
        let s = EndpointSettings::default();
        assert_eq!(s.concurrency_for(32), 32);
        assert_eq!(s.concurrency_for(2), 2);
        let l = s.limits(32, None);
        assert_eq!(l.adaptive, Some(LimitPolicy::for_max(32)));
        let off = EndpointSettings {
            isolation: false,
            ..Default::default()
        };
        let l = off.limits(32, None);
        assert_eq!((l.concurrency, l.adaptive), (32, None));
        assert!(!l.breaker.enabled(), "isolation off: no breaker either");
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
