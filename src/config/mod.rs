//! Settings shared by the commands, and the AMQP URL list, which never
//! prints a password.

mod amqp_url;
mod egress;
mod endpoint;
mod events;
mod routes;
mod secret;
mod tls;

pub use amqp_url::{AmqpUrl, BadUrl, CONNECT_TIMEOUT};
pub use egress::{BadProxy, ProxySetting};
pub use endpoint::{
    ControlSettings, EndpointLimits, EndpointSettings, DEFAULT_DISABLE_AFTER, DEFAULT_MAX_AGE,
    DEFAULT_MAX_ENDPOINTS, DEFAULT_MAX_PARKED, DEFAULT_MAX_WAITING, SUGGESTED_BREAKER_PARK_AFTER,
};
pub use events::{parse_type_pattern, EventSettings, DEFAULT_FAILING_AFTER};
pub use routes::{Route, Routes};
pub use secret::{expiry_warning, parse_secrets, BadSecret, SecretError, SigningSecret};
pub use tls::{RouteTls, TlsFileError};

pub use crate::message::redact::redact_url;

use std::time::Duration;

use crate::message::DEFAULT_MAX_MESSAGE_BYTES;
use crate::policy::RetryPolicy;
use crate::policy::SuccessRules;

pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Connection failures that waiting will not fix: refused credentials or
/// vhost, and a broker certificate that does not verify (an unknown CA, a
/// wrong name or an expired certificate). Matched on the error's text:
/// lapin reports both as strings inside its error.
pub fn is_permanent_connect_error(text: &str) -> bool {
    ["ACCESS_REFUSED", "NOT_ALLOWED", "invalid peer certificate"]
        .iter()
        .any(|needle| text.contains(needle))
}

/// Broker-side settings common to every command.
#[derive(Clone, Debug)]
pub struct BrokerSettings {
    pub url: AmqpUrl,
    pub prefix: String,
    pub queue_type: QueueType,
    pub delay: DelayBackend,
}

/// How a retry waits out its delay (`--delay-backend`); the backends
/// themselves live in `crate::delay`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DelayBackend {
    /// The `x-delayed-message` exchange type (rabbitmq_delayed_message_exchange).
    #[default]
    Plugin,
    /// A cascade of TTL quorum queues, delays of 1 s or less held by the
    /// `run` workers: no plugin, for RabbitMQ 4.3+ and managed brokers.
    // See `crate::delay::cascade` and `crate::delay::hold`.
    Cascade,
}

impl DelayBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            DelayBackend::Plugin => "plugin",
            DelayBackend::Cascade => "cascade",
        }
    }

    /// The backend [`DelayBackend::as_str`] names, as headers carry it.
    pub fn from_name(name: &str) -> Option<Self> {
        [DelayBackend::Plugin, DelayBackend::Cascade]
            .into_iter()
            .find(|b| b.as_str() == name)
    }
}

/// Queue type of the work queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueType {
    /// Replicated, fsync'd Raft log: the safe default.
    Quorum,
    /// Classic durable queue.
    Classic,
}

impl QueueType {
    /// As `--queue-type` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// Messages one holder keeps at once (its prefetch) by default
/// (`--hold-prefetch`). With delays ≤ 1 s a holder releases up to about
/// this many per second before messages wait in the queue; each held
/// message costs its size in memory.
pub const DEFAULT_HOLD_PREFETCH: u16 = 8_192;

/// The upstream plugin confirms a delayed message once Mnesia logged it,
/// but the log's writer keeps up to 64 KB for up to 2 s before its write:
/// a broker `kill -9` lost copies confirmed up to 1,999 ms earlier
/// (`redeliver bench --phase confirm-window`, BENCHMARKS.md). 3 s covers
/// the 2 s with a margin for a busy node's late timer.
pub const DEFAULT_RETRY_SETTLE: Duration = Duration::from_secs(3);

/// Where new delays go while the plugin backend is stalled (`--delay-failover`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DelayFailover {
    /// Through the cascade (declared when first needed), until probes come
    /// back through the plugin again.
    #[default]
    Cascade,
    /// Nowhere else: retries keep going to the stalled plugin, held there
    /// until the broker is repaired.
    None,
}

