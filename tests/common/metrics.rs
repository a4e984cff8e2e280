//! A worker process's admin endpoint: a free port for `--admin-addr`, and
//! values read from its `/metrics` (Prometheus text).

use std::process::Command;
use std::time::Duration;

use super::app::TestApp;
use super::harness::{wait_until, wait_until_async};
use super::process::Proc;
use super::receiver::Receiver;

/// A port that was free a moment ago, for `--admin-addr 127.0.0.1:PORT`.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The worker's `/metrics` text, or `None` while it does not answer.
pub async fn scrape(admin: u16) -> Option<String> {
    let url = format!("http://127.0.0.1:{admin}/metrics");
    reqwest::get(url).await.ok()?.text().await.ok()
}

/// The value of metric `name` whose labels contain every one of
/// `labels` (e.g. `endpoint="127.0.0.1:4000"`); `None` if absent.
pub fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.trim().parse().ok())
}

/// `endpoint="host:port"`: the label of the receiver's endpoint.
pub fn endpoint_label(rx: &Receiver) -> String {
    let host_port = rx
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    format!("endpoint=\"{host_port}\"")
}

/// `redeliver run` with `args` and an admin endpoint; returns the process
/// (killed on drop) and the admin port.
pub fn run_with_admin(app: &TestApp, args: &[&str]) -> (Proc, u16) {
    let admin = free_port();
    let mut cmd = app.command();
    cmd.arg("run").args(args);
    cmd.arg("--admin-addr").arg(format!("127.0.0.1:{admin}"));
    (Proc::spawn(cmd), admin)
}

/// Polls metric `name` (with `labels`) every 50 ms until `ok` holds for its
/// value, for at most `within`; returns the last value read.
pub async fn wait_metric(
    admin: u16,
    name: &str,
    labels: &[&str],
    within: Duration,
    ok: impl Fn(f64) -> bool,
) -> Option<f64> {
    let deadline = std::time::Instant::now() + within;
    let mut last = None;
    loop {
        if let Some(text) = scrape(admin).await {
            last = value(&text, name, labels);
            if last.is_some_and(&ok) {
                return last;
            }
        }
        if std::time::Instant::now() > deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `redeliver run ARGS` from `cmd`, its log format left to the default
/// (JSON, as stderr is not a terminal).
pub fn start(mut cmd: Command, args: &[&str]) -> Proc {
    cmd.arg("run").args(args);
    Proc::spawn(cmd)
}

/// The admin endpoint's URL, once the worker has logged it.
pub async fn admin(w: &Proc) -> String {
    let addr = || {
        w.json().into_iter().find_map(|v| {
            let m = v["message"].as_str()?.starts_with("admin endpoint");
            m.then(|| v["addr"].as_str().map(str::to_string)).flatten()
        })
    };
    let logged = wait_until(Duration::from_secs(10), || addr().is_some()).await;
    assert!(logged, "no admin address logged: {:?}", w.stderr());
    format!("http://{}", addr().unwrap())
}

pub async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The status of `url`, or `None` when nothing answers.
pub async fn status(url: &str) -> Option<u16> {
    reqwest::get(url).await.ok().map(|r| r.status().as_u16())
}

pub async fn ready(admin: &str) -> bool {
    let readyz = format!("{admin}/readyz");
    wait_until_async(Duration::from_secs(10), async || {
        status(&readyz).await == Some(200)
    })
    .await
}
