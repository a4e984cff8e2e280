//! A notification's run (`redeliver-run`, docs/configuration.md): every
//! copy carries it, a plain AMQP client's message gets one derived from
//! its bytes, a replay starts a new one, and a retry chain forked by a
//! `kill -9` inside the settle window announces its exhaustion with one
//! event id. Real `redeliver run` processes, real HTTP, both backends.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::app::TestApp;
use common::events::Sink;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;
use redeliver::message::run::{derived, H_RUN};
use serde_json::{json, Value};

both_backends!(
    a_chain_forked_in_the_settle_window_keeps_one_event_id,
    every_copy_carries_its_run_and_a_replay_starts_a_new_one,
);

/// The worker, with a 3 s `--retry-settle` on both backends (the
/// cascade's default is none): the window in which a `kill -9` forks a
/// chain, its retry copy confirmed and its original not yet acked.
fn run(app: &TestApp) -> Proc {
    let mut cmd = app.command();
    cmd.args(["run", "--retry-settle", "3s"]);
    Proc::spawn(cmd)
}

/// Every notification fails twice and is exhausted; the worker is killed
/// (-9) a second after all first attempts, inside their settle window, so
/// each original comes back and its chain runs twice. Both chains announce
/// the exhaustion, with one event id: the id comes from the run, not from
/// the chain's own history (which differs between the two).
async fn a_chain_forked_in_the_settle_window_keeps_one_event_id(backend: DelayBackend) {
    let app = TestApp::new("run-fork", backend);
    let mut sink = Sink::bind(&app, "fork-exhausted", &["notification.exhausted"]).await;
    let rx = Receiver::start(|_| Reply::status(500)).await;
    let n = 40;
    let load: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("f-{i}"), "url": rx.url("/"), "max_attempts": 2, "schedule": ["1s"]}))
        .collect();
    app.publish(&load).await;
    let mut worker = run(&app);
    let first = common::harness::wait_until(Duration::from_secs(30), || rx.count() >= n).await;
    assert!(first, "{} of {n} first attempts", rx.count());
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.kill();
    let worker = run(&app);
    let forked = |s: &[Value]| s.len() >= n * 2;
    let all = sink.wait(&app, Duration::from_secs(60), forked).await;
    let mut ids: HashMap<String, HashSet<String>> = HashMap::new();
    for e in &sink.seen {
        let nid = e["data"]["notification_id"].as_str().unwrap().to_string();
        ids.entry(nid).or_default().insert(e["id"].to_string());
    }
    let twice = sink.seen.len() - ids.len();
    println!("{n} exhausted, {twice} announced again by a forked chain");
    assert!(
        all,
        "{} events for {n} forked notifications",
        sink.seen.len()
    );
    assert_eq!(ids.len(), n, "every notification announced");
    for (nid, e) in &ids {
        assert_eq!(e.len(), 1, "{nid}: one run, one event id: {e:?}");
    }
    drop(worker);
}

/// A notification published by the library and one by a plain AMQP client
/// (no run header) are dead-lettered with their runs: the library's drawn
/// at publish, the client's derived from its id and bytes. Replayed, each
/// dies again under a new run.
async fn every_copy_carries_its_run_and_a_replay_starts_a_new_one(backend: DelayBackend) {
    let app = TestApp::new("run-copy", backend);
    let rx = Receiver::start(|_| Reply::status(500)).await;
    let url = rx.url("/");
    app.publish(&[json!({"id": "lib", "url": url, "max_attempts": 2, "schedule": ["1s"]})])
        .await;
    let raw = json!({"id": "raw", "url": url, "max_attempts": 2, "schedule": ["1s"]}).to_string();
    app.publish_raw(raw.as_bytes(), None).await;
    let worker = run(&app);
    let dead = dead_after(&app, 2).await;
    let first = runs_of(&dead);
    assert_eq!(first.len(), 2, "both dead-lettered: {first:?}");
    assert!(first["lib"].starts_with("run_"), "{first:?}");
    assert_eq!(first["raw"], derived("raw", raw.as_bytes()));
    assert_ne!(first["lib"], first["raw"]);
    // Back where they were, as they were, for `dlq replay` to find.
    let items: Vec<_> = dead.into_iter().map(|d| (d.body, d.headers)).collect();
    app.publish_to_queue("dead", &items).await;
    let out = app.cli(&["dlq", "replay", "--all"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = runs_of(&dead_after(&app, 2).await);
    for id in ["lib", "raw"] {
        assert!(second[id].starts_with("run_"), "{second:?}");
        assert_ne!(second[id], first[id], "{id}: a replay is a new run");
    }
    assert_eq!(rx.count(), 8, "two attempts per run");
    drop(worker);
}

/// The dead letters, once there are `n` (30 s at most).
async fn dead_after(app: &TestApp, n: usize) -> Vec<common::harness::DeadLetter> {
    let mut dead = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while dead.len() < n && std::time::Instant::now() < deadline {
        dead.extend(app.drain_dead().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    dead
}

/// Each dead letter's id and run.
fn runs_of(dead: &[common::harness::DeadLetter]) -> HashMap<String, String> {
    dead.iter()
        .map(|d| {
            let id = d.str(redeliver::message::state::H_ID).unwrap_or_default();
            (id, d.str(H_RUN).unwrap_or_default())
        })
        .collect()
}
