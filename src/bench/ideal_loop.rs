//! Phase 4's ceiling: the ideal retry loop on the bench's delay backend,
//! the least a retry can cost (see `ideal.rs`, which also has phase 3's
//! ideal worker and the helpers both share).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Consumer};
use tokio::task::JoinSet;

use super::ideal::{check, connect, consume, next, prefetch_for, DELAY_MS};
use super::load;
use super::phases::Bench;
use crate::config::{BrokerSettings, DelayBackend, DEFAULT_HOLD_PREFETCH};
use crate::delay::{cascade, hold};
use crate::message::state::{self, H_ATTEMPT, H_DELAY};
use crate::topology::Topology;

impl Bench {
    /// Phase 4's ceiling: the ideal retry loop on the bench's delay
    /// backend, over `n` preloaded notifications under a fresh prefix
    /// (removed afterwards whatever happened). Returns its rate and the
    /// broker's CPU seconds over the loop (`None`: unknown).
    pub(super) async fn ideal_retry_run(&self, n: usize) -> anyhow::Result<(f64, Option<f64>)> {
        let c = self.sizes.concurrency;
        let prefix = self.prefix("ideal-retry");
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let broker_cpu = || self.opts.broker_pid.and_then(super::procs::cpu_seconds);
        let mut used = None;
        let looped = match load::preload(&self.conn, &self.opts.broker, &prefix, items).await {
            Ok(_) => {
                let before = broker_cpu();
                let lane = (self.sink_lane(&prefix), self.sink_key());
                let r = retry_loop(&self.opts.broker, &prefix, lane, n, c).await;
                used = before.zip(broker_cpu()).map(|(a, b)| b - a);
                r
            }
            Err(e) => Err(e),
        };
        load::remove(&self.conn, &prefix).await;
        Ok((looped.context("the ideal retry loop")?, used))
    }

    /// The ideal retry loop's name in the table.
    pub(super) fn ideal_retry_name(&self) -> String {
        let backend = match self.opts.broker.delay {
            DelayBackend::Plugin => "plugin",
            DelayBackend::Cascade => "cascade",
        };
        format!("ideal retry loop ({backend})")
    }
}

/// What the ideal retry loop's tasks share.
struct Loop {
    /// Confirm-mode channels, as many as a worker publishes on
    /// ([`crate::worker::PUBLISH_CHANNELS`]), used round-robin: one would
    /// serialise every confirm behind the previous one.
    channels: Vec<Channel>,
    next: AtomicUsize,
    topology: Topology,
    backend: DelayBackend,
    /// The lane the sink's notifications travel in, and their bucket key.
    lane: String,
    key: String,
}

impl Loop {
    async fn open(
        conn: &Connection,
        prefix: &str,
        backend: DelayBackend,
        (lane, key): (String, String),
    ) -> anyhow::Result<Self> {
        let mut channels = Vec::with_capacity(crate::worker::PUBLISH_CHANNELS);
        for _ in 0..crate::worker::PUBLISH_CHANNELS {
            let ch = conn.create_channel().await?;
            // Publisher confirms: the broker acks each publish once it
            // has the message (on disk, for the delayed ones here).
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .context("confirm mode")?;
            channels.push(ch);
        }
        Ok(Loop {
            channels,
            next: AtomicUsize::new(0),
            topology: Topology::new(prefix),
            backend,
            lane,
            key,
        })
    }

    fn channel(&self) -> &Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.channels[i % self.channels.len()]
    }

    /// Publishes `payload` and waits for the broker's confirm; a nack or a
    /// mandatory publish returned unroutable is an error.
    async fn confirmed(
        &self,
        (exchange, key, mandatory): (&str, &str, bool),
        payload: &[u8],
        props: BasicProperties,
    ) -> anyhow::Result<()> {
        // mandatory: an unroutable message comes back rather than vanishing.
        let opts = BasicPublishOptions {
            mandatory,
            ..Default::default()
        };
        let ch = self.channel();
        let confirm = ch
            .basic_publish(exchange.into(), key.into(), opts, payload, props)
            .await
            .context("publishing")?;
        match confirm.await.context("waiting for a confirm")? {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => anyhow::bail!("a publish was unroutable"),
            Confirmation::Nack(_) => anyhow::bail!("the broker nacked a publish"),
        }
    }

    /// The delayed copy of an original: the route and delay headers the
    /// worker's publisher uses for a retry (`DelayBackend::route`), and a
    /// `redeliver-attempt` header that tells it apart when it comes back.
    async fn republish(&self, payload: &[u8]) -> anyhow::Result<()> {
        let mut headers = FieldTable::default();
        // redeliver-attempt: 1, as the worker's copy of a first attempt says.
        headers.insert(H_ATTEMPT.into(), AMQPValue::LongLongInt(1));
        // x-delay (and, held on the cascade, the due time) and the route.
        let route = self
            .backend
            .route(&self.topology, DELAY_MS, &self.key, &mut headers);
        // delivery_mode 2: persistent, like every copy the worker makes.
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        let to = (
            route.exchange.as_str(),
            route.routing_key.as_str(),
            route.mandatory,
        );
        self.confirmed(to, payload, props).await
    }
}

