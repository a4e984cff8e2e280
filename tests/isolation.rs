//! One bad receiver must not starve the others: per-endpoint concurrency,
//! rate limits, the circuit breaker, Retry-After pauses, deferral that
//! costs no attempt, and `--max-age`. Real broker, real HTTP receivers on
//! 127.0.0.1:0.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::app::TestApp;
use common::harness::{schedule_settings, wait_until};
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::config::{Route, Routes, WorkerSettings};
use redeliver::delay::DelayBackend;
use redeliver::message::state::H_DEAD_REASON;
use redeliver::HttpDeliverer;
use serde_json::json;

const PLUGIN: DelayBackend = DelayBackend::Plugin;

/// A worker isolated as in production, with a hard ceiling of
/// `endpoint_concurrency` under its adaptive limits (the harness's
/// settings turn the breaker off for tests about other things).
fn isolated(concurrency: usize, endpoint_concurrency: usize) -> WorkerSettings {
    let mut s = schedule_settings("200ms", 5, concurrency);
    s.endpoints.concurrency = Some(endpoint_concurrency);
    s.endpoints.breaker = redeliver::policy::BreakerPolicy::default();
    s.shutdown_grace = Duration::from_secs(1);
    s
}

fn notifications(rx: &Receiver, path: &str, tag: &str, n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| json!({"url": rx.url(path), "id": format!("{tag}-{i}"), "body": {"i": i}}))
        .collect()
}

fn attempts_by_id(rx: &Receiver) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for r in rx.requests() {
        let attempt = r.header("redeliver-attempt").unwrap_or_default();
        m.entry(r.id()).or_default().push(attempt);
    }
    m
}

/// 20 notifications to a receiver that hangs for a minute, 100 to a
/// healthy one, interleaved, 8 slots, a ceiling of 2: the hanging one
/// holds one slot (a new endpoint starts at one and, never answering,
/// earns no more; the ceiling is above that) and every healthy
/// notification arrives long before the first hanging attempt times out
/// (30 s). Without a limit, the first 8 hanging ones would take every
/// slot for 30 s. (tests/adaptive.rs has the same with no ceiling.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_receiver_does_not_starve_another() {
    let app = TestApp::new("hang", PLUGIN);
    let hang = Receiver::start(|_| Reply::status(200).delay(Duration::from_secs(60))).await;
    let ok = Receiver::start(|_| Reply::status(200)).await;
    let handler = HttpDeliverer::new(Duration::from_secs(30), 8).unwrap();
    let w = app.spawn_worker_with(isolated(8, 2), handler);
    let mut batch = vec![];
    for i in 0..100 {
        if i % 5 == 0 {
            batch.push(json!({"url": hang.url("/"), "id": format!("hang-{i}")}));
        }
        batch.push(json!({"url": ok.url("/"), "id": format!("ok-{i}")}));
    }
    let started = Instant::now();
    app.publish(&batch).await;
    let healthy_done = wait_until(Duration::from_secs(20), || ok.count() >= 100).await;
    let took = started.elapsed();
    w.stop().await;
    assert!(healthy_done, "healthy receiver got {} of 100", ok.count());
    assert!(took < Duration::from_secs(25), "took {took:?}");
    assert_eq!(hang.max_in_flight(), 1, "a new endpoint's one attempt");
}

/// 30 notifications to a receiver that takes 200 ms, 16 slots, a cap of
/// 3: never more than 3 at once, the cap reached, every one delivered
/// once on its first attempt (waiting for the endpoint is no attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_endpoint_cap_holds_and_waiting_costs_no_attempt() {
    let app = TestApp::new("cap", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(200))).await;
    let mut settings = isolated(16, 3);
    settings.policy.max_attempts = 1;
    let w = app.spawn_worker(settings);
    app.publish(&notifications(&rx, "/", "cap", 30)).await;
    let done = wait_until(Duration::from_secs(60), || rx.count() >= 30).await;
    w.stop().await;
    assert!(done, "{} of 30 delivered", rx.count());
    assert_eq!(rx.max_in_flight(), 3);
    let attempts = attempts_by_id(&rx);
    assert_eq!(attempts.len(), 30);
    assert!(attempts.values().all(|a| a == &["1"]), "{attempts:?}");
    assert!(app.drain_dead().await.is_empty());
}

