//! Putting load on the broker: preloading notifications through the
//! library's own publisher, and the broker ceiling (phase 1), measured with
//! a bare lapin producer and consumer and no HTTP at all.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{stream, StreamExt, TryStreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection};

use crate::config::BrokerSettings;
use crate::publish::{prepare, Publisher};
use crate::topology::{work_args, Topology};

/// Publishes awaiting confirms at once, as `redeliver publish --file` does
/// with a window of its own.
const WINDOW: usize = 1024;

/// A notification to preload: its JSON, and a delay (through the delay
/// mechanism) or none (through the intake exchange).
pub struct Item {
    pub json: String,
    pub delay: Option<Duration>,
}

/// Declares `prefix`'s topology and publishes `items` with confirms.
/// Returns how long publishing took.
pub async fn preload(
    conn: &Connection,
    broker: &BrokerSettings,
    prefix: &str,
    items: impl IntoIterator<Item = Item>,
) -> anyhow::Result<Duration> {
    Ok(
        preload_windowed(conn, broker, prefix, items, (WINDOW, None))
            .await?
            .took,
    )
}

/// Declares `prefix`'s topology, its lanes laid for the default count as
/// the bench's workers lay them (a producer alone sends everything to
/// lane 0 until a worker has), and opens a publisher on it.
async fn publisher_for(
    conn: &Connection,
    broker: &BrokerSettings,
    prefix: &str,
) -> anyhow::Result<Publisher> {
    let b = BrokerSettings {
        prefix: prefix.to_string(),
        ..broker.clone()
    };
    let lanes = Some(crate::config::DEFAULT_LANES);
    let t = crate::delay::declare_topology_with(&b, conn, lanes).await?;
    Ok(Publisher::new(conn, t, b.delay, Duration::from_secs(60)).await?)
}

/// How a preload went.
pub struct Published {
    pub took: Duration,
    /// The longest time from a publish to its confirm: the broker received
    /// each message somewhere inside that span.
    pub max_confirm: Duration,
}

/// [`preload`] with at most `window` publishes awaiting their confirms. A
/// small window keeps the publish instant close to the broker's receipt,
/// which the delay phase needs: a message's due time starts there. With
/// `per_s`, publishes start at that steady rate rather than as fast as
/// the window allows, so backends compare under the same load.
pub async fn preload_windowed(
    conn: &Connection,
    broker: &BrokerSettings,
    prefix: &str,
    items: impl IntoIterator<Item = Item>,
    (window, per_s): (usize, Option<f64>),
) -> anyhow::Result<Published> {
    let publisher = publisher_for(conn, broker, prefix).await?;
    let started = Instant::now();
    // Paced, an item is taken from `items` only when its turn comes, so a
    // body that stamps its own due time stamps it at publish time.
    let paced = stream::unfold((items.into_iter(), 0u32), |(mut it, i)| async move {
        if let Some(r) = per_s {
            let at = started + Duration::from_secs_f64(f64::from(i) / r);
            tokio::time::sleep_until(at.into()).await;
        }
        let item = it.next()?;
        Some((Ok::<_, anyhow::Error>(item), (it, i + 1)))
    });
    let lags = paced
        .map_ok(|item| {
            let p = publisher.clone();
            async move {
                let prepared = prepare(&item.json, 1 << 20)?;
                let sent = Instant::now();
                p.publish_new(&prepared, item.delay).await?;
                Ok(sent.elapsed())
            }
        })
        .try_buffer_unordered(window)
        .try_collect::<Vec<Duration>>()
        .await?;
    Ok(Published {
        took: started.elapsed(),
        max_confirm: lags.into_iter().max().unwrap_or_default(),
    })
}

/// Waits, up to 30 s, until `queue` has a consumer: a worker's start-up
/// (the cascade's 121 queues are re-declared) must not count as lateness.
pub async fn wait_for_consumer(conn: &Connection, queue: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if crate::ops::status::queue(conn, queue).await?.consumers > 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no worker consumed {queue} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes a prefix's topology; a failure is only worth a warning.
pub async fn remove(conn: &Connection, prefix: &str) {
    if let Err(e) = crate::delay::delete(&Topology::new(prefix), conn).await {
        tracing::warn!(error = %e, prefix, "could not delete the benchmark's queues");
    }
}

/// What phase 1 measured.
pub struct Ceiling {
    pub publish_per_s: f64,
    pub drain_per_s: f64,
}

/// Phase 1: `n` persistent messages of `size` bytes published with confirms
/// to a fresh queue of the work queue's type, then consumed and acked one
/// by one at `prefetch`.
pub async fn broker_ceiling(
    conn: &Connection,
    broker: &BrokerSettings,
    queue: &str,
    n: usize,
    size: usize,
    prefetch: u16,
) -> anyhow::Result<Ceiling> {
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, work_args(broker.queue_type))
        .await
        .context("declaring the ceiling queue")?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let payload = vec![b'x'; size];
    let started = Instant::now();
    stream::iter(0..n)
        .map(|_| {
            let (ch, payload) = (ch.clone(), &payload);
            async move {
                // delivery_mode 2: persistent, like every notification.
                let props = BasicProperties::default().with_delivery_mode(2);
                let opts = BasicPublishOptions::default();
                let confirm = ch
                    .basic_publish("".into(), queue.into(), opts, payload, props)
                    .await?;
                match confirm.await? {
                    Confirmation::Nack(_) => anyhow::bail!("the broker nacked a publish"),
                    _ => Ok(()),
                }
            }
        })
        .buffer_unordered(WINDOW)
        .try_collect::<Vec<()>>()
        .await?;
    let publish_s = started.elapsed().as_secs_f64();
    let drain_s = drain(conn, queue, n, prefetch).await?;
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let _ = ch.close(200, "done".into()).await;
    Ok(Ceiling {
        publish_per_s: n as f64 / publish_s,
        drain_per_s: n as f64 / drain_s,
    })
}

/// Consumes and acks `n` messages; returns the seconds from the first
/// delivery to the last ack.
async fn drain(conn: &Connection, queue: &str, n: usize, prefetch: u16) -> anyhow::Result<f64> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "bench-ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut first = None;
    // Each ack is sent from a task of its own, as the worker's delivery
    // tasks do, rather than one round trip at a time.
    let mut acks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let d = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .context("the ceiling queue stopped delivering")?
            .context("the consumer ended")??;
        first.get_or_insert_with(Instant::now);
        acks.spawn(async move { d.acker.ack(BasicAckOptions::default()).await });
    }
    while let Some(r) = acks.join_next().await {
        r??;
    }
    let secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    let _ = ch.close(200, "done".into()).await;
    Ok(secs.max(1e-9))
}

/// Publishes at `rate` per second for `run` through the intake exchange,
/// each notification's JSON made at its publish instant; returns how many
/// were published (all confirmed).
pub async fn paced(
    conn: &Connection,
    broker: &BrokerSettings,
    prefix: &str,
    rate: f64,
    run: Duration,
    json: impl Fn(usize) -> String,
) -> anyhow::Result<usize> {
    let publisher = publisher_for(conn, broker, prefix).await?;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let mut confirms = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    let mut i = 0;
    while start.elapsed() < run {
        tokio::time::sleep_until(start + interval * i as u32).await;
        let prepared = prepare(&json(i), 1 << 20)?;
        let p = publisher.clone();
        confirms.spawn(async move { p.publish_new(&prepared, None).await });
        i += 1;
    }
    while let Some(r) = confirms.join_next().await {
        r??;
    }
    Ok(i)
}
