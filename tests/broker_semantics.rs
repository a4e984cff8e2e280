//! What RabbitMQ 4.x changed for quorum queues, held against the project's
//! own queues. CI runs this suite on 3.10 and again on 4.x
//! (`REDELIVER_TEST_RABBITMQ=4`, see `tests/broker/ctl`), where it matters:
//! - 4.0 gave quorum queues a default delivery limit of 20, past which a
//!   returned message is dropped (or dead-lettered), and in 4.3
//!   `basic.reject` counts toward it;
//! - 4.3 adds `x-acquired-count` beside `x-delivery-count` to a message it
//!   hands out again.
//!
//! The cascade's at-least-once dead-lettering through a node crash is
//! `tests/cascade.rs`'s `cascade_survives_a_broker_kill`, in the same 4.x pass.

#[macro_use]
mod common;

use std::time::Duration;

use common::dead_letters::{assert_unchanged, fixture};
use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use redeliver::delay::DelayBackend;
use redeliver::message::state::is_broker_count_header;
use serde_json::json;

/// More returns than 4.x's default delivery limit of 20.
const RETURNS: u32 = 25;

/// Takes the one message on the work queue and returns it with
/// `basic.reject` (requeue) `RETURNS` times, as a consumer that crashes on
/// it would; returns the broker-count headers of the last delivery.
async fn return_work_message(app: &TestApp, url: &str) -> FieldTable {
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    // Published by a producer alone: no worker has laid the buckets yet,
    // so it waits in lane 0, whatever its URL's lane.
    let _ = url;
    let queue = app.name("work.0");
    let opts = BasicConsumeOptions::default();
    let consume = ch.basic_consume(
        queue.as_str().into(),
        "returner".into(),
        opts,
        FieldTable::default(),
    );
    let mut consumer = consume.await.expect("consume the work queue");
    let mut last = FieldTable::default();
    for n in 1..=RETURNS {
        let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
        let Ok(Some(Ok(d))) = next else {
            panic!("return {n}: the message was not handed out again")
        };
        last = d.properties.headers().clone().unwrap_or_default();
        let requeue = BasicRejectOptions { requeue: true };
        d.reject(requeue).await.expect("basic.reject");
    }
    let _ = conn.close(0, "done".into()).await;
    last
}

/// A notification its consumers returned 25 times (a crash loop, say) is
/// still delivered: the project's work queue sets a delivery limit of
/// 1,000,000, not 4.x's default 20. The receiver sees attempt 1: the
/// broker's counts are never taken for the notification's attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_message_returned_25_times_is_still_delivered_as_attempt_1() {
    let app = TestApp::new("returned", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    app.publish(&[json!({"url": rx.url("/"), "id": "returned"})])
        .await;
    let counts = return_work_message(&app, &rx.url("/")).await;
    let count = counts.inner().get("x-delivery-count");
    println!("the last return carried x-delivery-count {count:?}");
    assert!(count.is_some(), "a quorum queue counts returns: {counts:?}");
    // 4.3 adds x-acquired-count too (4.0.5 does not).
    if redeliver::ops::test_rabbitmq().0 == Some("forky") {
        assert!(
            counts.inner().contains_key("x-acquired-count"),
            "{counts:?}"
        );
    }
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    let delivered = wait_until(Duration::from_secs(20), || rx.count() >= 1).await;
    w.stop().await;
    assert!(delivered, "a message returned {RETURNS} times was dropped");
    let req = &rx.requests()[0];
    assert_eq!(req.id(), "returned");
    let attempt = req.header(redeliver::deliver::ATTEMPT_HEADER);
    assert_eq!(
        attempt.as_deref(),
        Some("1"),
        "the broker's count is not ours"
    );
}

/// The same message, then refused for good by its receiver: its dead
/// letter records one attempt and shows none of the broker's count headers
/// as the producer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_count_headers_never_reach_a_dead_letter_as_the_producers() {
    let app = TestApp::new("counts", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(410)).await;
    let id = "counted";
    app.publish(&[json!({"url": rx.url("/"), "id": id, "headers": {"x-custom": "kept"}})])
        .await;
    return_work_message(&app, &rx.url("/")).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    let dead = wait_until_async(Duration::from_secs(20), async || {
        app.queue_len("dead").await == 1
    })
    .await;
    w.stop().await;
    assert!(dead, "the refused notification was dead-lettered");
    let shown = stdout(&app.cli(&["dlq", "show", id]));
    let doc: serde_json::Value = serde_json::from_str(&shown).expect("dlq show prints JSON");
    let letter = &doc["dead_letter"];
    assert_eq!(letter["attempts"], 1, "{shown}");
    assert_eq!(
        letter["history"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );
    let headers = letter["headers"].as_object().cloned().unwrap_or_default();
    let broker: Vec<&String> = headers
        .keys()
        .filter(|k| is_broker_count_header(k))
        .collect();
    assert!(
        broker.is_empty(),
        "broker counts shown as the producer's: {broker:?} in {shown}"
    );
}

/// `dlq list` walks the dead-letter queue by taking and returning every
/// message. 25 walks (more than 4.x's default delivery limit of 20) leave
/// every dead letter there, unchanged, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_listed_25_times_is_still_there_unchanged_in_order() {
    let app = TestApp::new("walked", DelayBackend::Plugin);
    let items = fixture("http://127.0.0.1:9");
    app.publish_to_queue("dead", &items).await;
    let first = stdout(&app.cli(&["dlq", "list", "--json"]));
    assert_eq!(first.lines().count(), items.len(), "{first}");
    for walk in 2..=RETURNS {
        let listed = stdout(&app.cli(&["dlq", "list", "--json"]));
        assert_eq!(listed, first, "walk {walk} listed something else");
    }
    assert_unchanged(&app.drain_dead().await, &items);
}

/// Workers of a fleet start at once, and each declares the whole topology
/// (the cascade's 121 quorum queues) while the others do. On RabbitMQ 4.3
/// a declare of a quorum queue another connection is creating at that
/// moment was refused with `NOT_FOUND - home node ... of durable queue ...
/// is down or inaccessible` (CI saw it once, on `cascade.1.12`): the
/// broker's "not there yet". Every declare must succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declares_racing_each_other_all_succeed() {
    for round in 0..3 {
        let app = TestApp::new(&format!("race{round}"), DelayBackend::Cascade);
        let broker = app.broker();
        let racers = (0..4).map(|_| {
            let broker = broker.clone();
            tokio::spawn(async move {
                let conn = common::connect(&broker.url.urls()[0]).await;
                let declared = redeliver::delay::declare_topology(&broker, &conn).await;
                let _ = conn.close(200, "".into()).await;
                declared.map(|_| ()).map_err(|e| e.to_string())
            })
        });
        for declared in futures_util::future::join_all(racers).await {
            declared
                .expect("the racer ran")
                .expect("its declare succeeded");
        }
    }
}
