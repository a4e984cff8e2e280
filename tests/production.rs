//! Running it in production: Standard Webhooks signatures checked by an
//! independent verifier, the admin endpoint, JSON logs, the config file and
//! its per-URL routes. Real broker, real HTTP, the real binary where the
//! user would use it.

mod common;

use std::time::Duration;

use common::harness::*;
use common::metrics::{admin, get, ready, start, status};
use common::receiver::{Receiver, Reply};
use common::{redeliver_command, TestApp};
use redeliver::config::SigningSecret;
use redeliver::config::{Route, Routes};
use redeliver::delay::DelayBackend;
use redeliver::HttpDeliverer;
use serde_json::{json, Value};
use standardwebhooks::Webhook;

const S1: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const S2: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tdGVzdHM=";
const S3: &str = "whsec_cm91dGUtb25seS1zZWNyZXQtZm9yLXRoZS1wcmVmaXg=";

fn secret(s: &str) -> SigningSecret {
    s.parse().unwrap()
}

/// Every request verifies with the `standardwebhooks` crate under each of
/// the worker's secrets (key rotation), the route's secret replaces them
/// for its URLs, and a changed body no longer verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signatures_verify_with_the_standard_webhooks_crate() {
    let app = TestApp::new("sign", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let route = Route {
        url_prefix: rx.url("/special"),
        secrets: Some(vec![secret(S3)]),
        ..Route::default()
    };
    let settings = schedule_settings("100ms", 3, 4);
    let handler = HttpDeliverer::new(Duration::from_secs(5), 4)
        .unwrap()
        .with_signing(vec![secret(S1), secret(S2)], Routes::new(vec![route]));
    let w = app.spawn_worker_with(settings, handler);
    let body = json!({"order": 42, "note": "ünïcode"});
    app.publish(&[
        json!({"url": rx.url("/plain"), "id": "plain-1", "body": body}),
        json!({"url": rx.url("/special/x"), "id": "special-1", "body": body}),
    ])
    .await;
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 2).await);
    w.stop().await;
    let reqs = rx.requests();
    let verify = |path: &str, s: &str, body: &[u8]| {
        let r = reqs.iter().find(|r| r.path.starts_with(path)).unwrap();
        Webhook::new(s).unwrap().verify(body, &r.headers).is_ok()
    };
    let sent = |path: &str| {
        reqs.iter()
            .find(|r| r.path.starts_with(path))
            .unwrap()
            .body
            .clone()
    };
    let plain = sent("/plain");
    assert!(verify("/plain", S1, &plain), "old key must verify");
    assert!(verify("/plain", S2, &plain), "new key must verify");
    assert!(
        !verify("/plain", S3, &plain),
        "the route's key is not for /plain"
    );
    assert!(
        !verify("/plain", S1, b"{\"order\":43}"),
        "a changed body must fail"
    );
    let special = sent("/special");
    assert!(verify("/special", S3, &special));
    assert!(!verify("/special", S1, &special));
    let signatures = |path: &str| {
        let r = reqs.iter().find(|r| r.path.starts_with(path)).unwrap();
        let sig = r.header("webhook-signature").unwrap();
        sig.split(' ').filter(|s| s.starts_with("v1,")).count()
    };
    assert_eq!(signatures("/plain"), 2, "one signature per secret");
    assert_eq!(signatures("/special"), 1);
}

/// A route's max attempts and success body apply to its URLs only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routes_override_policy_and_success_body() {
    let app = TestApp::new("route", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200).body("ok")).await;
    let mut settings = schedule_settings("100ms", 5, 4);
    settings.routes = Routes::new(vec![Route {
        url_prefix: rx.url("/strict"),
        max_attempts: Some(1),
        success_body: Some("SUCCESS".into()),
        ..Route::default()
    }]);
    let w = app.spawn_worker(settings);
    app.publish(&[
        json!({"url": rx.url("/strict"), "id": "strict"}),
        json!({"url": rx.url("/loose"), "id": "loose"}),
    ])
    .await;
    let dead = app.wait_dead(1).await;
    w.stop().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0]
            .str(redeliver::message::state::H_DEAD_REASON)
            .as_deref(),
        Some("max-attempts")
    );
    let reqs = rx.requests();
    assert_eq!(reqs.iter().filter(|r| r.path == "/strict").count(), 1);
    assert_eq!(reqs.iter().filter(|r| r.path == "/loose").count(), 1);
}

