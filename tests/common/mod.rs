//! Test helpers shared by the integration tests: the local broker node,
//! AMQP connections, per-test name prefixes, and [`TestApp`], through which
//! the tests use a prefix and start the binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use lapin::{Connection, ConnectionProperties};

/// Port of the shared test node (see `tests/broker/ctl`), before
/// [`node_port`].
pub fn default_port() -> u16 {
    std::env::var("REDELIVER_TEST_BROKER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(5674)
}

/// Whether the test nodes run RabbitMQ 4.x (`REDELIVER_TEST_RABBITMQ=4` or
/// `4.0`, read as `tests/broker/ctl` and the library read it): CI runs the
/// broker-facing suites once on 3.10 and once on 4.3.
pub fn rabbitmq4() -> bool {
    redeliver::ops::test_rabbitmq().0.is_some()
}

/// The port a test's node really listens on: as far from its 3.10 port as
/// the version's default node is from 5674 (4.3: 100, 4.0: 200), so one
/// version's pass never meets another's node left running by the pass
/// before it. Every ctl call goes through here. But the cluster's nodes
/// (`tests/broker/ctl cluster`): their ports are the same under every
/// version, one cluster at a time.
pub fn node_port(port: u16) -> u16 {
    if cluster::ports().contains(&port) {
        return port;
    }
    port + (redeliver::ops::test_rabbitmq().1 - 5674)
}

fn ctl_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/broker/ctl")
}

/// Runs `tests/broker/ctl ARGS` against the node on `port`; returns its last line.
pub fn ctl(port: u16, args: &[&str]) -> String {
    ctl_env(port, args, &[])
}

/// `ctl` with extra environment (e.g. the plugin's late-write mode).
pub fn ctl_env(port: u16, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(ctl_path())
        .args(args)
        .env("REDELIVER_TEST_BROKER_PORT", node_port(port).to_string())
        .envs(env.iter().copied())
        .output()
        .expect("tests/broker/ctl could not be run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/broker/ctl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_string()
}

/// Runs `tests/broker/ctl ARGS` and returns its whole stdout.
pub fn ctl_output(port: u16, args: &[&str]) -> String {
    let out = Command::new(ctl_path())
        .args(args)
        .env("REDELIVER_TEST_BROKER_PORT", node_port(port).to_string())
        .output()
        .expect("tests/broker/ctl could not be run");
    assert!(
        out.status.success(),
        "tests/broker/ctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// AMQP URL of the shared node with the `x-delayed-message` stand-in,
/// brought up once per test process (`ctl up` is idempotent and locked).
pub fn broker_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| ctl(default_port(), &["up"])).clone()
}

/// A broker without the `x-delayed-message` type: `REDELIVER_PLAIN_AMQP_URL`
/// when set, else the system broker on 5672 when one answers (3.10 only),
/// else (a fresh machine, or a 4.x pass) a ctl node on 5673 started without the stand-in
/// (`REDELIVER_TEST_BROKER_PLAIN=1`). Resolved once per test process.
pub fn plain_broker_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("REDELIVER_PLAIN_AMQP_URL") {
            url
        } else if !rabbitmq4() && local_port_answers(5672) {
            "amqp://guest:guest@127.0.0.1:5672/%2f".to_string()
        } else {
            ctl_env(5673, &["up"], &[("REDELIVER_TEST_BROKER_PLAIN", "1")])
        }
    })
    .clone()
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
fn local_port_answers(port: u16) -> bool {
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).is_ok()
}

/// A fresh name prefix, so parallel tests never share queues or exchanges.
pub fn prefix(test: &str) -> String {
    format!(
        "t-{test}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

pub async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("AMQP connection to the test broker")
}

/// Takes a private node down when the last of the `users` tests that share
/// it ends, passed or failed (Drop runs while a panic unwinds).
pub struct DownWhenLast {
    pub port: u16,
    pub users: usize,
    pub finished: &'static std::sync::atomic::AtomicUsize,
}

impl Drop for DownWhenLast {
    fn drop(&mut self) {
        let key = format!("node-{}", node_port(self.port));
        if last_to_finish(&key, self.users, self.finished) {
            let port = self.port;
            let _ = std::panic::catch_unwind(|| ctl(port, &["down"]));
        }
    }
}

/// Counts one more finished test of the `users` that share `key` (a node,
/// the cluster); true for the last. `cargo test` runs them as threads of
/// one process, which `finished` counts. nextest runs each in a process of
/// its own, so there the count is a file of the run (`NEXTEST_RUN_ID`),
/// taken under a lock: otherwise no test would ever be the last, and the
/// idle node would take CPU from the rest of the run.
pub fn last_to_finish(key: &str, users: usize, finished: &std::sync::atomic::AtomicUsize) -> bool {
    use std::io::{Read, Seek, Write};
    let Ok(run) = std::env::var("NEXTEST_RUN_ID") else {
        let before = finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return before + 1 == users;
    };
    let path = std::env::temp_dir().join(format!("redeliver-finished-{key}-{run}"));
    let count = (|| -> std::io::Result<usize> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        f.lock()?;
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let count = text.trim().parse::<usize>().unwrap_or(0) + 1;
        f.set_len(0)?;
        f.rewind()?;
        write!(f, "{count}")?;
        Ok(count)
    })();
    let last = count.is_ok_and(|n| n == users);
    if last {
        let _ = std::fs::remove_file(&path);
    }
    last
}

/// Runs each `async fn NAME(DelayBackend)` as two tests, `plugin::NAME` and
/// `cascade::NAME`: one body, both backends.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod plugin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(redeliver::delay::DelayBackend::Plugin).await
                }
            )*
        }
        mod cascade {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(redeliver::delay::DelayBackend::Cascade).await
                }
            )*
        }
    };
}

pub mod app;
pub mod cascade;
pub mod chaos;
pub mod cluster;
pub mod console;
pub mod dead_letters;
pub mod delayed;
pub mod endpoints;
pub mod events;
pub mod gate;
pub mod harness;
pub mod metrics;
pub mod otlp;
pub mod process;
pub mod proxy;
pub mod receiver;
pub mod tls_front;

#[allow(unused_imports)] // not every test file starts the binary
pub use app::{redeliver_command, TestApp};