/// Whether a delivery is a copy the loop published (not an original).
fn is_copy(d: &Delivery) -> bool {
    state::get(d.properties.headers().as_ref(), H_ATTEMPT).is_some()
}

/// One work-queue delivery: an original gets its copy, confirmed, then
/// its ack; a copy only its ack. Returns when a copy was acked.
async fn turn(s: Arc<Loop>, d: Delivery) -> anyhow::Result<Option<Instant>> {
    let copy = is_copy(&d);
    if !copy {
        s.republish(&d.data).await?;
    }
    d.acker
        .ack(BasicAckOptions::default())
        .await
        .context("acking")?;
    Ok(copy.then(Instant::now))
}

/// The ideal retry loop: consumes the work queue at the real worker's
/// prefetch; each original is republished with a 1 ms delay and acked
/// after the confirm, confirms outstanding for every delivery at once;
/// each copy comes back through the delay to the same queue and is acked.
/// Returns copies acked per second from the first delivery to the last
/// copy's ack, the span the retry phase's sink rate covers.
async fn retry_loop(
    broker: &BrokerSettings,
    prefix: &str,
    lane: (String, String),
    n: usize,
    c: usize,
) -> anyhow::Result<f64> {
    let conn = connect(broker).await?;
    let s = Arc::new(Loop::open(&conn, prefix, broker.delay, lane).await?);
    let holder = match broker.delay {
        DelayBackend::Cascade => {
            let queue = cascade::hold(&s.topology);
            let held = consume(&conn, &queue, DEFAULT_HOLD_PREFETCH).await?;
            Some(tokio::spawn(holder(held, s.clone())))
        }
        DelayBackend::Plugin => None,
    };
    let result = loop_through(&conn, s, n, c).await;
    // A holder that failed explains a loop that stalled.
    let result = match holder {
        Some(h) if h.is_finished() => match h.await {
            Ok(Err(e)) => Err(e.context("the ideal holder")),
            _ => result,
        },
        Some(h) => {
            h.abort();
            result
        }
        None => result,
    };
    let _ = conn.close(200, "ideal retry loop done".into()).await;
    result
}

/// [`retry_loop`]'s consumer: 2 × `n` deliveries, originals and copies.
async fn loop_through(conn: &Connection, s: Arc<Loop>, n: usize, c: usize) -> anyhow::Result<f64> {
    let (_ch, mut consumer) = consume(conn, &s.lane, prefetch_for(c)).await?;
    let (mut first, mut last, mut copies) = (None, None, 0);
    let mut tasks = JoinSet::new();
    let mut tally = |r: Option<Instant>| {
        if let Some(at) = r {
            copies += 1;
            last = last.max(Some(at));
        }
    };
    for _ in 0..2 * n {
        let d = next(&mut consumer).await?;
        first.get_or_insert_with(Instant::now);
        tasks.spawn(turn(s.clone(), d));
        while let Some(r) = tasks.try_join_next() {
            tally(r??);
        }
    }
    while let Some(r) = tasks.join_next().await {
        tally(r??);
    }
    anyhow::ensure!(copies == n, "{copies} copies came back, not {n}");
    let span = match (first, last) {
        (Some(f), Some(l)) => (l - f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(n as f64 / span.max(1e-9))
}

/// The cascade's 1 ms copies go to its hold queue (`DelayBackend::route`:
/// delays ≤ `cascade::HOLD_MAX_MS` skip the TTL stages), which only a
/// consumer empties: in the real worker, its holder. So the physically
/// minimal path for that backend is the same queue with a bare holder:
/// consume at the holder's prefetch, wait until due, publish to the
/// cascade's exit with a confirm, ack. The TTL stage `cascade.0.1` would
/// need no consumer, but it is not the path the worker's copies take.
/// Serves `consumer` (the hold queue's) until aborted; its tasks end
/// with it.
async fn holder((_ch, mut consumer): (Channel, Consumer), s: Arc<Loop>) -> anyhow::Result<()> {
    let mut tasks = JoinSet::new();
    loop {
        let d = consumer
            .next()
            .await
            .context("the broker cancelled the holder")?
            .context("a held delivery failed")?;
        tasks.spawn(release(s.clone(), d));
        check(&mut tasks)?;
    }
}

/// Waits until the held copy is due ([`hold::hold_for`], as the worker's
/// holder does), releases it to the exit and acks it after the confirm.
async fn release(s: Arc<Loop>, d: Delivery) -> anyhow::Result<()> {
    let headers = d.properties.headers().as_ref();
    let int = |name| state::get(headers, name).and_then(state::int);
    let now = crate::clock::now_us();
    let wait = hold::hold_for(int(cascade::DUE_HEADER), int(H_DELAY), now);
    tokio::time::sleep(wait).await;
    let out = cascade::out(&s.topology);
    // Fanout exit, no key; mandatory, as the worker's holder publishes.
    s.confirmed((&out, &s.key, true), &d.data, d.properties.clone())
        .await?;
    d.acker
        .ack(BasicAckOptions::default())
        .await
        .context("acking a held copy")?;
    Ok(())
}
