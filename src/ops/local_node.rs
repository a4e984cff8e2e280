//! The local test broker node that `tests/broker/ctl` runs, so that
//! `cargo run -- demo` on a fresh checkout needs no set-up: when nothing
//! answers on the node's port, it is started (and, on first use, the Debian
//! packages it needs are installed by `ctl`).

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;

/// The port `tests/broker/ctl` uses when `REDELIVER_TEST_BROKER_PORT` is unset
/// (for RabbitMQ 3.10; see [`test_rabbitmq`] for 4.x).
const DEFAULT_PORT: u16 = 5674;

/// How long a connect to 127.0.0.1 may take before the port counts as
/// silent; a local listener answers at once, this only guards a wedged stack.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The local test node's URL (port from `REDELIVER_TEST_BROKER_PORT`, default 5674).
pub fn url() -> String {
    url_for(port())
}

fn url_for(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// The running local node's OS process id, from the pid file `ctl` keeps
/// under `target/test-broker/` (`None`: not running from this checkout).
pub fn pid() -> Option<u32> {
    let (suite, port) = (test_rabbitmq().0, port());
    let dir = match suite {
        Some(suite) => format!("node-{suite}-{port}"),
        None => format!("node-{port}"),
    };
    pid_in(&dir)
}

/// The OS process id of a node `ctl` runs on `port` without a suite (a
/// node of the local cluster, say).
pub fn pid_at(port: u16) -> Option<u32> {
    pid_in(&format!("node-{port}"))
}

fn pid_in(dir: &str) -> Option<u32> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-broker")
        .join(dir)
        .join("node.pid");
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Whether `url` names this checkout's running local node: one plain
/// `amqp://` URL on 127.0.0.1 or localhost at its port, with a pid file.
/// Only then may the bench restart the node it measures.
pub fn is_named_by(url: &crate::config::AmqpUrl) -> bool {
    names(url.urls(), port()) && pid().is_some()
}

fn names(urls: &[String], port: u16) -> bool {
    let [one] = urls else { return false };
    let Ok(uri) = one.parse::<lapin::uri::AMQPUri>() else {
        return false;
    };
    let host = uri.authority.host.as_str();
    uri.scheme == lapin::uri::AMQPScheme::AMQP
        && uri.authority.port == port
        && matches!(host, "127.0.0.1" | "localhost")
}

/// Restarts the local node with `tests/broker/ctl restart` (a clean stop,
/// then `up`), for the bench's crash phase. Its clients lose their
/// connections; it returns once the node accepts them again.
pub async fn restart() -> anyhow::Result<()> {
    run_ctl(port(), &ctl_path(), "restart").await
}

/// Sends SIGKILL to the local node's process (no clean stop: what the
/// node had not written is lost, as in a crash) and returns once the
/// process is gone, so that `ctl up` starts a new one rather than wait
/// for the dying one. The caller takes the moment before the call as the
/// crash's.
pub async fn kill_9(pid: u32) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stdin(Stdio::null())
        .status()
        .await
        .context("running kill -9")?;
    anyhow::ensure!(status.success(), "kill -9 {pid} failed ({status})");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    for _ in 0..1000 {
        if !proc_dir.exists() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("the node's process {pid} was still there 10 s after kill -9")
}

/// Starts the local node again with `tests/broker/ctl up` (after
/// [`kill_9`]); returns once it accepts connections.
pub async fn start() -> anyhow::Result<()> {
    run_ctl(port(), &ctl_path(), "up").await
}

/// Runs an Erlang expression on the local node (`ctl rabbitmqctl eval`)
/// and returns the last line it printed: the bench's look into the delay
/// plugin's tables after a crash.
pub async fn eval(expr: &str) -> anyhow::Result<String> {
    let out = ctl_command(port(), &ctl_path(), &["rabbitmqctl", "eval", expr])
        .output()
        .await
        .context("running tests/broker/ctl rabbitmqctl eval")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "rabbitmqctl eval failed: {text}");
    Ok(text.lines().last().unwrap_or_default().trim().to_string())
}

/// The node's port, read the way `ctl` reads it, so the demo, the bench
/// and `cargo test` talk to the same node.
fn port() -> u16 {
    let (_, default) = test_rabbitmq();
    port_from(
        std::env::var("REDELIVER_TEST_BROKER_PORT").ok().as_deref(),
        default,
    )
}

/// A missing or unparsable value means the default rather than an error:
/// the caller only wants *a* local node.
fn port_from(value: Option<&str>, default: u16) -> u16 {
    value.and_then(|p| p.parse().ok()).unwrap_or(default)
}

/// The local test node's RabbitMQ, read from `REDELIVER_TEST_RABBITMQ` as
/// `tests/broker/ctl` reads it: the Debian suite a 4.x node runs from
/// (`None`: the machine's own 3.10) and the node's default port. The tests
/// put every node they start the same distance from its 3.10 port.
pub fn test_rabbitmq() -> (Option<&'static str>, u16) {
    version_of(std::env::var("REDELIVER_TEST_RABBITMQ").ok().as_deref())
}

fn version_of(value: Option<&str>) -> (Option<&'static str>, u16) {
    match value {
        Some("4" | "4.3") => (Some("forky"), DEFAULT_PORT + 100),
        Some("4.0") => (Some("trixie"), DEFAULT_PORT + 200),
        _ => (None, DEFAULT_PORT),
    }
}

