//! SSRF protection and secret redaction, through real HTTP and the CLI.

mod common;

use std::time::Duration;

use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::{broker_url, prefix};
use lapin::types::FieldTable;
use redeliver::deliver::AddressPolicy;
use redeliver::message::state::*;
use redeliver::HttpDeliverer;
use serde_json::json;

/// Metadata and link-local addresses are refused by default and
/// dead-lettered as `permanent` after one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_address_is_refused_for_good() {
    let (url, p) = (broker_url(), prefix("ssrf"));
    let w = spawn_worker(&url, &p, schedule_settings("100ms", 5, 4));
    publish(
        &url,
        &p,
        &[json!({"url": "http://169.254.169.254/latest/meta-data/", "id": "meta"})],
    )
    .await;
    let dead = wait_dead(&url, &p, 1).await;
    w.stop().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].str(H_DEAD_REASON).as_deref(), Some("permanent"));
    assert_eq!(dead[0].int(H_ATTEMPT), Some(1), "no retries");
    assert!(dead[0]
        .str(H_LAST_ERROR)
        .unwrap()
        .contains("169.254.169.254 is blocked"));
    cleanup(&url, &p).await;
}

/// `--deny-private` judges the resolved address: `localhost` is refused,
/// and `--allow-cidr` punches a hole for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deny_private_checks_the_resolved_address() {
    let (url, p) = (broker_url(), prefix("private"));
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let by_name = rx.base.replace("127.0.0.1", "localhost");
    let deny = AddressPolicy::new(true, vec![]);
    let handler = HttpDeliverer::with_policy(Duration::from_secs(5), 4, deny).unwrap();
    let w = spawn_worker_with(&url, &p, schedule_settings("100ms", 5, 4), handler);
    publish(
        &url,
        &p,
        &[json!({"url": format!("{by_name}/x"), "id": "by-name"})],
    )
    .await;
    let dead = wait_dead(&url, &p, 1).await;
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
    let w = spawn_worker_with(&url, &p, schedule_settings("100ms", 5, 4), handler);
    publish(
        &url,
        &p,
        &[json!({"url": format!("{by_name}/y"), "id": "allowed"})],
    )
    .await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    w.stop().await;
    cleanup(&url, &p).await;
}

/// Credentials never show in `dlq list --json`, `dlq show` or `dlq export`
/// (unless `--include-secrets`), nor the AMQP password in any output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted() {
    let (url, p) = (broker_url(), prefix("secrets"));
    let n = json!({
        "id": "sec-1",
        "url": "https://user:hunter2@example.com/hook",
        "headers": {"Authorization": "Bearer s3cr3t-bearer", "X-Auth-Token": "tok-s3cr3t", "Cookie": "sid=s3cr3t-cookie", "X-Plain": "visible"},
        "body": {"a": 1}
    });
    let mut h = FieldTable::default();
    h.insert(H_DEAD_REASON.into(), long_string("max-attempts"));
    publish_to_queue(
        &url,
        &p,
        &format!("{p}.dead"),
        &[(n.to_string().into_bytes(), h)],
    )
    .await;
    let secrets = ["s3cr3t", "hunter2"];
    for args in [
        vec!["dlq", "list", "--json"],
        vec!["dlq", "list"],
        vec!["dlq", "show", "sec-1"],
        vec!["dlq", "export"],
    ] {
        let out = stdout(&cli(&url, &p, &args));
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
    let full = stdout(&cli(&url, &p, &["dlq", "export", "--include-secrets"]));
    assert!(full.contains("s3cr3t-bearer") && full.contains("hunter2"));

    let status = cli(&url, &p, &["status"]);
    let text = String::from_utf8_lossy(&status.stdout).to_string()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(
        text.contains("guest:***@") && !text.contains("guest:guest@"),
        "{text}"
    );
    let bad = cli("amqp://guest:wr0ngpass@127.0.0.1:5674/%2f", &p, &["status"]);
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(!text.contains("wr0ngpass"), "{text}");
    cleanup(&url, &p).await;
}

/// Credentials are refused on re-import when they were redacted on export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_exports_are_not_re_imported() {
    let (url, p) = (broker_url(), prefix("reimport"));
    let n = json!({"id": "r1", "url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer s3cr3t"}});
    publish_to_queue(
        &url,
        &p,
        &format!("{p}.dead"),
        &[(n.to_string().into_bytes(), FieldTable::default())],
    )
    .await;
    let file = std::env::temp_dir().join(format!("{p}.jsonl"));
    let path = file.to_str().unwrap();
    assert!(cli(&url, &p, &["dlq", "export", "--out", path])
        .status
        .success());
    let o = cli(&url, &p, &["publish", "--file", path]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("redacted secrets"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(cli(
        &url,
        &p,
        &["dlq", "export", "--include-secrets", "--out", path]
    )
    .status
    .success());
    assert_eq!(
        stdout(&cli(&url, &p, &["publish", "--file", path])).trim(),
        "r1"
    );
    let _ = std::fs::remove_file(&file);
    cleanup(&url, &p).await;
}
