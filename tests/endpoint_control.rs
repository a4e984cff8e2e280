//! Endpoints an operator sees and steers (`redeliver endpoint ...`), from
//! outside: real `redeliver run` processes on default flags, real HTTP
//! receivers, the CLI, and the documented contract: a change is in force
//! on every worker within 2 s, a pause holds every attempt and a resume
//! delivers the backlog as first attempts, a disable dead-letters at once,
//! and state survives a broker restart.

mod common;

use std::time::{Duration, Instant};

use common::app::TestApp;
use common::endpoints::{
    all_delivered, delivered, endpoint, endpoint_output, history_count, in_force, origin, show,
};
use common::harness::{assert_quiet_for, wait_until};
use common::metrics::{run_with_admin, scrape, value};
use common::receiver::{Receiver, Reply};
use redeliver::delay::DelayBackend;

both_backends!(
    a_pause_holds_every_attempt_and_a_resume_delivers_the_backlog_as_first_attempts,
    a_disabled_prefix_dead_letters_at_once_and_replays_after_enable,
);

async fn a_pause_holds_every_attempt_and_a_resume_delivers_the_backlog_as_first_attempts(
    backend: DelayBackend,
) {
    let app = TestApp::new("ep-pause", backend);
    let (held, other) = (ok_receiver().await, ok_receiver().await);
    let (_w1, a1) = run_with_admin(&app, &[]);
    let (_w2, a2) = run_with_admin(&app, &[]);
    assert!(app.wait_consumer_count("work", 2).await, "two workers");
    let target = origin(&held);
    let said = endpoint(&app, &["pause", &target, "--reason", "maintenance"]);
    assert!(said.contains("is paused"), "{said}");
    let changed = Instant::now();
    for admin in [a1, a2] {
        assert!(
            in_force(admin, "paused", 1.0).await,
            "not in force on a worker"
        );
    }
    // The gauge follows the state within the worker's one-second tick.
    let took = changed.elapsed();
    assert!(
        took <= Duration::from_secs(2),
        "in force on both after {took:?}"
    );
    let ids = app.publish(&held.notifications("held", 200)).await;
    let others = app.publish(&other.notifications("other", 200)).await;
    let quiet = assert_quiet_for(Duration::from_secs(10), "paused", || held.count()).await;
    assert_eq!(quiet, 0, "a paused endpoint got requests");
    assert!(
        all_delivered(&other, &others, Duration::from_secs(1)).await,
        "the other endpoint's deliveries stopped too: {} of 200",
        delivered(&other).len()
    );
    let status = String::from_utf8_lossy(&app.cli(&["status"]).stdout).into_owned();
    assert!(status.contains("1 paused"), "{status}");
    assert!(
        status.contains("parked         200 in the parking queues"),
        "{status}"
    );
    // Parked, all 200, and none went round the delay backend.
    let v = show(&app, &target).expect("show");
    assert_eq!(v["state"], "paused", "{v:#}");
    assert_eq!(v["parked"], 200, "{v:#}");
    let mut parked = 0.0;
    for admin in [a1, a2] {
        let text = scrape(admin).await.expect("metrics");
        let deferrals = value(&text, "redeliver_deferrals_republished_total", &[]);
        assert_eq!(
            deferrals.unwrap_or(0.0),
            0.0,
            "a copy went to the delay backend"
        );
        let op = ["op=\"parked\""];
        parked += value(&text, "redeliver_parking_queue_total", &op).unwrap_or(0.0);
    }
    assert_eq!(parked, 200.0, "parked by the two workers");
    endpoint(&app, &["resume", &target]);
    let resumed = Instant::now();
    assert!(
        all_delivered(&held, &ids, Duration::from_secs(5)).await,
        "not all delivered after the resume: {} of 200",
        delivered(&held).len()
    );
    println!(
        "backlog of 200 delivered {:?} after the resume",
        resumed.elapsed()
    );
    let attempts: Vec<String> = held
        .requests()
        .iter()
        .map(|r| r.header("redeliver-attempt").unwrap_or_default())
        .collect();
    assert!(attempts.iter().all(|a| a == "1"), "{attempts:?}");
}

async fn a_disabled_prefix_dead_letters_at_once_and_replays_after_enable(backend: DelayBackend) {
    let app = TestApp::new("ep-disable", backend);
    let rx = ok_receiver().await;
    // A first retry a minute out: "at once" below may then take a loaded
    // machine's seconds (CI once took 9.8 s on 4.3.6) and still be told
    // apart from an attempt and a retry.
    let (_w, admin) = run_with_admin(&app, &["--schedule", "60s"]);
    assert!(app.wait_consumers("work").await);
    // A tenant's prefix: the host's other paths go on.
    let prefix = rx.url("/m/1/");
    endpoint(&app, &["disable", &prefix, "--reason", "merchant gone"]);
    assert!(in_force(admin, "disabled", 1.0).await);
    let to = |path: &str, tag: &str| {
        (0..10)
            .map(|i| serde_json::json!({"url": rx.url(path), "id": format!("{tag}-{i}")}))
            .collect::<Vec<_>>()
    };
    let published = Instant::now();
    let dead_ids = app.publish(&to("/m/1/pay", "m1")).await;
    let live_ids = app.publish(&to("/m/2/pay", "m2")).await;
    while app.queue_len("dead").await < 10 && published.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At once: well before the first retry (60 s) could have come, and
    // with no attempt (below). Alone it takes well under a second.
    let took = published.elapsed();
    println!("dead-lettered after {took:?}");
    assert!(
        took <= Duration::from_secs(30),
        "dead-lettered after {took:?}"
    );
    let listed = app.cli(&["dlq", "list", "--json", "--endpoint", &prefix]);
    let dead: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 10, "dead letters under the prefix");
    for d in &dead {
        assert_eq!(d["dead_letter"]["reason"], "endpoint-disabled");
        assert_eq!(d["dead_letter"]["attempts"], 0, "no attempt");
    }
    assert!(all_delivered(&rx, &live_ids, Duration::from_secs(10)).await);
    assert!(rx.requests().iter().all(|r| !r.path.starts_with("/m/1/")));
    endpoint(&app, &["enable", &prefix]);
    let replay = [
        "dlq",
        "replay",
        "--endpoint",
        &prefix,
        "--reason",
        "endpoint-disabled",
    ];
    let out = app.cli(&replay);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("replayed 10"));
    assert!(all_delivered(&rx, &dead_ids, Duration::from_secs(20)).await);
}

