//! The consume loop: bounded concurrency, explicit shutdown, and
//! reconnection after the broker connection is lost.

mod acks;
mod admit;
mod context;
mod copy;
mod error;
mod feed;
mod lanes;
mod notify;
mod park;
pub(crate) mod process;
mod record;
mod reread;
mod rotation;
mod session;
mod traced;
mod unpark;
mod wait;

pub use error::WorkerError;
pub use session::{prefetch, DEFAULT_PREFETCH_ROOM, PUBLISH_CHANNELS};

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::warn;

use crate::config::{BrokerSettings, WorkerSettings};
use crate::delay::probe::Watch;
use crate::deliver::DeliveryHandler;
use crate::isolation::Endpoints;
use crate::policy::{Backoff, Jitter, RetryPolicy};
use crate::telemetry;
use session::{Session, Shared};

/// A session that lasted this long resets the reconnect backoff.
const STABLE_SESSION: Duration = Duration::from_secs(30);
/// How long a stopping worker waits for the broker's close-ok.
const CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Runs a worker until `shutdown` is cancelled.
///
/// Deliveries are processed by `handler` with at most
/// `settings.concurrency` in flight: a semaphore permit is taken *before*
/// the next delivery is pulled, and the prefetch matches, so the broker
/// never hands this process more than it can work on. The semaphore outlives
/// connections, so deliveries still finishing from a lost connection count
/// against the bound of the next one.
///
/// When the connection is lost, the worker reconnects with capped
/// exponential backoff and jitter, re-declares the topology and resumes.
/// Deliveries it could not settle are redelivered by the broker.
pub async fn run<H: DeliveryHandler>(
    broker: &BrokerSettings,
    settings: WorkerSettings,
    handler: H,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    if settings.concurrency == 0 {
        return Err(WorkerError::Concurrency);
    }
    // A malformed URL would otherwise look like a broker that is down.
    if let Err(bad) = broker.url.validate() {
        return Err(WorkerError::BadUrl {
            url: bad.url,
            reason: bad.reason,
        });
    }
    let handler = Arc::new(handler);
    let shared = shared(&settings, broker.delay);
    metrics::gauge!(telemetry::CONCURRENCY).set(settings.concurrency as f64);
    // Present from the start, so dashboards and alerts see 0, not "no data".
    metrics::counter!(telemetry::RECONNECTS).increment(0);
    metrics::gauge!(telemetry::IN_FLIGHT).increment(0.0);
    metrics::gauge!(telemetry::CONFIRMS_PENDING).increment(0.0);
    // The pump runs as a task of the runtime, not in the caller's
    // `block_on` (the binary's main thread): a delivery's task is then
    // spawned onto the pumping worker thread's own queue and usually runs
    // there next, rather than waking another thread for each delivery.
    // Aborted if this future is dropped: the worker never outlives its caller.
    let broker = broker.clone();
    let pump = AbortOnDropHandle::new(tokio::spawn(async move {
        reconnect_loop(&broker, settings, handler, shared, shutdown).await
    }));
    match pump.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Aborted only when this future is dropped; a runtime shutting
        // down ends the worker too.
        Err(_) => Ok(()),
    }
}

/// Sessions, one after another, until shutdown or a fatal error.
async fn reconnect_loop<H: DeliveryHandler>(
    broker: &BrokerSettings,
    settings: WorkerSettings,
    handler: Arc<H>,
    shared: Shared,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let reconnect = reconnect_policy();
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        let result = session(broker, &settings, &handler, &shared, &shutdown).await;
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                failures = if started.elapsed() > STABLE_SESSION {
                    1
                } else {
                    failures + 1
                };
                let delay = reconnect.delay(failures, &mut rand::rng());
                metrics::counter!(telemetry::RECONNECTS).increment(1);
                warn!(error = %e, attempt = failures, retry_in = ?delay, "no broker connection; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The slots, the endpoints' state and the delay probes'. They outlive
/// connections: deliveries still finishing from a lost connection count
/// against the next one's bounds, an endpoint's breaker does not forget a
/// dead receiver on a broker hiccup, nor the probe a stalled backend.
fn shared(settings: &WorkerSettings, delay: crate::config::DelayBackend) -> Shared {
    let mut endpoints = settings.endpoints.clone();
    // Parked deliveries are unacked: they must fit in the prefetch beside
    // the slots, or the broker would stop sending while they wait.
    endpoints.max_parked = endpoints
        .max_parked
        .min(prefetch(settings).saturating_sub(settings.concurrency));
    Shared {
        slot_wanted: Arc::new(tokio::sync::Notify::new()),
        slots: Arc::new(Semaphore::new(settings.concurrency)),
        endpoints: Arc::new(Endpoints::new(
            endpoints,
            settings.concurrency,
            settings.routes.clone(),
        )),
        watch: Watch::new(settings.delay_probe, delay, settings.health.clone()),
        control: crate::control::Control::new(&settings.control),
        waiting: Arc::new(wait::WaitRoom::new(settings.endpoints.max_waiting)),
        parking: context::Parking::default(),
    }
}

/// 200 ms doubling to 30 s, with equal jitter so a fleet of workers does not
/// reconnect in lockstep after a broker restart.
fn reconnect_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: u32::MAX,
        backoff: Backoff::Exponential {
            initial: Duration::from_millis(200),
            factor: 2.0,
            max: Duration::from_secs(30),
            jitter: Jitter::Equal,
        },
    }
}

/// One connection's life: `Ok` on shutdown, `Err` when the connection failed.
async fn session<H: DeliveryHandler>(
    broker: &BrokerSettings,
    settings: &WorkerSettings,
    handler: &Arc<H>,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    // The connection's name says the prefix: `status` counts each node's
    // workers by it (`ops::management::Api::workers_by_node`).
    let name = format!("redeliver run {}", broker.prefix);
    let (conn, node) =
        broker
            .url
            .connect_to(&name)
            .await
            .map_err(|source| WorkerError::Connect {
                url: broker.url.redacted(),
                source,
            })?;
    // Shared with the feed, which opens a channel for each new consumer.
    let conn = Arc::new(conn);
    let result = match Session::open(&conn, &node, broker, settings, handler, shared).await {
        Ok(mut session) => {
            let result = session.pump(shutdown).await;
            // A broken session's acks could not reach the broker: no grace.
            let grace = match result {
                Ok(()) => settings.shutdown_grace,
                Err(_) => Duration::ZERO,
            };
            session.drain(grace).await;
            result
        }
        Err(e) => Err(e),
    };
    // Bounded: a broker that does not answer must not hold the stop. A
    // second is plenty for a close-ok, and nothing waits on it: every ack
    // and nack went out in `drain`. (Seen about once in 30 stops right
    // after start-up: lapin dropped the socket at once and its close then
    // waited for a close-ok that could never come.)
    let close = conn.close(200, "redeliver worker stopping".into());
    let _ = tokio::time::timeout(CLOSE_BOUND, close).await;
    result
}
