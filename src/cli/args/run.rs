//! `redeliver run`: the worker's flags, its per-endpoint isolation and its
//! retry policy.

use std::time::Duration;

use clap::Args;

use super::parse::{confirm_timeout, duration, duration_or_off, on_off, OrOff};
use crate::policy::Jitter;

#[derive(Debug, Args, Clone)]
#[command(
    after_help = "Traces: with OTEL_EXPORTER_OTLP_ENDPOINT set (e.g. http://collector:4318), each \
attempt is an OpenTelemetry span, a child of the notification's traceparent, exported over \
OTLP/HTTP; OTEL_SERVICE_NAME names the service [default: redeliver]. Metrics and health: \
--admin-addr. Alert rules and a Grafana dashboard: monitoring/ (docs/operations.md)."
)]
pub struct RunArgs {
    /// Most HTTP attempts in flight in this process.
    #[arg(long, env = "REDELIVER_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// AMQP prefetch: the most unacked deliveries this process holds. Beyond
    /// --concurrency it is room for deliveries waiting for a retry's confirm
    /// or held by --retry-settle; memory grows with it times the message
    /// size. [default: concurrency + max(1024, 4 × concurrency)]
    #[arg(long, env = "REDELIVER_PREFETCH", value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: Option<u16>,
    /// Lanes of the work queue (1 to 64): quorum queues <prefix>.work.0 ...,
    /// each notification in the lane of its endpoint's hash, each consumed
    /// on its own channel, so a slow or failing endpoint holds up only the
    /// endpoints that share its lane. Give every worker of a prefix the same
    /// value; a change drains the old lanes into the new (docs/lanes.md).
    #[arg(long, env = "REDELIVER_LANES", default_value_t = crate::config::DEFAULT_LANES, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub lanes: u16,
    /// With --delay-backend cascade: the most short delays (≤ 1 s) this
    /// worker holds at once, each in memory until due; it releases up to
    /// about this many per second. More wait in the hold queue, later.
    #[arg(long, env = "REDELIVER_HOLD_PREFETCH", default_value_t = crate::config::DEFAULT_HOLD_PREFETCH, value_parser = clap::value_parser!(u16).range(1..))]
    pub hold_prefetch: u16,
    /// Timeout of one HTTP attempt.
    #[arg(long, env = "REDELIVER_TIMEOUT", default_value = "15s", value_parser = duration)]
    pub timeout: Duration,
    /// A 2xx counts as success only if the trimmed response body equals this.
    #[arg(long, env = "REDELIVER_SUCCESS_BODY")]
    pub success_body: Option<String>,
    /// HTTP statuses that dead-letter at once, without retrying.
    #[arg(
        long,
        env = "REDELIVER_PERMANENT_STATUS",
        value_delimiter = ',',
        default_value = "410"
    )]
    pub permanent_status: Vec<u16>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Messages larger than this are dead-lettered as invalid.
    #[arg(long, env = "REDELIVER_MAX_MESSAGE_BYTES", default_value_t = crate::message::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Also refuse private addresses (RFC 1918, loopback, CGNAT, unique local).
    /// Link-local and cloud-metadata addresses are always refused.
    #[arg(long, env = "REDELIVER_DENY_PRIVATE")]
    pub deny_private: bool,
    /// Networks to allow even when refused above, e.g. 10.20.0.0/16.
    #[arg(long, env = "REDELIVER_ALLOW_CIDR", value_delimiter = ',')]
    pub allow_cidr: Vec<ipnet::IpNet>,
    /// Deliver through this proxy: http://host:port (CONNECT for https
    /// receivers), socks5://host:port or socks5h:// (the proxy resolves
    /// names); user:password@ is allowed and never printed. `env` uses the
    /// standard HTTP_PROXY / HTTPS_PROXY / ALL_PROXY / NO_PROXY variables,
    /// which are ignored otherwise. The SSRF guard still checks each
    /// receiver, never the proxy.
    #[arg(
        long,
        env = "REDELIVER_PROXY",
        hide_env_values = true,
        value_name = "URL|env"
    )]
    // Parsed in `run`, not by clap, whose error would repeat the value
    // (and a password in it).
    pub proxy: Option<String>,
    /// Hosts that bypass --proxy URL, in NO_PROXY syntax
    /// (e.g. "localhost,.internal,10.0.0.0/8").
    #[arg(
        long,
        env = "REDELIVER_NO_PROXY",
        value_name = "HOSTS",
        requires = "proxy"
    )]
    pub no_proxy: Option<String>,
    /// How long to wait for the broker to confirm a retry or dead-letter.
    #[arg(long, env = "REDELIVER_CONFIRM_TIMEOUT", default_value = "30s", value_parser = confirm_timeout)]
    pub confirm_timeout: Duration,
    /// Keep a retried original unacked this long after its delayed copy was
    /// confirmed. The upstream delayed-message plugin confirms before its
    /// disk write (a broker kill -9 loses copies confirmed up to 2 s
    /// earlier); until the ack, the broker would redeliver the original
    /// instead. 0s turns it off. [default: 3s with --delay-backend plugin;
    /// 0s with cascade, which confirms only what is on disk]
    #[arg(long, env = "REDELIVER_RETRY_SETTLE", value_parser = duration)]
    pub retry_settle: Option<Duration>,
    /// Send a tiny probe through the delay backend this often, on the path
    /// a retry takes, and report the backend stalled (log, metrics, status,
    /// /readyz) when one is not back within its delay (~1 s) plus
    /// --delay-probe-grace: a wedged plugin holds every retry silently.
    /// 0s turns probes (and failover) off.
    #[arg(long, env = "REDELIVER_DELAY_PROBE_EVERY", default_value = "5s", value_parser = duration)]
    pub delay_probe_every: Duration,
    /// How late past its delay a probe may come back before the backend
    /// counts as stalled.
    #[arg(long, env = "REDELIVER_DELAY_PROBE_GRACE", default_value = "10s", value_parser = duration)]
    pub delay_probe_grace: Duration,
    /// With --delay-backend plugin: where new retries and deferrals go
    /// while the plugin is stalled. `cascade` declares the cascade's queues
    /// when first needed and goes back to the plugin once its probes
    /// return; copies already in the plugin wait for the broker's repair.
    #[arg(long, env = "REDELIVER_DELAY_FAILOVER", value_enum, default_value_t = crate::config::DelayFailover::Cascade)]
    pub delay_failover: crate::config::DelayFailover,
    /// Serve /metrics (Prometheus), /healthz and /readyz here, e.g.
    /// 127.0.0.1:9464 (port 0 picks one and logs it). Off by default.
    #[arg(long, env = "REDELIVER_ADMIN_ADDR", value_name = "ADDR")]
    pub admin_addr: Option<String>,
    /// Sign every request (Standard Webhooks `webhook-signature`) with this
    /// `whsec_...` secret. Repeat (or comma-separate) to rotate keys: each
    /// secret adds a signature. `whsec_...@2026-12-01T00:00:00Z` stops
    /// signing with it at that time (UTC), without a restart: the old
    /// secret's grace period in a rotation. Never printed.
    #[arg(
        long,
        env = "REDELIVER_SIGNING_SECRET",
        hide_env_values = true,
        value_delimiter = ',',
        value_name = "SECRET"
    )]
    pub signing_secret: Vec<String>,
    /// On SIGTERM/SIGINT, how long in-flight deliveries may take to finish.
    #[arg(long, env = "REDELIVER_SHUTDOWN_GRACE", default_value = "30s", value_parser = duration)]
    pub shutdown_grace: Duration,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
    #[command(flatten)]
    pub events: Box<EventArgs>,
    #[command(flatten)]
    pub history: Box<super::HistoryArgs>,
}

