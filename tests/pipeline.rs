//! The delivery pipeline end to end: real broker node, real HTTP receivers.

#[macro_use]
mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;
use redeliver::message::state::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

async fn first_time_success_is_delivered_once(backend: DelayBackend) {
    let app = TestApp::new("ok", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    let text = format!(
        r#"{{"url": "{}", "body": {{"amount": 1.50, "z": [1]}}, "headers": {{"X-Tenant": "t1"}}}}"#,
        rx.url("/hook")
    );
    let ids = app.publish(&[text]).await;
    assert!(wait_until(WAIT, || rx.count() == 1).await);
    assert_quiet_for(ms(500), "requests", || rx.count()).await;
    w.stop().await;
    let r = &rx.requests()[0];
    assert_eq!(rx.count(), 1);
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/hook");
    assert_eq!(
        &r.body[..],
        br#"{"amount": 1.50, "z": [1]}"#,
        "the body bytes are sent unchanged"
    );
    assert_eq!(r.id(), ids[0]);
    assert_eq!(r.header("x-tenant").as_deref(), Some("t1"));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(r.header("redeliver-attempt").as_deref(), Some("1"));
    assert!(r.header("user-agent").unwrap().starts_with("redeliver/"));
    let ts: u64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
    assert!(ts > 1_700_000_000);
    assert_eq!(app.queue_len("work").await, 0);
    assert_eq!(app.queue_len("dead").await, 0);
}

async fn fails_twice_then_succeeds_on_schedule_with_a_stable_id(backend: DelayBackend) {
    let app = TestApp::new("twice", backend);
    let rx = Receiver::start(|r| {
        if r.nth <= 2 {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = app.spawn_worker(schedule_settings("1s,2s", 5, 4));
    app.publish(&[format!(
        r#"{{"url": "{}", "body": {{"n": 1}}}}"#,
        rx.url("/")
    )])
    .await;
    assert!(wait_until(WAIT, || rx.count() == 3).await);
    assert_quiet_for(ms(500), "requests", || rx.count()).await;
    w.stop().await;
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 3);
    for (i, want) in [(1, 1000u128), (2, 2000u128)] {
        let gap = reqs[i].at.duration_since(reqs[i - 1].at).as_millis();
        println!("gap {i}: {gap} ms (scheduled {want} ms)");
        assert!(
            gap >= want && gap < want + 500,
            "gap {i} was {gap} ms, scheduled {want} ms"
        );
    }
    let ids: HashSet<_> = reqs.iter().map(|r| r.id()).collect();
    assert_eq!(ids.len(), 1, "webhook-id is identical on every attempt");
    let attempts: Vec<_> = reqs
        .iter()
        .map(|r| r.header("redeliver-attempt").unwrap())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    assert!(reqs.iter().all(|r| &r.body[..] == br#"{"n": 1}"#));
}

async fn always_failing_is_dead_lettered_after_max_attempts(backend: DelayBackend) {
    let app = TestApp::new("dead", backend);
    let rx = Receiver::start(|_| Reply::status(503).body("down")).await;
    let w = app.spawn_worker(schedule_settings("200ms", 3, 4));
    let ids = app
        .publish(&[json!({"url": rx.url("/"), "body": "x", "id": "order-7"})])
        .await;
    assert_eq!(ids, ["order-7"]);
    assert!(wait_until(WAIT, || rx.count() >= 3).await);
    assert_quiet_for(ms(1000), "requests", || rx.count()).await;
    w.stop().await;
    assert_eq!(rx.count(), 3, "exactly max_attempts deliveries");
    let dead = app.drain_dead().await;
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.str(H_DEAD_REASON).as_deref(), Some("max-attempts"));
    assert_eq!(d.int(H_ATTEMPT), Some(3));
    assert_eq!(d.int(H_LAST_STATUS), Some(503));
    assert_eq!(d.str(H_LAST_ERROR).as_deref(), Some("HTTP 503"));
    let first = d.int(H_FIRST_AT).unwrap();
    let dead_at = d.int(H_DEAD_AT).unwrap();
    assert!(
        dead_at >= first + 400,
        "first attempt {first}, dead at {dead_at}"
    );
    match d.get(H_HISTORY) {
        Some(lapin::types::AMQPValue::FieldArray(a)) => assert_eq!(a.as_slice().len(), 3),
        other => panic!("no history: {other:?}"),
    }
    let body: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
    assert_eq!(body["id"], "order-7", "the original body is kept");
}

async fn permanent_status_is_dead_after_one_attempt(backend: DelayBackend) {
    let app = TestApp::new("gone", backend);
    let rx = Receiver::start(|_| Reply::status(410)).await;
    let w = app.spawn_worker(schedule_settings("100ms", 5, 4));
    app.publish(&[json!({"url": rx.url("/")})]).await;
    assert!(wait_until(WAIT, || rx.count() == 1).await);
    let mut dead = app.wait_dead(1).await;
    assert!(!dead.is_empty(), "dead-lettered within 10 s");
    assert_quiet_for(ms(500), "requests", || rx.count()).await;
    w.stop().await;
    assert_eq!(rx.count(), 1);
    dead.extend(app.drain_dead().await);
    assert_eq!(
        dead[0].str(H_DEAD_REASON).as_deref(),
        Some("permanent-status")
    );
    assert_eq!(dead[0].int(H_LAST_STATUS), Some(410));
    assert_eq!(dead[0].int(H_ATTEMPT), Some(1));
}

async fn success_body_mismatch_counts_as_failure(backend: DelayBackend) {
    let app = TestApp::new("sbody", backend);
    let rx =
        Receiver::start(|r| Reply::status(200).body(if r.nth == 1 { "ok" } else { " success\n" }))
            .await;
    let w = app.spawn_worker(schedule_settings("200ms", 5, 4));
    app.publish(&[json!({"url": rx.url("/"), "success_body": "success"})])
        .await;
    assert!(wait_until(WAIT, || rx.count() == 2).await);
    assert_quiet_for(ms(800), "requests", || rx.count()).await;
    w.stop().await;
    assert_eq!(
        rx.count(),
        2,
        "a 200 with the wrong body was retried, the right body ended it"
    );
}

async fn retry_after_is_honoured(backend: DelayBackend) {
    let app = TestApp::new("ra", backend);
    let rx = Receiver::start(|r| {
        if r.nth == 1 {
            Reply::status(429).header("Retry-After", "2")
        } else {
            Reply::status(204)
        }
    })
    .await;
    let mut settings = schedule_settings("100ms", 5, 4);
    settings.policy.backoff = redeliver::policy::Backoff::Exponential {
        initial: Duration::from_millis(100),
        factor: 2.0,
        max: Duration::from_secs(30),
        jitter: redeliver::policy::Jitter::None,
    };
    let w = app.spawn_worker(settings);
    app.publish(&[json!({"url": rx.url("/")})]).await;
    assert!(wait_until(WAIT, || rx.count() == 2).await);
    w.stop().await;
    let reqs = rx.requests();
    let gap = reqs[1].at.duration_since(reqs[0].at);
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2500),
        "gap {gap:?}"
    );
}

async fn concurrency_is_bounded_and_reached(backend: DelayBackend) {
    let app = TestApp::new("conc", backend);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(200))).await;
    let batch: Vec<_> = (0..200)
        .map(|i| json!({"url": rx.url("/"), "body": i}))
        .collect();
    app.publish(&batch).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 8));
    assert!(wait_until(Duration::from_secs(30), || rx.count() == 200).await);
    assert_quiet_for(ms(300), "requests", || rx.count()).await;
    w.stop().await;
    println!("max concurrent requests seen: {}", rx.max_in_flight());
    assert_eq!(rx.max_in_flight(), 8);
    assert_eq!(rx.count(), 200);
}

