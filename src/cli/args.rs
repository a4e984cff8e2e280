//! The command line. The global options and those of `run` and `publish`
//! can also be set as `REDELIVER_*` environment variables (each flag's
//! `--help` names its variable); the `dlq`, `bench` and `config` options
//! cannot. A `--config` file sets the global and `run` options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::policy::Jitter;
use crate::topology::QueueType;

#[derive(Debug, Parser)]
#[command(
    name = "redeliver",
    version,
    about = "Reliable HTTP notification delivery over RabbitMQ",
    after_help = "Quick start, from a checkout (the same as the README):\n  cargo run --release -- demo    # the whole lifecycle; starts the local test broker node if none answers\n  cargo test\n\nBy hand, against the local test node (tests/broker/ctl up):\n  export REDELIVER_AMQP_URL='amqp://guest:guest@127.0.0.1:5674/%2f'\n  redeliver run &\n  redeliver publish --url http://127.0.0.1:8080/hook --body '{\"order\":\"A-1001\",\"status\":\"paid\"}'\n  redeliver status\n  redeliver dlq list"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Broker URL (amqp:// or amqps://), or the comma-separated URLs of
    /// one cluster's nodes: each connection starts at a random one and a
    /// lost connection tries the next. Passwords are never printed.
    /// [default: amqp://guest:guest@127.0.0.1:5672/%2f; for `demo` and
    /// `bench`, the local test node amqp://guest:guest@127.0.0.1:5674/%2f]
    #[arg(
        long,
        global = true,
        env = "REDELIVER_AMQP_URL",
        hide_env_values = true
    )]
    pub amqp_url: Option<String>,
    /// Prefix of every exchange and queue name (<prefix>.work, <prefix>.dead, ...).
    #[arg(
        long,
        global = true,
        env = "REDELIVER_PREFIX",
        default_value = "redeliver"
    )]
    pub prefix: String,
    /// Type of the work and dead-letter queues when each is first declared
    /// (an existing queue keeps its type). Quorum queues are replicated
    /// across a cluster's nodes; a classic queue lives on one node.
    #[arg(
        long,
        global = true,
        env = "REDELIVER_QUEUE_TYPE",
        value_enum,
        default_value = "quorum"
    )]
    pub queue_type: QueueType,
    /// How retries wait: the x-delayed-message plugin, or a cascade of TTL
    /// quorum queues that needs no plugin (RabbitMQ 4.3+, managed brokers;
    /// delays of 1 s or less are then held by the `run` workers).
    #[arg(
        long,
        global = true,
        env = "REDELIVER_DELAY_BACKEND",
        value_enum,
        default_value = "plugin"
    )]
    pub delay_backend: crate::delay::DelayBackend,
    /// TOML config file: the same settings under the flags' long names, and
    /// per-URL-prefix [[route]] overrides. Flags > env > file > defaults.
    #[arg(long, global = true, env = "REDELIVER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log lines as human-readable text or JSON objects, filtered by
    /// RUST_LOG [default: pretty on a terminal, json otherwise].
    #[arg(long, global = true, env = "REDELIVER_LOG_FORMAT", value_enum)]
    pub log_format: Option<crate::telemetry::LogFormat>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume the work queue and deliver notifications over HTTP.
    Run(RunArgs),
    /// Publish notifications (one from flags, or JSON lines from a file).
    Publish(PublishArgs),
    /// Inspect, replay, purge or export dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Queue depths, workers attached, and whether the delay mechanism is available.
    Status(StatusArgs),
    /// The whole lifecycle in well under a minute: a failing receiver,
    /// retries, dead letters (own prefix, deleted at the end). Without
    /// --amqp-url it uses the local test node, and starts it when nothing
    /// answers there.
    Demo,
    /// Measure throughput, latency, delay accuracy, memory and scaling against
    /// the broker and an embedded HTTP sink (own prefixes, cleaned up).
    Bench(BenchArgs),
    /// Check a config file, or print the effective settings of `run`.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file; errors name the line.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
    /// The settings `run` would use (flags > env > --config file > defaults),
    /// with where each comes from; secrets redacted. Takes `run`'s flags.
    Show(Box<RunArgs>),
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// A table of dead letters (non-destructive; order and headers kept).
    List(DlqListArgs),
    /// One dead letter in full: body, notification fields, attempt history.
    Show {
        /// The notification id.
        id: String,
    },
    /// Republish dead letters to the work queue with a fresh attempt counter.
    Replay(DlqReplayArgs),
    /// Delete dead letters (requires --yes; without it, counts and exits 1).
    Purge(DlqPurgeArgs),
    /// Write dead letters as JSON lines (non-destructive); re-import with `publish --file`.
    Export(DlqExportArgs),
}

