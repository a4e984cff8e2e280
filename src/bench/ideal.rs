//! Physical-limit ceilings measured in the same run, on the same broker
//! and sink as the real worker: an ideal worker (phase 3) and an ideal
//! retry loop (phase 4). Each does the least its job needs, with nothing
//! of the worker's features (policy, endpoints, headers, telemetry), so
//! the ratio of the real worker to it is what those features cost.
//!
//! Both run in-process, on the bench's tokio runtime, on a connection of
//! their own (as a `redeliver run` process has). That keeps them free of
//! a hidden CLI command, but the ideal worker then shares the runtime's
//! threads with the sink it posts to, where the real worker has a process
//! of its own: on a small machine that makes the ceiling a little lower,
//! so the ratio errs towards the real worker's side.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Consumer};
use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::load;
use super::phases::Bench;
use super::sink::Mode;
use crate::config::{BrokerSettings, DelayBackend, DEFAULT_HOLD_PREFETCH};
use crate::delay::{cascade, hold};
use crate::message::state::{self, H_ATTEMPT, H_DELAY};
use crate::topology::{lanes, Topology};

/// The retry loop's delay: the retry phase's `--schedule 1ms`.
const DELAY_MS: u32 = 1;
/// How long a consumer may stay silent before the ceiling gives up.
const STALL: Duration = Duration::from_secs(30);

type Http = Client<HttpConnector, Full<Bytes>>;

impl Bench {
    /// Phase 3's ceiling: the ideal worker drains a backlog like the one
    /// the real worker drained (same n, same messages, a fresh prefix,
    /// removed afterwards whatever happened). Returns its rate, measured
    /// at the sink like the real one's.
    pub(super) async fn ideal_worker_rate(&self) -> anyhow::Result<f64> {
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let prefix = self.prefix("ideal");
        self.sink.reset(Mode::default());
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let drained = match load::preload(&self.conn, &self.opts.broker, &prefix, items).await {
            Ok(_) => worker(&self.opts.broker, &self.sink_lane(&prefix), n, c).await,
            Err(e) => Err(e),
        };
        load::remove(&self.conn, &prefix).await;
        drained.context("the ideal worker")?;
        Ok(self.sink.seen().rate())
    }

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

    /// The bucket key of the sink's notifications: they all travel in one
    /// lane, the one the ideal consumers read.
    fn sink_key(&self) -> String {
        let url = self.sink.url("/ok");
        url::Url::parse(&url).map_or_else(|_| String::new(), |u| lanes::key_for_url(&u))
    }

    /// The lane of [`Bench::sink_key`] under `prefix`.
    fn sink_lane(&self, prefix: &str) -> String {
        let t = Topology::new(prefix);
        t.lane(lanes::lane_of_key(&self.sink_key(), t.lanes))
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

/// The real worker's prefetch at `--concurrency c` (see
/// [`crate::worker::prefetch`]), so both hold as many unacked.
fn prefetch_for(c: usize) -> u16 {
    let settings = crate::config::WorkerSettings {
        concurrency: c,
        ..Default::default()
    };
    u16::try_from(crate::worker::prefetch(&settings)).unwrap_or(u16::MAX)
}

/// A connection of the ceiling's own, as a worker process has.
async fn connect(broker: &BrokerSettings) -> anyhow::Result<Connection> {
    let url = &broker.url;
    url.connect("redeliver bench ideal")
        .await
        .with_context(|| format!("cannot connect to the broker at {url}"))
}

/// A channel consuming `queue`, at most `prefetch` deliveries unacked.
/// The channel is returned to be kept: lapin closes a channel when its
/// last handle is dropped, and the broker would requeue what it delivered.
async fn consume(
    conn: &Connection,
    queue: &str,
    prefetch: u16,
) -> anyhow::Result<(Channel, Consumer)> {
    let ch = conn.create_channel().await?;
    // prefetch_count: the broker stops delivering at this many unacked.
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .context("setting the prefetch")?;
    // Default options: manual acks (no_ack false), not exclusive.
    let consumer = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("consuming {queue}"))?;
    Ok((ch, consumer))
}

/// The next delivery, or an error when none came for [`STALL`].
async fn next(consumer: &mut Consumer) -> anyhow::Result<Delivery> {
    tokio::time::timeout(STALL, consumer.next())
        .await
        .with_context(|| format!("no delivery for {STALL:?}"))?
        .context("the broker cancelled the consumer")?
        .context("a delivery failed")
}

/// Fails on the first finished task that failed, without waiting.
fn check<T: 'static>(tasks: &mut JoinSet<anyhow::Result<T>>) -> anyhow::Result<()> {
    while let Some(r) = tasks.try_join_next() {
        r??;
    }
    Ok(())
}

/// The ideal worker: consumes the sink's lane at the real worker's
/// prefetch, at most `c` POSTs in flight (a slot taken before the next
/// delivery is pulled, as the worker does), and acks each message once
/// the sink answered 2xx. Returns when `n` were acked.
async fn worker(broker: &BrokerSettings, lane: &str, n: usize, c: usize) -> anyhow::Result<()> {
    let conn = connect(broker).await?;
    let result = async {
        let (_ch, mut consumer) = consume(&conn, lane, prefetch_for(c)).await?;
        let http: Http = Client::builder(TokioExecutor::new()).build_http();
        let slots = Arc::new(Semaphore::new(c.max(1)));
        let mut tasks = JoinSet::new();
        for _ in 0..n {
            let slot = slots.clone().acquire_owned().await?;
            let d = next(&mut consumer).await?;
            tasks.spawn(post_and_ack(http.clone(), d, slot));
            check(&mut tasks)?;
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        anyhow::Ok(())
    }
    .await;
    let _ = conn.close(200, "ideal worker done".into()).await;
    result
}

/// All of a notification the ideal worker reads: where, and what to send.
#[derive(serde::Deserialize)]
struct Minimal<'a> {
    #[serde(borrow)]
    url: Cow<'a, str>,
    #[serde(borrow)]
    body: Option<&'a RawValue>,
}

/// POSTs the notification's body to its URL, reads the answer to its end
/// (so the connection returns to the pool) and acks on 2xx.
async fn post_and_ack(http: Http, d: Delivery, slot: OwnedSemaphorePermit) -> anyhow::Result<()> {
    let m: Minimal = serde_json::from_slice(&d.data).context("a notification that is not JSON")?;
    let body = m.body.map(|b| b.get().as_bytes()).unwrap_or_default();
    let req = hyper::Request::post(m.url.as_ref())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .context("building the request")?;
    let resp = http.request(req).await.context("POST to the sink")?;
    let status = resp.status();
    resp.into_body()
        .collect()
        .await
        .context("reading the sink's answer")?;
    drop(slot);
    anyhow::ensure!(status.is_success(), "the sink answered {status}");
    d.acker
        .ack(BasicAckOptions::default())
        .await
        .context("acking a delivered message")?;
    Ok(())
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
