//! OpenTelemetry traces from the outside: `redeliver publish` and
//! `redeliver run` export over OTLP/HTTP (the standard environment
//! variables) to a test collector that decodes with `opentelemetry-proto`;
//! a real receiver records each request's `traceparent`.

#[macro_use]
mod common;

use std::time::Duration;

use common::app::TestApp;
use common::harness::wait_until;
use common::metrics::{free_port, wait_metric};
use common::otlp::{Collector, Got};
use common::process::Proc;
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::delay::DelayBackend;

/// The caller's context, from the W3C specification's example.
const UPSTREAM_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const UPSTREAM_SPAN: &str = "b7ad6b7169203331";

fn upstream() -> String {
    format!("00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01")
}

/// (trace id, span id) of a `traceparent`.
fn ids(tp: &str) -> (String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    (p[1].to_string(), p[2].to_string())
}

/// `redeliver publish --file` of `lines`, with `env` and `args`.
fn publish(app: &TestApp, lines: &[serde_json::Value], env: &[(&str, &str)], args: &[&str]) {
    let dir = std::env::temp_dir().join(format!("{}-{}.jsonl", app.name("n"), free_port()));
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&dir, text.join("\n")).expect("write");
    let mut cmd = app.command();
    cmd.arg("publish").arg("--file").arg(&dir).args(args);
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("publish");
    let _ = std::fs::remove_file(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Spans of the upstream trace, once `n` have arrived (10 s at most).
async fn trace_spans(c: &Collector, n: usize) -> Vec<Got> {
    let of_trace = || {
        c.spans()
            .into_iter()
            .filter(|s| s.trace_id() == UPSTREAM_TRACE)
            .collect::<Vec<_>>()
    };
    wait_until(Duration::from_secs(10), || of_trace().len() >= n).await;
    of_trace()
}

/// A notification failing twice, then delivered: the producer's span is
/// a child of the caller's context, and the three attempt spans are its
/// children, in one trace; each request's `traceparent` names its own
/// attempt's span; the spans carry the HTTP client conventions' names.
async fn three_attempts_are_one_trace(backend: DelayBackend) {
    let app = TestApp::new("trace", backend);
    let collector = Collector::start().await;
    let rx = Receiver::start(|r: &Recorded| match r.nth <= 2 {
        true => Reply::status(500),
        false => Reply::status(200),
    })
    .await;
    let otlp = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())];
    let mut cmd = app.command();
    cmd.arg("run")
        .envs(otlp)
        .env("OTEL_SERVICE_NAME", "worker-under-test");
    let _w = Proc::spawn(cmd);
    let n = serde_json::json!({"url": rx.url("/hook"), "id": "tr-1", "schedule": ["1s", "1s"]});
    publish(&app, &[n], &otlp, &["--traceparent", &upstream()]);
    let done = wait_until(Duration::from_secs(30), || {
        rx.requests().iter().any(|r| r.reply == 200)
    })
    .await;
    assert!(done, "{} requests", rx.count());
    let spans = trace_spans(&collector, 4).await;
    let producer: Vec<&Got> = spans.iter().filter(|s| s.span.name == "publish").collect();
    assert_eq!(producer.len(), 1, "{spans:#?}");
    let p = producer[0];
    assert_eq!(
        p.parent_id(),
        UPSTREAM_SPAN,
        "the caller's context is the parent"
    );
    assert_eq!(p.span.kind, 4, "PRODUCER");
    assert_eq!(p.service, "redeliver-publish");
    let mut attempts: Vec<&Got> = spans.iter().filter(|s| s.span.name == "POST").collect();
    attempts.sort_by_key(|s| s.attr("redeliver.attempt"));
    assert_eq!(attempts.len(), 3, "{spans:#?}");
    let requests = rx.requests();
    assert_eq!(requests.len(), 3);
    for (i, (a, r)) in attempts.iter().zip(&requests).enumerate() {
        check_attempt(a, r, i as u32 + 1, &p.span_id(), rx.url("/"));
    }
}

