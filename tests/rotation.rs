//! Signing-secret rotation with a grace period: `whsec_...@TIME` signs
//! beside the new secret until TIME, then stops, in the same running
//! worker; `config check` and `run` warn of expiries.

mod common;

use std::time::{Duration, SystemTime};

use base64::Engine;
use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;
use serde_json::json;
use standardwebhooks::Webhook;

fn new_secret(byte: u8) -> String {
    let key = base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    format!("whsec_{key}")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_old_secret_signs_until_its_expiry_then_only_the_new_one() {
    // The plugin backend: a worker on the cascade declares its 120 quorum
    // queues first, and in CI, at a load of 14 on two cores, that start and
    // the first delivery took past the old secret's expiry. What is tested
    // here is signing, which is the same on both.
    let app = TestApp::new("rotate", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let (old, new) = (new_secret(1), new_secret(2));
    let expiry = SystemTime::now() + Duration::from_secs(12);
    let old_until = format!("{old}@{}", rfc3339(expiry));
    let mut cmd = app.command();
    cmd.args([
        "run",
        "--signing-secret",
        &old_until,
        "--signing-secret",
        &new,
    ]);
    let mut worker = Proc::spawn(cmd);
    assert!(app.wait_consumers("work").await);

    app.publish(&[json!({"url": rx.url("/hook"), "id": "before", "body": {"n": 1}})])
        .await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    let verifies = |n: usize, s: &str| {
        let r = &rx.requests()[n];
        Webhook::new(s).unwrap().verify(&r.body, &r.headers).is_ok()
    };
    let signatures = |n: usize| {
        let h = rx.requests()[n].header("webhook-signature").unwrap();
        h.split(' ').count()
    };
    assert!(SystemTime::now() < expiry, "the first delivery was in time");
    assert_eq!(signatures(0), 2, "both secrets sign before the expiry");
    assert!(verifies(0, &old) && verifies(0, &new));

    let left = expiry.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(500)).await;
    app.publish(&[json!({"url": rx.url("/hook"), "id": "after", "body": {"n": 2}})])
        .await;
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 2).await);
    assert_eq!(signatures(1), 1, "only the new secret signs after it");
    assert!(verifies(1, &new), "the new secret verifies");
    assert!(!verifies(1, &old), "the old one no longer does");

    worker.sigterm();
    worker.wait_exit(Duration::from_secs(30));
    let told = "a signing secret expired: it no longer signs";
    assert_eq!(worker.stderr_count(told), 1, "{:?}", worker.stderr());
    let logs = worker.stderr().join("\n");
    assert!(
        !logs.contains(&old[6..]) && !logs.contains(&new[6..]),
        "no key in the logs"
    );
}

#[test]
fn config_check_warns_of_expired_and_expiring_secrets() {
    let now = SystemTime::now();
    let soon = format!(
        "{}@{}",
        new_secret(3),
        rfc3339(now + Duration::from_secs(3600))
    );
    let gone = format!(
        "{}@{}",
        new_secret(4),
        rfc3339(now - Duration::from_secs(60))
    );
    let later = format!(
        "{}@{}",
        new_secret(5),
        rfc3339(now + Duration::from_secs(86400 * 7))
    );
    let text = format!(
        "[run]\nsigning-secret = [\"{soon}\", \"{later}\"]\n\n\
         [[route]]\nurl-prefix = \"https://pay.example.com/\"\nsigning-secret = [\"{gone}\", \"{}\"]\n",
        new_secret(6)
    );
    let path = std::env::temp_dir().join(format!("redeliver-rotation-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let o = common::redeliver_command()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "warnings are not errors: {out}");
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 2, "{out}");
    assert!(
        warnings[0].contains("line 2") && warnings[0].contains("expires at"),
        "{out}"
    );
    assert!(warnings[0].contains("(in 59m"), "{out}");
    assert!(
        warnings[1].contains("route https://pay.example.com/"),
        "{out}"
    );
    assert!(
        warnings[1].contains("expired at") && warnings[1].contains("remove it"),
        "{out}"
    );
    assert!(!out.contains("whsec_"), "never a secret: {out}");
}

#[test]
fn run_refuses_when_every_secret_has_expired() {
    let gone = format!("{}@2020-01-01T00:00:00Z", new_secret(7));
    let o = common::redeliver_command()
        .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f", "run"])
        .args(["--signing-secret", &gone])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("every signing secret has expired"), "{err}");
    let bad = format!("{}@2026-12-01T00:00:00+08:00", new_secret(8));
    let o = common::redeliver_command()
        .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f", "run"])
        .args(["--signing-secret", &bad])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("RFC 3339 time in UTC"), "{err}");
}
