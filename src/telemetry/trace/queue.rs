//! The span queue between the delivery path and the OTLP exporter.
//!
//! Why not the SDK's `BatchSpanProcessor`: it drops spans when its queue
//! is full and only logs how many, at shutdown. An operator needs that
//! count while it happens, so this processor counts every span it drops,
//! on `/metrics`, by reason. Ending a span is one `try_send`: the delivery
//! path never waits for the exporter, however slow or dead the collector.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Spans dropped, by `reason`: `queue-full` (the exporter is behind),
/// `export-failed` (the collector refused, timed out or is down),
/// `shutdown` (ended after the exporter stopped).
pub const SPANS_DROPPED: &str = "redeliver_trace_spans_dropped_total";
/// Spans the collector accepted.
pub const SPANS_EXPORTED: &str = "redeliver_trace_spans_exported_total";

/// Queue room, batch size and the longest a span waits for a batch: the
/// OpenTelemetry defaults (`OTEL_BSP_*`), but a 1 s schedule instead of
/// 5 s so a trace shows up while an operator is still looking.
pub(super) const QUEUE: usize = 2048;
const BATCH: usize = 512;
const SCHEDULE: Duration = Duration::from_secs(1);

/// The processor the tracer provider calls; the exporter runs in a task.
#[derive(Debug)]
pub(super) struct Queue {
    tx: mpsc::Sender<SpanData>,
    /// Set once the first drop was logged: the counter tells the rest.
    warned: AtomicBool,
    /// Dropped here (the queue full or closed), for shutdown's summary.
    pub drops: Arc<AtomicU64>,
}

/// The exporter task and what stops it.
pub(super) struct Exporting {
    pub stop: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Queue {
    /// Starts the exporter task (on the current Tokio runtime).
    pub fn start<E: SpanExporter + 'static>(exporter: E, room: usize) -> (Queue, Exporting) {
        let (tx, rx) = mpsc::channel(room);
        let stop = CancellationToken::new();
        let task = tokio::spawn(export_loop(exporter, rx, stop.clone()));
        let (warned, drops) = (AtomicBool::new(false), Arc::default());
        (Queue { tx, warned, drops }, Exporting { stop, task })
    }

    fn dropped(&self, reason: &'static str) {
        metrics::counter!(SPANS_DROPPED, "reason" => reason).increment(1);
        self.drops.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reason,
                "trace spans dropped (the OTLP exporter is behind or stopped); redeliver_trace_spans_dropped_total counts them"
            );
        }
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        match self.tx.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped("queue-full"),
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped("shutdown"),
        }
    }

    /// Flushing happens in the task, on its schedule and at shutdown.
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The task is stopped by [`super::Tracing::shutdown`], which can wait
    /// for it; this is called from synchronous code that cannot.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends a batch when it is full or [`SCHEDULE`] after its first span,
/// and what is left when stopped.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut failing = false;
    loop {
        let first = tokio::select! {
            s = rx.recv() => s,
            _ = stop.cancelled() => None,
        };
        let Some(first) = first else { break };
        batch.push(first);
        let due = tokio::time::sleep(SCHEDULE);
        tokio::pin!(due);
        while batch.len() < BATCH {
            tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => batch.push(s),
                    None => break,
                },
                _ = &mut due => break,
                _ = stop.cancelled() => break,
            }
        }
        export(&exporter, &mut batch, &mut failing).await;
    }
    rx.close();
    while let Ok(s) = rx.try_recv() {
        batch.push(s);
        if batch.len() == BATCH {
            export(&exporter, &mut batch, &mut failing).await;
        }
    }
    export(&exporter, &mut batch, &mut failing).await;
}

/// Exports a batch; a failure drops it, counted. The first failure after
/// a success is logged as a warning, the recovery as info: a collector
/// that is down costs two lines, not one a second.
async fn export<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>, failing: &mut bool) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    match exporter.export(std::mem::take(batch)).await {
        Ok(()) => {
            metrics::counter!(SPANS_EXPORTED).increment(n);
            if std::mem::take(failing) {
                tracing::info!("trace export works again");
            }
        }
        Err(e) => {
            metrics::counter!(SPANS_DROPPED, "reason" => "export-failed").increment(n);
            if !std::mem::replace(failing, true) {
                tracing::warn!(error = %e, spans = n, "trace export failed; spans are dropped (counted in redeliver_trace_spans_dropped_total) until the collector answers");
            }
        }
    }
}
