//! What [`super::app::TestApp`] builds on: in-process workers and holders,
//! publishing, dead letters, queue counts, and waiting on conditions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use redeliver::config::{AmqpUrl, BrokerSettings, WorkerSettings};
use redeliver::policy::{parse_schedule, Backoff, RetryPolicy};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A `redeliver::run` task, stopped and checked with [`Worker::stop`]; the
/// [`super::TestApp`] that started it stops it when a test fails first.
pub struct Worker {
    pub token: CancellationToken,
    pub join: JoinHandle<Result<(), redeliver::worker::WorkerError>>,
    running: Running,
}

/// Held by a spawned task until it ends: the task runs while a clone is
/// alive beyond this one.
#[derive(Clone, Default)]
pub struct Running(Arc<()>);

impl Running {
    pub fn is_running(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

impl Worker {
    pub fn spawn(
        b: BrokerSettings,
        settings: WorkerSettings,
        handler: impl redeliver::DeliveryHandler,
    ) -> Worker {
        let (token, running) = (CancellationToken::new(), Running::default());
        let (t, r) = (token.clone(), running.clone());
        let join = tokio::spawn(async move {
            let _running = r;
            redeliver::run(&b, settings, handler, t).await
        });
        Worker {
            token,
            join,
            running,
        }
    }

    pub fn running(&self) -> &Running {
        &self.running
    }

    pub async fn stop(self) {
        self.token.cancel();
        let r = tokio::time::timeout(Duration::from_secs(40), self.join).await;
        r.expect("worker stops")
            .expect("worker task")
            .expect("worker result");
    }
}

/// A `redeliver::delay::hold::run` task, for tests that consume the work queue
/// themselves but need the cascade's short delays held.
pub struct Holder {
    token: CancellationToken,
    join: JoinHandle<Result<(), redeliver::delay::hold::HoldError>>,
    running: Running,
}

impl Holder {
    pub fn spawn(b: &BrokerSettings) -> Holder {
        let (b, token, running) = (b.clone(), CancellationToken::new(), Running::default());
        let (t, r) = (token.clone(), running.clone());
        let join = tokio::spawn(async move {
            let _running = r;
            redeliver::delay::hold::run(&b, t).await
        });
        Holder {
            token,
            join,
            running,
        }
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn running(&self) -> &Running {
        &self.running
    }

    /// Stops it and returns how it ended.
    pub async fn stop(self) -> Result<(), redeliver::delay::hold::HoldError> {
        self.token.cancel();
        let r = tokio::time::timeout(Duration::from_secs(40), self.join).await;
        r.expect("holder stops").expect("holder task")
    }
}

pub fn schedule_settings(schedule: &str, max_attempts: u32, concurrency: usize) -> WorkerSettings {
    let mut s = WorkerSettings {
        concurrency,
        policy: RetryPolicy {
            max_attempts,
            backoff: Backoff::Schedule(parse_schedule(schedule).unwrap()),
        },
        ..Default::default()
    };
    // Tests of other features run on the default per-endpoint isolation
    // (an adaptive limit; alone, an endpoint earns every slot), but
    // without the breaker: some hang or refuse on purpose, and the breaker
    // would defer what they test. tests/isolation.rs turns it on.
    s.endpoints.breaker.failures = 0;
    s
}

/// Publishes notifications through the library, with confirms.
pub(super) async fn publish(b: &BrokerSettings, notifications: &[impl ToString]) -> Vec<String> {
    let conn = b.url.connect("test publish").await.unwrap();
    let t = redeliver::delay::declare_topology(b, &conn).await.unwrap();
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

/// Declares the prefix's topology, then publishes persistent messages with
/// confirms.
pub(super) async fn publish_confirmed(
    b: &BrokerSettings,
    exchange: &str,
    key: &str,
    items: &[(Vec<u8>, FieldTable)],
) {
    let conn = b.url.connect("test publish").await.unwrap();
    redeliver::delay::declare_topology(b, &conn).await.unwrap();
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

/// Takes every message off `queue` (none when it is missing).
pub(super) async fn drain(url: &str, queue: &str) -> Vec<DeadLetter> {
    let conn = AmqpUrl::new(url).connect("test drain").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut out = vec![];
    loop {
        let got = ch.basic_get(queue.into(), BasicGetOptions { no_ack: true });
        let m = match got.await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) if e.is_amqp_soft_error() => break,
            // RabbitMQ 4.0 closes the connection when a quorum queue's
            // process is not running yet (just redeclared): nothing to
            // take this time; the callers poll.
            Err(e) if e.to_string().contains("noproc") => break,
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

/// The bodies [`drain`] takes.
pub async fn drain_url(url: &str, queue: &str) -> Vec<Vec<u8>> {
    drain(url, queue)
        .await
        .into_iter()
        .map(|d| d.body)
        .collect()
}

/// Messages and consumers of a queue (passive declare), or `None` when it
/// does not exist.
pub async fn queue_counts(url: &str, queue: &str) -> Option<(u32, u32)> {
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

/// Polls the async `cond` (a broker query, an HTTP call) every 50 ms until
/// it holds or `timeout` passes.
pub async fn wait_until_async(timeout: Duration, cond: impl AsyncFnMut() -> bool) -> bool {
    poll_every(Duration::from_millis(50), timeout, cond).await
}

/// Polls the async `cond` every `interval` until it holds or `timeout`
/// passes: a wide interval for costly checks (`rabbitmqctl`), a narrow one
/// to catch a moment.
pub async fn poll_every(
    interval: Duration,
    timeout: Duration,
    mut cond: impl AsyncFnMut() -> bool,
) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond().await {
            return true;
        }
        tokio::time::sleep(interval).await;
    }
    cond().await
}

/// A deliberate quiet window, not a wait for something: asserts that
/// `count` (e.g. requests received) does not change for `window`, so a
/// late duplicate or an extra attempt would be seen. Returns the count.
pub async fn assert_quiet_for(window: Duration, what: &str, count: impl Fn() -> usize) -> usize {
    let before = count();
    tokio::time::sleep(window).await;
    let after = count();
    assert_eq!(after, before, "{what}: more arrived within {window:?}");
    after
}

/// RabbitMQ 3.10 persists a quorum queue's Ra registration lazily: one
/// declared seconds before a broker `kill -9` comes back without a leader.
/// So does the stream coordinator, started by a node's first stream: a
/// kill -9 seconds after it loses every stream of the node ("home node
/// ... is down or inaccessible" at each declare, seen with the history
/// stream that every worker declares).
/// Nothing observable says when it is safe, so tests that kill the broker
/// let the queues age this long first.
pub async fn let_quorum_queues_age() {
    tokio::time::sleep(Duration::from_secs(3)).await;
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
            panic!("redeliver did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stdout of a successful run; fails the test with its stderr otherwise.
pub fn stdout(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "redeliver failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