/// With the cascade, a worker holds short delays, at most
/// `--hold-prefetch` at once, and counts them in `redeliver_held` until it
/// releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_gauge_counts_short_delays() {
    let cascade = DelayBackend::Cascade;
    let app = TestApp::new("held", cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let args = ["--admin-addr", "127.0.0.1:0", "--hold-prefetch", "3"];
    let mut w = start(app.command(), &args);
    let admin = admin(&w).await;
    assert!(ready(&admin).await, "not ready while consuming");
    let b = app.broker();
    let conn = b.url.connect("test").await.unwrap();
    let t = redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    let publisher = redeliver::publish::Publisher::new(&conn, t, cascade, Duration::from_secs(30))
        .await
        .unwrap();
    for i in 0..5 {
        let body = json!({"url": rx.url("/ok"), "id": format!("h-{i}")}).to_string();
        let n = redeliver::publish::prepare(&body, 1 << 20).unwrap();
        let delay = Some(Duration::from_millis(1000));
        publisher.publish_new(&n, delay).await.unwrap();
    }
    let _ = conn.close(200, "".into()).await;
    // Every reading until all five were delivered (a sampling interval,
    // not a wait for something).
    let (mut most_held, until) = (0, std::time::Instant::now() + Duration::from_secs(20));
    while rx.count() < 5 && std::time::Instant::now() < until {
        let m = get(&format!("{admin}/metrics")).await.1;
        let held = m.lines().find_map(|l| l.strip_prefix("redeliver_held "));
        let held: i64 = held.and_then(|v| v.parse().ok()).unwrap_or(-1);
        most_held = most_held.max(held);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rx.count() >= 5, "{} of 5 delivered", rx.count());
    let mut after = String::new();
    wait_until_async(Duration::from_secs(5), async || {
        after = get(&format!("{admin}/metrics")).await.1;
        after.contains("redeliver_held 0")
    })
    .await;
    w.sigterm();
    w.wait_exit(Duration::from_secs(30));
    // Three held at once, not five, though all five were published
    // within far less than the 1 s they are held for.
    assert_eq!(most_held, 3, "the most held at once");
    assert!(after.contains("redeliver_held 0"), "{after}");
    assert!(after.contains("# HELP redeliver_held"), "{after}");
}

