//! The breaker tells an endpoint that is down from one that answers: a
//! quick application error (500, 404) is the notification's outcome and
//! follows its own schedule; no answer, or a 502/503/504, opens the
//! breaker. The binary on its default flags, a real broker, real HTTP
//! receivers on 127.0.0.1:0.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::app::TestApp;
use common::harness::wait_until;
use common::metrics::{endpoint_label, run_with_admin, scrape, value, wait_metric};
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::delay::DelayBackend;

const PLUGIN: DelayBackend = DelayBackend::Plugin;
const TRANSITIONS: &str = "redeliver_endpoint_breaker_transitions_total";
const BREAKER: &str = "redeliver_endpoint_breaker_state";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Each notification's (attempt header, time) requests, by id.
fn attempts_by_id(rx: &Receiver) -> HashMap<String, Vec<(String, Instant)>> {
    let mut m: HashMap<String, Vec<(String, Instant)>> = HashMap::new();
    for r in rx.requests() {
        let attempt = r.header("redeliver-attempt").unwrap_or_default();
        m.entry(r.id()).or_default().push((attempt, r.at));
    }
    m
}

/// Asserts the breaker of `rx`'s endpoint never opened.
async fn assert_never_opened(admin: u16, rx: &Receiver) {
    let text = scrape(admin).await.expect("metrics");
    let label = endpoint_label(rx);
    let opened = value(&text, TRANSITIONS, &[&label, "to=\"open\""]);
    assert_eq!(opened, None, "the breaker opened");
    assert_eq!(value(&text, BREAKER, &[&label]).unwrap_or(0.0), 0.0);
}

/// The receiver answers 500 to every first attempt and 200 to every
/// retry (a webhook that arrives before the receiver's own commit): 200
/// notifications on the default flags with `--schedule 1s` are all
/// delivered on attempt 2, about 1 s after attempt 1, and the breaker
/// stays closed. (It used to open on the first ten and starve them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_fails_first_attempts_gets_every_retry_on_schedule() {
    let app = TestApp::new("fail-first", PLUGIN);
    let rx =
        Receiver::start(|r: &Recorded| Reply::status(if r.nth == 1 { 500 } else { 200 })).await;
    let (_w, admin) = run_with_admin(&app, &["--schedule", "1s"]);
    app.publish(&rx.notifications("f", 200)).await;
    let done = wait_until(Duration::from_secs(30), || rx.count() >= 400).await;
    assert!(done, "{} of 400 requests", rx.count());
    let by_id = attempts_by_id(&rx);
    assert_eq!(by_id.len(), 200);
    for (id, a) in &by_id {
        let numbers: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(numbers, ["1", "2"], "{id}");
        let gap = a[1].1 - a[0].1;
        assert!(
            gap >= ms(990) && gap <= ms(2500),
            "{id}: retried after {gap:?}"
        );
    }
    assert_never_opened(admin, &rx).await;
}

/// A receiver that answers 500 to everything, `--max-attempts 2
/// --schedule 200ms`: every notification is dead-lettered after exactly
/// two attempts, about 200 ms apart, and the breaker never opens. (It
/// used to open, and deliveries then waited for `--max-age`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_always_500_receiver_dead_letters_after_max_attempts_on_schedule() {
    let app = TestApp::new("always-500", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(500)).await;
    let args = ["--max-attempts", "2", "--schedule", "200ms"];
    let (_w, admin) = run_with_admin(&app, &args);
    app.publish(&rx.notifications("e", 50)).await;
    let done = wait_until(Duration::from_secs(30), || rx.count() >= 100).await;
    assert!(done, "{} of 100 requests", rx.count());
    let mut dead = app.wait_dead(50).await;
    assert_eq!(dead.len(), 50, "all dead-lettered within seconds");
    dead.sort_by_key(|d| d.str("redeliver-id"));
    assert!(dead.iter().all(|d| d.int("redeliver-attempt") == Some(2)));
    for (id, a) in attempts_by_id(&rx) {
        assert_eq!(a.len(), 2, "{id}: exactly max_attempts");
        // Never early; late only by a busy machine's timers (the default
        // schedule's first retry would be 10 s, an open breaker longer).
        let gap = a[1].1 - a[0].1;
        assert!(gap >= ms(190) && gap <= ms(4000), "{id}: {gap:?}");
    }
    assert_never_opened(admin, &rx).await;
}

/// A receiver that refuses connections: the breaker opens (state 2 on
/// `/metrics`), and once the receiver listens again a probe closes it
/// (state 0) and every notification is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_refuses_connections_opens_the_breaker_until_it_is_back() {
    let app = TestApp::new("refused", PLUGIN);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    rx.down().await;
    let args = ["--schedule", "200ms", "--max-attempts", "100"];
    let (_w, admin) = run_with_admin(&app, &[&args[..], &["--breaker-open", "1s"]].concat());
    app.publish(&rx.notifications("r", 20)).await;
    let label = endpoint_label(&rx);
    let within = Duration::from_secs(20);
    let open = wait_metric(admin, BREAKER, &[&label], within, |v| v == 2.0).await;
    assert_eq!(open, Some(2.0), "refused connections open it");
    rx.up().await;
    let closed = wait_metric(admin, BREAKER, &[&label], within, |v| v == 0.0).await;
    assert_eq!(closed, Some(0.0), "a probe closed it");
    let all = wait_until(Duration::from_secs(30), || rx.count_by_id().len() >= 20).await;
    assert!(all, "{} of 20 delivered", rx.count_by_id().len());
}

/// The application-error share is reported per endpoint, for operators.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_application_error_share_is_a_gauge_that_gates_nothing() {
    let app = TestApp::new("app-errors", PLUGIN);
    let rx =
        Receiver::start(|r: &Recorded| Reply::status(if r.nth == 1 { 404 } else { 200 })).await;
    let (_w, admin) = run_with_admin(&app, &["--schedule", "100ms"]);
    app.publish(&rx.notifications("g", 40)).await;
    assert!(wait_until(Duration::from_secs(30), || rx.count() >= 80).await);
    let text = scrape(admin).await.expect("metrics");
    let share = value(
        &text,
        "redeliver_endpoint_app_error_ratio",
        &[&endpoint_label(&rx)],
    );
    assert!(share.is_some_and(|s| s > 0.1 && s < 0.9), "{share:?}");
    assert_never_opened(admin, &rx).await;
}
