//! Short deferrals wait in the worker (`--max-waiting`), unacked, instead
//! of a round trip through the delay backend: a `Retry-After` pause is
//! sat out without a republish, and a worker killed with `-9` while
//! deliveries wait in it loses none of them. Real broker, real `redeliver
//! run` processes, real HTTP receivers on 127.0.0.1:0.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::app::TestApp;
use common::harness::{schedule_settings, wait_until};
use common::metrics::{run_with_admin, scrape, value, wait_metric};
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::delay::DelayBackend;

const WAITS: &str = "redeliver_waits_total";
const REPUBLISHED: &str = "redeliver_deferrals_republished_total";

/// Every id of `ids` reached the receiver with a 200.
fn all_delivered(rx: &Receiver, ids: &[String]) -> bool {
    let ok: HashSet<String> = rx
        .requests()
        .into_iter()
        .filter(|r| r.reply == 200)
        .map(|r| r.id())
        .collect();
    ids.iter().all(|i| ok.contains(i))
}

/// A 429 with `Retry-After: 2` pauses the endpoint; the 20 notifications
/// that come meanwhile wait in the worker: no request for 2 s, then each
/// arrives on its first attempt, and no deferral went through the broker.
async fn a_short_pause_waits_in_the_worker(backend: DelayBackend) {
    let app = TestApp::new("wait-pause", backend);
    let rx = Receiver::start(|r: &Recorded| match r.nth == 1 && r.id() == "p-0" {
        true => Reply::status(429).header("retry-after", "2"),
        false => Reply::status(200),
    })
    .await;
    let (w, admin) = run_with_admin(&app, &["--concurrency", "4"]);
    app.publish(&rx.notifications("p", 1)).await;
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 1).await);
    let ids = app.publish(&rx.notifications("q", 20)).await;
    let done = wait_until(Duration::from_secs(30), || all_delivered(&rx, &ids)).await;
    let metrics = scrape(admin).await.unwrap_or_default();
    drop(w);
    assert!(done, "{} requests", rx.count());
    let reqs = rx.requests();
    let quiet = reqs[1].at.duration_since(reqs[0].at);
    assert!(quiet >= Duration::from_millis(1_950), "paused {quiet:?}");
    for r in reqs.iter().filter(|r| r.id().starts_with("q-")) {
        assert_eq!(r.header("redeliver-attempt").as_deref(), Some("1"));
    }
    let waits = value(&metrics, WAITS, &[]).unwrap_or(0.0);
    assert!(waits >= 20.0, "each waited in the worker ({waits})");
    assert_eq!(value(&metrics, REPUBLISHED, &[]), Some(0.0), "{metrics}");
    assert!(app.drain_dead().await.is_empty());
}

/// A receiver answering 429 with `Retry-After: 3` keeps 100 deliveries
/// waiting in the worker (read from its `/metrics`) when it is killed with
/// `-9`. They were unacked, so the broker hands them to the next worker:
/// every notification is delivered once the receiver is healthy, and
/// nothing is left in the work or dead-letter queue.
async fn a_kill_9_with_waiting_deliveries_loses_nothing(backend: DelayBackend) {
    let app = TestApp::new("wait-kill", backend);
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let rx = Receiver::start(move |_: &Recorded| match h.load(Ordering::SeqCst) {
        true => Reply::status(200),
        false => Reply::status(429).header("retry-after", "3"),
    })
    .await;
    let (mut w, admin) = run_with_admin(&app, &["--concurrency", "8"]);
    let ids = app.publish(&rx.notifications("k", 100)).await;
    let within = Duration::from_secs(30);
    let waiting = wait_metric(admin, "redeliver_waiting", &[], within, |v| v >= 20.0).await;
    let republished = scrape(admin)
        .await
        .and_then(|m| value(&m, REPUBLISHED, &[]));
    w.kill();
    assert!(
        waiting.unwrap_or(0.0) >= 20.0,
        "deliveries waited in the worker at the kill ({waiting:?})"
    );
    assert_eq!(republished, Some(0.0), "none went through the broker");
    healthy.store(true, Ordering::SeqCst);
    let mut settings = schedule_settings("200ms", 20, 16);
    settings.shutdown_grace = Duration::from_secs(1);
    let w = app.spawn_worker(settings);
    let done = wait_until(Duration::from_secs(60), || all_delivered(&rx, &ids)).await;
    let drained = wait_until_empty(&app).await;
    w.stop().await;
    assert!(done, "every notification was delivered after the kill");
    assert!(drained, "nothing left in the work queue");
    assert!(app.drain_dead().await.is_empty(), "nothing dead-lettered");
}

/// A delivery waiting in the worker keeps its tag open, and every ack
/// above it on its consumer's channel would go alone for as long as it
/// waits. The feed replaces the lane's consumer at once, so a healthy
/// endpoint whose notifications share the lane keeps its acks in runs. In
/// `redeliver_ack_frames_total`, `multiple` frames come at all, which
/// none can while the open tag is on the same channel (991 single and 0
/// multiple before the rotation). How many go alone anyway depends on the
/// machine (deliveries that finish more than 5 ms out of order): 166-195
/// on a quick day here, 609-666 on one 3.5 times slower.
async fn a_wait_in_the_worker_leaves_its_lanes_acks_multiple(backend: DelayBackend) {
    let app = TestApp::new("wait-lane", backend);
    let paused = Receiver::start(|r: &Recorded| match r.id() == "p-0" && r.nth == 1 {
        true => Reply::status(429).header("retry-after", "5"),
        false => Reply::status(200),
    })
    .await;
    let healthy = loop {
        let rx =
            Receiver::start(|_: &Recorded| Reply::status(200).delay(Duration::from_millis(20)))
                .await;
        if app.lane_for(&rx.url("/")) == app.lane_for(&paused.url("/")) {
            break rx;
        }
    };
    let (w, admin) = run_with_admin(&app, &[]);
    app.publish(&paused.notifications("p", 1)).await;
    assert!(wait_until(Duration::from_secs(20), || paused.count() >= 1).await);
    app.publish(&paused.notifications("q", 1)).await;
    let within = Duration::from_secs(10);
    let waiting = wait_metric(admin, "redeliver_waiting", &[], within, |v| v >= 1.0).await;
    let ids = app.publish(&healthy.notifications("h", 1_000)).await;
    let done = wait_until(Duration::from_secs(60), || all_delivered(&healthy, &ids)).await;
    let metrics = scrape(admin).await.unwrap_or_default();
    drop(w);
    assert_eq!(waiting, Some(1.0), "q-0 waited in the worker");
    assert!(done, "{} of 1,000 delivered", healthy.count());
    let lane = format!("queue=\"{}\"", app.name(&app.lane_for(&healthy.url("/"))));
    let ack = "redeliver_ack_frames_total";
    let single = value(&metrics, ack, &["kind=\"single\"", &lane]).unwrap_or(0.0);
    let multiple = value(&metrics, ack, &["kind=\"multiple\"", &lane]).unwrap_or(0.0);
    println!("the shared lane's ack frames: {single} single, {multiple} multiple");
    assert!(
        multiple >= 5.0 && single <= 900.0,
        "{single} single and {multiple} multiple frames for 1,000 deliveries"
    );
}

async fn wait_until_empty(app: &TestApp) -> bool {
    for _ in 0..100 {
        if app.queue_len("work").await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

both_backends!(
    a_short_pause_waits_in_the_worker,
    a_wait_in_the_worker_leaves_its_lanes_acks_multiple,
    a_kill_9_with_waiting_deliveries_loses_nothing
);
