use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::*;

/// An exporter that records what it got, and can hang like a collector
/// that accepts the connection and never answers.
#[derive(Debug, Clone, Default)]
struct Sink {
    got: Arc<std::sync::Mutex<Vec<SpanData>>>,
    calls: Arc<AtomicUsize>,
    hang: bool,
}

impl SpanExporter for Sink {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang {
            std::future::pending::<()>().await;
        }
        self.got.lock().unwrap().extend(batch);
        Ok(())
    }
}

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn start(attempt: u32) -> AttemptStart<'static> {
    AttemptStart {
        id: "n-1",
        method: "POST",
        scheme: "https",
        host: "shop.example",
        port: 443,
        attempt,
    }
}

fn delivered() -> AttemptEnd<'static> {
    AttemptEnd {
        status: Some(200),
        error: None,
        outcome: "delivered",
        delay: None,
        dead_reason: None,
    }
}

#[test]
fn off_passes_the_parent_through_and_makes_no_span() {
    let parent = TraceContext::parse(PARENT, Some("k=v"));
    let t = Tracing::off();
    let span = t.attempt(parent.as_ref(), &start(1));
    assert_eq!(span.context(), parent.as_ref());
    span.end(&delivered());
    assert_eq!(t.publish(None, "n-1", "x").context(), None);
}

#[tokio::test]
async fn an_attempt_is_a_child_of_its_parent_and_its_request_names_it() {
    let sink = Sink::default();
    let t = Tracing::with_exporter(sink.clone(), Resource::builder_empty().build(), 16);
    let parent = TraceContext::parse(PARENT, Some("k=v")).expect("valid");
    let span = t.attempt(Some(&parent), &start(2));
    let cx = span.context().cloned().expect("a context");
    assert_eq!(cx.trace_id(), parent.trace_id());
    assert_ne!(cx.span_id(), parent.span_id());
    assert_eq!(cx.tracestate(), Some("k=v"));
    span.end(&delivered());
    t.shutdown().await;
    let got = sink.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(format!("{:016x}", got[0].parent_span_id), parent.span_id());
    assert_eq!(
        format!("{:016x}", got[0].span_context.span_id()),
        cx.span_id()
    );
    assert_eq!(got[0].name, "POST");
}

/// A collector that never answers: the exporter holds one batch, the
/// queue fills, and the rest are dropped and counted; ending a span never
/// waits.
///
/// The test waits for the first batch to go out (however long a loaded
/// machine takes), then ends 1,999 spans against the hung exporter. A span
/// end that waited on the exporter would never return, so the bound is a
/// generous timeout, not a speed target.
#[tokio::test]
async fn a_hung_collector_drops_and_counts_and_never_blocks() {
    let sink = Sink {
        hang: true,
        ..Sink::default()
    };
    let t = Tracing::with_exporter(sink.clone(), Resource::builder_empty().build(), 4);
    t.attempt(None, &start(1)).end(&delivered());
    let first_out = async {
        while sink.calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let waited = tokio::time::timeout(Duration::from_secs(30), first_out).await;
    assert!(waited.is_ok(), "the first batch never went out");
    let rest = async {
        for i in 1..2_000 {
            t.attempt(None, &start(i + 1)).end(&delivered());
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(30), rest).await;
    assert!(ended.is_ok(), "ending spans waited on a hung exporter");
    assert!(t.dropped() >= 1_990, "dropped {}", t.dropped());
    assert_eq!(sink.calls.load(Ordering::SeqCst), 1);
}
