//! Lanes: raw producers' keys, retries back to the lane, and the move from
//! the single work queue of an earlier build (or another lane count) with
//! nothing lost. Real worker, real broker, real HTTP receiver.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::harness::{schedule_settings, wait_until};
use common::receiver::{Receiver, Reply};
use common::TestApp;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use redeliver::delay::DelayBackend;

/// Publishes `payloads` to `exchange` with `key`, confirms pipelined.
async fn publish_raw(app: &TestApp, exchange: &str, key: &str, payloads: &[String]) {
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for chunk in payloads.chunks(500) {
        let mut pending = Vec::new();
        for p in chunk {
            // delivery_mode 2: persistent, as every producer should.
            let props = BasicProperties::default().with_delivery_mode(2);
            let opts = BasicPublishOptions::default();
            let sent = ch.basic_publish(exchange.into(), key.into(), opts, p.as_bytes(), props);
            pending.push(sent.await.expect("publish"));
        }
        for c in pending {
            assert!(c.await.expect("confirm").is_ack(), "nacked");
        }
    }
    let _ = conn.close(200, "".into()).await;
}

fn notification(url: &str, id: &str) -> String {
    format!(r#"{{"url":"{url}","id":"{id}","body":{{}}}}"#)
}

/// Raw producers publish to the intake with any routing key: none, one
/// of their own, a bucket that does not exist, a bucket of another lane.
/// Each arrives, and its retry comes back (the first attempt fails).
async fn any_routing_key_from_a_raw_producer_arrives(backend: DelayBackend) {
    let app = TestApp::new("rawkey", backend);
    let rx = Receiver::start(|r| match r.nth {
        1 => Reply::status(500),
        _ => Reply::status(200),
    })
    .await;
    let w = app.spawn_worker(schedule_settings("300ms", 3, 4));
    assert!(
        app.wait_consumers("work").await,
        "the worker consumes every lane"
    );
    let keys = ["", "orders", "bucket.99", "bucket.3", "bucket.x"];
    for (i, key) in keys.iter().enumerate() {
        let n = notification(&rx.url(&format!("/{i}")), &format!("raw-{i}"));
        publish_raw(&app, &app.name("notifications"), key, &[n]).await;
    }
    let delivered = || rx.requests().iter().filter(|r| r.reply == 200).count();
    assert!(
        wait_until(Duration::from_secs(20), || delivered() == keys.len()).await,
        "delivered {} of {}: {:?}",
        delivered(),
        keys.len(),
        rx.count_by_id()
    );
    assert!(
        rx.count_by_id().values().all(|&n| n == 2),
        "{:?}",
        rx.count_by_id()
    );
    w.stop().await;
    // Nothing is stuck in a lane. A copy of a notification that already
    // arrived may be (at least once: CI's 4.3.6 pass once left one, cause
    // not seen); anything else is named.
    let left = app.drain_queue("work").await;
    let stuck: Vec<String> = left
        .iter()
        .filter(|m| {
            let id = serde_json::from_slice::<serde_json::Value>(&m.body)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned));
            !id.is_some_and(|id| rx.count_by_id().contains_key(&id))
        })
        .map(|m| format!("{:?} {}", m.headers, String::from_utf8_lossy(&m.body)))
        .collect();
    assert!(stuck.is_empty(), "stuck in a lane: {stuck:#?}");
    if !left.is_empty() {
        let ids: Vec<String> = left.iter().map(|m| format!("{:?}", m.headers)).collect();
        eprintln!("duplicates left in the lanes: {ids:#?}");
    }
}

