//! Operational events from outside (`src/events`, docs/operations.md
//! "Operational events"): real `redeliver run` processes, real HTTP
//! receivers, a queue bound to `<prefix>.events` with `#` as a user would
//! bind one, the endpoint commands, `--events-url` checked with the
//! `standardwebhooks` crate, and kill -9 between events and acks.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::app::TestApp;
use common::endpoints::{endpoint, in_force, origin};
use common::events::{assert_schema, count, Sink};
use common::metrics::run_with_admin;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;
use serde_json::{json, Value};
use standardwebhooks::Webhook;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

both_backends!(
    every_type_is_published_with_the_documented_schema,
    the_events_url_gets_signed_events_and_none_about_itself,
    a_kill_9_between_an_event_and_its_ack_duplicates_never_loses,
);

/// `/fail` 500, `/flaky` 500 four times then 200, `/gone` 410, `/abort`
/// 500 with `webhook-delivery: abort-message`, anything else 200.
async fn receiver() -> Receiver {
    Receiver::start(|r| match r.path.as_str() {
        "/fail" => Reply::status(500),
        "/flaky" if r.nth <= 4 => Reply::status(500),
        "/gone" => Reply::status(410),
        "/abort" => Reply::status(500).header("webhook-delivery", "abort-message"),
        _ => Reply::status(200),
    })
    .await
}

async fn every_type_is_published_with_the_documented_schema(backend: DelayBackend) {
    let app = TestApp::new("ev-types", backend);
    let mut sink = Sink::bind(&app, "ev-all", &["#"]).await;
    let (rx, other) = (
        receiver().await,
        Receiver::start(|_| Reply::status(200)).await,
    );
    let (_w, admin) = run_with_admin(&app, &["--schedule", "1s"]);
    assert!(app.wait_consumers("work").await);
    let n = |id: &str, path: &str, extra: Value| {
        let mut v = json!({"id": id, "url": rx.url(path)});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    app.publish(&[
        n("ex-1", "/fail", json!({"max_attempts": 5})),
        n("rec-1", "/flaky", json!({})),
        n("perm-1", "/gone", json!({})),
        n("abort-1", "/abort", json!({})),
        n(
            "old-1",
            "/fail",
            json!({"max_age": "1s", "schedule": ["2s"]}),
        ),
        n("ok-1", "/ok", json!({})),
    ])
    .await;
    // An operator's four changes, and a notification to the disabled one.
    let target = origin(&other);
    endpoint(
        &app,
        &["pause", &target, "--reason", "deploy", "--for", "1h"],
    );
    endpoint(&app, &["resume", &target]);
    endpoint(&app, &["disable", &target, "--reason", "gone for good"]);
    assert!(in_force(admin, "disabled", 1.0).await);
    app.publish(&[json!({"id": "dis-1", "url": other.url("/x")})])
        .await;
    let expected = [
        ("notification.failing", 2),
        ("notification.exhausted", 2),
        ("notification.recovered", 1),
        ("notification.dead-lettered", 3),
    ];
    let all_in = |seen: &[Value]| expected.iter().all(|(k, n)| count(seen, k) >= *n);
    assert!(
        sink.wait(&app, Duration::from_secs(40), all_in).await,
        "{:#?}",
        sink.seen
    );
    endpoint(&app, &["enable", &target]);
    let four = |seen: &[Value]| count(seen, "endpoint.enabled") == 1;
    assert!(sink.wait(&app, Duration::from_secs(10), four).await);
    for e in &sink.seen {
        assert_schema(e, &app.prefix);
    }
    check_notifications(&sink, &rx);
    check_endpoints(&sink, &target);
    assert!(sink.about("notification.recovered", "ok-1").is_empty());
    assert!(
        sink.seen
            .iter()
            .all(|e| e["data"]["notification_id"] != "ok-1"),
        "a plain success has no event"
    );
}

/// The notification events' fields, and that the `webhook_id` is the one
/// the receiver got.
fn check_notifications(sink: &Sink, rx: &Receiver) {
    let one = |kind: &str, id: &str| -> Value {
        let got = sink.about(kind, id);
        assert_eq!(got.len(), 1, "{kind} {id}: {:#?}", sink.seen);
        got[0].clone()
    };
    let failing = one("notification.failing", "ex-1");
    assert_eq!(failing["data"]["attempt"], 4);
    assert_eq!(failing["data"]["status"], 500);
    assert!(failing["data"]["reason"].is_null());
    let exhausted = one("notification.exhausted", "ex-1");
    assert_eq!(exhausted["data"]["attempt"], 5);
    assert_eq!(exhausted["data"]["reason"], "max-attempts");
    assert_eq!(exhausted["data"]["endpoint"], origin(rx));
    let got: HashSet<String> = rx.requests().iter().map(|r| r.id()).collect();
    assert!(got.contains(exhausted["data"]["webhook_id"].as_str().unwrap()));
    one("notification.failing", "rec-1");
    let recovered = one("notification.recovered", "rec-1");
    assert_eq!(recovered["data"]["attempt"], 5);
    assert_eq!(recovered["data"]["status"], 200);
    let expired = one("notification.exhausted", "old-1");
    assert_eq!(expired["data"]["reason"], "expired");
    assert_eq!(expired["data"]["attempt"], 1);
    assert_eq!(expired["data"]["status"], 500, "the last attempt's status");
    let perm = one("notification.dead-lettered", "perm-1");
    assert_eq!(perm["data"]["reason"], "permanent-status");
    assert_eq!(perm["data"]["status"], 410);
    let abort = one("notification.dead-lettered", "abort-1");
    assert_eq!(abort["data"]["reason"], "aborted-by-receiver");
    let disabled = one("notification.dead-lettered", "dis-1");
    assert_eq!(disabled["data"]["reason"], "endpoint-disabled");
    assert_eq!(disabled["data"]["attempt"], 0);
    let ids: HashSet<&str> = sink
        .seen
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), sink.seen.len(), "distinct events, distinct ids");
}

