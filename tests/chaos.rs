//! Chaos: 3 real worker processes, 5,000 notifications, a receiver that
//! fails 30% of requests and hangs on 5% past the timeout, and one of:
//! workers killed with SIGKILL, broker restarts and a broker kill, a 20 s
//! receiver outage, or a second endpoint that hangs for 15 s (500 more
//! notifications) while workers are killed. Each scenario asserts that every notification
//! ends delivered or dead-lettered with a reason, that none is lost, that
//! duplicates stay within what was in flight at the crash moments, and
//! that the receiver never saw more than workers x concurrency requests at
//! once. The figures are printed (`cargo test --test chaos -- --nocapture`).
//!
//! The scenarios share one private node (port 5689) and run one at a time,
//! so their timings do not depend on each other. They run with
//! `--retry-settle 0s` (the local stand-in writes a delayed message to disk
//! before it confirms, so there is no confirm window to cover; the settle
//! is tested in `tests/reliability.rs`) and `--prefetch 16`, so each
//! worker's unacked messages, and the duplicates a crash can cause, are
//! bounded by 16. All run the default per-endpoint isolation (adaptive
//! limits); the first three give their one receiver a ceiling of 16 (the
//! whole worker), the hanging-endpoint scenario a ceiling of 4 and
//! parking places. They run on the plugin backend;
//! `REDELIVER_CHAOS_BACKEND=cascade cargo test --test chaos` runs them on
//! the cascade.

mod common;

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use common::chaos::*;
use common::events::Sink;
use common::harness::let_quorum_queues_age;
use common::receiver::{Receiver, Reply};
use common::{ctl, DownWhenLast, TestApp};
use redeliver::delay::DelayBackend;

const N: usize = 5_000;
const WORKERS: usize = 3;
const CONCURRENCY: usize = 16;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static FINISHED: AtomicUsize = AtomicUsize::new(0);

/// The chaos node goes down after the last scenario, even one that failed.
fn node_guard() -> DownWhenLast {
    DownWhenLast {
        port: PORT,
        users: 4,
        finished: &FINISHED,
    }
}

fn worker_args(schedule: &str) -> Vec<String> {
    isolation_args(schedule, CONCURRENCY, CONCURRENCY)
}

