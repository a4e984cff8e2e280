//! Per-endpoint isolation: one bad receiver must not starve the others.
//!
//! An **endpoint** is a URL's scheme, host and port; the URLs of a
//! `[[route]]` form an endpoint of their own, with the route's limits. For
//! each endpoint a worker keeps (in memory, for at most `--max-endpoints`
//! of them, the least recently used forgotten):
//!
//! - a **concurrency cap** (`--endpoint-concurrency`, a route's
//!   `concurrency`): attempts in flight to it;
//! - an optional **rate** (`--endpoint-rate`, a route's `rate`);
//! - a **circuit breaker** and `Retry-After` **pauses** (the pure state
//!   machine is `crate::policy::Breaker`).
//!
//! [`Endpoints::try_admit`] answers for each delivery, before its attempt:
//! **go**; **park** (the endpoint is at its cap or waits for its rate turn,
//! and will be free soon: the delivery gives its concurrency slot back and
//! waits, in arrival order, holding one of `--max-parked` places); or
//! **defer** (the breaker is open, the endpoint paused, or its wait would
//! be long: the worker republishes it with a delay, confirmed before the
//! ack). Parking and deferring are not attempts and cost none.

mod pass;
mod state;

pub use pass::{Admission, Parked, Pass};
pub use state::{DeferReason, MAX_SCHEDULE, PARK_TIMEOUT, PARK_WAIT};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{EndpointSettings, Route, Routes};
use crate::policy::Gate;
use crate::telemetry;
use state::Endpoint;

/// Every endpoint this worker knows, and the parking places they share.
pub struct Endpoints {
    settings: EndpointSettings,
    worker_concurrency: usize,
    routes: Routes,
    map: Mutex<HashMap<String, Arc<Endpoint>>>,
    room: Arc<Semaphore>,
    labels: Mutex<Vec<String>>,
}

impl Endpoints {
    pub fn new(settings: EndpointSettings, worker_concurrency: usize, routes: Routes) -> Self {
        let room = Arc::new(Semaphore::new(settings.max_parked));
        metrics::gauge!(telemetry::PARKED).set(0.0);
        Endpoints {
            settings,
            worker_concurrency,
            routes,
            map: Mutex::new(HashMap::new()),
            room,
            labels: Mutex::new(Vec::new()),
        }
    }

    /// A parking place for the next delivery, taken *before* it is pulled
    /// (like its concurrency slot): the worker pulls no more deliveries
    /// than it can park, so a delivery never has to be deferred for want
    /// of a place (backpressure when every endpoint is busy). `None` when
    /// parking is off.
    pub async fn place(&self) -> Option<OwnedSemaphorePermit> {
        match self.settings.max_parked {
            0 => None,
            _ => self.room.clone().acquire_owned().await.ok(),
        }
    }

    /// The answer for a delivery to `url`; see [`Admission`]. `place` is
    /// the parking place taken for it ([`Endpoints::place`]), kept only if
    /// it parks.
    pub fn try_admit(&self, url: &url::Url, place: Option<OwnedSemaphorePermit>) -> Admission {
        let route = self.routes.find(url);
        let ep = self.endpoint(url, route);
        let now = Instant::now();
        let mut st = ep.state();
        st.used = now;
        if let Gate::Wait(wait, why) = st.breaker.gate(now, &ep.limits.breaker, false) {
            return pass::defer(&ep, &mut st, now, wait, why.into());
        }
        let permit = ep.permits.clone().try_acquire_owned().ok();
        if permit.is_some() && state::rate_wait_at(&ep, &st, now).is_zero() {
            if let Some(p) = permit {
                return pass::go(&ep, &mut st, p, now);
            }
        }
        let wait = ep.park_estimate(&st, now);
        let reason = match (&permit, ep.limits.rate) {
            (Some(_), Some(_)) => DeferReason::Rate,
            _ => DeferReason::Busy,
        };
        if wait > PARK_WAIT {
            return pass::defer(&ep, &mut st, now, wait, reason);
        }
        match place {
            Some(place) => Admission::Park(Parked::new(ep.clone(), &mut st, place, permit)),
            None => pass::defer(&ep, &mut st, now, wait.max(PARK_WAIT), DeferReason::Busy),
        }
    }

    /// The endpoint of `url` (the route's, when one matches), created with
    /// its limits when new; the least recently used are forgotten beyond
    /// `--max-endpoints`.
    fn endpoint(&self, url: &url::Url, route: Option<&Route>) -> Arc<Endpoint> {
        let key = match route {
            Some(r) => r.url_prefix.clone(),
            None => endpoint_key(url),
        };
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ep) = map.get(&key) {
            return ep.clone();
        }
        if map.len() >= self.settings.max_endpoints.max(1) {
            forget_least_used(&mut map);
        }
        let limits = self.settings.limits(self.worker_concurrency, route);
        let ep = Endpoint::new(key.clone(), self.label(url), limits, Instant::now());
        let ep = Arc::new(ep);
        map.insert(key, ep.clone());
        metrics::gauge!(telemetry::ENDPOINTS).set(map.len() as f64);
        ep
    }

    /// `host:port` for the first [`telemetry::MAX_ENDPOINT_LABELS`]
    /// endpoints seen, `other` after that.
    fn label(&self, url: &url::Url) -> String {
        let name = format!(
            "{}:{}",
            url.host_str().unwrap_or(""),
            url.port_or_known_default().unwrap_or(0)
        );
        let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        if labels.contains(&name) {
            return name;
        }
        if labels.len() < telemetry::MAX_ENDPOINT_LABELS {
            labels.push(name.clone());
            return name;
        }
        "other".into()
    }
}

/// Scheme, host and port: `https://pay.example.com:443`.
pub fn endpoint_key(url: &url::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(0)
    )
}

/// Forgets the least recently used tenth of the endpoints that nobody is
/// using (no delivery holds them).
fn forget_least_used(map: &mut HashMap<String, Arc<Endpoint>>) {
    let mut idle: Vec<(Instant, String)> = map
        .iter()
        .filter(|(_, ep)| Arc::strong_count(ep) == 1)
        .map(|(k, ep)| (ep.state().used, k.clone()))
        .collect();
    idle.sort();
    let n = (map.len() / 10).max(1);
    for (_, k) in idle.into_iter().take(n) {
        map.remove(&k);
    }
}

/// How long a deferred delivery waits: at least `wait` (the breaker's open
/// time left, the pause, the rate's next turn, the estimated queue), and at
/// least 1 s (shorter waits park instead) doubled for each earlier deferral
/// (up to a minute), so a long backlog circulates ever more slowly; plus
/// up to half again of jitter, so deferred deliveries do not all come back
/// at once.
pub fn defer_delay(wait: Duration, deferrals: u32, rng: &mut impl Rng) -> Duration {
    let floor = Duration::from_secs(1)
        .saturating_mul(2u32.saturating_pow(deferrals.min(16)))
        .min(Duration::from_secs(60));
    let base = wait.max(floor);
    let jitter_ms = u64::try_from(base.as_millis() / 2).unwrap_or(u64::MAX);
    base + Duration::from_millis(rng.random_range(0..=jitter_ms))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
