//! The consume loop: bounded concurrency, explicit shutdown, and
//! reconnection after the broker connection is lost.

pub(crate) mod process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{BrokerSettings, WorkerSettings};
use crate::delay::hold::Holder;
use crate::delay::DelayBackend;
use crate::deliver::DeliveryHandler;
use crate::policy::{Backoff, Jitter, RetryPolicy};
use crate::publish::Publisher;
use crate::telemetry;
use crate::topology::{Topology, TopologyError};
use crate::worker::process::{hold_then_ack, process, Context, Settled, Slot};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot connect to the broker at {url}")]
    Connect { url: String, source: lapin::Error },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker cancelled the consumer (was the work queue deleted?)")]
    ConsumerCancelled,
    #[error("the publishing channel closed")]
    PublisherClosed,
    #[error(
        "republishing failed (unroutable or unconfirmed); reconnecting to re-declare the topology"
    )]
    RepublishFailing,
    #[error("the broker connection was lost")]
    ConnectionLost,
    #[error("holding short delays failed: {0}")]
    Hold(#[from] crate::delay::hold::HoldError),
    #[error("the short-delay holder stopped; reconnecting")]
    HolderStopped,
    #[error("concurrency must be at least 1")]
    Concurrency,
    #[error("invalid broker URL {url}: {reason}")]
    BadUrl { url: String, reason: String },
}

impl WorkerError {
    /// Errors an operator must fix; everything else is retried.
    fn is_fatal(&self) -> bool {
        match self {
            WorkerError::Connect { source, .. } => {
                crate::config::is_permanent_connect_error(&source.to_string())
            }
            WorkerError::Concurrency
            | WorkerError::BadUrl { .. }
            | WorkerError::Topology(TopologyError::DelayedExchangeMissing)
            | WorkerError::Topology(TopologyError::Mismatch { .. }) => true,
            _ => false,
        }
    }
}

/// A session that lasted this long resets the reconnect backoff.
const STABLE_SESSION: Duration = Duration::from_secs(30);

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
    if let Err(reason) = broker.url.expose().parse::<lapin::uri::AMQPUri>() {
        return Err(WorkerError::BadUrl {
            url: broker.url.redacted(),
            reason,
        });
    }
    let handler = Arc::new(handler);
    let semaphore = Arc::new(Semaphore::new(settings.concurrency));
    metrics::gauge!(telemetry::CONCURRENCY).set(settings.concurrency as f64);
    // Present from the start, so dashboards and alerts see 0, not "no data".
    metrics::counter!(telemetry::RECONNECTS).increment(0);
    metrics::gauge!(telemetry::IN_FLIGHT).increment(0.0);
    metrics::gauge!(telemetry::CONFIRMS_PENDING).increment(0.0);
    let reconnect = reconnect_policy();
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        let result = session(broker, &settings, &handler, &semaphore, &shutdown).await;
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

/// Deliveries past their HTTP attempt (waiting for a republish confirm, or
/// held by `--retry-settle`) are unacked but hold no concurrency slot, so
/// the prefetch has room for them: `--prefetch`, or by default
/// concurrency + max(1024, 4 × concurrency), at most 65535.
pub fn prefetch(settings: &WorkerSettings) -> usize {
    let room = (4 * settings.concurrency).max(DEFAULT_PREFETCH_ROOM);
    settings
        .prefetch
        .unwrap_or(settings.concurrency + room)
        .min(usize::from(u16::MAX))
}

/// Channels a worker republishes on (see [`Publisher`]).
const PUBLISH_CHANNELS: usize = 8;

/// See [`prefetch`].
pub const DEFAULT_PREFETCH_ROOM: usize = 1024;

/// One connection's life: `Ok` on shutdown, `Err` when the connection failed.
async fn session<H: DeliveryHandler>(
    broker: &BrokerSettings,
    settings: &WorkerSettings,
    handler: &Arc<H>,
    semaphore: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let conn = broker
        .url
        .connect("redeliver run")
        .await
        .map_err(|source| WorkerError::Connect {
            url: broker.url.redacted(),
            source,
        })?;
    let result = consume(&conn, broker, settings, handler, semaphore, shutdown).await;
    let _ = conn.close(200, "redeliver worker stopping".into()).await;
    result
}