/// A prefix with the single work queue of an earlier build, 10,000
/// notifications waiting in it (and, with the plugin, a copy delayed
/// with the old queue's name as its key): a worker with lanes drains it
/// and delivers every one; once it is empty, a worker that starts no
/// longer consumes it, and `status` shows it for the operator to delete.
async fn the_single_work_queue_is_drained_into_the_lanes(backend: DelayBackend) {
    const N: usize = 10_000;
    let app = TestApp::new("migrate", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let old = app.name("work");
    old_layout(&app, &old).await;
    let ids: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    let payloads: Vec<String> = ids
        .iter()
        .map(|id| notification(&rx.url("/m"), id))
        .collect();
    publish_raw(&app, "", &old, &payloads).await;
    let w = app.spawn_worker(schedule_settings("300ms", 3, 32));
    if backend == DelayBackend::Plugin {
        // Declared by the worker's session: wait for its consumers.
        assert!(app.wait_consumers("work").await);
        let late = [notification(&rx.url("/late"), "late")];
        let mut h = FieldTable::default();
        // x-delay: 1 s, a copy made by the earlier build before the upgrade.
        h.insert("x-delay".into(), AMQPValue::LongLongInt(1_000));
        publish_delayed(&app, &app.name("retry"), &old, &late[0], h).await;
    }
    let want = N + usize::from(backend == DelayBackend::Plugin);
    let got = || rx.count_by_id().len();
    assert!(
        wait_until(Duration::from_secs(120), || got() >= want).await,
        "delivered {} of {want}",
        got()
    );
    w.stop().await;
    let seen: HashSet<String> = rx.count_by_id().into_keys().collect();
    assert!(ids.iter().all(|id| seen.contains(id)), "every one arrived");
    assert_eq!(
        common::harness::queue_counts(&app.url, &old)
            .await
            .map(|c| c.0),
        Some(0)
    );
    let again = app.spawn_worker(schedule_settings("300ms", 3, 4));
    assert!(app.wait_consumers("work").await);
    let left = common::harness::queue_counts(&app.url, &old).await;
    assert_eq!(left, Some((0, 0)), "empty, and no longer consumed");
    again.stop().await;
    let status = app.cli(&["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(s["lanes"]["legacy"]["name"], old.as_str(), "{s}");
    assert_eq!(s["lanes"]["lanes"].as_array().map(Vec::len), Some(8), "{s}");
}

/// The objects of a build before lanes: the intake fanout bound to one
/// quorum work queue.
async fn old_layout(app: &TestApp, work: &str) {
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.expect("channel");
    let opts = lapin::options::ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let intake = app.name("notifications");
    ch.exchange_declare(
        intake.as_str().into(),
        lapin::ExchangeKind::Fanout,
        opts,
        FieldTable::default(),
    )
    .await
    .expect("intake");
    let q = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(work.into(), q, args)
        .await
        .expect("old work queue");
    ch.queue_bind(
        work.into(),
        intake.as_str().into(),
        "".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .expect("old binding");
    let _ = conn.close(200, "".into()).await;
}

async fn publish_delayed(app: &TestApp, exchange: &str, key: &str, payload: &str, h: FieldTable) {
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h);
    let sent = ch.basic_publish(
        exchange.into(),
        key.into(),
        Default::default(),
        payload.as_bytes(),
        props,
    );
    assert!(sent
        .await
        .expect("publish")
        .await
        .expect("confirm")
        .is_ack());
    let _ = conn.close(200, "".into()).await;
}

/// Notifications waiting in 8 lanes; a worker with `--lanes 3` binds the
/// buckets to its 3 lanes, drains the other 5 and delivers every one.
async fn fewer_lanes_drain_the_others(backend: DelayBackend) {
    const N: usize = 600;
    let app = TestApp::new("fewer", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let ids: Vec<String> = (0..N).map(|i| format!("f{i}")).collect();
    let payloads: Vec<String> = ids
        .iter()
        .map(|id| notification(&rx.url(&format!("/{id}")), id))
        .collect();
    // Laid for 8 lanes, as a worker with the default would.
    let b = app.broker();
    let conn = b.url.connect("test").await.expect("connect");
    let eight = Some(redeliver::config::DEFAULT_LANES);
    redeliver::delay::declare_topology_with(&b, &conn, eight)
        .await
        .expect("declare");
    let _ = conn.close(200, "".into()).await;
    // Spread over every bucket, as many endpoints' hashes would be.
    for b in 0..64 {
        let some: Vec<String> = payloads.iter().skip(b).step_by(64).cloned().collect();
        publish_raw(&app, &app.name("lanes"), &format!("bucket.{b}"), &some).await;
    }
    let mut s = schedule_settings("300ms", 3, 16);
    s.lanes = 3;
    let w = app.spawn_worker(s);
    let got = || rx.count_by_id().len();
    assert!(
        wait_until(Duration::from_secs(60), || got() >= N).await,
        "delivered {} of {N}",
        got()
    );
    w.stop().await;
    let seen: HashSet<String> = rx.count_by_id().into_keys().collect();
    assert!(ids.iter().all(|id| seen.contains(id)));
}

/// A receiver whose origin is in another lane than `other`'s.
async fn receiver_beside(
    app: &TestApp,
    other: &Receiver,
    reply: fn(&common::receiver::Recorded) -> Reply,
) -> Receiver {
    loop {
        let rx = Receiver::start(reply).await;
        if app.lane_for(&rx.url("/")) != app.lane_for(&other.url("/")) {
            return rx;
        }
    }
}

/// A counter's value from a worker's `/metrics`: the sum of its series
/// that have every one of `labels`.
async fn counter(admin: u16, name: &str, labels: &[&str]) -> f64 {
    let url = format!("http://127.0.0.1:{admin}/metrics");
    let text = reqwest::get(url)
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|s| l.contains(s)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// 1,000 notifications to a healthy receiver beside 100 to one that
/// answers 500 after 300 ms, drained by a `redeliver run` on default
/// flags: returns the single ack frames it sent on the healthy one's lane.
async fn single_acks(
    app: &TestApp,
    healthy: &Receiver,
    bad: Option<&Receiver>,
    lanes: &str,
) -> f64 {
    // The backlog first, so the worker drains it at its own pace (published
    // while it consumes, each delivery would arrive, and be acked, alone).
    let mut all = Vec::new();
    for i in 0..1_000 {
        all.push(notification(&healthy.url("/ok"), &format!("h{i}")));
        match bad {
            Some(bad) if i % 10 == 0 => all.push(notification(&bad.url("/bad"), &format!("b{i}"))),
            _ => {}
        }
    }
    let b = app.broker();
    let conn = b.url.connect("test").await.expect("connect");
    let n = lanes.parse().ok();
    redeliver::delay::declare_topology_with(&b, &conn, n)
        .await
        .expect("lanes laid");
    let _ = conn.close(200, "".into()).await;
    app.publish(&all).await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut worker = app
        .command()
        .args(["run", "--lanes", lanes, "--admin-addr"])
        .arg(format!("127.0.0.1:{admin}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redeliver run");
    let done = wait_until(Duration::from_secs(90), || {
        healthy.count_by_id().len() >= 1_000
    })
    .await;
    let lane = match lanes {
        "1" => app.name("work.0"),
        _ => app.name(&app.lane_for(&healthy.url("/"))),
    };
    let lane = format!("queue=\"{lane}\"");
    let single = "kind=\"single\"";
    let singles = counter(admin, "redeliver_ack_frames_total", &[single, &lane]).await;
    worker.kill().expect("stop the worker");
    let _ = worker.wait();
    assert!(
        done,
        "{} of 1000 healthy delivered",
        healthy.count_by_id().len()
    );
    singles
}

/// A bad endpoint beside a healthy one in another lane: the healthy one's
/// deliveries are acked in runs (multiple frames), where with one lane
/// each went alone behind the bad one's open tags.
async fn a_bad_endpoint_leaves_another_lanes_acks_multiple(backend: DelayBackend) {
    let bad_reply =
        |_: &common::receiver::Recorded| Reply::status(500).delay(Duration::from_millis(300));
    let ok_reply = |_: &common::receiver::Recorded| Reply::status(200);
    // Each case on a prefix and receivers of its own.
    let case = async |name: &str, lanes: &str, with_bad: bool| {
        let app = TestApp::new(name, backend);
        let healthy = Receiver::start(ok_reply).await;
        let bad = receiver_beside(&app, &healthy, bad_reply).await;
        single_acks(&app, &healthy, Some(&bad).filter(|_| with_bad), lanes).await
    };
    let alone = case("acks-alone", "8", false).await;
    let one_lane = case("acks-one", "1", true).await;
    let lanes = case("acks-eight", "8", true).await;
    println!(
        "single ack frames on the healthy endpoint's lane, 1,000 deliveries: \
         alone {alone}; beside a bad endpoint: one lane {one_lane}, eight lanes {lanes}"
    );
    // Beside the bad endpoint with one lane, its acks go alone: the cost
    // lanes remove. With eight they go as when it is alone in 7 runs of 9
    // here (304-416 single against 305-473 alone), but in 2 runs (one on
    // CI, running alone) 944 and 985 still went alone. The likely cause, a
    // healthy delivery waiting in the worker with its lane's tags behind
    // it, now rotates the lane's consumer (`tests/waiting.rs` holds that);
    // unconfirmed here, so only "fewer than with one lane" is held.
    assert!(
        one_lane >= 900.0,
        "one lane: {one_lane} single, the old cost"
    );
    assert!(
        lanes < one_lane,
        "{lanes} against {one_lane} with one lane ({alone} alone)"
    );
}

both_backends!(
    a_bad_endpoint_leaves_another_lanes_acks_multiple,
    any_routing_key_from_a_raw_producer_arrives,
    the_single_work_queue_is_drained_into_the_lanes,
    fewer_lanes_drain_the_others,
);
