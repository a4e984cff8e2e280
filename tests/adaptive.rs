//! Isolation without a tax: alone, an endpoint earns every slot and its
//! retries keep their schedule; one that turns slow falls to a few slots
//! and earns them back; a hanging neighbour holds no more than its
//! adaptive limit while the healthy endpoint keeps its rate. Real broker,
//! real HTTP receivers on 127.0.0.1:0, the binary on its default flags
//! where the test is about the defaults.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::app::TestApp;
use common::harness::wait_until;
use common::metrics::{endpoint_label, run_with_admin, scrape, value, wait_metric};
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::config::WorkerSettings;
use redeliver::delay::DelayBackend;
use redeliver::HttpDeliverer;
use serde_json::json;

const PLUGIN: DelayBackend = DelayBackend::Plugin;
const LIMIT: &str = "redeliver_endpoint_limit";

/// One test of this file at a time: the rate comparison must not share
/// the two cores with another test's 4,000-notification drain.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `redeliver run --concurrency 4` and nothing else, one receiver that
/// takes 200 ms: the peak in flight is exactly 4, and nothing is deferred
/// (the quarter cap of old allowed 1 and deferred the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alone_an_endpoint_gets_every_slot() {
    let _one = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("alone", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200).delay(ms(200))).await;
    let (_w, admin) = run_with_admin(&app, &["--concurrency", "4"]);
    app.publish(&rx.notifications("a", 40)).await;
    let done = wait_until(Duration::from_secs(30), || rx.count() >= 40).await;
    assert!(done, "{} of 40 delivered", rx.count());
    assert_eq!(rx.max_in_flight(), 4, "every slot, and never more");
    let text = scrape(admin).await.expect("metrics");
    let deferred = value(&text, "redeliver_endpoint_deferred_total", &[]);
    assert_eq!(deferred, None, "no deferral round trips");
    assert_eq!(value(&text, LIMIT, &[&endpoint_label(&rx)]), Some(4.0));
}

/// Each notification's request times, by id.
fn times_by_id(rx: &Receiver) -> HashMap<String, Vec<Instant>> {
    let mut m: HashMap<String, Vec<Instant>> = HashMap::new();
    for r in rx.requests() {
        m.entry(r.id()).or_default().push(r.at);
    }
    m
}

/// `--concurrency 3 --schedule 300ms,600ms`, one receiver that fails each
/// notification twice: every retry comes on schedule (the old quarter cap
/// gave this endpoint one slot and deferred retries by 5-8 s).
async fn a_lone_endpoints_retries_keep_their_schedule(backend: DelayBackend) {
    let _one = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("schedule", backend);
    let rx =
        Receiver::start(|r: &Recorded| Reply::status(if r.nth <= 2 { 500 } else { 200 })).await;
    let args = ["--concurrency", "3", "--schedule", "300ms,600ms"];
    let (_w, _admin) = run_with_admin(&app, &args);
    app.publish(&rx.notifications("s", 12)).await;
    let done = wait_until(Duration::from_secs(30), || rx.count() >= 36).await;
    assert!(done, "{} of 36 requests", rx.count());
    // Never early, and never held back as the old cap did (5-8 s): late
    // only by what a busy machine's timers add (in CI, at a load of 13 on
    // two cores, a 600 ms retry came after 1.17 s).
    for (id, t) in times_by_id(&rx) {
        assert_eq!(t.len(), 3, "{id}");
        let (first, second) = (t[1] - t[0], t[2] - t[1]);
        assert!(first >= ms(290) && first <= ms(3000), "{id}: {first:?}");
        assert!(second >= ms(590) && second <= ms(3300), "{id}: {second:?}");
    }
}

both_backends!(a_lone_endpoints_retries_keep_their_schedule);

/// One receiver, `--concurrency 16`: fast (10 ms), its limit reaches 16;
/// it turns slow (600 ms) and the limit falls to a few; it recovers and
/// the limit is back at 16, each within seconds, read from `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_healthy_endpoint_that_turns_slow_falls_and_rises_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("slowdown", PLUGIN);
    let slow = Arc::new(AtomicBool::new(false));
    let s = slow.clone();
    let rx = Receiver::start(move |_: &Recorded| {
        let d = if s.load(Ordering::SeqCst) { 600 } else { 10 };
        Reply::status(200).delay(ms(d))
    })
    .await;
    app.publish(&rx.notifications("d", 4000)).await;
    let (_w, admin) = run_with_admin(&app, &["--concurrency", "16"]);
    let label = endpoint_label(&rx);
    let labels = [label.as_str()];
    let wait =
        |ok: fn(f64) -> bool| wait_metric(admin, LIMIT, &labels, Duration::from_secs(10), ok);
    let full = wait(|v| v >= 16.0).await;
    assert_eq!(full, Some(16.0), "healthy and busy: every slot");
    slow.store(true, Ordering::SeqCst);
    let fell = wait(|v| v <= 4.0).await;
    assert!(fell.is_some_and(|v| v <= 4.0), "slowed down: {fell:?}");
    slow.store(false, Ordering::SeqCst);
    let back = wait(|v| v >= 16.0).await;
    assert_eq!(back, Some(16.0), "recovered");
}

