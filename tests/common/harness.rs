//! Starting workers in-process, publishing, reading dead letters, cleaning up.

use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use redeliver::config::{AmqpUrl, BrokerSettings, WorkerSettings};
use redeliver::policy::{parse_schedule, Backoff, RetryPolicy};
use redeliver::topology::{QueueType, Topology};
use redeliver::HttpDeliverer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct Worker {
    pub token: CancellationToken,
    pub join: JoinHandle<Result<(), redeliver::worker::WorkerError>>,
}

impl Worker {
    pub async fn stop(self) {
        self.token.cancel();
        let r = tokio::time::timeout(Duration::from_secs(40), self.join).await;
        r.expect("worker stops")
            .expect("worker task")
            .expect("worker result");
    }
}

pub fn broker(url: &str, prefix: &str) -> BrokerSettings {
    BrokerSettings {
        url: AmqpUrl::new(url),
        prefix: prefix.into(),
        queue_type: QueueType::Quorum,
        delay: super::backend_of(prefix),
    }
}

pub fn schedule_settings(schedule: &str, max_attempts: u32, concurrency: usize) -> WorkerSettings {
    WorkerSettings {
        concurrency,
        policy: RetryPolicy {
            max_attempts,
            backoff: Backoff::Schedule(parse_schedule(schedule).unwrap()),
        },
        ..Default::default()
    }
}

pub fn spawn_worker(url: &str, prefix: &str, settings: WorkerSettings) -> Worker {
    let handler = HttpDeliverer::new(Duration::from_secs(5), settings.concurrency).unwrap();
    spawn_worker_with(url, prefix, settings, handler)
}

/// A worker with a handler of the test's choosing.
pub fn spawn_worker_with(
    url: &str,
    prefix: &str,
    settings: WorkerSettings,
    handler: impl redeliver::DeliveryHandler,
) -> Worker {
    let token = CancellationToken::new();
    let b = broker(url, prefix);
    let t = token.clone();
    let join = tokio::spawn(async move { redeliver::run(&b, settings, handler, t).await });
    Worker { token, join }
}

/// Publishes notifications (JSON objects or their exact text) through the
/// library, with confirms.
pub async fn publish(url: &str, prefix: &str, notifications: &[impl ToString]) -> Vec<String> {
    let b = broker(url, prefix);
    let conn = b.url.connect("test publish").await.unwrap();
    let t = redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    let p = redeliver::publish::Publisher::new(&conn, t, b.delay, Duration::from_secs(30))
        .await
        .unwrap();
    let mut ids = vec![];
    for n in notifications {
        let prepared = redeliver::publish::prepare(&n.to_string(), 1 << 20).unwrap();
        p.publish_new(&prepared, None).await.unwrap();
        ids.push(prepared.id);
    }
    let _ = conn.close(200, "".into()).await;
    ids
}

/// Declares the topology and publishes raw bytes to the intake exchange,
/// as any AMQP producer could.
pub async fn publish_raw(url: &str, prefix: &str, payload: &[u8], headers: Option<FieldTable>) {
    let intake = format!("{prefix}.notifications");
    let items = [(payload.to_vec(), headers.unwrap_or_default())];
    publish_confirmed(url, prefix, &intake, "", &items).await;
}

#[derive(Debug)]
pub struct DeadLetter {
    pub headers: FieldTable,
    pub body: Vec<u8>,
}

impl DeadLetter {
    pub fn get(&self, k: &str) -> Option<&AMQPValue> {
        self.headers.inner().get(k)
    }
    pub fn str(&self, k: &str) -> Option<String> {
        self.get(k).and_then(redeliver::message::state::string)
    }
    pub fn int(&self, k: &str) -> Option<i64> {
        self.get(k).and_then(redeliver::message::state::int)
    }
}

/// Takes every message off the dead-letter queue (none when it is missing).
pub async fn drain_dead(url: &str, prefix: &str) -> Vec<DeadLetter> {
    let conn = AmqpUrl::new(url).connect("test dead").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("{prefix}.dead");
    let mut out = vec![];
    loop {
        let got = ch
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await;
        let m = match got {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) if e.is_amqp_soft_error() => break,
            Err(e) => panic!("basic.get on {queue}: {e}"),
        };
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        out.push(DeadLetter {
            headers,
            body: m.delivery.data.clone(),
        });
    }
    let _ = conn.close(200, "".into()).await;
    out
}