/// Operational events (docs/operations.md, "Operational events"). Every
/// event goes to the topic exchange <prefix>.events, routed by its type;
/// bind a queue to it to consume them.
#[derive(Debug, Args, Clone)]
pub struct EventArgs {
    /// Also deliver every event as a notification to this URL, signed,
    /// retried and dead-lettered like any other (events about its own
    /// deliveries are never made). Give every worker of a prefix the same.
    #[arg(long, env = "REDELIVER_EVENTS_URL", value_name = "URL", value_parser = super::parse::http_url)]
    pub events_url: Option<url::Url>,
    /// Which event types go to --events-url: names or families, e.g.
    /// notification.exhausted,endpoint.* [default: all]
    #[arg(long, env = "REDELIVER_EVENTS_TYPES", value_delimiter = ',', value_name = "TYPES", value_parser = crate::config::parse_type_pattern, requires = "events_url")]
    pub events_types: Vec<String>,
    /// Send notification.failing after this many failed attempts of one
    /// notification (and notification.recovered on a success after it).
    /// 0: never.
    #[arg(long, env = "REDELIVER_FAILING_AFTER", default_value_t = crate::config::DEFAULT_FAILING_AFTER)]
    pub failing_after: u32,
}

/// Per-endpoint isolation (an endpoint is a URL's scheme, host and port;
/// a [[route]] can set its own concurrency, rate, breaker-failures and
/// max-age). Waiting for an endpoint costs no attempt.
#[derive(Debug, Args, Clone)]
pub struct EndpointArgs {
    /// A hard ceiling on HTTP attempts in flight to one endpoint. Below
    /// it each endpoint earns an adaptive limit from its own latency,
    /// timeouts and overload answers: a healthy one alone reaches all of
    /// --concurrency, a hanging one falls to a few slots. [default: --concurrency]
    #[arg(long, env = "REDELIVER_ENDPOINT_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..))]
    pub endpoint_concurrency: Option<u16>,
    /// Per-endpoint isolation: `on` gives each endpoint an adaptive limit,
    /// max-min fair shares of the slots while several have work, and a circuit
    /// breaker. `off` lets every delivery go at once, whatever its
    /// endpoint does (only --endpoint-concurrency, rates and Retry-After
    /// pauses remain): for one trusted receiver, or to compare.
    #[arg(long, env = "REDELIVER_ISOLATION", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub isolation: bool,
    /// Most attempts per interval to one endpoint, spaced evenly, e.g. 50/s
    /// or 600/min. [default: no limit]
    #[arg(long, env = "REDELIVER_ENDPOINT_RATE", value_name = "RATE")]
    pub endpoint_rate: Option<crate::policy::Rate>,
    /// Consecutive failures that open an endpoint's circuit breaker; it
    /// also opens when 70% of 20 or more attempts in 30 s failed. A failure
    /// means down or overloaded: no answer (connect, TLS, timeout) or a
    /// 502/503/504. A quick 500 or 404 is the notification's outcome, not
    /// the endpoint's, and never opens it. 0 turns the breaker off.
    #[arg(long, env = "REDELIVER_BREAKER_FAILURES", default_value_t = 10)]
    pub breaker_failures: u32,
    /// How long an open breaker first stays open (no attempts; deliveries
    /// are deferred to when one probe is let through). Doubles after each
    /// failed probe, up to --breaker-max-open.
    #[arg(long, env = "REDELIVER_BREAKER_OPEN", default_value = "5s", value_parser = duration)]
    pub breaker_open: Duration,
    /// The longest an open breaker stays open; also caps how long a 429's
    /// Retry-After pauses an endpoint.
    #[arg(long, env = "REDELIVER_BREAKER_MAX_OPEN", default_value = "5m", value_parser = duration)]
    pub breaker_max_open: Duration,
    /// Once an endpoint's breaker has been open this long, every worker
    /// parks its notifications (as for `endpoint pause`, for at most 10
    /// minutes) instead of deferring them through the delay backend; each
    /// worker's breaker still lets new deliveries through as probes, and
    /// the first probe that succeeds releases the backlog at once. `off`
    /// (the default for now; 1m is the suggested value): an open breaker
    /// always defers.
    #[arg(long, env = "REDELIVER_BREAKER_PARK_AFTER", default_value = "off", value_parser = duration_or_off, value_name = "DURATION|off")]
    pub breaker_park_after: OrOff,
    /// Endpoints whose state a worker keeps; the least recently used are
    /// forgotten beyond it.
    #[arg(long, env = "REDELIVER_MAX_ENDPOINTS", default_value_t = crate::config::DEFAULT_MAX_ENDPOINTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_endpoints: usize,
    /// Deliveries that may wait for a busy endpoint without a slot; they
    /// count against the prefetch. Beyond it they are deferred. 0: never park.
    #[arg(long, env = "REDELIVER_MAX_PARKED", default_value_t = crate::config::DEFAULT_MAX_PARKED)]
    pub max_parked: usize,
    /// Deliveries deferred for a short wait (a Retry-After or an open
    /// breaker of at most 5 s, a busy endpoint's turn) that wait in the
    /// worker, unacked, instead of a round trip through the delay backend;
    /// at most 10 s each and 64 MiB of bodies in all. A killed worker's
    /// return to the queue. 0: always through the delay backend.
    #[arg(long, env = "REDELIVER_MAX_WAITING", default_value_t = crate::config::DEFAULT_MAX_WAITING)]
    pub max_waiting: usize,
    /// How long a notification may keep being retried or deferred, from its
    /// first attempt (or first deferral); then it is dead-lettered as
    /// `expired`. A notification's own `max_age` and a route's win. 0s: no limit.
    #[arg(long, env = "REDELIVER_MAX_AGE", default_value = "3d", value_parser = duration)]
    pub max_age: Duration,
    /// Disable an endpoint (its notifications are then dead-lettered as
    /// `endpoint-disabled`) once it has had no successful attempt for this
    /// long and at least 10 failed ones in that span; a quiet endpoint is
    /// never disabled. Shared by every worker of the prefix, and recorded
    /// once. `off` never disables by itself.
    #[arg(long, env = "REDELIVER_DISABLE_AFTER", default_value = "5d", value_parser = duration_or_off, value_name = "DURATION|off")]
    pub disable_after: OrOff,
}

