//! The delay backend's liveness probe and failover (`src/delay/probe`),
//! from outside: real `redeliver run` processes with default flags, the
//! stand-in's fault switch (`tests/broker/ctl wedge`, per exchange, so the
//! shared node's other tests are not held), `/metrics`, `/readyz`,
//! `status` and real HTTP receivers.
//!
//! Every test runs on a multi-thread runtime: its receivers share it with
//! blocking calls (`redeliver status`, `tests/broker/ctl`), and on one
//! thread a slow `status` held their answers past the worker's 15 s
//! timeout (a third attempt of a notification that had answered 200).

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::app::TestApp;
use common::cascade::cascade_drained;
use common::chaos::Fleet;
use common::events::{assert_schema, count, Sink};
use common::harness::wait_until_async;
use common::metrics::{run_with_admin, wait_metric};
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;
use serde_json::json;

/// The bound for reporting a stall and clearing it.
const WITHIN: Duration = Duration::from_secs(60);
const STALLED: &str = "redeliver_delay_backend_stalled";
const FAILOVER: &str = "redeliver_delay_failover_active";

/// The stand-in holds `exchange`'s due messages until dropped, even when
/// the test fails (the node is shared).
struct Wedge(String);

impl Wedge {
    fn on(exchange: &str) -> Wedge {
        common::ctl(common::default_port(), &["wedge", exchange]);
        Wedge(exchange.to_string())
    }
}

impl Drop for Wedge {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new(env!("CARGO_MANIFEST_DIR").to_owned() + "/tests/broker/ctl")
                .args(["unwedge", &self.0])
                .env(
                    "REDELIVER_TEST_BROKER_PORT",
                    common::node_port(common::default_port()).to_string(),
                )
                .output();
    }
}

fn label(backend: &str) -> String {
    format!("backend=\"{backend}\"")
}

async fn stalled_is(admin: u16, backend: &str, want: f64) -> bool {
    let l = label(backend);
    let v = wait_metric(admin, STALLED, &[&l], WITHIN, |v| v == want).await;
    v == Some(want)
}

