//! Recovery and shutdown: broker restarts, SIGTERM with and without time
//! to finish.

mod common;

use std::time::{Duration, Instant};

use common::gate::Gate;
use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::{ctl, redeliver_command, TestApp};
use redeliver::delay::DelayBackend;
use serde_json::json;

const PLUGIN: DelayBackend = DelayBackend::Plugin;

/// `redeliver run ARGS` for the app's prefix.
fn spawn_run(app: &TestApp, args: &[&str]) -> Proc {
    let mut run = app.command();
    run.arg("run").args(args);
    Proc::spawn(run)
}

/// `tests/broker/ctl ARGS` for the node on `port`, off the async workers.
async fn node(port: u16, args: &'static [&'static str]) -> String {
    let ran = tokio::task::spawn_blocking(move || ctl(port, args));
    ran.await.unwrap()
}

/// A worker keeps delivering across a broker restart, without help.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_recovers_from_a_broker_restart() {
    const PORT: u16 = 5695;
    let url = node(PORT, &["up"]).await;
    let app = TestApp::on(&url, "restart", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    app.publish(&[json!({"url": rx.url("/"), "id": "before"})])
        .await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    node(PORT, &["restart"]).await;
    app.publish(&[json!({"url": rx.url("/"), "id": "after"})])
        .await;
    let recovered = wait_until(Duration::from_secs(45), || rx.count() == 2).await;
    assert!(!w.join.is_finished(), "the worker kept running");
    w.stop().await;
    drop(app);
    node(PORT, &["down"]).await;
    assert!(
        recovered,
        "delivered after the restart: {:?}",
        rx.requests().iter().map(|r| r.id()).collect::<Vec<_>>()
    );
    assert_eq!(rx.requests()[1].id(), "after");
}

/// SIGTERM: in-flight deliveries finish within the grace, then exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_in_flight_deliveries_finish() {
    let app = TestApp::new("term", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(1500))).await;
    let batch: Vec<_> = (0..4)
        .map(|i| json!({"url": rx.url("/"), "id": format!("t{i}")}))
        .collect();
    app.publish(&batch).await;
    // All four to one receiver, in flight at once: no per-endpoint limit
    // (a new endpoint starts at one in flight, and earns more only from
    // answers).
    let args = ["--concurrency", "4", "--isolation", "off"];
    let mut c = spawn_run(&app, &[&args[..], &["--shutdown-grace", "10s"]].concat());
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 4).await);
    c.sigterm();
    let st = c.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert_eq!(rx.count(), 4);
    assert_eq!(app.queue_len("work").await, 0, "all four were acked");
}

/// SIGTERM: what is still running when the grace is over goes back to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_requeues_what_the_grace_cannot_finish() {
    let app = TestApp::new("grace", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_secs(20))).await;
    let batch: Vec<_> = (0..2)
        .map(|i| json!({"url": rx.url("/"), "id": format!("g{i}")}))
        .collect();
    app.publish(&batch).await;
    // Both to one receiver, both in flight at once: no per-endpoint limit
    // (by default a new endpoint starts at one in flight, and earns more
    // only from answers, which this 20 s receiver never gives).
    let args = [
        "--concurrency",
        "4",
        "--isolation",
        "off",
        "--shutdown-grace",
        "300ms",
        "--timeout",
        "30s",
    ];
    let mut c = spawn_run(&app, &args);
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 2).await);
    let t = Instant::now();
    c.sigterm();
    let st = c.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "exited after {:?}; its log:\n{}",
        t.elapsed(),
        c.stderr().join("\n")
    );
    let mut back = 0;
    wait_until_async(Duration::from_secs(5), async || {
        back = app.queue_len("work").await;
        back == 2
    })
    .await;
    assert_eq!(back, 2, "both unfinished deliveries are back in the queue");
}

/// `publish` rides out a broker that is down for a few seconds, and prints
/// the id only once it is confirmed. "Down" is a refused connection, as
/// the client sees a stopped node: a closed [`Gate`] in front of the shared
/// node, opened once the publish has failed at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_retries_until_the_broker_is_back() {
    let app = TestApp::new("pubretry", PLUGIN);
    let mut gate = Gate::closed(&app.url).await;
    let mut publish = app.command_via(&gate.url(&app.url));
    publish.args(["publish", "--url", "http://127.0.0.1:9/", "--id", "late"]);
    let mut child = Proc::spawn(publish);
    let interrupted = "publishing interrupted; trying the next node";
    let failed = wait_until(Duration::from_secs(10), || {
        child.stderr_count(interrupted) > 0
    })
    .await;
    gate.open().await;
    let st = tokio::task::block_in_place(|| child.wait_exit(Duration::from_secs(60)));
    let len = app.queue_len("work").await;
    let stderr = child.stderr().join("\n");
    assert!(failed, "{interrupted}: {stderr}");
    assert!(st.success(), "{stderr}");
    assert_eq!(child.stdout(), ["late"]);
    assert_eq!(len, 1);
}