/// Messages and consumers of a queue (passive declare), or `None` when it
/// does not exist.
async fn queue_counts(url: &str, queue: &str) -> Option<(u32, u32)> {
    let conn = AmqpUrl::new(url).connect("test count").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await;
    let _ = conn.close(200, "".into()).await;
    q.ok().map(|q| (q.message_count(), q.consumer_count()))
}

/// Message count of a queue (passive declare).
pub async fn queue_len(url: &str, queue: &str) -> u32 {
    let counts = queue_counts(url, queue).await;
    counts.unwrap_or_else(|| panic!("{queue} exists")).0
}

/// Waits (up to 15 s) until `queue` exists and has a consumer.
pub async fn wait_consumers(url: &str, queue: &str) -> bool {
    for _ in 0..150 {
        if queue_counts(url, queue).await.is_some_and(|(_, c)| c > 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A `redeliver::delay::hold::run` task, for tests that consume the work queue
/// themselves but need the cascade's short delays held.
pub struct Holder {
    token: CancellationToken,
    join: JoinHandle<Result<(), redeliver::delay::hold::HoldError>>,
}

impl Holder {
    pub fn spawn(b: &BrokerSettings) -> Holder {
        let (b, token) = (b.clone(), CancellationToken::new());
        let t = token.clone();
        let join = tokio::spawn(async move { redeliver::delay::hold::run(&b, t).await });
        Holder { token, join }
    }

    /// Stops it and returns how it ended.
    pub async fn stop(self) -> Result<(), redeliver::delay::hold::HoldError> {
        self.token.cancel();
        let r = tokio::time::timeout(Duration::from_secs(40), self.join).await;
        r.expect("holder stops").expect("holder task")
    }
}

/// Drains the dead-letter queue until it has given at least `n` (about
/// 10 s at most), returning what it gave.
pub async fn wait_dead(url: &str, p: &str, n: usize) -> Vec<DeadLetter> {
    let mut dead = vec![];
    for _ in 0..100 {
        dead.extend(drain_dead(url, p).await);
        if dead.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dead
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub async fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// Deletes the prefix's exchanges and queues.
pub async fn cleanup(url: &str, prefix: &str) {
    let conn = AmqpUrl::new(url).connect("test cleanup").await.unwrap();
    // Both backends' names; deleting what does not exist is a no-op.
    let _ = redeliver::delay::delete(&Topology::new(prefix), &conn).await;
    let _ = conn.close(200, "".into()).await;
}

/// Publishes straight into a queue (default exchange), with confirms.
pub async fn publish_to_queue(
    url: &str,
    prefix: &str,
    queue: &str,
    items: &[(Vec<u8>, FieldTable)],
) {
    publish_confirmed(url, prefix, "", queue, items).await;
}

/// Declares the prefix's topology, then publishes persistent messages with
/// confirms.
async fn publish_confirmed(
    url: &str,
    prefix: &str,
    exchange: &str,
    key: &str,
    items: &[(Vec<u8>, FieldTable)],
) {
    let b = broker(url, prefix);
    let conn = b.url.connect("test publish").await.unwrap();
    redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    for (payload, headers) in items {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers.clone());
        let opts = BasicPublishOptions::default();
        let confirm = ch
            .basic_publish(exchange.into(), key.into(), opts, payload, props)
            .await
            .unwrap();
        assert!(
            confirm.await.unwrap().is_ack(),
            "the broker confirmed the message"
        );
    }
    let _ = conn.close(200, "".into()).await;
}

/// Runs the built `redeliver` binary with the broker and prefix set.
pub fn cli(url: &str, prefix: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_redeliver"))
        .args(["--amqp-url", url, "--prefix", prefix])
        .args(["--delay-backend", super::backend_of(prefix).as_str()])
        .args(args)
        .output()
        .expect("run redeliver")
}

/// SIGTERM: a graceful stop.
pub fn sigterm(c: &std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
}

/// Waits for `c` to exit; kills it and fails the test after `within`.
pub fn wait_exit(c: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > within {
            let _ = c.kill();
            panic!("redeliver run did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn stdout(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "redeliver failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