/// `endpoint_cap` per endpoint; `prefetch` beyond the concurrency is the
/// parking room.
fn isolation_args(schedule: &str, endpoint_cap: usize, prefetch: usize) -> Vec<String> {
    [
        "--concurrency",
        &CONCURRENCY.to_string(),
        "--endpoint-concurrency",
        &endpoint_cap.to_string(),
        "--timeout",
        "1s",
        "--schedule",
        schedule,
        "--max-attempts",
        "15",
        "--retry-settle",
        "0s",
        "--prefetch",
        &prefetch.to_string(),
        "--shutdown-grace",
        "5s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Everything a scenario needs: node, receiver, preloaded load, fleet.
/// The fleet comes first: fields drop in order, so its workers are gone
/// before the app deletes the prefix.
struct Setup {
    fleet: Fleet,
    app: TestApp,
    rx: Receiver,
    /// A second endpoint, when the scenario has one.
    other: Option<Receiver>,
    ids: Vec<String>,
    started: Instant,
    /// A queue bound to the dead letters' events.
    events: Sink,
}

async fn setup(name: &str, schedule: &str) -> Setup {
    setup_with(name, None, 0, &worker_args(schedule)).await
}

/// `extra` more notifications (ids `h-0..`) go to `other`.
async fn setup_with(name: &str, other: Option<Receiver>, extra: usize, args: &[String]) -> Setup {
    let url = tokio::task::spawn_blocking(node_up).await.unwrap();
    // The plugin in CI; `REDELIVER_CHAOS_BACKEND=cascade` by hand.
    let backend = match std::env::var("REDELIVER_CHAOS_BACKEND").as_deref() {
        Ok("cascade") => DelayBackend::Cascade,
        _ => DelayBackend::Plugin,
    };
    let app = TestApp::on(&url, name, backend);
    let rx = Receiver::start(flaky).await;
    let mut load = load(&rx, 0..N);
    if let Some(o) = &other {
        // Spread among the others' from the start, so the other endpoint
        // competes with them while it hangs.
        let every = N / extra.max(1);
        for i in (0..extra).rev() {
            let id = format!("h-{i}");
            let n = serde_json::json!({"url": o.url("/"), "id": id});
            load.insert((i * every).min(load.len()), (id, n));
        }
    }
    let keys = ["notification.exhausted", "notification.dead-lettered"];
    let events = Sink::bind(&app, "ev-dead", &keys).await;
    preload(&app, &load).await;
    let_quorum_queues_age().await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let fleet = Fleet::start(&app, WORKERS, &args);
    Setup {
        app,
        rx,
        other,
        ids: load.into_iter().map(|(id, _)| id).collect(),
        fleet,
        started: Instant::now(),
        events,
    }
}

/// Every dead letter has its event (exhausted or dead-lettered), with its
/// reason; a crash may have published one twice, with the same id.
async fn assert_every_dead_letter_has_its_event(
    s: &mut Setup,
    dead: &std::collections::HashMap<String, String>,
) {
    let all = |seen: &[serde_json::Value]| {
        let ids: std::collections::HashSet<_> = seen
            .iter()
            .filter_map(|e| e["data"]["notification_id"].as_str())
            .collect();
        dead.keys().all(|id| ids.contains(id.as_str()))
    };
    let complete = s.events.wait(&s.app, Duration::from_secs(20), all).await;
    let mut reasons = std::collections::HashMap::new();
    for e in &s.events.seen {
        let d = &e["data"];
        let id = d["notification_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        reasons.insert(id, d["reason"].as_str().unwrap_or_default().to_string());
    }
    let missing: Vec<_> = dead
        .keys()
        .filter(|id| !reasons.contains_key(*id))
        .collect();
    assert!(
        complete && missing.is_empty(),
        "dead letters without their event: {missing:?}"
    );
    for (id, reason) in dead {
        assert_eq!(&reasons[id], reason, "{id}");
    }
    println!(
        "events: {} for {} dead letters",
        s.events.seen.len(),
        dead.len()
    );
}

/// Settles, stops the fleet, prints the figures and asserts the promise.
async fn finish(mut s: Setup, name: &str, dup_bound: usize) {
    let rxs: Vec<&Receiver> = std::iter::once(&s.rx).chain(s.other.as_ref()).collect();
    let t = settle(&s.app, &s.ids, &rxs, Duration::from_secs(240), WORKERS).await;
    let elapsed = s.started.elapsed();
    assert_every_dead_letter_has_its_event(&mut s, &t.dead).await;
    let running = s.fleet.all_running();
    let statuses = tokio::task::spawn_blocking(move || {
        let st = s.fleet.stop();
        (st, s.fleet)
    })
    .await
    .unwrap();
    let (statuses, fleet) = statuses;
    let redelivered = fleet.log_lines("redelivered message");
    let max_in_flight = s.rx.max_in_flight();
    let mut reasons: Vec<_> = t.dead.values().cloned().collect();
    reasons.sort();
    reasons.dedup();
    println!(
        "chaos {name}: {} notifications in {:.1} s: delivered {}, dead {} (reasons {reasons:?}), \
         lost {}, attempts {}, duplicate successes {} (bound {dup_bound}), \
         redeliveries logged {redelivered}, worker kills {}, max in flight {max_in_flight} \
         (limit {}), logs in {}",
        s.ids.len(),
        elapsed.as_secs_f64(),
        t.delivered.len(),
        t.dead.len(),
        t.lost.len(),
        t.attempts,
        t.duplicates,
        fleet.kills,
        WORKERS * CONCURRENCY,
        fleet.logs().display(),
    );
    drop(s.app);
    assert!(
        t.lost.is_empty(),
        "lost: {:?}",
        &t.lost[..t.lost.len().min(20)]
    );
    assert!(
        t.dead.values().all(|r| !r.is_empty()),
        "every dead letter has a reason"
    );
    t.assert_only_gone_are_permanent();
    assert!(
        s.ids
            .iter()
            .filter(|id| is_gone(id))
            .all(|id| t.dead.contains_key(id) && !t.delivered.contains(id)),
        "every /gone notification was dead-lettered and none delivered"
    );
    assert!(
        t.duplicates <= dup_bound,
        "duplicates {} > bound {dup_bound}",
        t.duplicates
    );
    // The receiver counts the requests whose clients still wait for them
    // (common/receiver.rs): one a worker gave up on (the 1 s timeout on a
    // 3 s hang, a lost session, a kill) ends when its connection closes.
    assert!(
        max_in_flight <= WORKERS * CONCURRENCY,
        "concurrency bound exceeded: {max_in_flight}"
    );
    assert!(running, "no worker died on its own");
    assert!(
        statuses.iter().all(|s| s.success()),
        "every worker shut down cleanly: {statuses:?}"
    );
}

/// Scenario 1: one worker is SIGKILLed every 2.5 s and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_worker_kills() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _node = node_guard();
    let mut s = setup("kill9", "50ms,100ms,200ms,500ms,1s").await;
    let mut kills = 0;
    while kills < 8 {
        // The chaos's own pace, not a wait for something.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        s.fleet.kill9_and_restart(kills % WORKERS);
        kills += 1;
    }
    // Each kill can duplicate at most what that worker held unacked: its
    // prefetch, set equal to its concurrency.
    let bound = s.fleet.kills * CONCURRENCY;
    finish(s, "worker kill -9", bound).await;
}

/// Scenario 2: the broker is restarted twice and killed once under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_broker_restarts_and_kill() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _node = node_guard();
    let s = setup("broker", "50ms,100ms,200ms,500ms,1s").await;
    let mut rerouted = 0;
    for step in ["restart", "restart", "kill"] {
        // Under load a while before each step: the chaos's own pace.
        tokio::time::sleep(Duration::from_secs(3)).await;
        tokio::task::spawn_blocking(move || {
            ctl(PORT, &[step]);
            ctl(PORT, &["up"]);
        })
        .await
        .unwrap();
        rerouted += tokio::task::spawn_blocking(overdue_at_start).await.unwrap() as usize;
    }
    // Each broker stop can duplicate what every worker held unacked, plus
    // the retries the stand-in routed just before it stopped (re-routed
    // after the start, by design: a duplicate rather than a loss).
    let bound = 3 * WORKERS * CONCURRENCY + rerouted;
    println!("stand-in re-routed at most {rerouted} message(s) across the restarts");
    finish(s, "broker restart x2 + kill", bound).await;
}

/// Scenario 3: the receiver is down for 20 s, then recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_receiver_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _node = node_guard();
    let s = setup("outage", "100ms,200ms,500ms,1s,2s,3s,5s").await;
    // Under load a while, then the outage: both deliberate durations.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = s.rx.count();
    s.rx.down().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    s.rx.up().await;
    println!("receiver outage: {before} requests before it, down 20 s");
    // Nothing crashes here; at worst the requests cut off by the outage.
    let bound = WORKERS * CONCURRENCY;
    finish(s, "receiver down 20 s", bound).await;
}