/// Which dead letters: all filters must match.
#[derive(Debug, Args, Clone, Default)]
pub struct DlqFilterArgs {
    /// Only this dead-letter reason.
    #[arg(long, value_parser = ["max-attempts", "permanent-status", "permanent", "invalid", "expired"])]
    pub reason: Option<String>,
    /// Only notifications whose URL contains this text.
    #[arg(long)]
    pub url_contains: Option<String>,
    /// Only those dead-lettered within this long (e.g. 1h).
    #[arg(long, value_parser = duration)]
    pub since: Option<Duration>,
}

#[derive(Debug, Args, Clone)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// At most this many rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// One JSON object per line, with every recorded field.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct DlqReplayArgs {
    /// Notification ids to replay.
    pub ids: Vec<String>,
    /// Replay every dead letter.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only list what would be replayed.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args, Clone)]
pub struct DlqPurgeArgs {
    /// Notification ids to delete (default: all that match the filters).
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// Really delete. Without it, nothing changes: the count is shown and
    /// the command fails (exit 1), so `dlq purge && ...` stops there.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args, Clone)]
pub struct DlqExportArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// JSON lines (the only format; accepted for symmetry with `list --json`).
    #[arg(long)]
    pub json: bool,
    /// Write to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep credential header values (Authorization, Cookie, *-token, ...)
    /// and URL passwords; by default they are redacted, like everywhere else.
    #[arg(long)]
    pub include_secrets: bool,
}

#[derive(Debug, Args, Clone)]
#[command(
    after_help = "Phases: broker, sink, e2e, retry, latency, delay, memory, horizontal, noisy, \
cluster, crash, flaky, probe-cost (all by default), and confirm-window, which runs only when \
named: it kills the local test node with -9 sixteen times to measure the delay plugin's confirm \
window (run it on a node of its own, with REDELIVER_TEST_UPSTREAM_PLUGIN for the upstream plugin). \
Workers run as `redeliver run` processes of this executable. \
Against the local test node unless --amqp-url is given; the cluster phase against \
--cluster-url, or else the local three-node test cluster, started for it and stopped \
after. The crash phase restarts the broker only when it is the local test node \
(tests/broker/ctl, on REDELIVER_TEST_BROKER_PORT), and not with --quick. See BENCHMARKS.md."
)]
pub struct BenchArgs {
    /// Run only these phases (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub phase: Vec<crate::bench::Phase>,
    /// Notifications for the broker, sink, end-to-end and retry phases
    /// [default: 20000; 1000 with --quick].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(2..))]
    pub n: Option<u64>,
    /// Worker concurrency for phases 2-6 (phase 1 uses it as its prefetch).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Small sizes that only show every phase runs (about 20 s; for CI).
    #[arg(long)]
    pub quick: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The cluster phase's cluster: the comma-separated URLs of its three
    /// nodes [default: the local test cluster, `tests/broker/ctl cluster`].
    #[arg(long, env = "REDELIVER_BENCH_CLUSTER_URL", hide_env_values = true)]
    pub cluster_url: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// RabbitMQ management API (e.g. http://127.0.0.1:15672) for the unacked
    /// count, which AMQP cannot tell. Credentials come from --amqp-url.
    #[arg(long, env = "REDELIVER_MANAGEMENT_URL")]
    pub management_url: Option<String>,
}

#[derive(Debug, Args, Clone)]
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
    /// secret adds a signature. Never printed.
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
    /// Endpoints whose state a worker keeps; the least recently used are
    /// forgotten beyond it.
    #[arg(long, env = "REDELIVER_MAX_ENDPOINTS", default_value_t = crate::config::DEFAULT_MAX_ENDPOINTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_endpoints: usize,
    /// Deliveries that may wait for a busy endpoint without a slot; they
    /// count against the prefetch. Beyond it they are deferred. 0: never park.
    #[arg(long, env = "REDELIVER_MAX_PARKED", default_value_t = crate::config::DEFAULT_MAX_PARKED)]
    pub max_parked: usize,
    /// How long a notification may keep being retried or deferred, from its
    /// first attempt (or first deferral); then it is dead-lettered as
    /// `expired`. A notification's own `max_age` and a route's win. 0s: no limit.
    #[arg(long, env = "REDELIVER_MAX_AGE", default_value = "3d", value_parser = duration)]
    pub max_age: Duration,
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
    /// Largest notification accepted.
    #[arg(long, env = "REDELIVER_MAX_MESSAGE_BYTES", default_value_t = crate::message::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
}

/// Below a second, a slow broker's confirm would routinely "time out" after
/// the copy was already published, and every copy would start a retry chain.
fn confirm_timeout(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(d)
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::policy::parse_duration(s).map_err(|e| e.to_string())
}

/// `on` or `off`.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected `on` or `off`, not `{other}`")),
    }
}