/// The pause is taken before any worker runs (an operator may act before
/// traffic arrives), survives a broker restart, and holds a worker that
/// starts afterwards from its very first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_survives_a_broker_restart_and_holds_a_worker_started_later() {
    const PORT: u16 = 5697;
    let url = node(PORT, &["up"]).await;
    let _down = Down(PORT);
    let app = TestApp::on(&url, "ep-restart", DelayBackend::Plugin);
    let rx = ok_receiver().await;
    let target = origin(&rx);
    let out = endpoint_output(&app, &["pause", &target]);
    assert!(out.status.success());
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("no live worker has seen"), "{note}");
    let ids = app.publish(&rx.notifications("r", 20)).await;
    node(PORT, &["restart"]).await;
    let (_w, admin) = run_with_admin(&app, &[]);
    assert!(in_force(admin, "paused", 1.0).await, "the pause was lost");
    assert!(app.wait_consumers("work").await);
    assert_quiet_for(Duration::from_secs(5), "paused after a restart", || {
        rx.count()
    })
    .await;
    assert_eq!(rx.count(), 0);
    endpoint(&app, &["resume", &target]);
    assert!(all_delivered(&rx, &ids, Duration::from_secs(60)).await);
    let v = show(&app, &target).expect("show");
    assert_eq!(
        (history_count(&v, "paused"), history_count(&v, "resumed")),
        (1, 1)
    );
}

/// `endpoint list` merges what two workers see of the same endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoint_list_merges_what_two_workers_see() {
    let app = TestApp::new("ep-list", DelayBackend::Plugin);
    let slow = || Reply::status(200).delay(Duration::from_millis(30));
    let (a, b) = (
        Receiver::start(move |_| slow()).await,
        Receiver::start(move |_| slow()).await,
    );
    // One at a time each, so both workers get some of each endpoint's.
    let one = ["--concurrency", "1", "--prefetch", "1"];
    let (_w1, _) = run_with_admin(&app, &one);
    let (_w2, _) = run_with_admin(&app, &one);
    assert!(app.wait_consumer_count("work", 2).await);
    let mut ids = app.publish(&a.notifications("a", 20)).await;
    ids.extend(app.publish(&b.notifications("b", 20)).await);
    assert!(all_delivered(&a, &ids[..20], Duration::from_secs(30)).await);
    assert!(all_delivered(&b, &ids[20..], Duration::from_secs(30)).await);
    let rows = |app: &TestApp| -> Vec<serde_json::Value> {
        let text = endpoint(app, &["list", "--json"]);
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    // Reports come every 5 s; wait for both workers' newest.
    let merged = wait_until(Duration::from_secs(15), || {
        let r = rows(&app);
        r.len() == 2
            && r.iter()
                .all(|e| e["last_5m"]["attempts"] == 20 && e["workers"] == 2)
    })
    .await;
    assert!(merged, "{:#?}", rows(&app));
    let table = endpoint(&app, &["list"]);
    assert!(
        table.contains(&origin(&a)) && table.contains("2 live worker(s)"),
        "{table}"
    );
}

#[tokio::test]
async fn bad_input_exits_2_and_says_why() {
    let app = TestApp::new("ep-bad", DelayBackend::Plugin);
    let cases: [&[&str]; 4] = [
        &["pause", "hooks.example.com"],
        &["pause", "ftp://h.example"],
        &["pause", "https://h.example", "--for", "soon"],
        &["disable", "https://u:p@h.example"],
    ];
    for args in cases {
        let out = endpoint_output(&app, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
    let unseen = "http://127.0.0.1:9";
    for (args, says) in [
        (&["show", unseen][..], "no live worker has seen"),
        (&["resume", unseen][..], "is not paused"),
        (&["enable", unseen][..], "is not disabled"),
    ] {
        let out = endpoint_output(&app, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = app.cli(&["run", "--disable-after", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    // A disabled target is enabled before it is paused.
    endpoint(&app, &["disable", unseen]);
    let out = endpoint_output(&app, &["pause", unseen]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is disabled"), "{err}");
    let out = endpoint_output(&app, &["disable", unseen]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("already disabled"), "{err}");
}

async fn ok_receiver() -> Receiver {
    Receiver::start(|_| Reply::status(200)).await
}

/// `tests/broker/ctl ARGS` for the node on `port`, off the async workers.
async fn node(port: u16, args: &'static [&'static str]) -> String {
    let ran = tokio::task::spawn_blocking(move || common::ctl(port, args));
    ran.await.unwrap()
}

/// Takes a private node down when the test ends, passed or failed.
struct Down(u16);

impl Drop for Down {
    fn drop(&mut self) {
        let port = self.0;
        let _ = std::panic::catch_unwind(|| common::ctl(port, &["down"]));
    }
}
