//! What receivers decide for themselves, from outside: the automatic
//! disable of an endpoint with no success for `--disable-after` (and only
//! that one: a flaky endpoint or a quiet one is never disabled), recorded
//! once however many workers see it, and a receiver's
//! `webhook-delivery: abort-message`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::app::TestApp;
use common::endpoints::{history_count, origin, show, stream_records, wait_state};
use common::events::{assert_schema, Sink};
use common::harness::wait_until;
use common::metrics::run_with_admin;
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;
use serde_json::json;

both_backends!(
    only_an_endpoint_failing_for_the_whole_span_is_disabled_and_once,
    an_abort_message_ends_the_notification_after_one_attempt,
);

async fn only_an_endpoint_failing_for_the_whole_span_is_disabled_and_once(backend: DelayBackend) {
    let app = TestApp::new("ep-auto", backend);
    let mut events = Sink::bind(&app, "ev-endpoint", &["endpoint.#"]).await;
    let refused = refused_url();
    // 90% of the flaky receiver's answers are 500s.
    let n = AtomicUsize::new(0);
    let flaky = Receiver::start(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        Reply::status(if i % 10 == 9 { 200 } else { 500 })
    })
    .await;
    let quiet = Receiver::start(|_| Reply::status(500)).await;
    let args = [
        "--disable-after",
        "5s",
        "--schedule",
        "1s",
        "--max-attempts",
        "1000",
    ];
    let (_w1, _) = run_with_admin(&app, &args);
    let (_w2, _) = run_with_admin(&app, &args);
    assert!(app.wait_consumer_count("work", 2).await);
    let to = |url: &str, tag: &str, n: usize, extra: serde_json::Value| -> Vec<serde_json::Value> {
        (0..n)
            .map(|i| {
                let mut v = json!({"url": url, "id": format!("{tag}-{i}")});
                v.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                v
            })
            .collect()
    };
    // The quiet one fails twelve times, once each, then has no traffic.
    app.publish(&to(&quiet.url("/"), "q", 12, json!({"max_attempts": 1})))
        .await;
    let dead_ids = app
        .publish(&to(&format!("{refused}/x"), "r", 15, json!({})))
        .await;
    app.publish(&to(&flaky.url("/"), "f", 40, json!({}))).await;
    assert!(
        wait_state(&app, &refused, "disabled", Duration::from_secs(40)).await,
        "the refusing endpoint was not disabled"
    );
    let v = show(&app, &refused).expect("show");
    assert_eq!(history_count(&v, "disabled"), 1, "{v:#}");
    // One record on the stream too, whichever worker wrote it.
    let disables: Vec<_> = stream_records(&app)
        .await
        .into_iter()
        .filter(|r| r["type"] == "disable" && r["target"] == refused.as_str())
        .collect();
    assert_eq!(disables.len(), 1, "{disables:#?}");
    let reason = v["control"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(reason.starts_with("auto: no success since "), "{reason}");
    // Its notifications are dead-lettered with the reason.
    let listed = wait_until(Duration::from_secs(30), || {
        dead_with(&app, &refused, "endpoint-disabled") == dead_ids.len()
    })
    .await;
    assert!(
        listed,
        "{} of 15 dead-lettered",
        dead_with(&app, &refused, "endpoint-disabled")
    );
    // Twice the span later, the flaky and the quiet ones are still active.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for rx in [&flaky, &quiet] {
        let v = show(&app, &origin(rx)).expect("show");
        assert_eq!(v["state"], "active", "{v:#}");
        assert_eq!(history_count(&v, "disabled"), 0);
    }
    assert!(
        flaky.count() > 100,
        "the flaky endpoint kept getting traffic"
    );
    // One endpoint.disabled across the two workers, said to be automatic.
    events.take(&app).await;
    let disabled = events.of("endpoint.disabled");
    assert_eq!(disabled.len(), 1, "{:#?}", events.seen);
    let d = &disabled[0]["data"];
    assert_eq!(d["endpoint"], refused.as_str());
    assert_eq!(d["automatic"], true);
    assert!(d["by"].as_str().unwrap().starts_with("auto "), "{d}");
    assert!(d["reason"]
        .as_str()
        .unwrap()
        .starts_with("auto: no success since "));
    assert_schema(disabled[0], &app.prefix);
    assert_eq!(events.seen.len(), 1, "{:#?}", events.seen);
}

async fn an_abort_message_ends_the_notification_after_one_attempt(backend: DelayBackend) {
    let app = TestApp::new("ep-abort", backend);
    let rx = Receiver::start(|r| {
        let status = if r.path == "/ok" { 200 } else { 500 };
        Reply::status(status).header("webhook-delivery", "abort-message")
    })
    .await;
    let (_w, _) = run_with_admin(&app, &["--schedule", "1s"]);
    app.publish(&[json!({"url": rx.url("/fail"), "id": "abort-1"})])
        .await;
    app.publish(&[json!({"url": rx.url("/ok"), "id": "ok-1"})])
        .await;
    let dead = app.wait_dead(1).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].str("redeliver-dead-reason").as_deref(),
        Some("aborted-by-receiver")
    );
    assert_eq!(dead[0].int("redeliver-attempt"), Some(1));
    // Long enough for a retry at the 1 s schedule, had there been one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths.iter().filter(|p| *p == "/fail").count(),
        1,
        "{paths:?}"
    );
    assert_eq!(paths.iter().filter(|p| *p == "/ok").count(), 1, "{paths:?}");
    assert!(
        app.drain_dead().await.is_empty(),
        "a 2xx is delivered, abort or not"
    );
}

/// `http://127.0.0.1:PORT` where nothing listens: every connection refused.
fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// Dead letters to `target` with `reason` (`dlq list`, non-destructive).
fn dead_with(app: &TestApp, target: &str, reason: &str) -> usize {
    let out = app.cli(&[
        "dlq",
        "list",
        "--json",
        "--endpoint",
        target,
        "--reason",
        reason,
    ]);
    String::from_utf8_lossy(&out.stdout).lines().count()
}
