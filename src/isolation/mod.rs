//! Per-endpoint isolation: one bad receiver must not starve the others,
//! and isolation must cost nothing when nobody misbehaves.
//!
//! An **endpoint** is a URL's scheme, host and port; the URLs of a
//! `[[route]]` form an endpoint of their own, with the route's limits. For
//! each endpoint a worker keeps (in memory, for at most `--max-endpoints`
//! of them, the least recently used forgotten):
//!
//! - an **adaptive limit** on attempts in flight, earned from its own
//!   latency, timeouts and overload answers (`crate::policy::Limiter`),
//!   under an optional hard ceiling (`--endpoint-concurrency`, a route's
//!   `concurrency`);
//! - a **share**: alone, an endpoint may use every slot; while several
//!   had deliveries within the last second, max-min fair shares;
//! - an optional **rate** (`--endpoint-rate`, a route's `rate`);
//! - a **circuit breaker** and `Retry-After` **pauses** (the pure state
//!   machine is `crate::policy::Breaker`).
//!
//! [`Endpoints::try_admit`] answers for each delivery, before its attempt:
//! **go**; **park** (the endpoint is at its limit or waits for its rate
//! turn, and will be free soon: the delivery gives its concurrency slot
//! back and waits, in arrival order, holding one of `--max-parked`
//! places); or **defer** (the breaker is open, the endpoint paused, makes
//! no progress, or its wait would be long: the worker republishes it with
//! a delay, confirmed before the ack). Parking and deferring are not
//! attempts and cost none.

pub mod activity;
mod admission;
mod breakers;
mod pass;
mod reason;
mod state;
mod view;

pub use activity::{Counts, Failure, Outcome};
pub use admission::{Admission, Parked};
pub use breakers::{BreakerSeen, ProbeTurn, CLOCK_SLACK_MS};
pub use pass::Pass;
pub use reason::DeferReason;
pub use state::{ACTIVE_WINDOW, LONE_PARK_WAIT, MAX_SCHEDULE, PARK_TIMEOUT, PARK_WAIT};
pub use view::View;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{EndpointSettings, Route, Routes};
use crate::policy::Gate;
use crate::telemetry;
use state::{rate_wait_at, Endpoint, Shares, State};

/// How often the endpoints active within [`ACTIVE_WINDOW`] are counted
/// again (in between, a newly active one is added at once).
const RECOUNT: Duration = Duration::from_millis(100);

/// Every endpoint this worker knows, the slots they share, and the
/// parking places.
pub struct Endpoints {
    settings: EndpointSettings,
    worker_concurrency: usize,
    routes: Routes,
    map: Mutex<Registry>,
    shares: Arc<Shares>,
    room: Arc<Semaphore>,
    labels: Mutex<Vec<String>>,
}

/// The endpoints by key, and how many had a delivery lately.
struct Registry {
    endpoints: HashMap<String, Entry>,
    active: usize,
    counted: Instant,
}

struct Entry {
    ep: Arc<Endpoint>,
    /// Its last delivery.
    seen: Instant,
}