/// `/healthz`, `/readyz` and `/metrics` of a real worker process, and its
/// JSON attempt lines with every field the issue names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_endpoint_metrics_and_json_logs() {
    let app = TestApp::new("admin", DelayBackend::Plugin);
    let rx = Receiver::start(|r| Reply::status(if r.path == "/gone" { 410 } else { 200 })).await;
    let args = ["--admin-addr", "127.0.0.1:0", "--concurrency", "4"];
    let mut w = start(app.command(), &args);
    let admin = admin(&w).await;
    assert_eq!(get(&format!("{admin}/healthz")).await.0, 200);
    assert!(ready(&admin).await, "not ready while consuming");
    app.publish(&[
        json!({"url": rx.url("/ok"), "id": "m-ok"}),
        json!({"url": rx.url("/gone"), "id": "m-gone"}),
    ])
    .await;
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 2).await);
    let mut metrics = String::new();
    wait_until_async(Duration::from_secs(5), async || {
        metrics = get(&format!("{admin}/metrics")).await.1;
        // The attempt is counted before its dead letter's confirm comes.
        metrics.contains(r#"reason="permanent-status"} 1"#)
            && metrics.contains("redeliver_republish_confirms_pending 0")
            && metrics.contains("redeliver_in_flight 0")
    })
    .await;
    for needle in [
        r#"redeliver_deliveries_total{outcome="success",reason=""} 1"#,
        r#"redeliver_deliveries_total{outcome="dead",reason="permanent-status"} 1"#,
        r#"redeliver_attempt_duration_seconds_bucket{le="0.005"}"#,
        "redeliver_attempt_duration_seconds_count 2",
        r#"redeliver_success_attempt_number_bucket{le="1"} 1"#,
        "redeliver_in_flight 0",
        "redeliver_concurrency_limit 4",
        "redeliver_republish_confirms_pending 0",
        "redeliver_reconnects_total 0",
        "redeliver_dead_letters 0",
        "# HELP redeliver_deliveries_total",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from:\n{metrics}"
        );
    }
    // A host appears only as the bounded per-endpoint label (host:port),
    // never as a URL or a path.
    let endpoint = rx.url("").trim_start_matches("http://").to_string();
    for line in metrics.lines().filter(|l| l.contains("127.0.0.1")) {
        let label = format!("endpoint=\"{endpoint}\"");
        assert!(line.contains(&label) && !line.contains("http"), "{line}");
    }
    assert!(metrics.contains(&format!(
        "redeliver_endpoint_attempts_total{{endpoint=\"{endpoint}\"}} 2"
    )));
    let attempts: Vec<Value> = w
        .json()
        .into_iter()
        .filter(|v| v["message"] == "attempt")
        .collect();
    let ok = attempts
        .iter()
        .find(|v| v["id"] == "m-ok")
        .expect("attempt line");
    assert_eq!(ok["attempt"], 1);
    assert_eq!(ok["host"], "127.0.0.1");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["outcome"], "delivered");
    assert!(ok["duration_ms"].is_u64());
    let gone = attempts.iter().find(|v| v["id"] == "m-gone").unwrap();
    assert_eq!(gone["outcome"], "dead");
    w.sigterm();
    assert!(w.wait_exit(Duration::from_secs(20)).success());
}

/// Alive but not ready while the broker cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_without_a_broker() {
    let mut no_broker = redeliver_command();
    no_broker.args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f"]);
    let w = start(no_broker, &["--admin-addr", "127.0.0.1:0"]);
    let admin = admin(&w).await;
    assert_eq!(get(&format!("{admin}/healthz")).await.0, 200);
    // Once a connection attempt has failed (the reconnect counter shows),
    // it is still not ready.
    let failed = wait_until_async(Duration::from_secs(10), async || {
        let metrics = get(&format!("{admin}/metrics")).await.1;
        metrics.contains("redeliver_reconnects_total")
    })
    .await;
    assert!(failed, "redeliver_reconnects_total in /metrics");
    assert_eq!(get(&format!("{admin}/readyz")).await.0, 503);
}

/// While draining after SIGTERM the endpoint still answers, with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_is_503_while_draining() {
    let app = TestApp::new("drain", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_secs(2))).await;
    let mut w = start(app.command(), &["--admin-addr", "127.0.0.1:0"]);
    let admin = admin(&w).await;
    assert!(ready(&admin).await);
    app.publish(&[json!({"url": rx.url("/slow"), "id": "slow"})])
        .await;
    assert!(wait_until(Duration::from_secs(10), || rx.in_flight() == 1).await);
    w.sigterm();
    // The slow delivery holds the drain open for 2 s; /readyz answers
    // 503 within it (a process that had exited would not answer at all).
    let readyz = format!("{admin}/readyz");
    let draining = wait_until_async(Duration::from_secs(5), async || {
        status(&readyz).await == Some(503)
    })
    .await;
    assert!(draining, "/readyz answered 503 while draining");
    assert!(w.wait_exit(Duration::from_secs(20)).success());
    assert_eq!(app.queue_len("work").await, 0, "drained and acked");
}

