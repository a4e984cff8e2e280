//! Egress: deliveries through a real HTTP or SOCKS5 proxy on 127.0.0.1,
//! a proxy that refuses, `--proxy env` with `NO_PROXY`, the SSRF guard on
//! the target (not the proxy), and per-route client certificates (mTLS)
//! and CA roots against a receiver that requires them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::harness::*;
use common::process::Proc;
use common::proxy::Proxy;
use common::receiver::{Receiver, Reply};
use common::tls_front::{https_front, server_cert};
use common::TestApp;
use redeliver::delay::DelayBackend;
use redeliver::message::state::*;
use serde_json::json;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// `run` with `args`, consuming once it returns.
async fn worker(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut c = app.command();
    c.arg("run").args(args).envs(env.iter().copied());
    let p = Proc::spawn(c);
    assert!(app.wait_consumers("work").await, "{:?}", p.stderr());
    p
}

async fn stop(mut p: Proc) {
    p.sigterm();
    p.wait_exit(Duration::from_secs(30));
}

async fn publish(app: &TestApp, id: &str, url: &str) {
    app.publish(&[json!({"url": url, "id": id, "body": {"id": id}})])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deliveries_go_through_an_http_or_socks5_proxy() {
    let app = TestApp::new("proxy", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let target = rx.base.trim_start_matches("http://").to_string();
    for (n, proxy) in [Proxy::http().await, Proxy::socks5().await]
        .iter()
        .enumerate()
    {
        let w = worker(&app, &["--proxy", &proxy.url], &[]).await;
        publish(&app, &format!("via-{n}"), &rx.url("/hook")).await;
        let ok = wait_until(Duration::from_secs(10), || rx.count() == n + 1).await;
        stop(w).await;
        assert!(ok, "delivered through {}", proxy.url);
        assert_eq!(proxy.targets(), vec![target.clone()], "{}", proxy.url);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_that_refuses_fails_the_attempts_without_reaching_the_receiver() {
    let app = TestApp::new("proxyno", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let proxy = Proxy::refusing().await;
    // With credentials, which no log line or dead letter may show.
    let url = proxy.url.replace("http://", "http://user:hunter2@");
    let args = [
        "--proxy",
        &url,
        "--max-attempts",
        "2",
        "--schedule",
        "100ms",
    ];
    let mut w = worker(&app, &args, &[]).await;
    publish(&app, "refused", &rx.url("/hook")).await;
    let dead = app.wait_dead(1).await;
    w.sigterm();
    w.wait_exit(Duration::from_secs(30));
    let logs = w.stderr().join("\n");
    assert!(!logs.contains("hunter2"), "{logs}");
    assert!(!format!("{:?}", dead[0].headers).contains("hunter2"));
    assert_eq!(rx.count(), 0, "nothing reached the receiver");
    assert_eq!(proxy.count(), 2, "both attempts went to the proxy");
    assert_eq!(dead[0].str(H_DEAD_REASON).as_deref(), Some("max-attempts"));
    // A plain-http request is forwarded, so the proxy's 403 is its answer.
    assert_eq!(dead[0].int(H_LAST_STATUS), Some(403));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_env_reads_the_variables_and_honours_no_proxy() {
    let app = TestApp::new("proxyenv", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let proxy = Proxy::http().await;
    let vars = [("HTTP_PROXY", proxy.url.as_str()), ("NO_PROXY", "")];
    let cases = [
        // The variables alone change nothing.
        (vec![], vars, 0),
        (vec!["--proxy", "env"], vars, 1),
        (
            vec!["--proxy", "env"],
            [vars[0], ("NO_PROXY", "127.0.0.1")],
            0,
        ),
    ];
    for (n, (args, env, through)) in cases.iter().enumerate() {
        let before = proxy.count();
        let w = worker(&app, args, env).await;
        publish(&app, &format!("env-{n}"), &rx.url("/hook")).await;
        let ok = wait_until(Duration::from_secs(10), || rx.count() == n + 1).await;
        stop(w).await;
        assert!(ok, "case {n} delivered");
        assert_eq!(
            proxy.count() - before,
            *through,
            "case {n}: {args:?} {env:?}"
        );
    }
}

/// The guard judges the target, which the proxy would resolve, and never
/// the proxy: one named `localhost` (a refused address under
/// `--deny-private`) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ssrf_guard_checks_the_target_not_the_proxy() {
    let app = TestApp::new("proxyguard", DelayBackend::Cascade);
    // Loopback addresses are private: only the receiver's is let through.
    let rx = Receiver::start_on("127.0.0.3:0", |_| Reply::status(200)).await;
    let proxy = Proxy::http().await;
    let by_its_name = proxy.url.replace("127.0.0.1", "localhost");
    let args = [
        "--proxy",
        &by_its_name,
        "--deny-private",
        "--allow-cidr",
        "127.0.0.3/32",
    ];
    let w = worker(&app, &args, &[]).await;
    publish(&app, "allowed", &rx.url("/hook")).await;
    // A name the proxy would resolve to a refused address (127.0.0.1/::1).
    let by_name = rx.url("/hook").replace("127.0.0.3", "localhost");
    publish(&app, "by-name", &by_name).await;
    publish(&app, "literal", "http://10.1.2.3:9/hook").await;
    let ok = wait_until(Duration::from_secs(10), || rx.count() == 1).await;
    let dead = app.wait_dead(2).await;
    stop(w).await;
    let errors: Vec<_> = dead.iter().map(|d| d.str(H_LAST_ERROR)).collect();
    assert!(
        ok,
        "the allowed target was delivered through the proxy: {errors:?}"
    );
    assert_eq!(proxy.count(), 1, "only the allowed one reached the proxy");
    for d in &dead {
        assert_eq!(d.str(H_DEAD_REASON).as_deref(), Some("permanent"));
        let error = d.str(H_LAST_ERROR).unwrap_or_default();
        assert!(error.contains("is blocked"), "{error}");
    }
}

/// The TLS tests' CA (made by `tests/broker/ctl certs`), with a client
/// certificate it signed.
fn test_ca() -> PathBuf {
    let dir = PathBuf::from(common::ctl_env(5690, &["certs"], &[]));
    assert!(
        dir.join("client.pem").exists(),
        "no client certificate in {dir:?}"
    );
    dir
}

/// Terminates TLS with the server certificate, requiring a client
/// certificate from the test CA, and forwards to `plain`.
async fn mtls_front(tls: &Path, plain: &str) -> String {
    let (certs, key) = server_cert(tls);
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(tls.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    https_front(config, plain).await
}

fn config_file(app: &TestApp, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", app.prefix));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_with_a_client_certificate_passes_mtls_and_one_without_fails_as_tls() {
    let app = TestApp::new("mtls", DelayBackend::Cascade);
    let tls = test_ca();
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let front = mtls_front(&tls, &rx.base).await;
    let f = |name: &str| tls.join(name).display().to_string();
    // Both routes trust the test CA through ca-roots alone (the system's
    // roots do not hold it); only one has a client certificate.
    let text = format!(
        "[[route]]\nurl-prefix = \"{front}/with/\"\nclient-cert = \"{}\"\nclient-key = \"{}\"\nca-roots = \"{}\"\n\n\
         [[route]]\nurl-prefix = \"{front}/without/\"\nca-roots = \"{}\"\n",
        f("client.pem"),
        f("client.key"),
        f("ca.pem"),
        f("ca.pem"),
    );
    let path = config_file(&app, &text);
    let config = path.display().to_string();
    let args = [
        "--config",
        &config,
        "--max-attempts",
        "2",
        "--schedule",
        "100ms",
    ];
    let w = worker(&app, &args, &[]).await;
    publish(&app, "with", &format!("{front}/with/hook")).await;
    publish(&app, "without", &format!("{front}/without/hook")).await;
    let delivered = wait_until(Duration::from_secs(10), || rx.count() == 1).await;
    let dead = app.wait_dead(1).await;
    stop(w).await;
    let _ = std::fs::remove_file(&path);
    assert!(delivered, "the client certificate was accepted");
    assert_eq!(rx.requests()[0].id(), "with");
    assert_eq!(dead[0].str(H_DEAD_REASON).as_deref(), Some("max-attempts"));
    let error = dead[0].str(H_LAST_ERROR).unwrap_or_default();
    assert!(error.starts_with("TLS failed"), "{error}");
}

#[test]
fn bad_client_certificate_files_are_clear_start_up_errors() {
    let tls = test_ca();
    let f = |name: &str| tls.join(name).display().to_string();
    let cases = [
        (f("missing.pem"), f("client.key"), "cannot read client-cert"),
        (
            f("client.pem"),
            f("server.key"),
            "does not match client-cert",
        ),
        (f("client.key"), f("client.key"), "holds no PEM certificate"),
    ];
    for (n, (cert, key, needle)) in cases.iter().enumerate() {
        let text = format!(
            "[[route]]\nurl-prefix = \"https://pay.example.com/\"\nclient-cert = \"{cert}\"\nclient-key = \"{key}\"\n"
        );
        let path =
            std::env::temp_dir().join(format!("redeliver-mtls-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let config = path.display().to_string();
        for args in [
            vec!["config", "check", &config],
            vec!["--config", &config, "run"],
        ] {
            let o = common::redeliver_command()
                .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f"])
                .args(&args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{args:?} must fail");
            let at_line = format!("{config}:1:");
            assert!(
                err.contains(needle) && err.contains(&at_line),
                "{args:?}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn a_bad_proxy_is_refused_without_echoing_it() {
    for bad in ["htp://user:hunter2@proxy:1", "user:hunter2@proxy:1"] {
        let o = common::redeliver_command()
            .args(["--amqp-url", "amqp://guest:guest@127.0.0.1:1/%2f", "run"])
            .args(["--proxy", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{bad}");
        assert!(err.contains("--proxy"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
