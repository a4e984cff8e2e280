//! `dlq replay --rate`: a paced replay holds its rate at the receiver, and
//! one stopped by Ctrl-C leaves the rest in order and continues when run
//! again, delivering each notification once.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::dead_letters::{dead, ids_of, now_ms};
use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Recorded, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;

/// One test at a time: the paced test measures the receiver's busiest
/// second, which a heavy replay beside it (CPU for its worker) would bunch.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The most requests the receiver got within any one second.
/// The most requests in any `window`.
fn peak_in(requests: &[Recorded], window: Duration) -> usize {
    let mut at: Vec<Instant> = requests.iter().map(|r| r.at).collect();
    at.sort();
    let mut peak = 0;
    for (i, start) in at.iter().enumerate() {
        let within = at[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < window)
            .count();
        peak = peak.max(within);
    }
    peak
}

fn assert_each_once(rx: &Receiver, n: usize) {
    let by_id = rx.count_by_id();
    assert_eq!(by_id.len(), n, "every notification delivered");
    let twice: Vec<_> = by_id.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paced_replay_holds_its_rate_at_the_receiver() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("pace", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let url = rx.url("/hook");
    let items: Vec<_> = (0..2000)
        .map(|i| dead(&format!("p{i}"), &url, "max-attempts", now_ms()))
        .collect();
    app.publish_to_queue("dead", &items).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 16));

    let args = ["dlq", "replay", "--all", "--rate", "200/s"];
    let dry = stdout(&app.cli(&[&args[..], &["--dry-run"]].concat()));
    let expect = "2000 would be replayed (dry run); at 200/s that takes about 10s";
    assert!(dry.contains(expect), "{dry}");
    assert_eq!(
        app.queue_len("dead").await,
        2000,
        "a dry run changes nothing"
    );

    let started = Instant::now();
    let out = app.cli(&args);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(stdout(&out).contains("replayed 2000"), "{}", stdout(&out));
    // A wait for the worker, not a pace: starved by other suites, it once
    // took past 30 s to deliver the last of them.
    assert!(
        wait_until(Duration::from_secs(90), || rx.count() >= 2000).await,
        "{} of 2000 delivered",
        rx.count()
    );
    assert_quiet_for(Duration::from_millis(500), "requests", || rx.count()).await;
    w.stop().await;
    let peak = peak_in(&rx.requests(), Duration::from_secs(1));
    let peak2 = peak_in(&rx.requests(), Duration::from_secs(2));
    println!("2000 dead letters at 200/s: {took:.2?}, receiver peak {peak} in 1 s, {peak2} in 2 s");
    // 10 s of pacing at the least: the pace is never beaten. How much
    // longer is the machine's figure, not the replay's: in CI, at a load of
    // 14 on two cores, the broker's confirms came so late that the same
    // replay took 89 s (unpaced, it would be far faster than 9 s).
    assert!(took.as_secs_f64() >= 9.0, "took {took:?}, under 9 s");
    // The replay paces its republishes; the worker that delivers them,
    // starved by other suites on this machine, once sent a second's worth
    // late and the next on time (243 in one second), once 442 in two, and
    // once (CI, the 4.3.6 pass) 534 in two, and once 684. Two seconds at
    // the pace are 400; a worker stalled for a second or more bunches what
    // it missed. Twice the pace would show 800, and an unpaced replay
    // (2,000 in about 2 s) far more; the 9 s above is the pace itself.
    assert!(peak2 < 800, "the receiver saw {peak2} in two seconds");
    assert_each_once(&rx, 2000);
    assert_eq!(app.queue_len("dead").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_stopped_by_ctrl_c_continues_where_it_stopped() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("resume", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let url = rx.url("/hook");
    // Every third one is not selected, so the order that is checked has
    // kept dead letters between replayed ones.
    let reason = |i: usize| {
        if i.is_multiple_of(3) {
            "expired"
        } else {
            "max-attempts"
        }
    };
    let ids: Vec<String> = (0..600).map(|i| format!("r{i:03}")).collect();
    let items: Vec<_> = (ids.iter().enumerate())
        .map(|(i, id)| dead(id, &url, reason(i), now_ms()))
        .collect();
    app.publish_to_queue("dead", &items).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 16));
    let args = [
        "dlq",
        "replay",
        "--reason",
        "max-attempts",
        "--rate",
        "100/s",
    ];

    let mut first = Proc::spawn({
        let mut c = app.command();
        c.args(args);
        c
    });
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 100).await);
    first.sigint();
    let status = first.wait_exit(Duration::from_secs(30));
    let stderr = first.stderr().join("\n");
    assert!(!status.success(), "a stopped replay is not a finished one");
    assert!(stderr.contains("run the same command again"), "{stderr}");
    let done: usize = (first.stdout().iter())
        .find_map(|l| l.strip_prefix("replayed ")?.parse().ok())
        .expect("it says how many it replayed");
    assert!((100..400).contains(&done), "stopped halfway: {done}");

    // The first `done` selected ones are gone; the rest are there, in order.
    let selected: Vec<&String> = (ids.iter().enumerate())
        .filter(|(i, _)| reason(*i) == "max-attempts")
        .map(|(_, id)| id)
        .collect();
    let replayed = &selected[..done];
    let left: Vec<String> = (ids.iter())
        .filter(|id| !replayed.contains(id))
        .cloned()
        .collect();
    let export = stdout(&app.cli(&["dlq", "export"]));
    assert_eq!(ids_of(&export), left, "the rest, unchanged and in order");

    let again = app.cli(&args);
    let out = stdout(&again);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(out.contains(&format!("replayed {}", 400 - done)), "{out}");
    assert!(wait_until(Duration::from_secs(30), || rx.count() >= 400).await);
    assert_quiet_for(Duration::from_millis(500), "requests", || rx.count()).await;
    w.stop().await;
    assert_each_once(&rx, 400);
    let kept: Vec<String> = (ids.iter().enumerate())
        .filter(|(i, _)| reason(*i) == "expired")
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(ids_of(&stdout(&app.cli(&["dlq", "export"]))), kept);
}

/// More dead letters than two read windows (2,000 each) hold, few of them
/// selected: the batch in flight when the window fills is settled before
/// the walk moves on, so none is skipped and the kept ones keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sparse_replay_past_two_windows_skips_none_and_keeps_the_order() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let app = TestApp::new("sparse", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let url = rx.url("/hook");
    // Every 7th: a batch of 100 is part-filled when the first window fills.
    let picked = |i: usize| i.is_multiple_of(7);
    let ids: Vec<String> = (0..5_000).map(|i| format!("s{i:04}")).collect();
    let reason = |i: usize| if picked(i) { "max-attempts" } else { "expired" };
    let items: Vec<_> = (ids.iter().enumerate())
        .map(|(i, id)| dead(id, &url, reason(i), now_ms()))
        .collect();
    app.publish_to_queue("dead", &items).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 16));
    let out = app.cli(&["dlq", "replay", "--reason", "max-attempts"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let n = (0..5_000).filter(|i| picked(*i)).count();
    assert!(
        stdout(&out).contains(&format!("replayed {n}")),
        "{}",
        stdout(&out)
    );
    assert!(wait_until(Duration::from_secs(30), || rx.count() >= n).await);
    assert_quiet_for(Duration::from_millis(300), "requests", || rx.count()).await;
    w.stop().await;
    assert_each_once(&rx, n);
    let kept: Vec<String> = (ids.iter().enumerate())
        .filter(|(i, _)| !picked(*i))
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(ids_of(&stdout(&app.cli(&["dlq", "export"]))), kept);
}
