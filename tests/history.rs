//! The delivery history (issue 49): every attempt recorded on the stream
//! `<prefix>.history`, indexed by a console, asked through its API and the
//! `redeliver history` CLI. Real workers with the default flags, a real
//! broker and real HTTP, both backends.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::console::TestConsole;
use common::harness::*;
use common::receiver::{Receiver, Recorded, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;
use serde_json::{json, Value};

const SECRET: &str = "Bearer s3cr3t-history-token";

/// The receiver's answer to each request: by the id's kind and how many
/// times it came (`nth`), with a body that names the attempt.
fn answer(r: &Recorded) -> Reply {
    let id = r.id();
    let kind = id.split('-').next().unwrap_or("");
    let body = format!("{kind} answer #{}", r.nth);
    let reply = match kind {
        "ok" => Reply::status(200),
        "flaky" if r.nth < 3 => Reply::status(503),
        "flaky" => Reply::status(200),
        "gone" => Reply::status(410),
        _ => Reply::status(500),
    };
    reply.body(&body).header("content-type", "text/plain")
}

/// What a record should say of the request that it records.
fn expected_outcome(kind: &str, nth: usize, last: bool) -> &'static str {
    match (kind, last) {
        ("ok", _) | ("flaky", true) => "delivered",
        ("gone", _) => "dead",
        ("dead", true) => "dead",
        _ if nth > 0 => "retry",
        _ => unreachable!(),
    }
}

async fn history_equals_the_receivers_log(backend: DelayBackend) {
    let app = TestApp::new("history", backend);
    let rx = Receiver::start(answer).await;
    // Default flags but the schedule: three attempts, 1 s apart.
    let w = app.spawn_worker(schedule_settings("1s", 3, 8));
    let kinds = ["ok", "flaky", "gone", "dead"];
    let mut notifications = vec![];
    for k in kinds {
        for i in 0..3 {
            notifications.push(json!({
                "url": rx.url(&format!("/hook?token=q-secret-{i}")),
                "id": format!("{k}-{i}"),
                "body": {"kind": k, "i": i},
                "headers": {"Authorization": SECRET, "X-Order": format!("o-{i}")},
            }));
        }
    }
    app.publish(&notifications).await;
    // ok 1, flaky 3, gone 1, dead 3 requests each.
    let total = 3 * (1 + 3 + 1 + 3);
    assert!(
        wait_until(Duration::from_secs(30), || rx.count() == total).await,
        "requests: {}",
        rx.count()
    );
    let console = TestConsole::start(&app.broker()).await;
    assert!(console.ready(Duration::from_secs(20)).await, "ready");
    let all = console.wait_records(total, Duration::from_secs(20)).await;
    assert_eq!(all.len(), total, "every attempt has its record");
    let by_id = requests_by_id(&rx.requests());
    for (id, requests) in &by_id {
        check_timeline(id, requests, &console.attempts_of(id).await);
    }
    assert_no_secret(&console, &all).await;
    // A fresh console on an empty directory rebuilds the same answers.
    let fresh = TestConsole::start(&app.broker()).await;
    assert!(fresh.ready(Duration::from_secs(20)).await, "fresh ready");
    let again = fresh.wait_records(total, Duration::from_secs(20)).await;
    assert_eq!(again, all, "a fresh console's list");
    for id in by_id.keys() {
        assert_eq!(
            fresh.attempts_of(id).await,
            console.attempts_of(id).await,
            "{id}"
        );
    }
    fresh.stop().await;
    console.stop().await;
    w.stop().await;
}

fn requests_by_id(requests: &[Recorded]) -> BTreeMap<String, Vec<Recorded>> {
    let mut by_id: BTreeMap<String, Vec<Recorded>> = BTreeMap::new();
    for r in requests {
        by_id.entry(r.id()).or_default().push(r.clone());
    }
    by_id
}

/// The records of `id` say what its receiver saw: as many, the same
/// statuses in the same order, the outcome each led to, each failed
/// attempt's own response body.
fn check_timeline(id: &str, requests: &[Recorded], records: &[Value]) {
    let kind = id.split('-').next().unwrap();
    assert_eq!(records.len(), requests.len(), "{id}: {records:?}");
    for (i, (req, rec)) in requests.iter().zip(records).enumerate() {
        let last = i + 1 == requests.len();
        assert_eq!(rec["notification_id"], id);
        assert_eq!(rec["webhook_id"], id);
        assert_eq!(rec["attempt"], i as u64 + 1, "{id}: {rec}");
        assert_eq!(rec["status"], req.reply, "{id} #{}: {rec}", i + 1);
        assert_eq!(
            rec["outcome"],
            expected_outcome(kind, req.nth, last),
            "{id}: {rec}"
        );
        assert_eq!(
            rec["response_body"],
            format!("{kind} answer #{}", req.nth),
            "{id}"
        );
        assert_eq!(rec["response_content_type"], "text/plain");
        assert!(
            rec["run"].as_str().is_some_and(|r| r.starts_with("run_")),
            "{rec}"
        );
        assert!(
            rec["url"].as_str().unwrap().ends_with("/hook?token=***"),
            "{rec}"
        );
        // The request body once per run, on its first attempt.
        assert_eq!(rec["request_body"].is_string(), i == 0, "{id}: {rec}");
        if rec["outcome"] == "retry" {
            assert!(rec["next_attempt_at"].is_string(), "{rec}");
        }
        if rec["outcome"] == "dead" {
            let reason = if kind == "gone" {
                "permanent-status"
            } else {
                "max-attempts"
            };
            assert_eq!(rec["dead_reason"], reason, "{rec}");
        }
    }
}