impl Endpoints {
    pub fn new(settings: EndpointSettings, worker_concurrency: usize, routes: Routes) -> Self {
        let room = Arc::new(Semaphore::new(settings.max_parked));
        let shares = Arc::new(Shares::new(worker_concurrency, settings.max_parked));
        metrics::gauge!(telemetry::PARKED).set(0.0);
        let registry = Registry {
            endpoints: HashMap::new(),
            active: 0,
            counted: Instant::now(),
        };
        Endpoints {
            settings,
            worker_concurrency,
            routes,
            map: Mutex::new(registry),
            shares,
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
        let now = Instant::now();
        let ep = self.endpoint(url, route, now);
        let mut st = ep.state();
        ep.check(&mut st, now);
        if let Gate::Wait(wait, why) = st.breaker.gate(now, &ep.limits.breaker, false) {
            return admission::defer(&ep, &mut st, now, wait, why.into());
        }
        let rate_wait = rate_wait_at(&ep, &st, now);
        // Nobody parked ahead of it (arrival order), room, and its rate turn.
        if st.queue.is_empty() && ep.has_room(&st) && rate_wait.is_zero() {
            return admission::go(&ep, &mut st, now);
        }
        park_or_defer(&ep, &mut st, now, place, rate_wait)
    }

    /// The endpoint of `url` (the route's, when one matches), created with
    /// its limits when new and marked active; the least recently used are
    /// forgotten beyond `--max-endpoints`.
    fn endpoint(&self, url: &url::Url, route: Option<&Route>, now: Instant) -> Arc<Endpoint> {
        let key = match route {
            Some(r) => r.url_prefix.clone(),
            None => endpoint_key(url),
        };
        let mut guard = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let reg = &mut *guard;
        let ep = match reg.endpoints.get_mut(&key) {
            Some(e) => {
                if now.saturating_duration_since(e.seen) > ACTIVE_WINDOW {
                    reg.active += 1;
                }
                e.seen = now;
                e.ep.clone()
            }
            None => self.insert(reg, key, url, route, now),
        };
        if now.saturating_duration_since(reg.counted) >= RECOUNT {
            recount(reg, &self.shares, now);
        }
        self.shares.set_active(reg.active);
        ep
    }

    fn insert(
        &self,
        reg: &mut Registry,
        key: String,
        url: &url::Url,
        route: Option<&Route>,
        now: Instant,
    ) -> Arc<Endpoint> {
        if reg.endpoints.len() >= self.settings.max_endpoints.max(1) {
            forget_least_used(&mut reg.endpoints);
        }
        let limits = self.settings.limits(self.worker_concurrency, route);
        let ep = Endpoint::new(
            key.clone(),
            self.label(url),
            limits,
            self.shares.clone(),
            now,
        );
        let ep = Arc::new(ep);
        reg.endpoints.insert(
            key,
            Entry {
                ep: ep.clone(),
                seen: now,
            },
        );
        reg.active += 1;
        metrics::gauge!(telemetry::ENDPOINTS).set(reg.endpoints.len() as f64);
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

/// Counts the endpoints that had a delivery within [`ACTIVE_WINDOW`], and
/// the slots they claim (see [`Shares::claim`]).
fn recount(reg: &mut Registry, shares: &Shares, now: Instant) {
    let active: Vec<&Entry> = reg
        .endpoints
        .values()
        .filter(|e| now.saturating_duration_since(e.seen) <= ACTIVE_WINDOW)
        .collect();
    reg.active = active.len();
    shares.set_active(reg.active);
    let mut claimed = 0;
    for e in &active {
        let (demand, own) = {
            let st = e.ep.state();
            (e.ep.demand(&st), e.ep.own_limit(&st))
        };
        let claim = shares.claim(demand, own);
        e.ep.claim
            .store(claim, std::sync::atomic::Ordering::Relaxed);
        claimed += claim;
    }
    shares.set_claimed(claimed);
    reg.counted = now;
    metrics::gauge!(telemetry::ACTIVE_ENDPOINTS).set(reg.active as f64);
}

/// A delivery that cannot go now parks, in order, when its wait is short
/// enough ([`Endpoint::park_bound`]: long alone, short while others have
/// work); it is deferred when the endpoint makes no progress, when the
/// wait is longer, or, while others have work, when the endpoint is in
/// doubt ([`Endpoint::in_doubt`]: nothing answered lately, it may be
/// hanging) and already has a round of deliveries waiting, or when it has
/// not answered yet ([`Endpoint::cold`]) and holds its share of the
/// parking places: its deliveries must not fill the places the others
/// need.
fn park_or_defer(
    ep: &Arc<Endpoint>,
    st: &mut State,
    now: Instant,
    place: Option<OwnedSemaphorePermit>,
    rate_wait: Duration,
) -> Admission {
    let ahead = st.queue.len();
    let estimate = ep.park_estimate(st, now, ahead);
    let reason = match ep.has_room(st) && !rate_wait.is_zero() {
        true => DeferReason::Rate,
        false => DeferReason::Busy,
    };
    let round = ep.allowed(st);
    let doubt = ep.in_doubt(st, now) && ahead >= round;
    let cold = ep.cold(st) && ahead >= ep.shares.fair_places().max(round);
    let hold_back = ep.shares.contended() && (doubt || cold);
    if ep.stalled(st, now) || hold_back || estimate > ep.park_bound() {
        return admission::defer(ep, st, now, estimate.max(PARK_WAIT), reason);
    }
    match place {
        Some(place) => {
            let keeps_slot = !ep.shares.contended();
            Admission::Park(Parked::new(ep.clone(), st, place, keeps_slot))
        }
        None => admission::defer(ep, st, now, estimate.max(PARK_WAIT), reason),
    }
}

/// Forgets the least recently used tenth of the endpoints that nobody is
/// using (no delivery holds them).
fn forget_least_used(map: &mut HashMap<String, Entry>) {
    let mut idle: Vec<(Instant, String)> = map
        .iter()
        .filter(|(_, e)| Arc::strong_count(&e.ep) == 1)
        .map(|(k, e)| (e.seen, k.clone()))
        .collect();
    idle.sort();
    let n = (map.len() / 10).max(1);
    for (_, k) in idle.into_iter().take(n) {
        map.remove(&k);
    }
}

/// How long a deferred delivery waits: at least `wait` and at least 1 s
/// (shorter waits park instead), plus jitter, so deferred deliveries do
/// not all come back at once.
///
/// A busy or rate-limited endpoint (`scheduled`) gave `wait` from its own
/// schedule: one place per deferral, at the pace it can take them
/// (`state.rs`, `deferral`). That is the delay, with a tenth of jitter: a
/// floor that doubled per deferral would send the notifications deferred
/// most often to the back of a drain, up to 45 s out.
///
/// Otherwise (an open breaker, a `Retry-After` pause, probes out) the 1 s
/// floor doubles for each deferral since the notification's last attempt,
/// `streak`, up to 30 s, with up to half again of jitter: an endpoint that
/// keeps refusing is asked less and less often.
pub fn defer_delay(wait: Duration, streak: u32, scheduled: bool, rng: &mut impl Rng) -> Duration {
    let second = Duration::from_secs(1);
    let (floor, jitter_part) = match scheduled {
        true => (second, 10),
        false => {
            let doubled = second.saturating_mul(2u32.saturating_pow(streak.min(16)));
            (doubled.min(Duration::from_secs(30)), 2)
        }
    };
    let base = wait.max(floor);
    let jitter_ms = u64::try_from(base.as_millis() / jitter_part).unwrap_or(u64::MAX);
    base + Duration::from_millis(rng.random_range(0..=jitter_ms))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "places_tests.rs"]
mod places_tests;