fn check_endpoints(sink: &Sink, target: &str) {
    for (kind, reason) in [
        ("endpoint.paused", Some("deploy")),
        ("endpoint.resumed", None),
        ("endpoint.disabled", Some("gone for good")),
        ("endpoint.enabled", None),
    ] {
        let got = sink.of(kind);
        assert_eq!(got.len(), 1, "{kind}: {:#?}", sink.seen);
        let d = &got[0]["data"];
        assert_eq!(d["endpoint"], target);
        assert!(d["by"].as_str().unwrap().starts_with("command "), "{d}");
        assert_eq!(d["automatic"], false);
        assert_eq!(d["reason"].as_str(), reason, "{kind}");
    }
    let paused = &sink.of("endpoint.paused")[0]["data"];
    assert!(paused["until"].as_str().is_some(), "{paused}");
}

async fn the_events_url_gets_signed_events_and_none_about_itself(backend: DelayBackend) {
    let app = TestApp::new("ev-url", backend);
    let mut sink = Sink::bind(&app, "ev-all", &["#"]).await;
    let rx = receiver().await;
    // The events receiver fails each event's first five attempts.
    let events_rx = Receiver::start(|r| Reply::status(if r.nth <= 5 { 503 } else { 200 })).await;
    let hook = events_rx.url("/events");
    let args = [
        "--schedule",
        "1s",
        "--events-url",
        &hook,
        "--events-types",
        "notification.dead-lettered,endpoint.*",
        "--signing-secret",
        SECRET,
    ];
    let (_w, _) = run_with_admin(&app, &args);
    assert!(app.wait_consumers("work").await);
    app.publish(&[
        json!({"id": "perm-1", "url": rx.url("/gone")}),
        json!({"id": "ex-1", "url": rx.url("/fail"), "max_attempts": 1}),
    ])
    .await;
    let delivered = || {
        events_rx
            .requests()
            .into_iter()
            .filter(|r| r.reply == 200)
            .collect::<Vec<_>>()
    };
    let got =
        common::harness::wait_until(Duration::from_secs(40), || !delivered().is_empty()).await;
    assert!(got, "the events URL got {} requests", events_rx.count());
    let ok = delivered();
    assert_eq!(ok.len(), 1, "only the selected type: {ok:#?}");
    let r = &ok[0];
    Webhook::new(SECRET)
        .unwrap()
        .verify(&r.body, &r.headers)
        .expect("signed as any notification");
    let event: Value = serde_json::from_slice(&r.body).unwrap();
    assert_schema(&event, &app.prefix);
    assert_eq!(event["type"], "notification.dead-lettered");
    assert_eq!(event["data"]["notification_id"], "perm-1");
    assert_eq!(
        r.id(),
        event["id"].as_str().unwrap(),
        "webhook-id is the event's id"
    );
    assert_eq!(r.nth, 6, "its own retries");
    // The exchange has both events, and none about the events receiver.
    sink.wait(&app, Duration::from_secs(5), |s| s.len() >= 2)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    sink.take(&app).await;
    let mine = origin(&events_rx);
    let about_itself: Vec<_> = sink
        .seen
        .iter()
        .filter(|e| e["data"]["endpoint"] == mine.as_str())
        .collect();
    assert!(about_itself.is_empty(), "{about_itself:#?}");
    assert_eq!(count(&sink.seen, "notification.dead-lettered"), 1);
    assert_eq!(count(&sink.seen, "notification.exhausted"), 1);
    let status = app.cli(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("events         {}", app.name("events"))),
        "{text}"
    );
    assert!(
        text.contains("--events-url relay 0 waiting, 1 consumer(s)"),
        "{text}"
    );
}

