//! Contract tests of the `x-delayed-message` stand-in: delays, routing, headers and declare errors.

mod common;

use common::delayed::*;
use common::TestApp;
use redeliver::delay::DelayBackend;
use std::collections::HashMap;
use std::time::Instant;

use lapin::options::*;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ErrorKind};
use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};

/// 50 distinct delays (100..3000 ms, published shuffled) are each held at
/// least their delay, nine in ten at most 250 ms late and all within 2 s,
/// and arrive in due order.
///
/// The tail is loose: a loaded CI machine (two RabbitMQ nodes and the test
/// binaries on two cores) once delivered a message 319 ms late, a 4.3.6
/// pass 835 ms. A timer that rounded to the second is still caught.
///
/// The broker starts a delay when it takes the message in: some time
/// between the publish and its confirm, which on a busy machine can be
/// longer than the 59 ms between two delays. So each message is due within
/// a window, and only a message that arrives outside its window, or after
/// one whose whole window lies later, breaks the contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_accuracy_and_order() {
    let _shared = LOAD.read().await;
    let app = TestApp::new("accuracy", DelayBackend::Plugin);
    let mut r = Route::of(&app, QueueKind::Quorum).await;
    let mut order: Vec<u64> = (0..50).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let (mut earliest, mut latest) = (HashMap::new(), HashMap::new());
    for i in order {
        let (id, delay) = (format!("m{i}"), ms(100 + i * 59));
        let sent = r.to.publish(delayed(&id, delay)).await;
        latest.insert(id.clone(), Instant::now() + delay);
        earliest.insert(id, sent + delay);
    }

    let arrivals = r.inbox.collect(50, ms(10_000)).await;
    assert_eq!(arrivals.len(), 50, "duplicate deliveries");
    for pair in arrivals.windows(2) {
        let (a, b) = (&pair[0].0, &pair[1].0);
        let due_sooner = latest[b] + ms(5) < earliest[a];
        assert!(!due_sooner, "{b} came after {a}, due sooner");
    }
    let early = lateness(&arrivals, &earliest).1;
    assert!(early.is_empty(), "arrived before their delay: {early:?}");
    let late = lateness(&arrivals, &latest).0;
    let max = *late.last().expect("arrivals");
    // Nine in ten within 250 ms (a timer rounding to the second misses
    // that), and none past 2 s: a loaded machine once held one 835 ms.
    let p90 = late[late.len() * 9 / 10];
    assert!(p90 <= ms(250), "one in ten arrived more than {p90:?} late");
    assert!(max <= ms(2_000), "a message arrived {max:?} late");
    println!("accuracy: lateness {}", summary(&late));
    r.close().await;
}

/// Absent, non-positive, out-of-range and non-numeric x-delay values route
/// at once, and a malformed string leaves the channel usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_routing() {
    let _shared = LOAD.read().await;
    let app = TestApp::new("immediate", DelayBackend::Plugin);
    let mut r = Route::of(&app, QueueKind::Quorum).await;
    let cases = [
        ("absent", None),
        ("zero", Some(AMQPValue::LongInt(0))),
        ("negative", Some(AMQPValue::LongInt(-100))),
        ("too-large", Some(AMQPValue::LongLongInt(4_294_967_296))),
        ("boolean", Some(AMQPValue::Boolean(true))),
        ("abc", Some(long_str("abc"))),
        ("after-abc", None), // the same channel still works after "abc"
        ("empty-string", Some(long_str(""))),
        ("void", Some(AMQPValue::Void)),
    ];
    for (id, delay) in cases {
        let at = r.to.publish(props(id, delay)).await;
        let (d, arrived) = r.inbox.next(ms(5000), id).await;
        assert_eq!(id_of(&d), id);
        assert!(arrived - at < ms(500), "{id} took {:?}", arrived - at);
    }
    assert!(r.conn.status().connected() && r.to.ch.status().connected());
    r.close().await;
}

/// Every AMQP integer type, floats (truncated) and numeric strings are
/// accepted as x-delay and hold the message that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_delay_types() {
    let _shared = LOAD.read().await;
    let app = TestApp::new("types", DelayBackend::Plugin);
    let mut r = Route::of(&app, QueueKind::Quorum).await;
    let cases = [
        ("long-int", AMQPValue::LongInt(300), 300),
        ("long-long-int", AMQPValue::LongLongInt(300), 300),
        ("short-int", AMQPValue::ShortInt(300), 300),
        ("long-uint", AMQPValue::LongUInt(300), 300),
        ("short-short-int", AMQPValue::ShortShortInt(120), 120),
        ("float", AMQPValue::Float(300.9), 300),
        ("double", AMQPValue::Double(300.7), 300),
        ("long-string", long_str("300"), 300),
    ];
    let mut sent = HashMap::new();
    for (id, value, delay) in cases {
        let at = r.to.publish(props(id, Some(value))).await;
        sent.insert(id.to_string(), (at, ms(delay)));
    }
    for (id, arrived) in r.inbox.collect(sent.len(), ms(5000)).await {
        let (at, delay) = sent[&id];
        let held = arrived - at;
        let ok = held >= delay && held < delay + ms(400);
        assert!(ok, "{id}: held {held:?} for a delay of {delay:?}");
    }
    r.close().await;
}