/// Where `ctl` sat when this binary was built. A binary installed elsewhere
/// has no checkout beside it, which `ensure_running` reports.
fn ctl_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/ctl")
}

/// Makes sure the local test node answers, so the demo can run without a
/// broker set up by hand. If a TCP connect to 127.0.0.1:<port> succeeds,
/// does nothing and returns `Ok(false)`. Otherwise writes one line to `out`
/// (the start can take a minute the first time, when `ctl` installs Debian
/// packages), runs `tests/broker/ctl up` with its stderr going to ours, and
/// returns `Ok(true)` once it succeeded; an error with its exit status if not.
pub async fn ensure_running(out: &mut dyn Write) -> anyhow::Result<bool> {
    ensure_running_with(port(), &ctl_path(), out).await
}

/// [`ensure_running`] for a given port and `ctl`, so tests need no
/// environment variables.
async fn ensure_running_with(port: u16, ctl: &Path, out: &mut dyn Write) -> anyhow::Result<bool> {
    if answers(port).await {
        return Ok(false);
    }
    if !ctl.is_file() {
        anyhow::bail!(
            "no broker answers on 127.0.0.1:{port}, and {} (which starts the local test node) \
             is not here, as for an installed binary; start a RabbitMQ and pass --amqp-url",
            ctl.display()
        );
    }
    writeln!(
        out,
        "starting the local test broker node with tests/broker/ctl up \
         (the first start may install Debian packages)..."
    )
    .and_then(|()| out.flush())
    .context("writing the progress line")?;
    run_ctl_up(port, ctl).await?;
    Ok(true)
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
async fn answers(port: u16) -> bool {
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, connect).await,
        Ok(Ok(_))
    )
}

/// Runs `ctl up` as a child process, so a minute of apt-get and node start
/// blocks no runtime thread. The port is passed explicitly so that `ctl`
/// starts the node [`url`] names even when the variable did not parse. The
/// child is not killed if this future is dropped: `ctl` is locked and
/// idempotent, and an apt-get cut short would leave dpkg half-done.
async fn run_ctl_up(port: u16, ctl: &Path) -> anyhow::Result<()> {
    run_ctl(port, ctl, "up").await
}

/// `ctl ARGS` for the node on `port`, with no input.
fn ctl_command(port: u16, ctl: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(ctl);
    cmd.args(args)
        .env("REDELIVER_TEST_BROKER_PORT", port.to_string())
        .stdin(Stdio::null());
    cmd
}

/// `ctl VERB` for the node on `port`, its messages on our stderr.
async fn run_ctl(port: u16, ctl: &Path, verb: &str) -> anyhow::Result<()> {
    let status = ctl_command(port, ctl, &[verb])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .await
        .with_context(|| format!("running {} {verb}", ctl.display()))?;
    anyhow::ensure!(
        status.success(),
        "{} {verb} failed ({status}); its messages are above",
        ctl.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_defaults_and_parses() {
        assert_eq!(port_from(None, DEFAULT_PORT), 5674);
        assert_eq!(port_from(Some("5690"), DEFAULT_PORT), 5690);
        assert_eq!(version_of(Some("4")), (Some("forky"), 5774));
        assert_eq!(version_of(Some("4.0")), (Some("trixie"), 5874));
        assert_eq!(version_of(None), (None, 5674));
        assert_eq!(port_from(Some(""), DEFAULT_PORT), 5674);
        assert_eq!(port_from(Some("not-a-port"), DEFAULT_PORT), 5674);
        assert_eq!(port_from(Some("70000"), DEFAULT_PORT), 5674);
        assert_eq!(url_for(5690), "amqp://guest:guest@127.0.0.1:5690/%2f");
    }

    #[test]
    fn only_the_local_port_on_loopback_names_the_node() {
        let one = |u: &str| vec![u.to_string()];
        assert!(names(&one(&url_for(5702)), 5702));
        assert!(names(&one("amqp://u:p@localhost:5702/%2f"), 5702));
        assert!(!names(&one(&url_for(5702)), 5674));
        assert!(!names(&one("amqp://u:p@10.0.0.1:5702/%2f"), 5702));
        assert!(!names(&one("amqps://u:p@127.0.0.1:5702/%2f"), 5702));
        assert!(!names(&[url_for(5702), url_for(5703)], 5702));
    }

    #[tokio::test]
    async fn an_answering_port_is_left_alone() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind a local port");
        let port = listener.local_addr().expect("local address").port();
        let mut out = Vec::new();
        let started = ensure_running_with(port, Path::new("/nonexistent/ctl"), &mut out).await;
        assert!(!started.expect("no start needed"));
        assert!(out.is_empty(), "nothing is printed when the node answers");
    }

    #[tokio::test]
    async fn without_ctl_the_error_names_amqp_url() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = listener.local_addr().expect("local address").port();
        drop(listener);
        let mut out = Vec::new();
        let err = ensure_running_with(port, Path::new("/nonexistent/ctl"), &mut out)
            .await
            .expect_err("no ctl, no node");
        assert!(err.to_string().contains("--amqp-url"), "{err}");
        assert!(out.is_empty());
    }
}
