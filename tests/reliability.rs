//! Recovery and shutdown: broker restarts, SIGTERM with and without time
//! to finish.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::{broker_url, ctl, prefix};
use serde_json::json;

fn spawn_run(url: &str, p: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_redeliver"))
        .args(["--amqp-url", url, "--prefix", p, "run"])
        .args(args)
        .spawn()
        .expect("spawn redeliver run")
}

/// A worker keeps delivering across a broker restart, without help.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_recovers_from_a_broker_restart() {
    const PORT: u16 = 5686;
    let url = tokio::task::spawn_blocking(|| ctl(PORT, &["up"]))
        .await
        .unwrap();
    let p = prefix("restart");
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = spawn_worker(&url, &p, schedule_settings("1s", 3, 4));
    publish(&url, &p, &[json!({"url": rx.url("/"), "id": "before"})]).await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    tokio::task::spawn_blocking(|| ctl(PORT, &["restart"]))
        .await
        .unwrap();
    publish(&url, &p, &[json!({"url": rx.url("/"), "id": "after"})]).await;
    let recovered = wait_until(Duration::from_secs(45), || rx.count() == 2).await;
    assert!(!w.join.is_finished(), "the worker kept running");
    w.stop().await;
    tokio::task::spawn_blocking(|| ctl(PORT, &["down"]))
        .await
        .unwrap();
    assert!(
        recovered,
        "delivered after the restart: {:?}",
        rx.requests().iter().map(|r| r.id()).collect::<Vec<_>>()
    );
    assert_eq!(rx.requests()[1].id(), "after");
}

/// SIGTERM: in-flight deliveries finish within the grace, then exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_in_flight_deliveries_finish() {
    let (url, p) = (broker_url(), prefix("term"));
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_millis(1500))).await;
    publish(
        &url,
        &p,
        &(0..4)
            .map(|i| json!({"url": rx.url("/"), "id": format!("t{i}")}))
            .collect::<Vec<_>>(),
    )
    .await;
    let mut c = spawn_run(&url, &p, &["--concurrency", "4", "--shutdown-grace", "10s"]);
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 4).await);
    sigterm(&c);
    let st = wait_exit(&mut c, Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert_eq!(rx.count(), 4);
    assert_eq!(
        queue_len(&url, &format!("{p}.work")).await,
        0,
        "all four were acked"
    );
    cleanup(&url, &p).await;
}

/// SIGTERM: what is still running when the grace is over goes back to the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_requeues_what_the_grace_cannot_finish() {
    let (url, p) = (broker_url(), prefix("grace"));
    let rx = Receiver::start(|_| Reply::status(200).delay(Duration::from_secs(20))).await;
    publish(
        &url,
        &p,
        &(0..2)
            .map(|i| json!({"url": rx.url("/"), "id": format!("g{i}")}))
            .collect::<Vec<_>>(),
    )
    .await;
    let mut c = spawn_run(
        &url,
        &p,
        &[
            "--concurrency",
            "4",
            "--shutdown-grace",
            "300ms",
            "--timeout",
            "30s",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 2).await);
    let t = Instant::now();
    sigterm(&c);
    let st = wait_exit(&mut c, Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "exited after {:?}",
        t.elapsed()
    );
    let mut back = 0;
    for _ in 0..50 {
        back = queue_len(&url, &format!("{p}.work")).await;
        if back == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(back, 2, "both unfinished deliveries are back in the queue");
    cleanup(&url, &p).await;
}

/// `publish` rides out a broker that is down for a few seconds, and prints
/// the id only once it is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_retries_until_the_broker_is_back() {
    const PORT: u16 = 5687;
    let url = tokio::task::spawn_blocking(|| ctl(PORT, &["up"]))
        .await
        .unwrap();
    let p = prefix("pubretry");
    tokio::task::spawn_blocking(|| ctl(PORT, &["down"]))
        .await
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_redeliver"))
        .args([
            "--amqp-url",
            &url,
            "--prefix",
            &p,
            "publish",
            "--url",
            "http://127.0.0.1:9/",
            "--id",
            "late",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::spawn_blocking(|| ctl(PORT, &["up"]))
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let len = queue_len(&url, &format!("{p}.work")).await;
    tokio::task::spawn_blocking(|| ctl(PORT, &["down"]))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("publishing interrupted; retrying"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "late");
    assert_eq!(len, 1);
}

/// With no broker at all, `publish` gives up after a bounded number of
/// tries, says so, and prints no id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_gives_up_clearly_without_a_broker() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_redeliver"))
        .args([
            "--amqp-url",
            "amqp://guest:guest@127.0.0.1:5999/%2f",
            "publish",
            "--url",
            "http://127.0.0.1:9/",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no id printed");
    assert!(
        stderr.contains("publishing failed after 6 tries; 1 notification(s) not confirmed"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// The upstream plugin's confirm window, mimicked by the test plugin's
/// late-write mode (confirm at once, disk write 3 s later). Without
/// `--retry-settle`, a broker kill -9 right after a retry copy is confirmed
/// loses the notification; with it, the broker redelivers the original.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_settle_covers_the_plugins_confirm_window() {
    const PORT: u16 = 5688;
    const LATE: &[(&str, &str)] = &[("REDELIVER_TEST_BROKER_LATE_WRITE_MS", "3000")];
    let url = tokio::task::spawn_blocking(|| common::ctl_env(PORT, &["up"], LATE))
        .await
        .unwrap();
    let mut seen = vec![];
    for settle in [Duration::ZERO, Duration::from_secs(5)] {
        let p = prefix("settle");
        let rx = Receiver::start(|r| {
            if r.nth == 1 {
                Reply::status(500)
            } else {
                Reply::status(200)
            }
        })
        .await;
        publish(&url, &p, &[] as &[String]).await;
        // A quorum queue must be a few seconds old to survive a kill -9
        // (RabbitMQ 3.10 persists its Ra registration lazily).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut settings = schedule_settings("1s", 3, 4);
        settings.retry_settle = settle;
        let w = spawn_worker(&url, &p, settings);
        publish(&url, &p, &[json!({"url": rx.url("/"), "id": "settle"})]).await;
        assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
        // The retry copy is confirmed but not yet on the broker's disk.
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::spawn_blocking(|| ctl(PORT, &["kill"]))
            .await
            .unwrap();
        tokio::task::spawn_blocking(|| common::ctl_env(PORT, &["up"], LATE))
            .await
            .unwrap();
        let delivered = wait_until(Duration::from_secs(25), || rx.count() >= 2).await;
        w.stop().await;
        println!("retry-settle {settle:?}: delivered after the crash: {delivered}");
        seen.push(delivered);
    }
    tokio::task::spawn_blocking(|| ctl(PORT, &["down"]))
        .await
        .unwrap();
    assert_eq!(
        seen,
        [false, true],
        "lost without the settle, saved with it"
    );
}
