//! OpenTelemetry traces: one span per attempt, a child of the producer's
//! context, exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `..._TRACES_ENDPOINT`) is set.
//!
//! Off, this is a pass-through: an attempt carries the producer's own
//! `traceparent` to the receiver and no span is made, so it costs nothing.
//! On, spans go through a bounded queue (`queue.rs`) to the exporter: a
//! slow or dead collector drops spans, counted, and never holds a delivery.

mod client;
mod queue;

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};
use opentelemetry_sdk::Resource;

use crate::message::trace::TraceContext;

pub use queue::{SPANS_DROPPED, SPANS_EXPORTED};

/// Why tracing could not start (a bad endpoint, say); `run` refuses to
/// start rather than run untraced when traces were asked for.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// The tracer, or nothing. Cheap to clone; pass it where spans are made.
#[derive(Clone, Default)]
pub struct Tracing {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    exporting: tokio::sync::Mutex<Option<queue::Exporting>>,
    /// Spans the queue dropped because it was full (or closed).
    drops: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Tracing(on)"
        } else {
            "Tracing(off)"
        })
    }
}

/// Whether the standard variables ask for trace export: an endpoint is
/// set, and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`.
pub fn wanted() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let is = |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.trim().eq_ignore_ascii_case(v));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

impl Tracing {
    /// Off: no spans, the producer's context passed through.
    pub fn off() -> Tracing {
        Tracing::default()
    }

    /// On when the environment asks for it ([`wanted`]); the exporter
    /// reads the standard `OTEL_EXPORTER_OTLP_*` variables, and the
    /// service is `OTEL_SERVICE_NAME`, else `service`. Needs a Tokio
    /// runtime (the exporter is a task).
    pub fn from_env(service: &str) -> Result<Tracing, TraceError> {
        if !wanted() {
            return Ok(Tracing::off());
        }
        if std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").is_ok_and(|p| p.trim().starts_with("grpc"))
        {
            tracing::warn!("OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported: exporting over OTLP/HTTP (protobuf), usually port 4318");
        }
        let client = client::Client::new().map_err(|e| TraceError::Exporter(e.to_string()))?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client)
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let resource = resource(service);
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        Ok(Tracing::with_exporter(exporter, resource, queue::QUEUE))
    }

    /// With any exporter and queue room (tests use a tiny queue).
    pub fn with_exporter<E>(exporter: E, resource: Resource, room: usize) -> Tracing
    where
        E: opentelemetry_sdk::trace::SpanExporter + 'static,
    {
        let (processor, exporting) = queue::Queue::start(exporter, room);
        let drops = processor.drops.clone();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("redeliver");
        metrics::counter!(SPANS_EXPORTED).increment(0);
        tracing::info!("exporting traces over OTLP");
        Tracing {
            inner: Some(Arc::new(Inner {
                provider,
                tracer,
                exporting: tokio::sync::Mutex::new(Some(exporting)),
                drops,
            })),
        }
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Spans dropped because the queue to the exporter was full.
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.drops.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Exports what is queued (for up to 5 s) and stops the exporter.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.inner else { return };
        if let Some(e) = inner.exporting.lock().await.take() {
            e.stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), e.task).await;
        }
        let _ = inner.provider.shutdown();
    }

    /// Starts a span under `parent` (a remote context) or as a new trace.
    fn start(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: Option<&TraceContext>,
        attributes: Vec<KeyValue>,
    ) -> Option<Span> {
        let inner = self.inner.as_ref()?;
        let cx = parent.and_then(remote).map_or_else(Context::new, |sc| {
            Context::new().with_remote_span_context(sc)
        });
        let span = inner
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&inner.tracer, &cx);
        Some(span)
    }

    /// The span of one HTTP attempt (OpenTelemetry's HTTP client
    /// conventions). Off, its context is the producer's, passed through.
    pub fn attempt(&self, parent: Option<&TraceContext>, a: &AttemptStart<'_>) -> AttemptSpan {
        if !self.is_on() {
            // Nothing is built when off: this runs on every attempt.
            return AttemptSpan {
                context: parent.cloned(),
                span: None,
            };
        }
        let mut attrs = vec![
            KeyValue::new("http.request.method", a.method.to_string()),
            KeyValue::new("server.address", a.host.to_string()),
            KeyValue::new("server.port", i64::from(a.port)),
            KeyValue::new("url.scheme", a.scheme.to_string()),
            KeyValue::new("messaging.message.id", a.id.to_string()),
            KeyValue::new("redeliver.endpoint", format!("{}:{}", a.host, a.port)),
            KeyValue::new("redeliver.attempt", i64::from(a.attempt)),
        ];
        if a.attempt > 1 {
            attrs.push(KeyValue::new(
                "http.request.resend_count",
                i64::from(a.attempt - 1),
            ));
        }
        match self.start(a.method_name(), SpanKind::Client, parent, attrs) {
            Some(span) => AttemptSpan {
                context: context_of(&span, parent),
                span: Some(span),
            },
            None => AttemptSpan {
                context: parent.cloned(),
                span: None,
            },
        }
    }

    /// A producer's span for one notification it publishes, under
    /// `parent` when given. Off: `parent` itself, passed through.
    pub fn publish(&self, parent: Option<&TraceContext>, id: &str, exchange: &str) -> ProducerSpan {
        if !self.is_on() {
            return ProducerSpan {
                context: parent.cloned(),
                span: None,
            };
        }
        let attrs = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", exchange.to_string()),
            KeyValue::new("messaging.message.id", id.to_string()),
        ];
        match self.start("publish", SpanKind::Producer, parent, attrs) {
            Some(span) => ProducerSpan {
                context: context_of(&span, parent),
                span: Some(span),
            },
            None => ProducerSpan {
                context: parent.cloned(),
                span: None,
            },
        }
    }
}