/// The retry policy: an explicit schedule, or exponential backoff.
#[derive(Debug, Args, Clone)]
pub struct PolicyArgs {
    /// Every delivery counts, the first included.
    #[arg(long, env = "REDELIVER_MAX_ATTEMPTS", default_value_t = crate::policy::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Explicit delays: retry n waits the n-th entry, the last one repeats
    /// (e.g. 15s,15s,30s,3m,10m,20m,30m,30m,30m,60m,3h,3h,3h,6h,6h).
    #[arg(long, env = "REDELIVER_SCHEDULE", conflicts_with_all = ["initial_delay", "factor", "max_delay", "jitter"])]
    pub schedule: Option<String>,
    /// Exponential backoff (used when no --schedule is given).
    #[arg(
        long,
        env = "REDELIVER_BACKOFF",
        value_enum,
        default_value = "exponential"
    )]
    pub backoff: BackoffKind,
    /// Exponential: the first retry's delay.
    #[arg(long, env = "REDELIVER_INITIAL_DELAY", default_value = "10s", value_parser = duration)]
    pub initial_delay: Duration,
    /// Exponential: the growth factor per retry.
    #[arg(long, env = "REDELIVER_FACTOR", default_value_t = 2.0)]
    pub factor: f64,
    /// Exponential: the largest delay (also caps Retry-After).
    #[arg(long, env = "REDELIVER_MAX_DELAY", default_value = "1h", value_parser = duration)]
    pub max_delay: Duration,
    /// Exponential: AWS-style jitter.
    #[arg(long, env = "REDELIVER_JITTER", value_enum, default_value = "equal")]
    pub jitter: Jitter,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackoffKind {
    Exponential,
}