/// Many notifications exhausted at once, the worker killed (-9) in the
/// middle three times: every dead letter has its event, and an event
/// published again (its original was not acked) has the same id.
async fn a_kill_9_between_an_event_and_its_ack_duplicates_never_loses(backend: DelayBackend) {
    let app = TestApp::new("ev-kill", backend);
    let mut sink = Sink::bind(&app, "ev-exhausted", &["notification.exhausted"]).await;
    let rx = Receiver::start(|_| Reply::status(500)).await;
    // Enough for three kills 100 attempts apart to land mid-stream; each is
    // a confirmed dead letter, event and history record, so more only
    // lengthens a busy CI pass (1,500 took up to 228 s there).
    let n = 900;
    let load: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("k-{i}"), "url": rx.url("/"), "max_attempts": 1}))
        .collect();
    app.publish(&load).await;
    let mut worker = run(&app);
    for _ in 0..3 {
        let before = rx.count();
        common::harness::wait_until(Duration::from_secs(20), || rx.count() > before + 100).await;
        worker.kill();
        worker = run(&app);
    }
    let dead = common::harness::wait_until(Duration::from_secs(60), || rx.count() >= n).await;
    assert!(dead, "{} of {n} attempted", rx.count());
    let dead = drain_dead_ids(&app, n).await;
    assert_eq!(dead.len(), n, "every notification dead-lettered");
    let all = |s: &[Value]| {
        let ids: HashSet<_> = s
            .iter()
            .map(|e| e["data"]["notification_id"].clone())
            .collect();
        ids.len() >= n
    };
    assert!(sink.wait(&app, Duration::from_secs(30), all).await);
    let mut by_id: HashMap<String, HashSet<String>> = HashMap::new();
    for e in &sink.seen {
        let nid = e["data"]["notification_id"].as_str().unwrap().to_string();
        by_id
            .entry(nid)
            .or_default()
            .insert(e["id"].as_str().unwrap().to_string());
    }
    for id in &dead {
        let ids = by_id.get(id).unwrap_or_else(|| panic!("no event for {id}"));
        assert_eq!(ids.len(), 1, "{id}: one id however often published");
    }
    let repeats = sink.seen.len() - by_id.len();
    println!("{n} exhausted, {repeats} event(s) published again after a kill");
    drop(worker);
}

fn run(app: &TestApp) -> Proc {
    let mut cmd = app.command();
    cmd.arg("run");
    Proc::spawn(cmd)
}

/// The ids of the dead letters, once `n` are there (or after 30 s).
async fn drain_dead_ids(app: &TestApp, n: usize) -> HashSet<String> {
    let mut ids = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ids.len() < n && std::time::Instant::now() < deadline {
        for d in app.drain_dead().await {
            let v: Value = serde_json::from_slice(&d.body).unwrap();
            ids.insert(v["id"].as_str().unwrap().to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ids
}

/// Two workers seeing the same stall at the same moment: one reports it,
/// the other does not; a recovery is reported once, then the next stall
/// can be reported again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_two_workers_reports_a_stall_and_one_its_recovery() {
    use redeliver::events::{lease, Emitter};
    let app = TestApp::new("ev-lease", DelayBackend::Plugin);
    let b = app.broker();
    let (c1, c2) = (
        b.url.connect("t1").await.unwrap(),
        b.url.connect("t2").await.unwrap(),
    );
    redeliver::delay::declare_topology(&b, &c1).await.unwrap();
    let t = redeliver::topology::Topology::new(&app.prefix);
    let p = redeliver::Publisher::new(&c1, t.clone(), b.delay, Duration::from_secs(5))
        .await
        .unwrap();
    let events = Emitter::new(&p, &t, &Default::default());
    let mut sink = Sink::bind(&app, "ev-delay", &["delay-backend.*"]).await;
    for round in 0..3 {
        let since = std::time::SystemTime::now();
        let (a, z) = tokio::join!(
            lease::stalled(&c1, &events, "plugin", since),
            lease::stalled(&c2, &events, "plugin", since)
        );
        assert_ne!(
            a.unwrap(),
            z.unwrap(),
            "round {round}: exactly one reports it"
        );
        let (a, z) = tokio::join!(
            lease::recovered(&c1, &events, "plugin"),
            lease::recovered(&c2, &events, "plugin")
        );
        assert_ne!(
            a.unwrap(),
            z.unwrap(),
            "round {round}: exactly one recovery"
        );
    }
    let six = |s: &[Value]| s.len() >= 6;
    assert!(sink.wait(&app, Duration::from_secs(10), six).await);
    assert_eq!(count(&sink.seen, "delay-backend.stalled"), 3);
    assert_eq!(count(&sink.seen, "delay-backend.recovered"), 3);
}
