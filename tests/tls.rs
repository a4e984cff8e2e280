//! TLS on both sides: the worker and `publish` reach the broker over
//! `amqps://`, and deliver to an `https://` receiver, trusting a private CA
//! through `SSL_CERT_FILE` like any program using the system's roots.
//! An untrusted broker certificate fails at once with a hint, not after
//! retries.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use common::harness::wait_until;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::tls_front::server_cert;
use common::{ctl_env, DownWhenLast, TestApp};
use redeliver::delay::DelayBackend;
use tokio_rustls::rustls::{self, ServerConfig};

const PORT: u16 = 5690;
/// The node's TLS listener, before [`common::node_port`]: the 4.x pass's
/// node listens 100 above, so both passes can run at once.
const TLS_PORT: u16 = 5691;
static FINISHED: AtomicUsize = AtomicUsize::new(0);

fn node_guard() -> DownWhenLast {
    DownWhenLast {
        port: PORT,
        users: 2,
        finished: &FINISHED,
    }
}

fn node_up() -> (String, PathBuf) {
    let tls_port = common::node_port(TLS_PORT).to_string();
    let tls = [("REDELIVER_TEST_BROKER_TLS_PORT", tls_port.as_str())];
    let url = ctl_env(PORT, &["up"], &tls);
    let dir = PathBuf::from(ctl_env(PORT, &["tls-dir"], &tls));
    (url, dir)
}

/// Terminates TLS on 127.0.0.1:0 with the node's server certificate and
/// forwards the bytes to `plain` (the recording receiver).
async fn https_front(tls_dir: &Path, plain: &str) -> String {
    let (certs, key) = server_cert(tls_dir);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    common::tls_front::https_front(config, plain).await
}

/// The node's TLS listener.
fn amqps() -> String {
    let port = common::node_port(TLS_PORT);
    format!("amqps://guest:guest@127.0.0.1:{port}/%2f")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqps_broker_and_https_receiver() {
    let _node = node_guard();
    let (url, tls_dir) = tokio::task::spawn_blocking(node_up).await.unwrap();
    let ca = tls_dir.join("ca.pem");
    let app = TestApp::on(&url, "tls", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let https = https_front(&tls_dir, &rx.base).await;

    let publish = app
        .command_via(&amqps())
        .args([
            "publish",
            "--id",
            "over-tls",
            "--url",
            &format!("{https}/hook"),
        ])
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&publish.stderr);
    assert!(publish.status.success(), "publish over amqps: {stderr}");
    assert_eq!(String::from_utf8_lossy(&publish.stdout).trim(), "over-tls");

    let mut worker = app.command_via(&amqps());
    worker
        .args(["run", "--concurrency", "2"])
        .env("SSL_CERT_FILE", &ca);
    let worker = Proc::spawn(worker);
    let delivered = wait_until(Duration::from_secs(20), || rx.count() == 1).await;
    drop(worker);
    assert!(delivered, "delivered to the https receiver through amqps");
    let r = &rx.requests()[0];
    assert_eq!((r.path.as_str(), r.id().as_str()), ("/hook", "over-tls"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_broker_certificate_fails_at_once_with_a_hint() {
    let _node = node_guard();
    let (url, _) = tokio::task::spawn_blocking(node_up).await.unwrap();
    let app = TestApp::on(&url, "tlsbad", DelayBackend::Plugin);
    // An empty bundle: no root trusts the node's private CA.
    let empty = std::env::temp_dir().join(format!("{}-empty.pem", app.prefix));
    std::fs::write(&empty, "").unwrap();
    for args in [vec!["publish", "--url", "http://127.0.0.1:9/"], vec!["run"]] {
        let started = std::time::Instant::now();
        let out = app
            .command_via(&amqps())
            .args(&args)
            .env("SSL_CERT_FILE", &empty)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(out.stdout.is_empty(), "{args:?} printed no id");
        assert!(
            stderr.contains("invalid peer certificate"),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("hint:") && stderr.contains("SSL_CERT_FILE"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("guest:guest"),
            "the password is never shown: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} did not retry"
        );
    }
    let _ = std::fs::remove_file(empty);
}