/// The binary with `--config`: the file's secret signs every request, its
/// `[[route]]` secret replaces it for the route's URLs, and its route
/// `max-attempts` applies: all through the CLI, as a user would set it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn config_file_secrets_and_routes_reach_the_worker() {
    let app = TestApp::new("cfgrun", DelayBackend::Plugin);
    let rx = Receiver::start(|r| Reply::status(if r.path == "/fail" { 500 } else { 200 })).await;
    let path = std::env::temp_dir().join(format!("{}.toml", app.prefix));
    let toml = format!(
        "[run]\nsigning-secret = \"{S1}\"\nschedule = \"100ms\"\nmax-attempts = 5\n\
         [[route]]\nurl-prefix = \"{}\"\nsigning-secret = [\"{S3}\"]\n\
         [[route]]\nurl-prefix = \"{}\"\nmax-attempts = 2\n",
        rx.url("/special"),
        rx.url("/fail")
    );
    std::fs::write(&path, toml).unwrap();
    let cfg = path.to_str().unwrap();
    let mut w = start(app.command(), &["--config", cfg]);
    app.publish(&[
        json!({"url": rx.url("/plain"), "id": "c-plain", "body": {"a": 1}}),
        json!({"url": rx.url("/special"), "id": "c-special", "body": {"a": 2}}),
        json!({"url": rx.url("/fail"), "id": "c-fail"}),
    ])
    .await;
    let dead = app.wait_dead(1).await;
    wait_until(Duration::from_secs(10), || rx.count() >= 4).await;
    w.sigterm();
    assert!(w.wait_exit(Duration::from_secs(20)).success());
    let _ = std::fs::remove_file(&path);
    let reqs = rx.requests();
    let verifies = |path: &str, s: &str| {
        let r = reqs.iter().find(|r| r.path == path).unwrap();
        Webhook::new(s).unwrap().verify(&r.body, &r.headers).is_ok()
    };
    assert!(verifies("/plain", S1) && !verifies("/plain", S3));
    assert!(verifies("/special", S3) && !verifies("/special", S1));
    assert_eq!(reqs.iter().filter(|r| r.path == "/fail").count(), 2);
    assert_eq!(dead.len(), 1, "the route's max-attempts dead-letters it");
}

/// An embedding handler that panics on its first call for one id. The
/// delivery's task dies with it, and its lease requeues the message: the
/// broker delivers it again (to the same worker), and the handler's next
/// call succeeds. Without that, the message would stay unacked on the
/// worker's channel for the whole session, delivered to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panics_leaves_its_message_requeued_not_stuck() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    struct PanicsOnce {
        panicked: AtomicBool,
        delivered: Arc<Mutex<Vec<String>>>,
    }
    impl redeliver::DeliveryHandler for PanicsOnce {
        async fn deliver(
            &self,
            n: &redeliver::Notification,
            _attempt: u32,
        ) -> redeliver::AttemptResult {
            if n.id == "boom" && !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("the test handler's one panic");
            }
            self.delivered.lock().unwrap().push(n.id.clone());
            redeliver::AttemptResult::Response {
                status: 200,
                body: String::new(),
                retry_after: None,
                content_type: None,
            }
        }
    }

    let app = TestApp::new("panic", DelayBackend::Plugin);
    let delivered = Arc::new(Mutex::new(vec![]));
    let handler = PanicsOnce {
        panicked: AtomicBool::new(false),
        delivered: delivered.clone(),
    };
    let w = app.spawn_worker_with(schedule_settings("100ms", 3, 4), handler);
    app.publish(&[
        json!({"url": "http://example.invalid/a", "id": "boom"}),
        json!({"url": "http://example.invalid/b", "id": "calm"}),
    ])
    .await;
    let both = wait_until(Duration::from_secs(20), || {
        let d = delivered.lock().unwrap();
        d.contains(&"boom".to_string()) && d.contains(&"calm".to_string())
    })
    .await;
    w.stop().await;
    assert!(both, "delivered: {:?}", delivered.lock().unwrap());
    assert_eq!(app.queue_len("work").await, 0, "nothing left behind");
}
