//! Parking queues, from outside: real `redeliver run` processes on default
//! flags, real HTTP receivers and the CLI. A paused endpoint's
//! notifications wait in `<prefix>.park.K` (the pause test itself is in
//! `endpoint_control.rs`); here, `--max-age` still bounds them, and a
//! worker killed while parking loses none.

mod common;

use std::time::Duration;

use common::app::TestApp;
use common::endpoints::{all_delivered, delivered, endpoint, origin, show};
use common::harness::wait_until_async;
use common::metrics::{run_with_admin, scrape, value};
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;
use serde_json::json;

both_backends!(a_parked_notification_past_its_max_age_is_dead_lettered_as_expired);

/// Parked notifications carry what is left of their max age as a TTL: on
/// expiry they go back to their lane and are dead-lettered as `expired`,
/// unattempted, while those without a max age stay parked until the resume.
async fn a_parked_notification_past_its_max_age_is_dead_lettered_as_expired(backend: DelayBackend) {
    let app = TestApp::new("park-age", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let (_w, admin) = run_with_admin(&app, &[]);
    assert!(app.wait_consumers("work").await, "worker up");
    let target = origin(&rx);
    endpoint(&app, &["pause", &target]);
    assert!(common::endpoints::in_force(admin, "paused", 1.0).await);
    let short: Vec<_> = (0..3)
        .map(|i| json!({"url": rx.url("/"), "id": format!("short-{i}"), "max_age": "2s"}))
        .collect();
    app.publish(&short).await;
    let kept = app.publish(&rx.notifications("kept", 3)).await;
    let dead = wait_until_async(Duration::from_secs(20), async || {
        app.queue_len("dead").await >= 3
    });
    assert!(dead.await, "the short-lived ones were not dead-lettered");
    let out = app.cli(&["dlq", "list", "--reason", "expired", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        (0..3).all(|i| text.contains(&format!("short-{i}"))),
        "{text}"
    );
    assert_eq!(rx.count(), 0, "a paused endpoint got requests");
    let v = show(&app, &target).expect("show");
    assert_eq!(v["state"], "paused", "{v:#}");
    endpoint(&app, &["resume", &target]);
    assert!(
        all_delivered(&rx, &kept, Duration::from_secs(5)).await,
        "the parked ones without a max age: {:?}",
        delivered(&rx)
    );
    assert_eq!(app.queue_len("dead").await, 3);
}

/// A worker killed while it parks a backlog: what it had parked stays in
/// the parking queue, what it had not goes back to the lane; the next
/// worker parks the rest, and the resume delivers every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_while_parking_loses_nothing() {
    let app = TestApp::new("park-kill", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let (mut w1, admin) = run_with_admin(&app, &[]);
    assert!(app.wait_consumers("work").await, "worker up");
    let target = origin(&rx);
    endpoint(&app, &["pause", &target]);
    assert!(common::endpoints::in_force(admin, "paused", 1.0).await);
    // The kill comes while the backlog is still being published and parked.
    let notifications = rx.notifications("n", N);
    let kill = async {
        let parked_some = wait_until_async(Duration::from_secs(30), async || {
            let text = scrape(admin).await.unwrap_or_default();
            let op = ["op=\"parked\""];
            value(&text, "redeliver_parking_queue_total", &op).unwrap_or(0.0) >= 100.0
        });
        assert!(parked_some.await, "nothing parked");
        w1.kill();
        parked(&app).await
    };
    let (ids, at_kill) = tokio::join!(app.publish(&notifications), kill);
    println!("{at_kill} of {N} parked when the worker was killed");
    assert!(at_kill < N as u64, "the kill came after the parking");
    let (_w2, admin2) = run_with_admin(&app, &[]);
    assert!(common::endpoints::in_force(admin2, "paused", 1.0).await);
    let all_parked = wait_until_async(Duration::from_secs(60), async || {
        app.queue_len("work").await == 0 && parked(&app).await >= N as u64
    });
    assert!(all_parked.await, "parked: {}", parked(&app).await);
    assert_eq!(rx.count(), 0, "a paused endpoint got requests");
    endpoint(&app, &["resume", &target]);
    assert!(
        all_delivered(&rx, &ids, Duration::from_secs(30)).await,
        "delivered {} of {N}",
        delivered(&rx).len()
    );
}

/// The backlog parked in the kill test.
const N: usize = 5_000;

/// What `status` says is in the parking queues.
async fn parked(app: &TestApp) -> u64 {
    let out = app.cli(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["parked"].as_u64().unwrap_or(0)
}