/// A `[[route]]` with `rate = "10/s"` and `concurrency = 2`, through the
/// binary and a config file: no second holds more than 10 requests, and
/// every notification arrives on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_routes_rate_holds_through_the_config_file() {
    let app = TestApp::new("rate", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let config = std::env::temp_dir().join(format!("{}.toml", app.prefix));
    let text = format!(
        "[[route]]\nurl-prefix = \"{}\"\nrate = \"10/s\"\nconcurrency = 2\n",
        rx.url("/")
    );
    std::fs::write(&config, text).unwrap();
    let mut child = app
        .command()
        .arg("--config")
        .arg(&config)
        .args(["run", "--max-attempts", "1", "--shutdown-grace", "1s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    app.publish(&notifications(&rx, "/r", "rate", 25)).await;
    let done = wait_until(Duration::from_secs(60), || rx.count() >= 25).await;
    common::harness::sigterm(&child);
    common::harness::wait_exit(&mut child, Duration::from_secs(20));
    let _ = std::fs::remove_file(&config);
    assert!(done, "{} of 25 delivered", rx.count());
    let mut at: Vec<Instant> = rx.requests().iter().map(|r| r.at).collect();
    at.sort();
    // 10/s spaces them 100 ms apart, so the 11th after any one comes a
    // second later, and the 25 span 2.4 s. The times are the receiver's:
    // on a busy machine a request sent on time can be stamped late and
    // close up on the next, so 300 ms of slack. Unpaced (concurrency 2),
    // the 25 would come within tens of milliseconds; at twice the rate,
    // 11 would come within 500 ms.
    for (i, pair) in at.windows(11).enumerate() {
        let gap = pair[10].duration_since(pair[0]);
        assert!(
            gap >= Duration::from_millis(700),
            "11 requests within {gap:?} from #{i}"
        );
    }
    let span = at[24].duration_since(at[0]);
    assert!(
        span >= Duration::from_millis(2_100),
        "25 requests within {span:?}"
    );
    assert!(rx.max_in_flight() <= 2);
    let attempts = attempts_by_id(&rx);
    assert_eq!(attempts.len(), 25);
    assert!(attempts.values().all(|a| a == &["1"]), "{attempts:?}");
}

/// With no parking places, every delivery beyond the cap is deferred
/// through the delay backend. With `max_attempts` 1, a deferral that
/// counted as an attempt would dead-letter: none is, and each arrives with
/// `redeliver-attempt: 1`.
async fn deferral_costs_no_attempt(backend: DelayBackend) {
    let app = TestApp::new("defer", backend);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(300))).await;
    let mut settings = isolated(8, 1);
    settings.endpoints.max_parked = 0;
    // Nor wait in the worker: this is about the deferral through the backend.
    settings.endpoints.max_waiting = 0;
    settings.policy.max_attempts = 1;
    let w = app.spawn_worker(settings);
    app.publish(&notifications(&rx, "/", "defer", 6)).await;
    let done = wait_until(Duration::from_secs(60), || rx.count() >= 6).await;
    w.stop().await;
    assert!(done, "{} of 6 delivered", rx.count());
    let attempts = attempts_by_id(&rx);
    assert_eq!(attempts.len(), 6);
    assert!(attempts.values().all(|a| a == &["1"]), "{attempts:?}");
    assert_eq!(rx.max_in_flight(), 1);
    assert!(app.drain_dead().await.is_empty(), "nothing dead-lettered");
}

both_backends!(deferral_costs_no_attempt);

/// A receiver that answers 503 (down or overloaded, no `Retry-After`)
/// until told otherwise; the breaker opens after 3 of them for 1 s: no
/// request reaches it while open, one probe after it (which fails, so it
/// opens again for 2 s), and once the receiver is healthy the next probe
/// closes it and everything is delivered. (A 500 would not open it:
/// tests/breaker.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_breaker_opens_probes_and_closes() {
    let app = TestApp::new("breaker", PLUGIN);
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let rx = Receiver::start(move |_: &Recorded| {
        Reply::status(if h.load(Ordering::SeqCst) { 200 } else { 503 })
    })
    .await;
    let mut settings = isolated(4, 1);
    settings.policy = redeliver::policy::RetryPolicy {
        max_attempts: 50,
        backoff: redeliver::policy::Backoff::Schedule(vec![Duration::from_millis(100)]),
    };
    settings.endpoints.breaker.failures = 3;
    settings.endpoints.breaker.open = Duration::from_secs(1);
    let w = app.spawn_worker(settings);
    app.publish(&notifications(&rx, "/", "b", 10)).await;
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 4).await);
    healthy.store(true, Ordering::SeqCst);
    let ids = |rx: &Receiver| {
        let ok = rx.requests().into_iter().filter(|r| r.reply == 200);
        ok.map(|r| r.id()).collect::<std::collections::HashSet<_>>()
    };
    let done = wait_until(Duration::from_secs(30), || ids(&rx).len() >= 10).await;
    w.stop().await;
    assert!(done, "{} of 10 delivered", ids(&rx).len());
    let reqs = rx.requests();
    let gap = |i: usize| reqs[i].at.duration_since(reqs[i - 1].at);
    assert!(reqs[..3].iter().all(|r| r.reply == 503));
    assert!(
        gap(3) >= Duration::from_millis(950),
        "open 1 s: {:?}",
        gap(3)
    );
    assert_eq!(reqs[3].reply, 503, "the first probe failed");
    assert!(
        gap(4) >= Duration::from_millis(1_900),
        "open 2 s: {:?}",
        gap(4)
    );
    assert_eq!(reqs[4].reply, 200, "the next probe closed it");
}