async fn consume<H: DeliveryHandler>(
    conn: &Connection,
    broker: &BrokerSettings,
    settings: &WorkerSettings,
    handler: &Arc<H>,
    semaphore: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let topology = crate::delay::declare_topology(&broker, conn).await?;
    let publisher = Publisher::with_channels(
        conn,
        PUBLISH_CHANNELS,
        topology.clone(),
        broker.delay,
        settings.confirm_timeout,
    )
    .await?;
    let channel = conn.create_channel().await?;
    let prefetch = u16::try_from(prefetch(settings)).unwrap_or(u16::MAX);
    // prefetch = concurrency + room for deliveries past their HTTP attempt
    // (see `prefetch`): the broker never hands this process more than that.
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            topology.work.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (hard_stop, tracker) = (CancellationToken::new(), TaskTracker::new());
    // Stops this session's helpers: the holder, the dead-letter gauge and
    // the connection watch.
    let watch = CancellationToken::new();
    let hold_failed = match broker.delay {
        // With the cascade, every worker also holds its prefix's short
        // delays; held messages are tasks on `tracker`, drained like
        // deliveries.
        DelayBackend::Cascade => {
            Holder::start(conn, &topology, publisher.clone(), settings.hold_prefetch)
                .await?
                .spawn(&tracker, &watch, &hard_stop)
        }
        DelayBackend::Plugin => CancellationToken::new(),
    };
    info!(queue = %topology.work, concurrency = settings.concurrency, broker = %broker.url, "consuming");
    let dead_channel = conn.create_channel().await?;
    tokio::spawn(watch_dead_letters(
        dead_channel,
        topology.clone(),
        watch.clone(),
    ));
    // Ready only now that every channel is open; not ready the moment the
    // connection drops, even while every slot is busy and the loop below
    // is not reading the consumer.
    settings.health.set_consuming(true);
    let lost = CancellationToken::new();
    tokio::spawn(watch_connection(
        conn.status().clone(),
        settings.health.clone(),
        lost.clone(),
        watch.clone(),
    ));

    let ctx = Arc::new(Context {
        handler: handler.clone(),
        publisher,
        settings: settings.clone(),
        hard_stop: hard_stop.clone(),
        broken: CancellationToken::new(),
    });
    let result = loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            _ = lost.cancelled() => break Err(WorkerError::ConnectionLost),
            _ = hold_failed.cancelled() => break Err(WorkerError::HolderStopped),
            p = semaphore.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break Ok(()),
            },
        };
        if !ctx.publisher.is_connected() {
            break Err(WorkerError::PublisherClosed);
        }
        let delivery = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            _ = ctx.broken.cancelled() => break Err(WorkerError::RepublishFailing),
            _ = hold_failed.cancelled() => break Err(WorkerError::HolderStopped),
            d = consumer.next() => d,
        };
        match delivery {
            Some(Ok(d)) => {
                let (ctx, pulled) = (ctx.clone(), std::time::Instant::now());
                tracker.spawn(async move {
                    // The slot is freed as soon as the HTTP attempt is over;
                    // confirm waits and settle holds do not count against
                    // the concurrency.
                    let settled = process(ctx.clone(), d, pulled, Slot::new(permit)).await;
                    if let Settled::Hold(acker) = settled {
                        hold_then_ack(&ctx, acker).await;
                    }
                });
            }
            Some(Err(e)) => break Err(e.into()),
            None => break Err(WorkerError::ConsumerCancelled),
        }
    };
    // Draining or reconnecting: not ready for traffic.
    settings.health.set_consuming(false);
    watch.cancel();
    let grace = if result.is_ok() {
        settings.shutdown_grace
    } else {
        Duration::ZERO
    };
    drain(
        &channel,
        consumer.tag().as_str(),
        &tracker,
        grace,
        &hard_stop,
    )
    .await;
    result
}

/// Stops taking deliveries and gives in-flight ones `grace` to finish; then
/// tells the rest to stop, which nacks them back to the queue.
async fn drain(
    channel: &lapin::Channel,
    tag: &str,
    tracker: &TaskTracker,
    grace: Duration,
    hard_stop: &CancellationToken,
) {
    let _ = channel
        .basic_cancel(tag.into(), BasicCancelOptions::default())
        .await;
    tracker.close();
    if grace.is_zero() && !tracker.is_empty() {
        // The session broke: their acks could no longer reach the broker,
        // which requeues them itself.
        warn!(
            in_flight = tracker.len(),
            "session lost; in-flight deliveries return to the queue"
        );
    } else if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!(
            in_flight = tracker.len(),
            "shutdown grace over; requeueing unfinished deliveries"
        );
    }
    hard_stop.cancel();
    // Nacks are quick; a dead connection makes them fail at once.
    let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
}

/// How often the dead-letter count is read for the metrics.
const DEAD_LETTER_CHECK: Duration = Duration::from_secs(30);

/// Sets the dead-letter gauge from a passive declare of the dead queue, now
/// and every [`DEAD_LETTER_CHECK`], until `stop`. A failed read keeps the
/// last value: the gauge is "at the last check".
async fn watch_dead_letters(channel: lapin::Channel, topology: Topology, stop: CancellationToken) {
    loop {
        match topology.dead_count(&channel).await {
            Ok(n) => metrics::gauge!(telemetry::DEAD_LETTERS).set(f64::from(n)),
            // A failed passive declare closes the channel; stop until the
            // next session.
            Err(_) => return,
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(DEAD_LETTER_CHECK) => {}
        }
    }
    let _ = channel.close(200, "done".into()).await;
}

/// Marks the worker not ready, and the session lost, as soon as the
/// connection is no longer up (checked every 250 ms), until `stop`.
async fn watch_connection(
    status: lapin::ConnectionStatus,
    health: crate::telemetry::Health,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if !status.connected() {
            health.set_consuming(false);
            lost.cancel();
            return;
        }
    }
}
