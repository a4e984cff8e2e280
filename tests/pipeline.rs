//! The delivery pipeline end to end: real broker node, real HTTP receivers.

#[macro_use]
mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::{prefix, prefix_on, url_for};
use redeliver::delay::DelayBackend;
use redeliver::message::state::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

async fn first_time_success_is_delivered_once(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("ok", backend));
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = spawn_worker(&url, &p, schedule_settings("1s", 3, 4));
    let text = format!(
        r#"{{"url": "{}", "body": {{"amount": 1.50, "z": [1]}}, "headers": {{"X-Tenant": "t1"}}}}"#,
        rx.url("/hook")
    );
    let ids = publish(&url, &p, &[text]).await;
    assert!(wait_until(WAIT, || rx.count() == 1).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    assert_eq!(queue_len(&url, &format!("{p}.work")).await, 0);
    assert_eq!(queue_len(&url, &format!("{p}.dead")).await, 0);
    cleanup(&url, &p).await;
}

async fn fails_twice_then_succeeds_on_schedule_with_a_stable_id(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("twice", backend));
    let rx = Receiver::start(|r| {
        if r.nth <= 2 {
            Reply::status(500)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let w = spawn_worker(&url, &p, schedule_settings("1s,2s", 5, 4));
    publish(
        &url,
        &p,
        &[format!(
            r#"{{"url": "{}", "body": {{"n": 1}}}}"#,
            rx.url("/")
        )],
    )
    .await;
    assert!(wait_until(WAIT, || rx.count() == 3).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    cleanup(&url, &p).await;
}

async fn always_failing_is_dead_lettered_after_max_attempts(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("dead", backend));
    let rx = Receiver::start(|_| Reply::status(503).body("down")).await;
    let w = spawn_worker(&url, &p, schedule_settings("200ms", 3, 4));
    let ids = publish(
        &url,
        &p,
        &[json!({"url": rx.url("/"), "body": "x", "id": "order-7"})],
    )
    .await;
    assert_eq!(ids, ["order-7"]);
    assert!(wait_until(WAIT, || rx.count() >= 3).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.stop().await;
    assert_eq!(rx.count(), 3, "exactly max_attempts deliveries");
    let dead = drain_dead(&url, &p).await;
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
    cleanup(&url, &p).await;
}

async fn permanent_status_is_dead_after_one_attempt(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("gone", backend));
    let rx = Receiver::start(|_| Reply::status(410)).await;
    let w = spawn_worker(&url, &p, schedule_settings("100ms", 5, 4));
    publish(&url, &p, &[json!({"url": rx.url("/")})]).await;
    assert!(wait_until(WAIT, || rx.count() == 1).await);
    assert!(wait_until_async_dead(&url, &p).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.stop().await;
    assert_eq!(rx.count(), 1);
    let dead = drain_dead(&url, &p).await;
    assert_eq!(
        dead[0].str(H_DEAD_REASON).as_deref(),
        Some("permanent-status")
    );
    assert_eq!(dead[0].int(H_LAST_STATUS), Some(410));
    assert_eq!(dead[0].int(H_ATTEMPT), Some(1));
    cleanup(&url, &p).await;
}

async fn wait_until_async_dead(url: &str, p: &str) -> bool {
    for _ in 0..200 {
        if queue_len(url, &format!("{p}.dead")).await > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn success_body_mismatch_counts_as_failure(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("sbody", backend));
    let rx =
        Receiver::start(|r| Reply::status(200).body(if r.nth == 1 { "ok" } else { " success\n" }))
            .await;
    let w = spawn_worker(&url, &p, schedule_settings("200ms", 5, 4));
    publish(
        &url,
        &p,
        &[json!({"url": rx.url("/"), "success_body": "success"})],
    )
    .await;
    assert!(wait_until(WAIT, || rx.count() == 2).await);
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;
    assert_eq!(
        rx.count(),
        2,
        "a 200 with the wrong body was retried, the right body ended it"
    );
    cleanup(&url, &p).await;
}

async fn retry_after_is_honoured(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("ra", backend));
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
    let w = spawn_worker(&url, &p, settings);
    publish(&url, &p, &[json!({"url": rx.url("/")})]).await;
    assert!(wait_until(WAIT, || rx.count() == 2).await);
    w.stop().await;
    let reqs = rx.requests();
    let gap = reqs[1].at.duration_since(reqs[0].at);
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2500),
        "gap {gap:?}"
    );
    cleanup(&url, &p).await;
}

async fn concurrency_is_bounded_and_reached(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("conc", backend));
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(200))).await;
    let batch: Vec<_> = (0..200)
        .map(|i| json!({"url": rx.url("/"), "body": i}))
        .collect();
    publish(&url, &p, &batch).await;
    let w = spawn_worker(&url, &p, schedule_settings("1s", 3, 8));
    assert!(wait_until(Duration::from_secs(30), || rx.count() == 200).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.stop().await;
    println!("max concurrent requests seen: {}", rx.max_in_flight());
    assert_eq!(rx.max_in_flight(), 8);
    assert_eq!(rx.count(), 200);
    cleanup(&url, &p).await;
}