/// Scenario 4: a second endpoint takes 10% more notifications and hangs
/// past the timeout for its first 15 s, then recovers, while a worker is
/// SIGKILLed every 3 s. Per-endpoint isolation is on (a ceiling of 4 of
/// 16, 32 parking places): deliveries to the hanging endpoint are parked,
/// deferred, and held back by its breaker; none may be lost, the kills
/// included, and it never sees more than its ceiling per worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_hanging_endpoint() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _node = node_guard();
    let t0 = Instant::now();
    let hang = Receiver::start(move |_| {
        if t0.elapsed() < Duration::from_secs(15) {
            Reply::status(200).delay(Duration::from_secs(60))
        } else {
            Reply::status(200)
        }
    })
    .await;
    const CAP: usize = 4;
    const PREFETCH: usize = CONCURRENCY + 32;
    let args = isolation_args("50ms,100ms,200ms,500ms,1s", CAP, PREFETCH);
    let mut s = setup_with("hang", Some(hang), N / 10, &args).await;
    for i in 0..5 {
        // The chaos's own pace, not a wait for something.
        tokio::time::sleep(Duration::from_secs(3)).await;
        s.fleet.kill9_and_restart(i % WORKERS);
    }
    // A killed worker's hanging requests end with it: the kernel closes
    // its connections, and the receiver no longer counts them.
    let hang_peak = s.other.as_ref().map_or(0, |r| r.max_in_flight());
    let cap_bound = CAP * WORKERS;
    println!("hanging endpoint: at most {hang_peak} requests at once (bound {cap_bound})");
    assert!(hang_peak <= cap_bound, "the endpoint cap held");
    // Each kill can duplicate what that worker held unacked: its prefetch.
    let bound = s.fleet.kills * PREFETCH;
    finish(s, "hanging endpoint + worker kill -9", bound).await;
}