fn status(app: &TestApp) -> String {
    let out = app.cli(&["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `status` (which reads the workers' reports, published right
/// after the change the gauge shows) until it shows `want`, for 10 s.
async fn status_shows(app: &TestApp, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = status(app);
        if text.contains(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed {want:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn readyz(admin: u16) -> (u16, String) {
    let r = reqwest::get(format!("http://127.0.0.1:{admin}/readyz"))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wedged_plugin_is_reported_within_a_minute_and_cleared_after() {
    let app = TestApp::new("probe-wedge", DelayBackend::Plugin);
    let mut events = Sink::bind(&app, "ev-delay", &["delay-backend.*"]).await;
    let (_w, admin) = run_with_admin(&app, &[]);
    // A second worker sees the same stall: still one event per stall.
    let (_w2, admin2) = run_with_admin(&app, &[]);
    assert!(
        stalled_is(admin, "plugin", 0.0).await,
        "the gauge starts at 0"
    );
    status_shows(&app, "probe plugin   routing").await;
    let wedge = Wedge::on(&app.name("retry"));
    let wedged = Instant::now();
    assert!(
        stalled_is(admin, "plugin", 1.0).await,
        "no stall reported within 60 s"
    );
    println!("stall reported after {:?}", wedged.elapsed());
    assert!(
        stalled_is(admin2, "plugin", 1.0).await,
        "the second worker's"
    );
    status_shows(&app, "probe plugin   STALLED since").await;
    let (code, body) = readyz(admin).await;
    // A broker-side stall does not fail readiness; it is reported there.
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("delay backend plugin: stalled since"),
        "{body}"
    );
    drop(wedge);
    let unwedged = Instant::now();
    assert!(
        stalled_is(admin, "plugin", 0.0).await,
        "the stall not cleared within 60 s"
    );
    println!("cleared after {:?}", unwedged.elapsed());
    status_shows(&app, "probe plugin   routing").await;
    assert!(!readyz(admin).await.1.contains("stalled"));
    assert!(stalled_is(admin2, "plugin", 0.0).await);
    one_stall_and_its_recovery(&app, &mut events, "plugin").await;
}

/// Exactly one `delay-backend.stalled` and one `.recovered` for the stall,
/// however many workers saw it, naming the same start.
async fn one_stall_and_its_recovery(app: &TestApp, events: &mut Sink, backend: &str) {
    let both = |s: &[serde_json::Value]| count(s, "delay-backend.recovered") >= 1;
    assert!(
        events.wait(app, Duration::from_secs(20), both).await,
        "{:#?}",
        events.seen
    );
    // Any late second one would come within a probe round.
    tokio::time::sleep(Duration::from_secs(3)).await;
    events.take(app).await;
    let (stalled, recovered) = (
        events.of("delay-backend.stalled"),
        events.of("delay-backend.recovered"),
    );
    assert_eq!(
        (stalled.len(), recovered.len()),
        (1, 1),
        "{:#?}",
        events.seen
    );
    for e in stalled.iter().chain(&recovered) {
        assert_schema(e, &app.prefix);
        assert_eq!(e["data"]["backend"], backend);
    }
    assert_eq!(stalled[0]["data"]["since"], recovered[0]["data"]["since"]);
    assert!(recovered[0]["data"]["lasted_seconds"].as_u64().is_some());
    assert_ne!(stalled[0]["id"], recovered[0]["id"]);
}

/// `n` notifications per receiver, each failing its first attempt.
fn fail_once_load(rxs: &[&Receiver], tag: &str, n: usize) -> Vec<serde_json::Value> {
    let mut out = vec![];
    for (r, rx) in rxs.iter().enumerate() {
        for i in 0..n {
            out.push(json!({"url": rx.url("/"), "id": format!("{tag}-{r}-{i}")}));
        }
    }
    out
}

async fn fail_once_receivers(n: usize) -> Vec<Receiver> {
    let mut v = vec![];
    for _ in 0..n {
        v.push(Receiver::start(|r| Reply::status(if r.nth == 1 { 500 } else { 200 })).await);
    }
    v
}

/// Ids delivered (answered 200) across the receivers.
fn delivered(rxs: &[Receiver]) -> HashSet<String> {
    rxs.iter()
        .flat_map(|rx| rx.requests())
        .filter(|r| r.reply == 200)
        .map(|r| r.id())
        .collect()
}

async fn wait_delivered(rxs: &[Receiver], ids: &[String], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let got = delivered(rxs);
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !got.contains(*id))
            .cloned()
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_delivers_retries_through_the_cascade_while_the_plugin_is_wedged() {
    let app = TestApp::new("probe-failover", DelayBackend::Plugin);
    let rxs = fail_once_receivers(4).await;
    let refs: Vec<&Receiver> = rxs.iter().collect();
    let (_w, admin) = run_with_admin(&app, &["--schedule", "2s"]);
    assert!(stalled_is(admin, "plugin", 0.0).await);
    let _wedge = Wedge::on(&app.name("retry"));
    // Before the stall is found: their retries go into the wedged plugin.
    let held = app.publish(&fail_once_load(&refs, "held", 2)).await;
    assert!(stalled_is(admin, "plugin", 1.0).await, "no stall reported");
    let on = wait_metric(admin, FAILOVER, &[], WITHIN, |v| v == 1.0).await;
    assert_eq!(on, Some(1.0), "failover not engaged");
    let fresh = app.publish(&fail_once_load(&refs, "fresh", 5)).await;
    let missing = wait_delivered(&rxs, &fresh, Duration::from_secs(30)).await;
    assert!(
        missing.is_empty(),
        "not delivered through the cascade: {missing:?}"
    );
    let got = delivered(&rxs);
    assert!(
        held.iter().all(|id| !got.contains(id)),
        "a held copy got out of the wedge"
    );
    status_shows(&app, "new delays go through the cascade on 1 workers").await;
    drop(_wedge);
    // Copies held in the plugin arrive once it routes again; 0 lost.
    let missing = wait_delivered(&rxs, &held, WITHIN).await;
    assert!(missing.is_empty(), "held copies lost: {missing:?}");
    let off = wait_metric(admin, FAILOVER, &[], WITHIN, |v| v == 0.0).await;
    assert_eq!(off, Some(0.0), "failover not released");
    for r in rxs.iter().flat_map(|rx| rx.requests()) {
        assert!(r.nth <= 2, "{} took {} attempts", r.id(), r.nth);
    }
    assert!(app.drain_dead().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cascade_stage_deleted_by_hand_is_reported_the_same_way() {
    let app = TestApp::new("probe-stage", DelayBackend::Cascade);
    let mut events = Sink::bind(&app, "ev-delay", &["delay-backend.*"]).await;
    let (_w, admin) = run_with_admin(&app, &[]);
    assert!(stalled_is(admin, "cascade", 0.0).await);
    // The probe's second stage, gone: what expires from stage 2 has no
    // route, and at-least-once dead-lettering keeps it there.
    let stage = app.name("cascade.1.1");
    // The worker's declare may still be under way (its gauge reads 0 from
    // the start): delete the stage once it exists.
    let declared = async || {
        common::harness::queue_counts(&app.url, &stage)
            .await
            .is_some()
    };
    assert!(
        wait_until_async(Duration::from_secs(30), declared).await,
        "{stage} declared"
    );
    common::ctl(
        common::default_port(),
        &["rabbitmqctl", "delete_queue", &stage],
    );
    assert!(
        stalled_is(admin, "cascade", 1.0).await,
        "no stall reported within 60 s"
    );
    status_shows(&app, "probe cascade  STALLED since").await;
    // The repair: any command (or worker connection) declares it again.
    let b = app.broker();
    let conn = b.url.connect("test repair").await.unwrap();
    redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    assert!(
        stalled_is(admin, "cascade", 0.0).await,
        "not cleared within 60 s"
    );
    one_stall_and_its_recovery(&app, &mut events, "cascade").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_failover_loses_nothing() {
    let app = TestApp::new("probe-kill", DelayBackend::Plugin);
    let rxs = fail_once_receivers(4).await;
    let refs: Vec<&Receiver> = rxs.iter().collect();
    let mut fleet = Fleet::start(&app, 2, &["--schedule", "2s"]);
    let _wedge = Wedge::on(&app.name("retry"));
    let deadline = Instant::now() + WITHIN;
    while fleet.log_lines("failing over") < 2 {
        assert!(Instant::now() < deadline, "the workers did not fail over");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut ids = vec![];
    for round in 0..4 {
        ids.extend(
            app.publish(&fail_once_load(&refs, &format!("k{round}"), 5))
                .await,
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
        fleet.kill9_and_restart(round % 2);
    }
    // Workers started during the stall take the others' word for it.
    assert!(
        fleet.log_lines("failing over from the start") >= 1,
        "a restarted worker sent its first retries into the stalled plugin"
    );
    let held = wait_delivered(&rxs, &ids, WITHIN).await;
    println!("{} of {} waited for the unwedge", held.len(), ids.len());
    // Copies a worker put into the plugin before it failed over wait there
    // for the repair; nothing is lost either way.
    drop(_wedge);
    let lost = wait_delivered(&rxs, &ids, WITHIN).await;
    assert!(lost.is_empty(), "lost during failover: {lost:?}");
    fleet.stop();
    assert!(app.drain_dead().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn probes_never_reach_a_receiver_the_dlq_or_leave_a_queue_behind() {
    for backend in [DelayBackend::Plugin, DelayBackend::Cascade] {
        let app = TestApp::new("probe-quiet", backend);
        let rx = Receiver::start(|_| Reply::status(200)).await;
        let (mut w, admin) = run_with_admin(&app, &["--delay-probe-every", "500ms"]);
        let b = backend.as_str();
        let hist = "redeliver_delay_probe_seconds_count";
        let l = label(b);
        let back = wait_metric(admin, hist, &[&l], WITHIN, |v| v >= 5.0).await;
        assert!(
            back.is_some_and(|v| v >= 5.0),
            "{b}: probes did not come back"
        );
        // A kill -9 with probes in flight: none may stay anywhere.
        w.kill();
        // Those in flight come out of the cascade into its sink.
        let held = cascade_drained(&app, Duration::from_secs(20)).await;
        assert!(held.is_empty(), "{b}: probes stay in {held:?}");
        assert_eq!(rx.count(), 0, "{b}: a probe reached a receiver");
        let dlq = app.cli(&["dlq", "list"]);
        let listed = String::from_utf8_lossy(&dlq.stdout);
        assert_eq!(app.queue_len("dead").await, 0, "{b}: {listed}");
        assert_eq!(
            app.queue_len("work").await,
            0,
            "{b}: a probe in the work queue"
        );
        let queues = common::ctl_output(
            common::default_port(),
            &["rabbitmqctl", "list_queues", "-q", "name", "messages"],
        );
        for line in queues.lines().filter(|l| l.starts_with(&app.prefix)) {
            assert!(!line.contains(".probe."), "{b}: left behind: {line}");
        }
    }
}