/// A 429 with `Retry-After: 2` pauses the whole endpoint: no request for
/// 2 s, then the rest arrive, on their first attempt (the paused ones were
/// deferred, not attempted); only the 429'd one shows attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_pauses_the_endpoint() {
    let app = TestApp::new("pause", PLUGIN);
    let rx = Receiver::start(|r: &Recorded| {
        if r.nth == 1 && r.id() == "p-0" {
            Reply::status(429).header("retry-after", "2")
        } else {
            Reply::status(200)
        }
    })
    .await;
    let mut settings = isolated(4, 1);
    settings.policy.max_attempts = 5;
    let w = app.spawn_worker(settings);
    app.publish(&notifications(&rx, "/", "p", 1)).await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() >= 1).await);
    app.publish(&notifications(&rx, "/", "q", 5)).await;
    let done = wait_until(Duration::from_secs(30), || rx.count() >= 7).await;
    w.stop().await;
    assert!(done, "{} requests", rx.count());
    let reqs = rx.requests();
    let quiet = reqs[1].at.duration_since(reqs[0].at);
    assert!(quiet >= Duration::from_millis(1_950), "paused {quiet:?}");
    let attempts = attempts_by_id(&rx);
    assert_eq!(attempts["p-0"], ["1", "2"]);
    for i in 0..5 {
        assert_eq!(attempts[&format!("q-{i}")], ["1"], "q-{i}");
    }
}

/// `--max-age` (and a notification's own `max_age`): a notification that
/// keeps failing is dead-lettered as `expired` once it is that old, and
/// `dlq list --reason expired` finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_age_expires_to_the_dead_letter_queue() {
    let app = TestApp::new("age", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(500)).await;
    let mut settings = isolated(4, 2);
    settings.policy = redeliver::policy::RetryPolicy {
        max_attempts: 100,
        backoff: redeliver::policy::Backoff::Schedule(vec![Duration::from_millis(300)]),
    };
    settings.endpoints.breaker.failures = 0;
    settings.max_age = Some(Duration::from_millis(1500));
    let route = Route {
        url_prefix: rx.url("/long"),
        max_age: Some(Duration::from_secs(3600)),
        ..Route::default()
    };
    settings.routes = Routes::new(vec![route]);
    let w = app.spawn_worker(settings);
    app.publish(&[
        json!({"url": rx.url("/flag"), "id": "by-flag"}),
        json!({"url": rx.url("/long"), "id": "by-own", "max_age": "1s"}),
    ])
    .await;
    let mut dead_count = 0;
    for _ in 0..100 {
        dead_count = app.queue_len("dead").await;
        if dead_count >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead_count, 2, "both dead-lettered");
    let out = app.cli(&["dlq", "list", "--reason", "expired", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains("by-flag") && text.contains("by-own"));
    let attempts = attempts_by_id(&rx);
    // Tried every 300 ms until expired: several attempts, not 100.
    assert!(attempts["by-flag"].len() >= 3 && attempts["by-flag"].len() < 10);
    assert!(attempts["by-own"].len() >= 2 && attempts["by-own"].len() < 10);
    // A replay starts a new age: it is attempted again from attempt 1,
    // not expired on arrival.
    let out = app.cli(&["dlq", "replay", "--reason", "expired", "--all"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first_again = |rx: &Receiver| {
        let a = attempts_by_id(rx);
        a["by-flag"].iter().filter(|n| *n == "1").count() == 2
    };
    let replayed = wait_until(Duration::from_secs(20), || first_again(&rx)).await;
    w.stop().await;
    assert!(replayed, "the replayed notification was attempted afresh");
    let dead = app.drain_dead().await;
    assert!(dead
        .iter()
        .all(|d| d.str(H_DEAD_REASON).as_deref() == Some("expired")));
}

/// `redeliver run` killed with `-9` while deliveries are parked (read from
/// its `/metrics`): they were unacked, so the broker hands them to the
/// next worker and every notification is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_9_with_parked_deliveries_loses_nothing() {
    let app = TestApp::new("kill-parked", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(100))).await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = app
        .command()
        .args(["run", "--concurrency", "8", "--endpoint-concurrency", "2"])
        .args(["--max-parked", "64", "--admin-addr"])
        .arg(format!("127.0.0.1:{admin}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ids = app.publish(&notifications(&rx, "/", "k", 300)).await;
    let mut parked = 0.0;
    for _ in 0..200 {
        parked = gauge(admin, "redeliver_parked").await.unwrap_or(0.0);
        if parked >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        parked >= 5.0,
        "deliveries were parked at the kill ({parked})"
    );
    let before = rx.count();
    assert!(before < 300, "the kill came before the end ({before})");
    let mut settings = schedule_settings("200ms", 5, 32);
    settings.endpoints.concurrency = Some(32);
    let w = app.spawn_worker(settings);
    let all = |rx: &Receiver| {
        let seen: std::collections::HashSet<String> =
            rx.requests().iter().map(|r| r.id()).collect();
        ids.iter().all(|i| seen.contains(i))
    };
    let done = wait_until(Duration::from_secs(60), || all(&rx)).await;
    w.stop().await;
    assert!(done, "every notification was delivered after the kill");
}

/// A gauge's value from a worker's `/metrics`.
async fn gauge(admin: u16, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