async fn invalid_messages_are_dead_lettered_with_their_bytes(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("invalid", backend));
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
        publish_raw(&url, &p, b, None).await;
    }
    let mut tampered = lapin::types::FieldTable::default();
    tampered.insert(H_ATTEMPT.into(), long_string("lots"));
    publish_raw(
        &url,
        &p,
        json!({"url": rx.url("/")}).to_string().as_bytes(),
        Some(tampered),
    )
    .await;
    let w = spawn_worker(&url, &p, schedule_settings("1s", 3, 4));
    let mut dead = vec![];
    for _ in 0..100 {
        dead.extend(drain_dead(&url, &p).await);
        if dead.len() > bad.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    cleanup(&url, &p).await;
}

async fn two_processes_share_the_work(backend: DelayBackend) {
    let (url, p) = (url_for(backend), prefix_on("two", backend));
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(5))).await;
    let logs: Vec<_> = (0..2)
        .map(|i| std::env::temp_dir().join(format!("{p}-{i}.log")))
        .collect();
    let spawn = |log: &std::path::PathBuf| {
        std::process::Command::new(env!("CARGO_BIN_EXE_redeliver"))
            .args(["--delay-backend", backend.as_str()])
            .args([
                "--amqp-url",
                &url,
                "--prefix",
                &p,
                "run",
                "--concurrency",
                "4",
            ])
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("spawn redeliver run")
    };
    // Declare the topology first so both consumers attach before the load.
    publish(&url, &p, &[] as &[String]).await;
    let mut procs = [spawn(&logs[0]), spawn(&logs[1])];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let batch: Vec<_> = (0..500)
        .map(|i| json!({"url": rx.url("/"), "id": format!("n-{i}")}))
        .collect();
    publish(&url, &p, &batch).await;
    let done = wait_until(Duration::from_secs(60), || rx.count() >= 500).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for c in &mut procs {
        unsafe_sigterm(c.id());
    }
    for c in &mut procs {
        let st = c.wait().unwrap();
        assert!(st.success(), "worker exit {st:?}");
    }
    assert!(done, "only {} of 500 delivered", rx.count());
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in rx.requests() {
        *per_id.entry(r.id()).or_default() += 1;
    }
    assert_eq!(per_id.len(), 500, "every notification delivered");
    assert!(per_id.values().all(|&n| n == 1), "none twice");
    let delivered: Vec<usize> = logs
        .iter()
        .map(|l| {
            std::fs::read_to_string(l)
                .unwrap()
                .lines()
                // JSON lines: stderr is a file, not a terminal.
                .filter(|l| l.contains(r#""outcome":"delivered""#))
                .count()
        })
        .collect();
    println!("deliveries per process: {delivered:?}");
    assert!(
        delivered.iter().all(|&n| n > 0),
        "both processes delivered some: {delivered:?}"
    );
    assert_eq!(delivered.iter().sum::<usize>(), 500);
    cleanup(&url, &p).await;
}

fn unsafe_sigterm(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_plugin_is_one_clear_sentence() {
    let (url, p) = (common::plain_broker_url(), prefix("noplugin"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redeliver"))
        .args(["--amqp-url", &url, "--prefix", &p, "run"])
        .output()
        .unwrap();
    // The work and dead queues were declared before the retry exchange failed.
    cleanup(&url, &p).await;
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
    let (url, p) = (url_for(backend), prefix_on("nodead", backend));
    // The receiver answers 410 (dead-letter at once) after 1 s, time enough
    // to delete the dead-letter queue while the first attempt is under way.
    let rx = Receiver::start(|_| Reply::status(410).delay(Duration::from_secs(1))).await;
    let w = spawn_worker(&url, &p, schedule_settings("1s", 3, 4));
    publish(&url, &p, &[json!({"url": rx.url("/"), "id": "x"})]).await;
    assert!(wait_until(Duration::from_secs(5), || rx.count() == 1).await);
    let conn = redeliver::AmqpUrl::new(&url).connect("t").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(format!("{p}.dead").as_str().into(), Default::default())
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
    let mut dead = vec![];
    for _ in 0..100 {
        dead = drain_dead(&url, &p).await;
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.stop().await;
    println!("requests before the dead letter landed: {}", rx.count());
    assert_eq!(dead.len(), 1);
    assert!(
        rx.count() <= 3,
        "{} requests: the receiver was hammered",
        rx.count()
    );
    cleanup(&url, &p).await;
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
