//! SSRF protection and secret redaction, through real HTTP and the CLI.

mod common;

use std::time::Duration;

use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use lapin::types::FieldTable;
use redeliver::delay::DelayBackend;
use redeliver::deliver::AddressPolicy;
use redeliver::message::state::*;
use redeliver::HttpDeliverer;
use serde_json::json;

/// Metadata and link-local addresses are refused by default and
/// dead-lettered as `permanent` after one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_address_is_refused_for_good() {
    let app = TestApp::new("ssrf", DelayBackend::Plugin);
    let w = app.spawn_worker(schedule_settings("100ms", 5, 4));
    app.publish(&[json!({"url": "http://169.254.169.254/latest/meta-data/", "id": "meta"})])
        .await;
    let dead = app.wait_dead(1).await;
    w.stop().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].str(H_DEAD_REASON).as_deref(), Some("permanent"));
    assert_eq!(dead[0].int(H_ATTEMPT), Some(1), "no retries");
    assert!(dead[0]
        .str(H_LAST_ERROR)
        .unwrap()
        .contains("169.254.169.254 is blocked"));
}

/// `--deny-private` judges the resolved address: `localhost` is refused,
/// and `--allow-cidr` punches a hole for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deny_private_checks_the_resolved_address() {
    let app = TestApp::new("private", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let by_name = rx.base.replace("127.0.0.1", "localhost");
    let deny = AddressPolicy::new(true, vec![]);
    let handler = HttpDeliverer::with_policy(Duration::from_secs(5), 4, deny).unwrap();
    let w = app.spawn_worker_with(schedule_settings("100ms", 5, 4), handler);
    app.publish(&[json!({"url": format!("{by_name}/x"), "id": "by-name"})])
        .await;
    let dead = app.wait_dead(1).await;
    w.stop().await;
    assert_eq!(rx.count(), 0, "the receiver never saw it");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].str(H_DEAD_REASON).as_deref(), Some("permanent"));
    assert!(
        dead[0].str(H_LAST_ERROR).unwrap().contains("is blocked"),
        "{:?}",
        dead[0].str(H_LAST_ERROR)
    );

    let allow = AddressPolicy::new(
        true,
        vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
    );
    let handler = HttpDeliverer::with_policy(Duration::from_secs(5), 4, allow).unwrap();
    let w = app.spawn_worker_with(schedule_settings("100ms", 5, 4), handler);
    app.publish(&[json!({"url": format!("{by_name}/y"), "id": "allowed"})])
        .await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    w.stop().await;
}

/// Credentials never show in `dlq list --json`, `dlq show` or `dlq export`
/// (unless `--include-secrets`), nor the AMQP password in any output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted() {
    let app = TestApp::new("secrets", DelayBackend::Plugin);
    let n = json!({
        "id": "sec-1",
        "url": "https://user:hunter2@example.com/hook",
        "headers": {"Authorization": "Bearer s3cr3t-bearer", "X-Auth-Token": "tok-s3cr3t", "Cookie": "sid=s3cr3t-cookie", "X-Plain": "visible"},
        "body": {"a": 1}
    });
    let mut h = FieldTable::default();
    h.insert(H_DEAD_REASON.into(), long_string("max-attempts"));
    app.publish_to_queue("dead", &[(n.to_string().into_bytes(), h)])
        .await;
    let secrets = ["s3cr3t", "hunter2"];
    for args in [
        vec!["dlq", "list", "--json"],
        vec!["dlq", "list"],
        vec!["dlq", "show", "sec-1"],
        vec!["dlq", "export"],
    ] {
        let out = stdout(&app.cli(&args));
        for s in secrets {
            assert!(!out.contains(s), "{args:?} leaked {s}: {out}");
        }
        if args[1] != "list" || args.len() == 3 {
            assert!(
                out.contains("***redacted***") && out.contains("visible"),
                "{args:?}: {out}"
            );
        }
    }
    let full = stdout(&app.cli(&["dlq", "export", "--include-secrets"]));
    assert!(full.contains("s3cr3t-bearer") && full.contains("hunter2"));

    let status = app.cli(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout).to_string()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(
        text.contains("guest:***@") && !text.contains("guest:guest@"),
        "{text}"
    );
    let wrong = app.url.replace("guest:guest@", "guest:wr0ngpass@");
    assert_ne!(wrong, app.url, "the test node's URL has guest's password");
    let bad = app.command_via(&wrong).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(!text.contains("wr0ngpass"), "{text}");
}

/// Credentials are refused on re-import when they were redacted on export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_exports_are_not_re_imported() {
    let app = TestApp::new("reimport", DelayBackend::Plugin);
    let n = json!({"id": "r1", "url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer s3cr3t"}});
    app.publish_to_queue(
        "dead",
        &[(n.to_string().into_bytes(), FieldTable::default())],
    )
    .await;
    let file = std::env::temp_dir().join(format!("{}.jsonl", app.prefix));
    let path = file.to_str().unwrap();
    assert!(app.cli(&["dlq", "export", "--out", path]).status.success());
    let o = app.cli(&["publish", "--file", path]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("redacted secrets"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(app
        .cli(&["dlq", "export", "--include-secrets", "--out", path])
        .status
        .success());
    assert_eq!(stdout(&app.cli(&["publish", "--file", path])).trim(), "r1");
    let _ = std::fs::remove_file(&file);
}
