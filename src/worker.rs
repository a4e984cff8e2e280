//! The consume loop: bounded concurrency, explicit shutdown.

use std::sync::Arc;

use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{BrokerSettings, WorkerSettings};
use crate::deliver::DeliveryHandler;
use crate::process::{process, Context};
use crate::publish::Publisher;
use crate::topology::TopologyError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot connect to the broker at {url}: {source}")]
    Connect { url: String, source: lapin::Error },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker cancelled the consumer (was the work queue deleted?)")]
    ConsumerCancelled,
    #[error("the publishing channel closed; stopping so the broker redelivers")]
    PublisherClosed,
    #[error("concurrency must be at least 1")]
    Concurrency,
}

/// Runs a worker until `shutdown` is cancelled or the connection fails.
///
/// Deliveries are processed by `handler` with at most
/// `settings.concurrency` in flight: a semaphore permit is taken *before*
/// the next delivery is pulled, and the prefetch matches, so the broker
/// never hands this process more than it can work on.
pub async fn run<H: DeliveryHandler>(
    broker: &BrokerSettings,
    settings: WorkerSettings,
    handler: H,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    if settings.concurrency == 0 {
        return Err(WorkerError::Concurrency);
    }
    let conn = broker
        .url
        .connect("redeliver run")
        .await
        .map_err(|source| WorkerError::Connect {
            url: broker.url.redacted(),
            source,
        })?;
    let topology = broker.declare_topology(&conn).await?;
    let publisher = Publisher::new(
        &conn,
        topology.clone(),
        broker.delay,
        settings.confirm_timeout,
    )
    .await?;
    let channel = conn.create_channel().await?;
    let prefetch = u16::try_from(settings.concurrency).unwrap_or(u16::MAX);
    // prefetch = concurrency: unacked deliveries never exceed what we can work on.
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
    info!(queue = %topology.work, concurrency = settings.concurrency, broker = %broker.url, "consuming");

    let grace = settings.shutdown_grace;
    let semaphore = Arc::new(Semaphore::new(settings.concurrency));
    let ctx = Arc::new(Context {
        handler,
        publisher,
        settings,
    });
    let tracker = TaskTracker::new();
    let result = loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
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
            d = consumer.next() => d,
        };
        match delivery {
            Some(Ok(d)) => {
                let ctx = ctx.clone();
                tracker.spawn(async move {
                    process(ctx, d).await;
                    drop(permit);
                });
            }
            Some(Err(e)) => break Err(e.into()),
            None => break Err(WorkerError::ConsumerCancelled),
        }
    };
    drain(&channel, consumer.tag().as_str(), &tracker, grace).await;
    let _ = conn.close(200, "redeliver worker stopping".into()).await;
    result
}

/// Stops taking deliveries and gives in-flight ones `grace` to finish.
/// Whatever is still unacked returns to the queue when the connection closes.
async fn drain(
    channel: &lapin::Channel,
    tag: &str,
    tracker: &TaskTracker,
    grace: std::time::Duration,
) {
    let _ = channel
        .basic_cancel(tag.into(), BasicCancelOptions::default())
        .await;
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!(
            in_flight = tracker.len(),
            "shutdown grace over; unacked deliveries return to the queue"
        );
    }
}
