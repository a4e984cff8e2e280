//! The plugin-free delay backend: delay accuracy by hop count (and of the
//! workers' hold for short delays), crash safety under a broker `kill -9`
//! and of held delays under a worker `kill -9`, isolation between
//! prefixes, and `status` per queue. The cascade needs no plugin: the status test runs
//! on the plain system broker, the others on the test node or a private
//! node (see `common::TestApp::new` for why).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::chaos::Fleet;
use common::delayed::OwnNode;
use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::{plain_broker_url, TestApp};
use futures_util::StreamExt;
use redeliver::config::BrokerSettings;
use redeliver::delay::DelayBackend;
use redeliver::publish::{prepare, Publisher};
use serde_json::json;

const CASCADE: DelayBackend = DelayBackend::Cascade;

/// Publishes `delays` through the library (each notification's id is its
/// index), returning when each publish started.
async fn publish_delayed(b: &BrokerSettings, delays: &[Duration]) -> Vec<Instant> {
    publish_delayed_to(b, "http://127.0.0.1:9/", delays).await
}

/// [`publish_delayed`] with notifications for `target`.
async fn publish_delayed_to(b: &BrokerSettings, target: &str, delays: &[Duration]) -> Vec<Instant> {
    let conn = b.url.connect("cascade test").await.unwrap();
    let t = redeliver::delay::declare_topology(b, &conn).await.unwrap();
    let p = Publisher::new(&conn, t, b.delay, Duration::from_secs(30))
        .await
        .unwrap();
    let mut started = vec![];
    for (i, d) in delays.iter().enumerate() {
        let n = prepare(
            &json!({"url": target, "id": i.to_string()}).to_string(),
            1 << 20,
        )
        .unwrap();
        started.push(Instant::now());
        p.publish_new(&n, Some(*d)).await.unwrap();
    }
    let _ = conn.close(200, "".into()).await;
    started
}

/// Takes `n` distinct ids off the work queue (acking), with arrival times.
async fn collect_work(b: &BrokerSettings, n: usize, within: Duration) -> BTreeMap<usize, Instant> {
    let conn = b.url.connect("cascade consumer").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(500, Default::default()).await.unwrap();
    // Every lane there is, on one channel: the delays' copies come back to
    // theirs (lane 0 alone when no worker has laid the others).
    let t = redeliver::topology::Topology::new(&b.prefix);
    let mut streams = Vec::new();
    for lane in t.lane_names() {
        if common::harness::queue_counts(b.url.expose().as_str(), &lane)
            .await
            .is_none()
        {
            continue;
        }
        let c = ch
            .basic_consume(
                lane.as_str().into(),
                "".into(),
                Default::default(),
                Default::default(),
            )
            .await
            .unwrap();
        streams.push(c);
    }
    let mut c = futures_util::stream::select_all(streams);
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + within;
    while seen.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(Ok(d))) = tokio::time::timeout(left, c.next()).await else {
            break;
        };
        let at = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(&d.data).unwrap();
        let id: usize = v["id"].as_str().unwrap().parse().unwrap();
        seen.entry(id).or_insert(at);
        d.acker.ack(Default::default()).await.unwrap();
    }
    let _ = conn.close(200, "".into()).await;
    seen
}

/// 1,000 delays over 1 ms … 20 s, exact powers of two and 2^k − 1 among
/// them, through the cascade: none arrives early. Prints the lateness of
/// delays ≤ 1 s (held by a holder, as every `run` worker holds) and > 1 s,
/// and by the number of queues waited in (the delay's non-zero
/// hexadecimal digits).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delays_are_never_early_and_lateness_by_hops_is_reported() {
    accuracy(CASCADE).await
}

/// The same 1,000 delays through the plugin (the test node's stand-in), so
/// the two backends' printed figures compare like for like.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugin_lateness_for_the_same_delays() {
    accuracy(DelayBackend::Plugin).await
}