/// What an attempt span is named and labelled with.
pub struct AttemptStart<'a> {
    pub id: &'a str,
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub attempt: u32,
}

impl AttemptStart<'_> {
    /// The conventions name an HTTP client span by its method.
    fn method_name(&self) -> &'static str {
        match self.method {
            "GET" => "GET",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "DELETE" => "DELETE",
            "POST" => "POST",
            _ => "HTTP",
        }
    }
}

/// How an attempt ended, for its span.
pub struct AttemptEnd<'a> {
    pub status: Option<u16>,
    pub error: Option<&'a str>,
    /// `delivered`, `retry` or `dead`.
    pub outcome: &'static str,
    pub delay: Option<Duration>,
    pub dead_reason: Option<&'static str>,
}

/// One attempt's span (none when tracing is off) and the context its
/// request carries.
pub struct AttemptSpan {
    span: Option<Span>,
    context: Option<TraceContext>,
}

impl AttemptSpan {
    /// The `traceparent` (and `tracestate`) the HTTP request carries.
    pub fn context(&self) -> Option<&TraceContext> {
        self.context.as_ref()
    }

    pub fn end(self, e: &AttemptEnd<'_>) {
        let Some(mut span) = self.span else { return };
        if let Some(s) = e.status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        span.set_attribute(KeyValue::new("redeliver.outcome", e.outcome));
        if let Some(d) = e.delay {
            span.set_attribute(KeyValue::new("redeliver.delay_ms", d.as_millis() as i64));
        }
        if let Some(r) = e.dead_reason {
            span.set_attribute(KeyValue::new("redeliver.dead_reason", r));
        }
        let failed = e.outcome != "delivered";
        if failed {
            let kind = match (e.status, e.error) {
                (Some(s), _) => s.to_string(),
                (None, Some(_)) => "error".to_string(),
                (None, None) => "_OTHER".to_string(),
            };
            span.set_attribute(KeyValue::new("error.type", kind));
            let what = e
                .error
                .map_or_else(|| e.outcome.to_string(), str::to_string);
            span.set_status(Status::Error {
                description: Cow::Owned(what),
            });
        }
        span.end();
    }
}

/// A producer's span; ended (as confirmed or not) when dropped.
pub struct ProducerSpan {
    span: Option<Span>,
    context: Option<TraceContext>,
}

impl ProducerSpan {
    /// The context the message's headers carry.
    pub fn context(&self) -> Option<&TraceContext> {
        self.context.as_ref()
    }

    /// The broker confirmed the message.
    pub fn confirmed(mut self) {
        if let Some(mut s) = self.span.take() {
            s.set_status(Status::Ok);
            s.end();
        }
    }
}

impl Drop for ProducerSpan {
    fn drop(&mut self) {
        if let Some(mut s) = self.span.take() {
            s.set_status(Status::error("not confirmed by the broker"));
            s.end();
        }
    }
}

/// The resource: `OTEL_SERVICE_NAME` (and `OTEL_RESOURCE_ATTRIBUTES`)
/// when set, else `service`.
fn resource(service: &str) -> Resource {
    let b = Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.trim().is_empty());
    if named {
        b.build()
    } else {
        b.with_service_name(service.to_string()).build()
    }
}

/// A W3C context as OpenTelemetry's remote parent.
fn remote(t: &TraceContext) -> Option<SpanContext> {
    let flags = if t.sampled() {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let state = t
        .tracestate()
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        TraceId::from_hex(t.trace_id()).ok()?,
        SpanId::from_hex(t.span_id()).ok()?,
        flags,
        true,
        state,
    ))
}

/// The context a span hands on: its ids, with the parent's `tracestate`.
fn context_of(span: &Span, parent: Option<&TraceContext>) -> Option<TraceContext> {
    let sc = span.span_context();
    if !sc.is_valid() {
        return parent.cloned();
    }
    let state = sc.trace_state().header();
    let state = (!state.is_empty()).then_some(state);
    TraceContext::from_parts(
        &format!("{:032x}", sc.trace_id()),
        &format!("{:016x}", sc.span_id()),
        sc.is_sampled(),
        state.as_deref(),
    )
}

#[cfg(test)]
mod tests;
