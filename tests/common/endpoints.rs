//! The `redeliver endpoint` commands from outside: run them, read `endpoint
//! show --json`, and wait for workers to have a change in force (their
//! `redeliver_endpoints{state}` gauge).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::app::TestApp;
use super::metrics::wait_metric;
use super::receiver::Receiver;

/// `redeliver endpoint ARGS`, which must succeed; returns its stdout.
pub fn endpoint(app: &TestApp, args: &[&str]) -> String {
    let out = endpoint_output(app, args);
    assert!(
        out.status.success(),
        "endpoint {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `redeliver endpoint ARGS`, whatever it does.
pub fn endpoint_output(app: &TestApp, args: &[&str]) -> std::process::Output {
    let mut all = vec!["endpoint"];
    all.extend_from_slice(args);
    app.cli(&all)
}

/// `endpoint show TARGET --json`, or `None` when it fails.
pub fn show(app: &TestApp, target: &str) -> Option<Value> {
    let out = endpoint_output(app, &["show", target, "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The history entries of `target` that are `what` (e.g. `disabled`).
pub fn history_count(v: &Value, what: &str) -> usize {
    v["history"]
        .as_array()
        .map_or(0, |h| h.iter().filter(|e| e["what"] == what).count())
}

/// The receiver's origin, as operators name it: `http://127.0.0.1:PORT`.
pub fn origin(rx: &Receiver) -> String {
    rx.base.clone()
}

/// Every record on the prefix's endpoint-state stream, as the documented
/// wire format has them (JSON), read up to a marker of the test's own.
pub async fn stream_records(app: &TestApp) -> Vec<Value> {
    use redeliver::control::{record, stream};
    let conn = app.broker().url.connect("test stream read").await.unwrap();
    let name = redeliver::topology::Topology::new(&app.prefix).endpoint_state;
    let writer = stream::Writer::open(&conn, &name).await.unwrap();
    let mut reader = stream::Reader::open(&conn, &name).await.unwrap();
    let marker = record::Record::new(0, "test", record::Change::Sync);
    writer.append(&marker).await.unwrap();
    let mut out = vec![];
    while let Some((_, r)) = reader.next().await.unwrap() {
        let Some(r) = r else { continue };
        if r.id == marker.id {
            break;
        }
        out.push(serde_json::from_slice(&r.to_json()).unwrap());
    }
    let _ = conn.close(200, "".into()).await;
    out
}

/// Waits until the worker behind `admin` counts `n` targets in `state`.
pub async fn in_force(admin: u16, state: &str, n: f64) -> bool {
    let label = format!("state=\"{state}\"");
    let got = wait_metric(
        admin,
        "redeliver_endpoints",
        &[&label],
        Duration::from_secs(10),
        |v| v == n,
    )
    .await;
    got == Some(n)
}

/// Polls `endpoint show` until `target`'s state is `state`, for `within`.
pub async fn wait_state(app: &TestApp, target: &str, state: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let now = show(app, target);
        if now.as_ref().is_some_and(|v| v["state"] == state) {
            return true;
        }
        if Instant::now() > deadline {
            println!("last show of {target}: {now:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Distinct ids the receiver answered 2xx.
pub fn delivered(rx: &Receiver) -> std::collections::HashSet<String> {
    rx.requests()
        .iter()
        .filter(|r| (200..300).contains(&r.reply))
        .map(|r| r.id())
        .collect()
}

/// Waits until the receiver delivered every one of `ids`.
pub async fn all_delivered(rx: &Receiver, ids: &[String], within: Duration) -> bool {
    let want = ids.len();
    super::harness::wait_until(within, || {
        let got = delivered(rx);
        ids.iter().filter(|id| got.contains(*id)).count() == want
    })
    .await
}