/// A delayed message keeps its body, all properties and all headers,
/// x-delay included and unchanged (classic queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_headers_kept() {
    let _shared = LOAD.read().await;
    let app = TestApp::new("headers", DelayBackend::Plugin);
    let mut r = Route::of(&app, QueueKind::Classic).await;
    let nested = vec![("depth", AMQPValue::LongInt(2)), ("name", long_str("in"))];
    let headers = table(vec![
        ("x-delay", AMQPValue::LongInt(200)),
        ("x-trace", long_str("trace-1")),
        ("attempt", AMQPValue::LongInt(3)),
        ("meta", AMQPValue::FieldTable(table(nested))),
    ]);
    let sent = BasicProperties::default()
        .with_message_id("orig-1".into())
        .with_correlation_id("corr-1".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_app_id("redeliver-tests".into())
        .with_timestamp(1_700_000_000)
        .with_priority(5)
        .with_headers(headers);
    let body = br#"{"hello":"world","n":[1,2,3]}"#;
    let at = Instant::now();
    acked(r.to.send(body, sent.clone()).await).await;

    let (d, arrived) = r.inbox.next(ms(5000), "the delayed message").await;
    assert!(arrived - at >= ms(200), "not held: {:?}", arrived - at);
    assert_eq!(d.properties, sent);
    assert_eq!(d.data, body);
    r.close().await;
}

/// Invalid `x-delayed-type` arguments fail with 406; direct, topic, fanout
/// and headers succeed, and topic patterns route delayed messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_errors() {
    let app = TestApp::new("declare", DelayBackend::Plugin);
    let conn = common::connect(&app.url).await;
    let name = app.name("x");
    let named = |s: &str| format!("{name}-{s}");
    let (hit, miss) = (named("hit"), named("miss"));
    let types = ["direct", "fanout", "headers", "topic"].map(named);
    let exchanges: Vec<&str> = types.iter().map(String::as_str).collect();
    app.delete_on_drop(&[&hit, &miss], &[&[name.as_str()], &exchanges[..]].concat());
    let bad = [
        ("missing", FieldTable::default()),
        ("empty", delayed_type("")),
        (
            "non-string",
            table(vec![("x-delayed-type", AMQPValue::LongInt(5))]),
        ),
        ("itself", delayed_type(DELAYED)),
        ("unknown", delayed_type("nope")),
    ];
    let precondition_failed = AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED);
    for (case, args) in bad {
        let ch = conn.create_channel().await.expect("create_channel");
        let err = declare_delayed(&ch, &name, args).await.expect_err(case);
        let ErrorKind::ProtocolError(e) = err.kind() else {
            panic!("{case}: expected a channel close, got {err:?}");
        };
        assert_eq!(e.get_id(), 406, "{case}: {e:?}");
        assert_eq!(e.kind(), &precondition_failed, "{case}");
    }

    let ch = open_channel(&conn).await;
    for t in ["direct", "fanout", "headers", "topic"] {
        let x = format!("{name}-{t}");
        let declared = declare_delayed(&ch, &x, delayed_type(t)).await;
        declared.unwrap_or_else(|e| panic!("declare over {t}: {e}"));
        if t != "topic" {
            teardown(&ch, &[&x], &[]).await;
        }
    }
    let exchange = format!("{name}-topic");
    bound_queue(&ch, &hit, QueueKind::Quorum, &exchange, "a.#").await;
    bound_queue(&ch, &miss, QueueKind::Quorum, &exchange, "x.#").await;
    let mut inbox = consume(&ch, &hit).await;
    let to = Target {
        ch: ch.clone(),
        exchange: exchange.clone(),
        key: "a.b.c".into(),
    };
    to.publish(delayed("topic-1", ms(200))).await;
    let (d, _) = inbox.next(ms(5000), "the a.b.c message").await;
    assert_eq!(id_of(&d), "topic-1");
    let passive = QueueDeclareOptions::default().passive();
    let q = ch.queue_declare(miss.as_str().into(), passive, FieldTable::default());
    let count = q.await.expect("passive queue_declare").message_count();
    assert_eq!(count, 0, "the x.# queue got the a.b.c message");
    teardown(&ch, &[&exchange], &[&hit, &miss]).await;
    conn.close(200, "done".into()).await.expect("close");
}