/// The healthy endpoint's span from its first request to its last.
fn span(rx: &Receiver) -> Duration {
    let reqs = rx.requests();
    let first = reqs.iter().map(|r| r.at).min().expect("requests");
    let last = reqs.iter().map(|r| r.at).max().expect("requests");
    last - first
}

/// The longest time the receiver went without a new request.
fn longest_gap(rx: &Receiver) -> Duration {
    let mut at: Vec<_> = rx.requests().iter().map(|r| r.at).collect();
    at.sort();
    let gaps = at.windows(2).map(|w| w[1] - w[0]);
    gaps.max().unwrap_or_default()
}

/// Drains `healthy` notifications (and, when `hang` is given, one in ten
/// more to it) with an 8-slot worker on the default isolation; returns
/// the healthy receiver's span, its most requests in flight at once and
/// its longest wait for a next request.
async fn drain_beside(healthy: usize, hang: Option<&Receiver>) -> (Duration, usize, Duration) {
    let app = TestApp::new("beside", PLUGIN);
    // 5 ms, as a quick real receiver: the span measures the slots the
    // healthy one keeps, not how busy the deferrals keep this machine's
    // two cores (with an instant receiver: 0.79-0.88).
    let ok = Receiver::start(|_| Reply::status(200).delay(ms(5))).await;
    let mut batch = vec![];
    for i in 0..healthy {
        if let (Some(h), 0) = (hang, i % 10) {
            batch.push(json!({"url": h.url("/"), "id": format!("hang-{i}")}));
        }
        batch.push(json!({"url": ok.url("/"), "id": format!("ok-{i}")}));
    }
    app.publish(&batch).await;
    let settings = WorkerSettings {
        concurrency: 8,
        shutdown_grace: ms(500),
        ..WorkerSettings::default()
    };
    let handler = HttpDeliverer::new(Duration::from_secs(30), 8).unwrap();
    let w = app.spawn_worker_with(settings, handler);
    // A wait, not a bound: in CI's 4.3.6 pass, at a load of 14 on two
    // cores, 3,964 of 4,000 had come after 60 s (what is judged is below:
    // the slots and the gaps, not how fast this machine is).
    let done = wait_until(Duration::from_secs(180), || ok.count() >= healthy).await;
    w.stop().await;
    assert!(done, "{} of {healthy} healthy delivered", ok.count());
    (span(&ok), ok.max_in_flight(), longest_gap(&ok))
}

/// A receiver that hangs for a minute beside a healthy one, 8 slots,
/// default isolation: the hanging one never has more than one attempt in
/// flight (a new endpoint starts at one, and it never answers), and the
/// healthy one gets the seven slots the hanging one cannot use. That is
/// asserted structurally: the healthy receiver saw 7 at once, and never
/// waited 5 s for a next request. Without isolation every slot soon waits
/// on the hanging one, for the 30 s timeout, and the healthy one kept
/// about 3% of its rate. The rate beside ÷ alone is printed (0.77-0.89 on
/// the 2-core machine alone; 0.47 once beside other suites, which is why
/// it is no longer a floor here): the 0.8 is a performance figure,
/// measured by `redeliver bench --phase noisy`; a timed test must not fail
/// on a slow machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_neighbour_keeps_to_its_limit_and_the_healthy_one_its_rate() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Long enough that the first second (the hanging endpoint's first
    // attempts, then its deferrals) is a small part of the span.
    let n = 4000;
    let (alone, _, _) = drain_beside(n, None).await;
    let hang = Receiver::start(|_| Reply::status(200).delay(Duration::from_secs(60))).await;
    let (beside, healthy_peak, gap) = drain_beside(n, Some(&hang)).await;
    let ratio = alone.as_secs_f64() / beside.as_secs_f64();
    println!(
        "healthy alone {alone:?}, beside a hanging one {beside:?}: ratio {ratio:.2}, \
         longest wait for a request {gap:?}"
    );
    assert!(
        hang.max_in_flight() <= 1,
        "{} in flight",
        hang.max_in_flight()
    );
    assert!(hang.count() >= 1, "it was tried");
    assert!(
        healthy_peak >= 7,
        "the healthy endpoint had at most {healthy_peak} of the 7 free slots"
    );
    assert!(
        gap < Duration::from_secs(5),
        "the healthy endpoint waited {gap:?} for a request"
    );
}