/// The accuracy test's delays: a fixed pseudo-random, log-uniform-ish
/// spread (xorshift) over 1 ms … 20 s, with 2^k and 2^k − 1 for k < 15.
fn accuracy_delays() -> Vec<u64> {
    let mut ms: Vec<u64> = (0..15)
        .flat_map(|k| [1u64 << k, (1u64 << k) - 1])
        .filter(|&m| m >= 1)
        .collect();
    let mut x: u64 = 0x9E37_79B9;
    while ms.len() < 1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let top = 1 + x % 15;
        ms.push(1 + x % (1u64 << top).min(20_000));
    }
    ms
}

async fn accuracy(backend: DelayBackend) {
    let app = TestApp::new("accuracy", backend);
    let b = app.broker();
    let ms = accuracy_delays();
    let delays: Vec<Duration> = ms.iter().map(|&m| Duration::from_millis(m)).collect();
    // The consumer runs before the first publish, so arrival is arrival.
    let conn = b.url.connect("declare").await.unwrap();
    redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    let _ = conn.close(200, "".into()).await;
    let (b2, n) = (b.clone(), delays.len());
    let collector =
        tokio::spawn(async move { collect_work(&b2, n, Duration::from_secs(60)).await });
    // The work queue is the collector's, so the cascade's short delays get
    // a holder of their own rather than a worker's.
    let holder = (backend == CASCADE).then(|| app.spawn_holder());
    assert!(app.wait_consumers("work.0").await, "the collector consumes");
    if holder.is_some() {
        assert!(app.wait_consumers("cascade.hold").await, "the holder holds");
    }
    let started = publish_delayed(&b, &delays).await;
    let seen = collector.await.unwrap();
    if let Some(h) = holder {
        h.stop().await.expect("the holder ran until stopped");
    }
    assert_eq!(seen.len(), delays.len(), "every delayed message arrived");
    let mut groups: BTreeMap<String, Vec<i128>> = BTreeMap::new();
    let mut early = vec![];
    for (i, at) in &seen {
        let late = at.duration_since(started[*i]).as_micros() as i128 - (ms[*i] as i128) * 1000;
        // The contract is whole milliseconds on the broker's clock, which
        // ticks in milliseconds: a message received at 10.9 ms is due at
        // 10 + its delay. Earlier than that one tick is early (seen once in
        // CI: 3 µs before 27 ms on the plugin stand-in).
        if late <= -1000 {
            early.push((ms[*i], late));
        }
        let range = if ms[*i] <= 1000 { "≤ 1 s" } else { "> 1 s" };
        groups
            .entry(format!("delays {range}"))
            .or_default()
            .push(late);
        if backend == CASCADE {
            let hops = match redeliver::delay::cascade::hops(ms[*i] as u32) {
                0 => "held".to_string(),
                n => format!("{n} queues"),
            };
            groups.entry(hops).or_default().push(late);
        }
    }
    println!(
        "{} lateness (held: by the holder; queues waited in: the delay's non-zero hex digits):",
        backend.as_str()
    );
    for (what, l) in &mut groups {
        l.sort();
        let q = |f: f64| l[((l.len() - 1) as f64 * f) as usize] as f64 / 1000.0;
        println!(
            "  {what:<12} n={:<4} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms",
            l.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    assert!(
        early.is_empty(),
        "delivered early (delay ms, µs): {early:?}"
    );
}

/// 2,000 messages held in the cascade, and 200 short delays in its hold
/// queue, survive a broker `kill -9`. On
/// RabbitMQ 3.10 a queue's dead-letter worker can start before the
/// exchanges are recovered; it then retries after
/// `dead_letter_worker_publisher_confirm_timeout` (180 s by default), so
/// the wait allows for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cascade_survives_a_broker_kill() {
    let (node, url) = OwnNode::up(5692).await;
    let app = TestApp::on(&url, "crash", CASCADE);
    let b = app.broker();
    // 2,000 in the stages, then 200 short ones in the hold queue.
    let delays: Vec<Duration> = (0..2200)
        .map(|i| match i {
            0..2000 => Duration::from_millis(3000 + (i % 500) * 7),
            _ => Duration::from_millis(1 + i % 1000),
        })
        .collect();
    publish_delayed(&b, &delays).await;
    node.ctl(&["kill"]).await;
    node.ctl(&["up"]).await;
    let restarted = Instant::now();
    let holder = app.spawn_holder();
    let seen = collect_work(&b, delays.len(), Duration::from_secs(300)).await;
    println!("all arrived {:?} after the restart", restarted.elapsed());
    let held = holder.stop().await;
    drop(app);
    node.down().await;
    held.expect("the holder ran until stopped");
    let missing: Vec<usize> = (0..delays.len())
        .filter(|i| !seen.contains_key(i))
        .collect();
    assert!(
        missing.is_empty(),
        "{} lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// Short delays are held by the `run` workers. One killed with `kill -9`
/// while holding leaves its held messages unacked; the broker returns them
/// to the hold queue and the next worker delivers every one, none before
/// its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_delays_survive_a_worker_kill() {
    let app = TestApp::new("hold-kill", CASCADE);
    let b = app.broker();
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let mut fleet = Fleet::start(&app, 1, &[]);
    assert!(app.wait_consumers("cascade.hold").await, "the worker holds");
    let delays = vec![Duration::from_millis(900); 300];
    let started = publish_delayed_to(&b, &rx.url("/"), &delays).await;
    let ids = || rx.requests().iter().map(|r| r.id()).collect::<HashSet<_>>();
    let before_kill = rx.count();
    fleet.kill9_and_restart(0);
    let all = wait_until(Duration::from_secs(30), || ids().len() >= delays.len()).await;
    fleet.stop();
    println!(
        "delivered before the kill: {before_kill}; after: {}",
        ids().len()
    );
    assert!(before_kill < delays.len(), "the kill came while holding");
    assert!(all, "{} of {} delivered", ids().len(), delays.len());
    for r in rx.requests() {
        let i: usize = r.id().parse().unwrap();
        assert!(r.at >= started[i] + delays[i], "{i} delivered early");
    }
}

/// A worker stopped gracefully (SIGTERM) while holding releases what it
/// holds before it exits, and each is delivered once: nothing it released
/// goes back to the hold queue to be released again by the next worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_stop_releases_held_delays_once() {
    let app = TestApp::new("hold-stop", CASCADE);
    let b = app.broker();
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let mut fleet = Fleet::start(&app, 1, &[]);
    assert!(app.wait_consumers("cascade.hold").await, "the worker holds");
    let delays = vec![Duration::from_millis(1000); 20];
    publish_delayed_to(&b, &rx.url("/"), &delays).await;
    // Stop it once it holds all 20 (none ready in the hold queue; they
    // are due 1 s after the publish).
    let holding = wait_until_async(Duration::from_secs(5), async || {
        app.queue_len("cascade.hold").await == 0
    })
    .await;
    assert!(holding, "the worker took all 20 to hold");
    let stopped = fleet.stop();
    let left_in_hold = app.queue_len("cascade.hold").await;
    let mut fleet = Fleet::start(&app, 1, &[]);
    let all = wait_until(Duration::from_secs(20), || rx.count() >= delays.len()).await;
    assert!(all, "{} of {} delivered", rx.count(), delays.len());
    // Time for any second copy to arrive too.
    assert_quiet_for(Duration::from_secs(3), "deliveries", || rx.count()).await;
    fleet.stop();
    assert!(stopped.iter().all(|s| s.success()), "{stopped:?}");
    assert_eq!(left_in_hold, 0, "nothing went back to the hold queue");
    assert_eq!(rx.count(), delays.len(), "each delivered once");
}

/// Two prefixes on one broker: each worker sees only its own retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefixes_do_not_receive_each_others_retries() {
    let (a, b) = (
        TestApp::new("iso-a", CASCADE),
        TestApp::new("iso-b", CASCADE),
    );
    let fail_once =
        |r: &common::receiver::Recorded| Reply::status(if r.nth == 1 { 500 } else { 200 });
    let (ra, rb) = (
        Receiver::start(fail_once).await,
        Receiver::start(fail_once).await,
    );
    let wa = a.spawn_worker(schedule_settings("50ms,120ms", 3, 8));
    let wb = b.spawn_worker(schedule_settings("70ms,90ms", 3, 8));
    let batch = |rx: &Receiver, tag: &str| -> Vec<serde_json::Value> {
        (0..50)
            .map(|i| json!({"url": rx.url("/"), "id": format!("{tag}-{i}")}))
            .collect()
    };
    a.publish(&batch(&ra, "a")).await;
    b.publish(&batch(&rb, "b")).await;
    let done = wait_until(Duration::from_secs(30), || {
        ra.count() >= 100 && rb.count() >= 100
    })
    .await;
    wa.stop().await;
    wb.stop().await;
    assert!(done, "a saw {}, b saw {}", ra.count(), rb.count());
    let ids = |rx: &Receiver| rx.requests().iter().map(|r| r.id()).collect::<HashSet<_>>();
    let (seen_a, seen_b) = (ids(&ra), ids(&rb));
    assert!(seen_a.iter().all(|i| i.starts_with("a-")) && seen_a.len() == 50);
    assert!(seen_b.iter().all(|i| i.starts_with("b-")) && seen_b.len() == 50);
}