/// The Authorization header and the URL's query values are in no record,
/// no file of the index, and no output of the CLI.
async fn assert_no_secret(console: &TestConsole, all: &[Value]) {
    let text = serde_json::to_string(all).unwrap();
    assert!(!text.contains("s3cr3t"), "a record holds the secret");
    assert!(!text.contains("q-secret"), "a record holds a query value");
    assert!(text.contains("X-Order"), "other headers are kept");
    for f in std::fs::read_dir(&console.data).unwrap() {
        let bytes = std::fs::read(f.unwrap().path()).unwrap();
        let found = bytes.windows(6).any(|w| w == b"s3cr3t");
        assert!(!found, "an index file holds the secret");
    }
    let out = history_cli(console, &["show", "dead-0", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("dead-0") && !printed.contains("s3cr3t"),
        "{printed}"
    );
}

/// `redeliver history ARGS` against the console, with its token.
fn history_cli(console: &TestConsole, args: &[&str]) -> std::process::Output {
    common::redeliver_command()
        .arg("history")
        .args(args)
        .args([
            "--console-url",
            &console.url,
            "--console-token",
            &console.token,
        ])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugin_history_equals_the_receivers_log() {
    history_equals_the_receivers_log(DelayBackend::Plugin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cascade_history_equals_the_receivers_log() {
    history_equals_the_receivers_log(DelayBackend::Cascade).await;
}

/// The API refuses requests without the token; the CLI's answers, its
/// empty answer and its bad input, as a user meets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_and_the_cli_answer_as_documented() {
    let app = TestApp::new("history-cli", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    app.publish(&[json!({"url": rx.url("/"), "id": "one"})])
        .await;
    // The worker's start is part of this wait (slow on a busy CI node).
    assert!(wait_until(Duration::from_secs(60), || rx.count() == 1).await);
    let console = TestConsole::start(&app.broker()).await;
    assert!(console.ready(Duration::from_secs(20)).await);
    assert_eq!(
        console.wait_records(1, Duration::from_secs(10)).await.len(),
        1
    );
    let bare = reqwest::get(format!("{}/api/attempts", console.url))
        .await
        .unwrap();
    assert_eq!(bare.status(), 401, "no token, no answer");
    let wrong = reqwest::Client::new()
        .get(format!("{}/api/notifications/one/attempts", console.url))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let shown = history_cli(&console, &["show", "one"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success() && text.lines().count() == 1,
        "{shown:?}"
    );
    assert!(text.contains("200") && text.contains("delivered"), "{text}");
    let listed = history_cli(
        &console,
        &["list", "--outcome", "delivered", "--since", "1h", "--json"],
    );
    let v: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    // A dead letter made with no attempt (here: not a notification) has
    // its record too: attempt 0, outcome dead, no status, its reason.
    app.publish_raw(b"not json", None).await;
    let all = console.wait_records(2, Duration::from_secs(10)).await;
    let invalid = all.iter().find(|r| r["attempt"] == 0);
    let invalid = invalid.unwrap_or_else(|| panic!("no record of the invalid one: {all:?}"));
    assert_eq!(invalid["outcome"], "dead", "{invalid}");
    assert_eq!(invalid["status"], Value::Null, "{invalid}");
    assert_eq!(invalid["dead_reason"], "invalid", "{invalid}");
    let unknown = history_cli(&console, &["show", "nobody"]);
    assert_eq!(unknown.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no attempts recorded"));
    for bad in [
        vec!["show", "has space"],
        vec!["list", "--since", "yesterday-ish"],
        vec!["list", "--status", "6xx"],
        vec!["list", "--endpoint", "ftp://x"],
    ] {
        let out = history_cli(&console, &bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
    let bad_url = common::redeliver_command()
        .args(["history", "show", "one", "--console-url", "not a url"])
        .output()
        .unwrap();
    assert_eq!(bad_url.status.code(), Some(2), "{bad_url:?}");
    // Open to the network without a token: refused at start, exit 2,
    // before it touches its data directory.
    let data = std::env::temp_dir().join(app.name("console-open"));
    let data = data.to_string_lossy().to_string();
    let open = app.cli(&["console", "--listen", "0.0.0.0:0", "--data", &data]);
    let err = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{err}");
    assert!(err.contains("not a loopback address"), "{err}");
    assert!(!std::path::Path::new(&data).exists(), "{data}");
    // The stream exists with the default retention: a worker that asks
    // for another stops at start and says why.
    let other = app.cli(&["run", "--history-max-age", "1d"]);
    let err = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(1), "{err}");
    assert!(err.contains("--history-max-age"), "{err}");
    let url = console.url.clone();
    console.stop().await;
    let down = common::redeliver_command()
        .args(["history", "show", "one", "--console-url", &url])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    assert!(String::from_utf8_lossy(&down.stderr).contains("does not answer"));
    w.stop().await;
}
