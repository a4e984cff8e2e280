//! [`TestApp`]: one test's prefix on one broker, and everything a test does
//! with it (workers, publishes, the dead-letter queue, the binary). Dropping
//! it deletes the prefix's queues and exchanges, also when the test fails.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lapin::types::FieldTable;
use redeliver::config::{AmqpUrl, BrokerSettings, WorkerSettings};
use redeliver::delay::DelayBackend;
use redeliver::topology::{QueueType, Topology};
use redeliver::HttpDeliverer;
use tokio_util::sync::CancellationToken;

use super::harness::{self, DeadLetter, Holder, Running, Worker};

/// How long dropping a [`TestApp`] may take to delete its prefix (a
/// cascade prefix is 120 quorum queues) before it gives up.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long dropping a [`TestApp`] waits for the workers it cancels to end
/// (they run on the test's runtime, which may be a single thread: blocked).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A test's own prefix on a broker, with the delay backend its workers,
/// publishes and CLI calls use. Deletes the prefix when dropped.
pub struct TestApp {
    pub url: String,
    pub prefix: String,
    pub backend: DelayBackend,
    /// Workers and holders started through the app, stopped before the
    /// prefix is deleted so none re-declares it.
    tasks: Mutex<Vec<(CancellationToken, Running)>>,
    /// Queues and exchanges outside the prefix's topology to delete too.
    extra: Mutex<(Vec<String>, Vec<String>)>,
}

impl TestApp {
    /// A fresh prefix on the shared test node ([`super::broker_url`]), for
    /// both backends. The cascade needs no plugin (tests/cascade.rs proves
    /// it on the plain system broker), but it declares 120 quorum queues
    /// per prefix, and the Debian broker's default limit of 1,024 file
    /// descriptors lets RabbitMQ 3.x hold only ~300 quorum queues before new
    /// connections block; the test node runs with 20,000.
    pub fn new(test: &str, backend: DelayBackend) -> TestApp {
        TestApp::on(&super::broker_url(), test, backend)
    }

    /// A fresh prefix on a given broker (the plain broker, a private node).
    pub fn on(url: &str, test: &str, backend: DelayBackend) -> TestApp {
        TestApp {
            url: url.to_string(),
            prefix: super::prefix(&format!("{}-{test}", backend.as_str())),
            backend,
            tasks: Mutex::new(vec![]),
            extra: Mutex::new((vec![], vec![])),
        }
    }

    pub fn broker(&self) -> BrokerSettings {
        BrokerSettings {
            url: AmqpUrl::new(&self.url),
            prefix: self.prefix.clone(),
            queue_type: QueueType::Quorum,
            delay: self.backend,
        }
    }

    /// `<prefix>.<suffix>`, e.g. `app.name("work")`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    /// Also deletes these queues and exchanges (outside the prefix's
    /// topology, e.g. a contract test's own) when the app is dropped.
    pub fn delete_on_drop(&self, queues: &[&str], exchanges: &[&str]) {
        let mut extra = self.extra.lock().unwrap_or_else(|e| e.into_inner());
        extra.0.extend(queues.iter().map(|q| q.to_string()));
        extra.1.extend(exchanges.iter().map(|x| x.to_string()));
    }

    /// A worker in-process with an `HttpDeliverer` (5 s timeout).
    pub fn spawn_worker(&self, settings: WorkerSettings) -> Worker {
        let handler = HttpDeliverer::new(Duration::from_secs(5), settings.concurrency).unwrap();
        self.spawn_worker_with(settings, handler)
    }

    /// A worker with a handler of the test's choosing.
    pub fn spawn_worker_with(
        &self,
        settings: WorkerSettings,
        handler: impl redeliver::DeliveryHandler,
    ) -> Worker {
        let w = Worker::spawn(self.broker(), settings, handler);
        self.track(&w.token, w.running());
        w
    }

    /// A `redeliver::delay::hold::run` task, for tests that consume the
    /// work queue themselves but need the cascade's short delays held.
    pub fn spawn_holder(&self) -> Holder {
        let h = Holder::spawn(&self.broker());
        self.track(h.token(), h.running());
        h
    }