/// One attempt span against its request (`nth` is the attempt number).
fn check_attempt(a: &Got, r: &Recorded, nth: u32, producer: &str, base: String) {
    assert_eq!(
        a.parent_id(),
        producer,
        "attempt {nth}: a child of the producer's span"
    );
    assert_eq!(a.service, "worker-under-test", "OTEL_SERVICE_NAME");
    assert_eq!(a.span.kind, 3, "CLIENT");
    let tp = r
        .header("traceparent")
        .expect("the request carries traceparent");
    assert_eq!(
        ids(&tp),
        (UPSTREAM_TRACE.to_string(), a.span_id()),
        "attempt {nth}"
    );
    assert_eq!(r.header("redeliver-attempt"), Some(nth.to_string()));
    let port = base
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap_or("")
        .to_string();
    let want = [
        ("http.request.method", "POST".to_string()),
        ("server.address", "127.0.0.1".to_string()),
        ("server.port", port),
        ("url.scheme", "http".to_string()),
        ("messaging.message.id", "tr-1".to_string()),
        ("redeliver.attempt", nth.to_string()),
    ];
    for (k, v) in want {
        assert_eq!(a.attr(k), Some(v), "attempt {nth}: {k}");
    }
    let (status, outcome) = if nth < 3 {
        ("500", "retry")
    } else {
        ("200", "delivered")
    };
    assert_eq!(a.attr("http.response.status_code").as_deref(), Some(status));
    assert_eq!(a.attr("redeliver.outcome").as_deref(), Some(outcome));
    let code = a.span.status.as_ref().map_or(0, |s| s.code);
    if nth < 3 {
        assert_eq!(a.attr("redeliver.delay_ms").as_deref(), Some("1000"));
        assert_eq!(a.attr("error.type").as_deref(), Some("500"));
        assert_eq!(code, 2, "ERROR");
    } else {
        assert_eq!(a.attr("redeliver.delay_ms"), None);
        assert_eq!(a.attr("error.type"), None);
        assert_ne!(code, 2);
    }
    if nth > 1 {
        assert_eq!(
            a.attr("http.request.resend_count"),
            Some((nth - 1).to_string())
        );
    }
}

/// The collector is down: every notification is still delivered, each
/// request still carries a context of the caller's trace, the spans that
/// could not be exported are counted, and the dead letter keeps the
/// caller's context in its headers.
async fn a_dead_collector_costs_no_delivery(backend: DelayBackend) {
    let app = TestApp::new("trace-dead", backend);
    let rx = Receiver::start(|r: &Recorded| match r.path.starts_with("/gone") {
        true => Reply::status(410),
        false => Reply::status(200),
    })
    .await;
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let admin = free_port();
    let mut cmd = app.command();
    cmd.arg("run")
        .arg("--admin-addr")
        .arg(format!("127.0.0.1:{admin}"));
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &nowhere);
    let w = Proc::spawn(cmd);
    let mut lines = rx.notifications("d", 20);
    lines.push(serde_json::json!({"url": rx.url("/gone"), "id": "d-gone"}));
    publish(&app, &lines, &[], &["--traceparent", &upstream()]);
    let ok = wait_until(Duration::from_secs(30), || rx.count() >= 21).await;
    assert!(ok, "{} of 21 requests", rx.count());
    let dropped = wait_metric(
        admin,
        "redeliver_trace_spans_dropped_total",
        &["reason=\"export-failed\""],
        Duration::from_secs(15),
        |v| v >= 21.0,
    )
    .await;
    drop(w);
    assert!(dropped.is_some_and(|v| v >= 21.0), "dropped {dropped:?}");
    for r in rx.requests() {
        let tp = r.header("traceparent").expect("traceparent");
        let (trace, span) = ids(&tp);
        assert_eq!(trace, UPSTREAM_TRACE);
        assert_ne!(span, UPSTREAM_SPAN, "the worker's own attempt span");
    }
    let dead = app.wait_dead(1).await;
    let kept = redeliver::message::trace::TraceContext::from_headers(Some(&dead[0].headers));
    assert_eq!(kept.map(|t| t.traceparent().to_string()), Some(upstream()));
}

/// Tracing off (no exporter): the caller's context reaches the receiver
/// unchanged, and the worker says nothing about traces.
async fn off_passes_the_context_through(backend: DelayBackend) {
    let app = TestApp::new("trace-off", backend);
    let rx = Receiver::start(|_: &Recorded| Reply::status(200)).await;
    let mut cmd = app.command();
    cmd.arg("run");
    let w = Proc::spawn(cmd);
    let state = ["--tracestate", "congo=t61rcWkgMzE"];
    publish(
        &app,
        &rx.notifications("o", 3),
        &[],
        &[&["--traceparent", &upstream()][..], &state[..]].concat(),
    );
    assert!(wait_until(Duration::from_secs(20), || rx.count() >= 3).await);
    for r in rx.requests() {
        assert_eq!(r.header("traceparent"), Some(upstream()));
        assert_eq!(r.header("tracestate").as_deref(), Some("congo=t61rcWkgMzE"));
    }
    assert_eq!(w.stderr_count("OTLP"), 0);
}

both_backends!(
    three_attempts_are_one_trace,
    a_dead_collector_costs_no_delivery,
    off_passes_the_context_through
);