async fn invalid_messages_are_dead_lettered_with_their_bytes(backend: DelayBackend) {
    let app = TestApp::new("invalid", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let bad: Vec<&[u8]> = vec![
        b"not json",
        b"\xff\xfe\xfd",
        br#"{"body": 1}"#,
        br#"{"url": "/relative"}"#,
        br#"{"url": "ftp://x/"}"#,
        br#"{"url": 5}"#,
        br#"{"url": "http://127.0.0.1:9/", "max_attempts": "three"}"#,
        br#"{"url": "http://127.0.0.1:9/", "headers": {"bad name": "v"}}"#,
    ];
    for b in &bad {
        app.publish_raw(b, None).await;
    }
    let mut tampered = lapin::types::FieldTable::default();
    tampered.insert(H_ATTEMPT.into(), long_string("lots"));
    app.publish_raw(
        json!({"url": rx.url("/")}).to_string().as_bytes(),
        Some(tampered),
    )
    .await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    let dead = app.wait_dead(bad.len() + 1).await;
    w.stop().await;
    assert_eq!(dead.len(), bad.len() + 1);
    assert_eq!(rx.count(), 0);
    let bodies: HashSet<Vec<u8>> = dead.iter().map(|d| d.body.clone()).collect();
    for b in &bad {
        assert!(
            bodies.contains(*b),
            "original bytes kept for {:?}",
            String::from_utf8_lossy(b)
        );
    }
    for d in &dead {
        assert_eq!(d.str(H_DEAD_REASON).as_deref(), Some("invalid"));
        assert!(!d.str(H_LAST_ERROR).unwrap_or_default().is_empty());
    }
}

async fn two_processes_share_the_work(backend: DelayBackend) {
    let app = TestApp::new("two", backend);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(5))).await;
    let spawn = || {
        let mut c = app.command();
        c.args(["run", "--concurrency", "4"])
            .env("RUST_LOG", "info");
        Proc::spawn(c)
    };
    // Declare the topology first so both consumers attach before the load.
    app.publish(&[] as &[String]).await;
    let mut procs = [spawn(), spawn()];
    assert!(app.wait_consumer_count("work", 2).await, "both consume");
    let batch: Vec<_> = (0..500)
        .map(|i| json!({"url": rx.url("/"), "id": format!("n-{i}")}))
        .collect();
    app.publish(&batch).await;
    let done = wait_until(Duration::from_secs(60), || rx.count() >= 500).await;
    assert!(done, "only {} of 500 delivered", rx.count());
    assert_quiet_for(ms(500), "requests", || rx.count()).await;
    procs.iter().for_each(Proc::sigterm);
    for c in &mut procs {
        let st = c.wait_exit(Duration::from_secs(40));
        assert!(st.success(), "worker exit {st:?}");
    }
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in rx.requests() {
        *per_id.entry(r.id()).or_default() += 1;
    }
    assert_eq!(per_id.len(), 500, "every notification delivered");
    assert!(per_id.values().all(|&n| n == 1), "none twice");
    // JSON lines: stderr is a pipe, not a terminal.
    let delivered = procs.map(|c| c.stderr_count(r#""outcome":"delivered""#));
    assert!(
        delivered.iter().all(|&n| n > 0),
        "both processes delivered some: {delivered:?}"
    );
    assert_eq!(delivered.iter().sum::<usize>(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_plugin_is_one_clear_sentence() {
    // The work and dead queues are declared before the retry exchange
    // fails; dropping the app deletes them.
    let plain = common::plain_broker_url();
    let app = TestApp::on(&plain, "noplugin", DelayBackend::Plugin);
    let out = app.cli(&["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the broker has no `x-delayed-message` exchange type"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rabbitmq_delayed_message_exchange"),
        "{stderr}"
    );
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "one sentence, no stack of AMQP errors: {stderr}"
    );
}

/// With the dead-letter queue deleted under a running worker, the worker
/// does not hammer the receiver: it backs off, reconnects, re-declares the
/// topology and then dead-letters the notification.
async fn a_missing_dead_letter_queue_is_redeclared_not_hammered(backend: DelayBackend) {
    let app = TestApp::new("nodead", backend);
    // The receiver answers 410 (dead-letter at once) after 1 s, time enough
    // to delete the dead-letter queue while the first attempt is under way.
    let rx = Receiver::start(|_| Reply::status(410).delay(Duration::from_secs(1))).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    app.publish(&[json!({"url": rx.url("/"), "id": "x"})]).await;
    assert!(wait_until(Duration::from_secs(5), || rx.count() == 1).await);
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(app.name("dead").as_str().into(), Default::default())
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
    let dead = app.wait_dead(1).await;
    w.stop().await;
    println!("requests before the dead letter landed: {}", rx.count());
    assert_eq!(dead.len(), 1);
    assert!(
        rx.count() <= 3,
        "{} requests: the receiver was hammered",
        rx.count()
    );
}

both_backends!(
    first_time_success_is_delivered_once,
    fails_twice_then_succeeds_on_schedule_with_a_stable_id,
    always_failing_is_dead_lettered_after_max_attempts,
    permanent_status_is_dead_after_one_attempt,
    success_body_mismatch_counts_as_failure,
    retry_after_is_honoured,
    concurrency_is_bounded_and_reached,
    invalid_messages_are_dead_lettered_with_their_bytes,
    two_processes_share_the_work,
    a_missing_dead_letter_queue_is_redeclared_not_hammered,
);