    fn track(&self, token: &CancellationToken, running: &Running) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.push((token.clone(), running.clone()));
    }

    /// Publishes notifications (JSON objects or their exact text) through
    /// the library, with confirms; returns their ids.
    pub async fn publish(&self, notifications: &[impl ToString]) -> Vec<String> {
        harness::publish(&self.broker(), notifications).await
    }

    /// Declares the topology and publishes raw bytes to the intake
    /// exchange, as any AMQP producer could.
    pub async fn publish_raw(&self, payload: &[u8], headers: Option<FieldTable>) {
        let items = [(payload.to_vec(), headers.unwrap_or_default())];
        let intake = self.name("notifications");
        harness::publish_confirmed(&self.broker(), &intake, "", &items).await;
    }

    /// Declares the topology and publishes straight into the queue
    /// `<prefix>.<suffix>` (default exchange), with confirms.
    /// Publishes to `<prefix>.<suffix>`; "work" means the lanes exchange
    /// with a key no bucket has, so lane 0 (through its alternate).
    pub async fn publish_to_queue(&self, suffix: &str, items: &[(Vec<u8>, FieldTable)]) {
        let (exchange, key) = match suffix {
            "work" => (self.name("lanes"), String::new()),
            _ => (String::new(), self.name(suffix)),
        };
        harness::publish_confirmed(&self.broker(), &exchange, &key, items).await;
    }

    /// The lane (`work.<k>` suffix) notifications to `url` travel in, with
    /// the default lane count.
    pub fn lane_for(&self, url: &str) -> String {
        use redeliver::topology::lanes;
        let key = lanes::key_for_url(&url::Url::parse(url).expect("a URL"));
        let k = lanes::lane_of_key(&key, redeliver::config::DEFAULT_LANES);
        format!("work.{k}")
    }

    /// `<prefix>.<suffix>`, or for "work" every lane of the default count.
    pub fn queues(&self, suffix: &str) -> Vec<String> {
        match suffix {
            "work" => (0..redeliver::config::DEFAULT_LANES)
                .map(|k| self.name(&format!("work.{k}")))
                .collect(),
            _ => vec![self.name(suffix)],
        }
    }

    /// Takes every message off the dead-letter queue (none when it is missing).
    pub async fn drain_dead(&self) -> Vec<DeadLetter> {
        self.drain_queue("dead").await
    }

    /// Takes every message off `<prefix>.<suffix>` (none when it is missing).
    pub async fn drain_queue(&self, suffix: &str) -> Vec<DeadLetter> {
        let mut all = Vec::new();
        for queue in self.queues(suffix) {
            all.extend(harness::drain(&self.url, &queue).await);
        }
        all
    }

    /// Drains the dead-letter queue until it has given at least `n` (about
    /// 10 s at most), returning what it gave.
    pub async fn wait_dead(&self, n: usize) -> Vec<DeadLetter> {
        // A loop, not `wait_until_async`: its async closure would make this
        // future not provably `Send`, so unusable in `tokio::spawn`.
        let (mut dead, deadline) = (vec![], Instant::now() + Duration::from_secs(10));
        loop {
            dead.extend(self.drain_dead().await);
            if dead.len() >= n || Instant::now() > deadline {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ready messages in `<prefix>.<suffix>` (passive declare); panics when
    /// the queue does not exist.
    /// Ready messages of `<prefix>.<suffix>`; for "work", of every lane
    /// that exists (a producer declares lane 0 alone, the workers the rest).
    pub async fn queue_len(&self, suffix: &str) -> u32 {
        let mut n = None;
        for queue in self.queues(suffix) {
            if let Some((ready, _)) = harness::queue_counts(&self.url, &queue).await {
                n = Some(n.unwrap_or(0) + ready);
            }
        }
        n.unwrap_or_else(|| panic!("{}.{suffix} exists", self.prefix))
    }

    /// Waits (up to 15 s) until `<prefix>.<suffix>` exists and has a consumer.
    pub async fn wait_consumers(&self, suffix: &str) -> bool {
        self.wait_consumer_count(suffix, 1).await
    }

    /// Waits (up to 60 s) until `<prefix>.<suffix>` has `n` consumers or more.
    /// A worker's start declares its queues (the cascade's 120 among them),
    /// which took over 15 s on a busy CI node; a test that passes waits
    /// only as long as the start takes.
    pub async fn wait_consumer_count(&self, suffix: &str, n: u32) -> bool {
        self.wait_consumer_count_within(suffix, n, Duration::from_secs(60))
            .await
    }

    /// [`TestApp::wait_consumer_count`], up to `within`.
    pub async fn wait_consumer_count_within(&self, suffix: &str, n: u32, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let mut all = true;
            for queue in self.queues(suffix) {
                let counts = harness::queue_counts(&self.url, &queue).await;
                all &= counts.is_some_and(|(_, c)| c >= n);
            }
            if all {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The binary with `--amqp-url`, `--prefix` and `--delay-backend` set.
    pub fn command(&self) -> std::process::Command {
        self.command_via(&self.url)
    }

    /// [`TestApp::command`] reaching the broker at another URL: its amqps://
    /// listener, wrong credentials, the plain broker.
    pub fn command_via(&self, url: &str) -> std::process::Command {
        command_for(url, &self.prefix, self.backend)
    }

    /// Runs [`TestApp::command`] with `args` and returns its output.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.command().args(args).output().expect("run redeliver")
    }
}

impl Drop for TestApp {
    /// Stops the workers and holders still running, then deletes the
    /// prefix's queues and exchanges of both backends, on a thread of its
    /// own with its own runtime (this may run on a runtime's worker, or
    /// while a panic unwinds), and never panics.
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let extra = std::mem::take(&mut *self.extra.lock().unwrap_or_else(|e| e.into_inner()));
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        let cleaner = std::thread::spawn(move || {
            stop(&tasks);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                // The timer is made inside the runtime: outside, it panics.
                let deleted = delete_prefix(&url, &prefix, &extra);
                let _ = rt.block_on(async { tokio::time::timeout(CLEANUP_TIMEOUT, deleted).await });
            }
        });
        let _ = cleaner.join();
    }
}

/// Cancels the tasks and waits (a while) for them to end. From a thread
/// outside the runtime, so the wake-ups go to its shared queue, which every
/// worker takes from, not to this (blocked) worker's own slot.
fn stop(tasks: &[(CancellationToken, Running)]) {
    tasks.iter().for_each(|(token, _)| token.cancel());
    let deadline = Instant::now() + STOP_TIMEOUT;
    while tasks.iter().any(|(_, r)| r.is_running()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Deletes a prefix's topology (both backends' names; deleting what does
/// not exist is a no-op) and the extra queues and exchanges.
async fn delete_prefix(url: &str, prefix: &str, extra: &(Vec<String>, Vec<String>)) {
    let Ok(conn) = AmqpUrl::new(url).connect("test cleanup").await else {
        return;
    };
    let _ = redeliver::delay::delete(&Topology::new(prefix), &conn).await;
    for q in &extra.0 {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
        }
    }
    for x in &extra.1 {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .exchange_delete(x.as_str().into(), Default::default())
                .await;
        }
    }
    let _ = conn.close(200, "".into()).await;
}

/// The binary with `--amqp-url`, `--prefix` and `--delay-backend` set.
pub(super) fn command_for(url: &str, prefix: &str, backend: DelayBackend) -> std::process::Command {
    let mut c = redeliver_command();
    c.args(["--amqp-url", url, "--prefix", prefix])
        .args(["--delay-backend", backend.as_str()]);
    c
}

/// The one way to start the binary: `redeliver` with no `REDELIVER_*`
/// variable of this shell, so only what a test sets applies.
pub fn redeliver_command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_redeliver"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("REDELIVER_") {
            c.env_remove(k);
        }
    }
    c
}