/// The delay backend's liveness probe and failover (`crate::delay::probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSettings {
    /// How often a worker sends a probe through each backend it uses;
    /// `None`: never (and no failover either, which needs the probe).
    pub every: Option<Duration>,
    /// How long past its own delay a probe may take to come back before the
    /// backend counts as stalled.
    pub grace: Duration,
    pub failover: DelayFailover,
}

/// See [`ProbeSettings::every`].
pub const DEFAULT_PROBE_EVERY: Duration = Duration::from_secs(5);
/// See [`ProbeSettings::grace`]. A loaded broker routes due messages late
/// by milliseconds to a second or so; ten seconds is far past that, and a
/// stall is still reported within about 16 s.
pub const DEFAULT_PROBE_GRACE: Duration = Duration::from_secs(10);

impl Default for ProbeSettings {
    fn default() -> Self {
        ProbeSettings {
            every: Some(DEFAULT_PROBE_EVERY),
            grace: DEFAULT_PROBE_GRACE,
            failover: DelayFailover::Cascade,
        }
    }
}

/// Lanes when `--lanes` is not given: see `docs/lanes.md` for why.
pub const DEFAULT_LANES: u16 = 8;

/// How a worker delivers and decides.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// Most HTTP attempts in flight in this process.
    pub concurrency: usize,
    /// The AMQP prefetch; `None`: concurrency plus room for deliveries past
    /// their attempt (see [`crate::worker::prefetch`]).
    pub prefetch: Option<usize>,
    /// With the cascade, the most short delays held at once
    /// ([`crate::delay::hold`]).
    pub hold_prefetch: u16,
    /// Lanes of the work queue (`--lanes`), each consumed on its own
    /// channel (`crate::topology::lanes`).
    pub lanes: u16,
    pub policy: RetryPolicy,
    pub rules: SuccessRules,
    pub max_message_bytes: usize,
    /// How long to wait for a publisher confirm before giving up (and nacking).
    pub confirm_timeout: Duration,
    /// On shutdown, how long in-flight deliveries may take to finish.
    pub shutdown_grace: Duration,
    /// How long a retried original stays unacked after its copy was
    /// confirmed (see `--retry-settle`); zero acks at once.
    pub retry_settle: Duration,
    /// When set, every attempt's outcome is also sent here (progress
    /// displays, metrics). Slow receivers lag; the worker never waits.
    pub events: Option<tokio::sync::broadcast::Sender<AttemptEvent>>,
    /// Per-URL-prefix overrides of the policy and success body (the
    /// handler applies their secrets and timeouts).
    pub routes: crate::config::Routes,
    /// Readiness and metrics, for `--admin-addr`.
    pub health: crate::telemetry::Health,
    /// Per-endpoint concurrency, rate, circuit breaker and parking.
    pub endpoints: EndpointSettings,
    /// How long a notification may keep being retried or deferred, from
    /// its first attempt (or first deferral); `None` or zero: no limit.
    pub max_age: Option<Duration>,
    /// The delay backend's liveness probe and failover.
    pub delay_probe: ProbeSettings,
    /// The shared endpoint state: automatic disable.
    pub control: ControlSettings,
    /// Operational events: where they go besides `<prefix>.events`.
    pub ops_events: EventSettings,
    /// OpenTelemetry: a span per attempt when an OTLP exporter is set up.
    pub tracing: crate::telemetry::trace::Tracing,
    /// The delivery history: on by default (`--history off`).
    pub history: crate::history::HistorySettings,
}

/// One attempt and what was decided about it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptEvent {
    pub id: String,
    pub attempt: u32,
    pub host: String,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub duration: Duration,
    pub action: crate::policy::Action,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            concurrency: 32,
            prefetch: None,
            hold_prefetch: DEFAULT_HOLD_PREFETCH,
            lanes: DEFAULT_LANES,
            policy: RetryPolicy::default(),
            rules: SuccessRules::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            confirm_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            retry_settle: DEFAULT_RETRY_SETTLE,
            events: None,
            routes: Default::default(),
            health: Default::default(),
            endpoints: EndpointSettings::default(),
            max_age: Some(DEFAULT_MAX_AGE),
            delay_probe: ProbeSettings::default(),
            control: ControlSettings::default(),
            ops_events: EventSettings::default(),
            tracing: Default::default(),
            history: Default::default(),
        }
    }
}
