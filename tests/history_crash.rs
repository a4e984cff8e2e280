//! The delivery history across a worker `kill -9` and a broker restart
//! (issue 49): every settled outcome has its record, since a delivery is
//! acked only once its record is confirmed. Both backends side by side on
//! one private node, so that one restart serves both.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::console::TestConsole;
use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::{ctl, TestApp};
use redeliver::delay::DelayBackend;
use serde_json::{json, Value};

/// A private node: the restart must not reach other suites' tests.
const PORT: u16 = 5696;
const N: usize = 160;

async fn node(args: &'static [&'static str]) -> String {
    tokio::task::spawn_blocking(move || ctl(PORT, args))
        .await
        .unwrap()
}

/// One id in eight always fails (dead after 2 attempts), one fails once,
/// the rest are delivered at once: mostly successes, so that the default
/// circuit breaker (10 failures in a row) stays closed.
fn answer(r: &common::receiver::Recorded) -> Reply {
    let id = r.id();
    match (id.split('-').next(), r.nth) {
        (Some("dead"), _) | (Some("flaky"), 1) => Reply::status(503).body("not now"),
        _ => Reply::status(200).body("ok"),
    }
}

fn load(rx: &Receiver) -> Vec<Value> {
    (0..N)
        .map(|i| {
            let kind = match i % 8 {
                0 => "dead",
                1 => "flaky",
                _ => "ok",
            };
            json!({"id": format!("{kind}-{i}"), "url": rx.url("/"), "max_attempts": 2, "schedule": ["1s"]})
        })
        .collect()
}

fn run(app: &TestApp) -> Proc {
    let mut cmd = app.command();
    cmd.args(["run", "--concurrency", "8"]);
    Proc::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_settled_outcome_survives_a_kill_9_and_a_broker_restart() {
    let url = node(&["up"]).await;
    let _down = common::DownWhenLast {
        port: PORT,
        users: 1,
        finished: Box::leak(Box::default()),
    };
    let apps = [
        TestApp::on(&url, "hist-crash", DelayBackend::Plugin),
        TestApp::on(&url, "hist-crash", DelayBackend::Cascade),
    ];
    let rxs = [Receiver::start(answer).await, Receiver::start(answer).await];
    let mut workers = vec![];
    for (app, rx) in apps.iter().zip(&rxs) {
        app.publish(&load(rx)).await;
        workers.push(run(app));
    }
    // Mid-run: about half of the attempts made.
    let half = || rxs.iter().all(|rx| rx.count() >= N / 2);
    if !wait_until(Duration::from_secs(30), half).await {
        let logs: Vec<_> = workers.iter().map(|w| w.stderr().join("\n")).collect();
        let counts: Vec<_> = rxs.iter().map(|rx| rx.count()).collect();
        panic!("requests {counts:?}; workers:\n{}", logs.join("\n---\n"));
    }
    for w in &mut workers {
        w.kill();
    }
    let workers: Vec<Proc> = apps.iter().map(run).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    node(&["restart"]).await;
    for (app, rx) in apps.iter().zip(&rxs) {
        let settled = settled(app, rx).await;
        assert_eq!(
            settled.len(),
            N,
            "{}: settled {}",
            app.backend.as_str(),
            settled.len()
        );
        check_history(app, &settled).await;
    }
    drop(workers);
}

/// Waits until every notification of `app` is settled: delivered (a 200
/// seen) or dead-lettered; what each came to.
async fn settled(app: &TestApp, rx: &Receiver) -> HashMap<String, &'static str> {
    let mut out = HashMap::new();
    let mut dead: HashSet<String> = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while out.len() < N && std::time::Instant::now() < deadline {
        for d in app.drain_dead().await {
            let body: Value = serde_json::from_slice(&d.body).unwrap_or_default();
            dead.insert(body["id"].as_str().unwrap_or_default().to_string());
        }
        for r in rx.requests() {
            if r.reply == 200 {
                out.insert(r.id(), "delivered");
            }
        }
        for id in &dead {
            out.insert(id.clone(), "dead");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    out
}

/// Each settled notification has a record of its outcome.
async fn check_history(app: &TestApp, settled: &HashMap<String, &'static str>) {
    let console = TestConsole::start(&app.broker()).await;
    assert!(console.ready(Duration::from_secs(30)).await, "ready");
    let mut missing = vec![];
    for (id, outcome) in settled {
        let records = console.attempts_of(id).await;
        if !records.iter().any(|r| r["outcome"] == *outcome) {
            missing.push(format!("{id} {outcome}: {records:?}"));
        }
    }
    console.stop().await;
    assert!(
        missing.is_empty(),
        "{}: {} settled outcomes without a record: {:?}",
        app.backend.as_str(),
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}
