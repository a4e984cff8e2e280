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
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::load;
use super::phases::Bench;
use super::sink::Mode;
use crate::config::BrokerSettings;
use crate::topology::{lanes, Topology};

/// The retry loop's delay: the retry phase's `--schedule 1ms`.
pub(super) const DELAY_MS: u32 = 1;
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

    /// The bucket key of the sink's notifications: they all travel in one
    /// lane, the one the ideal consumers read.
    pub(super) fn sink_key(&self) -> String {
        let url = self.sink.url("/ok");
        url::Url::parse(&url).map_or_else(|_| String::new(), |u| lanes::key_for_url(&u))
    }

    /// The lane of [`Bench::sink_key`] under `prefix`.
    pub(super) fn sink_lane(&self, prefix: &str) -> String {
        let t = Topology::new(prefix);
        t.lane(lanes::lane_of_key(&self.sink_key(), t.lanes))
    }
}

/// The real worker's prefetch at `--concurrency c` (see
/// [`crate::worker::prefetch`]), so both hold as many unacked.
pub(super) fn prefetch_for(c: usize) -> u16 {
    let settings = crate::config::WorkerSettings {
        concurrency: c,
        ..Default::default()
    };
    u16::try_from(crate::worker::prefetch(&settings)).unwrap_or(u16::MAX)
}

/// A connection of the ceiling's own, as a worker process has.
pub(super) async fn connect(broker: &BrokerSettings) -> anyhow::Result<Connection> {
    let url = &broker.url;
    url.connect("redeliver bench ideal")
        .await
        .with_context(|| format!("cannot connect to the broker at {url}"))
}

/// A channel consuming `queue`, at most `prefetch` deliveries unacked.
/// The channel is returned to be kept: lapin closes a channel when its
/// last handle is dropped, and the broker would requeue what it delivered.
pub(super) async fn consume(
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
pub(super) async fn next(consumer: &mut Consumer) -> anyhow::Result<Delivery> {
    tokio::time::timeout(STALL, consumer.next())
        .await
        .with_context(|| format!("no delivery for {STALL:?}"))?
        .context("the broker cancelled the consumer")?
        .context("a delivery failed")
}

/// Fails on the first finished task that failed, without waiting.
pub(super) fn check<T: 'static>(tasks: &mut JoinSet<anyhow::Result<T>>) -> anyhow::Result<()> {
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
