//! `redeliver publish`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::{confirm_timeout, duration};

#[derive(Debug, Args, Clone)]
pub struct PublishArgs {
    /// Target URL (http or https).
    #[arg(
        long,
        env = "REDELIVER_PUBLISH_URL",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub url: Option<String>,
    /// JSON request body.
    #[arg(long, env = "REDELIVER_PUBLISH_BODY", conflicts_with_all = ["body_file", "file"])]
    pub body: Option<String>,
    /// Read the JSON request body from a file.
    #[arg(long, env = "REDELIVER_PUBLISH_BODY_FILE", conflicts_with = "file")]
    pub body_file: Option<PathBuf>,
    /// Notification id (default: a new UUID). Receivers deduplicate on it.
    #[arg(long, env = "REDELIVER_PUBLISH_ID", conflicts_with = "file")]
    pub id: Option<String>,
    /// Extra request header, `Name: value`; repeatable.
    #[arg(
        long = "header",
        value_name = "K:V",
        env = "REDELIVER_PUBLISH_HEADERS",
        value_delimiter = '\n',
        conflicts_with = "file"
    )]
    pub headers: Vec<String>,
    /// HTTP method (default POST).
    #[arg(long, env = "REDELIVER_PUBLISH_METHOD", conflicts_with = "file")]
    pub method: Option<String>,
    /// Per-notification max attempts.
    #[arg(long, env = "REDELIVER_PUBLISH_MAX_ATTEMPTS", conflicts_with = "file")]
    pub max_attempts: Option<u64>,
    /// Per-notification schedule, e.g. 1s,5s,30s.
    #[arg(long, env = "REDELIVER_PUBLISH_SCHEDULE", conflicts_with = "file")]
    pub schedule: Option<String>,
    /// Per-notification expected response body.
    #[arg(long, env = "REDELIVER_PUBLISH_SUCCESS_BODY", conflicts_with = "file")]
    pub success_body: Option<String>,
    /// Per-notification max age (e.g. 72h): retried or deferred no longer
    /// than this, then dead-lettered as `expired`.
    #[arg(long, env = "REDELIVER_PUBLISH_MAX_AGE", conflicts_with = "file", value_parser = duration)]
    pub max_age: Option<Duration>,
    /// Delay the first delivery (sent through the retry exchange).
    #[arg(long, env = "REDELIVER_PUBLISH_DELAY", value_parser = duration)]
    pub delay: Option<Duration>,
    /// JSON lines, one notification object per line; `-` reads stdin.
    #[arg(long, env = "REDELIVER_PUBLISH_FILE")]
    pub file: Option<PathBuf>,
    /// How long to wait for the broker to confirm (or to answer a declare)
    /// before giving up that connection and publishing the unconfirmed rest
    /// again through the next node of the URL list, with the same ids. A
    /// partitioned node can accept a connection and never confirm. It goes
    /// on for up to 2 minutes without progress while nodes answer but do not confirm (a cut
    /// node is noticed only after up to 75 s), and gives up after 6 tries
    /// when no node accepts a connection.
    #[arg(long, env = "REDELIVER_CONFIRM_TIMEOUT", default_value = "10s", value_parser = confirm_timeout)]
    pub confirm_timeout: Duration,
    /// Largest notification accepted.
    #[arg(long, env = "REDELIVER_MAX_MESSAGE_BYTES", default_value_t = crate::message::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// W3C trace context to continue (`00-<trace id>-<span id>-<flags>`):
    /// every notification carries it in its AMQP headers, and each
    /// delivery attempt becomes a span of that trace. With an OTLP
    /// exporter set (`OTEL_EXPORTER_OTLP_ENDPOINT`), a `publish` span is
    /// made under it for each notification. `TRACEPARENT` is the
    /// OpenTelemetry convention for passing it to a command.
    #[arg(long, env = "TRACEPARENT", value_parser = traceparent)]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with --traceparent (ignored without
    /// one, as W3C says).
    #[arg(long, env = "TRACESTATE")]
    pub tracestate: Option<String>,
}

fn traceparent(s: &str) -> Result<String, String> {
    crate::message::trace::TraceContext::parse(s, None)
        .map(|t| t.traceparent().to_string())
        .ok_or_else(|| {
            "not a W3C traceparent: expected 00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>, ids not all zero".to_string()
        })
}