/// On the plain system broker, which has no plugin at all: `status` shows
/// how many messages wait in each queue of the cascade, and they arrive.
/// (The only cascade on that broker: see `common::TestApp::new`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_messages_per_queue() {
    let app = TestApp::on(&plain_broker_url(), "levels", CASCADE);
    let (b, p) = (app.broker(), &app.prefix);
    // 10 s = 0x2710 ms: its top digit is 2 at stage 3 (2 × 4,096 ms), so
    // it waits in `<prefix>.cascade.3.2` first. 500 ms waits in the hold
    // queue, for a worker (none runs yet).
    let ten = Duration::from_secs(10);
    publish_delayed(&b, &[ten, ten, Duration::from_millis(500)]).await;
    let s: serde_json::Value =
        serde_json::from_str(&stdout(&app.cli(&["status", "--json"]))).unwrap();
    assert_eq!(s["delay_backend"], "cascade");
    let queues = s["cascade"].as_array().unwrap();
    assert_eq!(queues.len(), 120);
    let held: Vec<_> = queues.iter().filter(|q| q["messages"] != 0).collect();
    assert_eq!(held.len(), 1, "{s}");
    assert_eq!(held[0]["queue"], format!("{p}.cascade.3.2"));
    assert_eq!(held[0]["messages"], 2);
    assert_eq!(held[0]["ttl_ms"], 8192);
    assert_eq!(s["hold"]["name"], format!("{p}.cascade.hold"));
    assert_eq!(
        (&s["hold"]["ready"], &s["hold"]["consumers"]),
        (&1.into(), &0.into())
    );
    let text = stdout(&app.cli(&["status"]));
    assert!(
        text.contains("cascade        2 waiting in 120 queues"),
        "{text}"
    );
    assert!(text.contains(&format!("{p}.cascade.3.2")), "{text}");
    let hold_line = format!(
        "hold           {p}.cascade.hold ready 1  held ? (needs --management-url)  holders 0"
    );
    assert!(text.contains(&hold_line), "{text}");
    assert!(
        text.contains("x-delayed-message not installed (not needed by the cascade)"),
        "no false alarm about the plugin: {text}"
    );
    let holder = app.spawn_holder();
    let arrived = collect_work(&b, 3, Duration::from_secs(30)).await;
    holder.stop().await.expect("the holder ran until stopped");
    assert_eq!(arrived.len(), 3, "all left the cascade for the work queue");
}

/// Without the plugin, the error names the cascade as the alternative.
#[tokio::test]
async fn missing_plugin_error_names_the_cascade() {
    let app = TestApp::on(&plain_broker_url(), "hint", DelayBackend::Plugin);
    let o = app.cli(&["publish", "--url", "http://127.0.0.1:9/", "--delay", "1s"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--delay-backend cascade"), "{err}");
}