/// With no broker at all, `publish` gives up after a bounded number of
/// tries, says so, and prints no id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_gives_up_clearly_without_a_broker() {
    let started = Instant::now();
    let out = redeliver_command()
        .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:5999/%2f"])
        .args(["publish", "--url", "http://127.0.0.1:9/"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no id printed");
    assert!(
        stderr.contains("publishing failed after 6 tries; 1 notification(s) not confirmed"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// The upstream plugin's confirm window, mimicked by the test plugin's
/// late-write mode (confirm at once, disk write 3 s later). Without
/// `--retry-settle`, a broker kill -9 right after a retry copy is confirmed
/// loses the notification; with it, the broker redelivers the original.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_settle_covers_the_plugins_confirm_window() {
    const PORT: u16 = 5688;
    let url = late_node_up(PORT).await;
    let mut seen = vec![];
    for settle in [Duration::ZERO, Duration::from_secs(5)] {
        let app = TestApp::on(&url, "settle", PLUGIN);
        let delivered = delivered_after_a_crash(&app, PORT, settle).await;
        println!("retry-settle {settle:?}: delivered after the crash: {delivered}");
        seen.push(delivered);
    }
    node(PORT, &["down"]).await;
    assert_eq!(
        seen,
        [false, true],
        "lost without the settle, saved with it"
    );
}

/// The node on `port` in late-write mode.
async fn late_node_up(port: u16) -> String {
    const LATE: &[(&str, &str)] = &[("REDELIVER_TEST_BROKER_LATE_WRITE_MS", "3000")];
    let up = tokio::task::spawn_blocking(move || common::ctl_env(port, &["up"], LATE));
    up.await.unwrap()
}

/// Notifications of the settle crash test. With a prefetch one above the
/// concurrency, each held original makes the worker replace its consumer,
/// so the crash finds most of them held on retired consumers' channels.
const SETTLE_N: usize = 8;

/// [`SETTLE_N`] notifications failing once under a worker with `settle`,
/// and a broker kill -9 inside the plugin's confirm window of their retry
/// copies: whether every one was delivered after all.
async fn delivered_after_a_crash(app: &TestApp, port: u16, settle: Duration) -> bool {
    let rx = Receiver::start(|r| Reply::status(if r.nth == 1 { 500 } else { 200 })).await;
    let mut settings = schedule_settings("1s", 3, 4);
    settings.retry_settle = settle;
    settings.prefetch = Some(5);
    let w = app.spawn_worker(settings);
    // The worker declares the streams too (endpoint state, history): on a
    // fresh node the first one starts the stream coordinator, which ages
    // like a quorum queue, or comes back from a kill -9 without it.
    assert!(app.wait_consumers("work").await, "the worker consumes");
    let_quorum_queues_age().await;
    let notes: Vec<_> = (0..SETTLE_N)
        .map(|i| json!({"url": rx.url("/"), "id": format!("settle-{i}")}))
        .collect();
    app.publish(&notes).await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == SETTLE_N).await);
    // A deliberate moment, not a wait for something: the retry copies are
    // confirmed within milliseconds of the 500s and reach the disk 3 s
    // later, and nothing observable marks the moment in between.
    tokio::time::sleep(Duration::from_millis(300)).await;
    node(port, &["kill"]).await;
    late_node_up(port).await;
    let all_twice =
        || rx.count_by_id().values().all(|&n| n >= 2) && rx.count_by_id().len() == SETTLE_N;
    let delivered = wait_until(Duration::from_secs(25), all_twice).await;
    println!("requests by id: {:?}", rx.count_by_id());
    w.stop().await;
    delivered
}

/// Originals held for `--retry-settle` leave the prefetch to deliveries
/// waiting for an attempt: with room for one held original and a 120 s
/// settle, 24 notifications that each fail once are all retried and
/// delivered within the settle, where the old limit retried about three
/// (the prefetch's room) and then nothing until the settle ended.
///
/// Each retry costs a consumer rotation (a channel, its prefetch, a
/// consume and a cancel, one after another), and the retries queue behind
/// the first attempts: about 2 s for 40 alone, but over 1 s a rotation on
/// a busy CI node (38 first attempts and no retry in 50 s once). So the
/// wait is 110 s, short of the settle, and passes as soon as all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settling_originals_do_not_take_the_prefetch() {
    const N: usize = 24;
    let app = TestApp::new("rotate", PLUGIN);
    let rx = Receiver::start(|r| Reply::status(if r.nth == 1 { 500 } else { 200 })).await;
    let mut settings = schedule_settings("1ms", 3, 2);
    settings.retry_settle = Duration::from_secs(120);
    // Two slots and one place for a held original: the old limit would
    // stall after the first retry.
    settings.prefetch = Some(3);
    settings.shutdown_grace = Duration::from_millis(200);
    let w = app.spawn_worker(settings);
    let notes: Vec<_> = (0..N)
        .map(|i| json!({"url": rx.url("/"), "id": format!("r-{i}")}))
        .collect();
    app.publish(&notes).await;
    let done = || {
        let by_id = rx.count_by_id();
        by_id.len() == N && by_id.values().all(|&n| n >= 2)
    };
    let started = Instant::now();
    let delivered = wait_until(Duration::from_secs(110), done).await;
    println!("all {N} retried and delivered in {:?}", started.elapsed());
    w.stop().await;
    assert!(delivered, "requests by id: {:?}", rx.count_by_id());
}
