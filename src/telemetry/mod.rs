//! Logs, metrics and health: what an operator sees of a running worker.
//!
//! Logs go to stderr, filtered by `RUST_LOG`, as human-readable lines on a
//! terminal and JSON lines otherwise (`--log-format`). The default filter,
//! `info,lapin=off`, leaves out lapin's own error lines, which would repeat
//! what redeliver reports in one sentence. Stdout stays free for command
//! output such as ids.
//!
//! Metrics go through the `metrics` facade; `--admin-addr` installs the
//! Prometheus recorder (`admin.rs`). Without it every call here is a
//! no-op. Labels are bounded: enums, and the per-endpoint metrics'
//! `endpoint` (host:port), of which at most [`MAX_ENDPOINT_LABELS`] are
//! named and the rest are `other`. Never a URL or a path.

pub(crate) mod admin;
pub mod trace;

mod log_writer;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::EnvFilter;

use crate::policy::Action;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Pretty,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// Pretty on a terminal, JSON when stderr goes to a file or a collector.
    pub fn detect() -> Self {
        if std::io::stderr().is_terminal() {
            LogFormat::Pretty
        } else {
            LogFormat::Json
        }
    }
}

/// Keeps the log writer's thread alive; dropping it flushes what is left.
/// Hold it until the process ends.
pub struct LogGuard(#[allow(dead_code)] log_writer::Flusher);

/// Logs to stderr from a thread of their own: a delivery never waits for a
/// write to a slow pipe or log collector (one line per attempt), and lines
/// reach stderr in batches, at most 10 ms after they were logged
/// (`log_writer.rs` says why not `tracing-appender`). Up to 4 MB wait;
/// past that the worker waits rather than drop a line.
pub fn init(format: LogFormat) -> LogGuard {
    init_with_default(format, "info,lapin=off")
}

/// Like [`init`], with another default filter (the demo prints its own
/// progress, so it only wants warnings).
pub fn init_with_default(format: LogFormat, default: &str) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // lapin's I/O loop traces raw frames, the login's credentials included;
    // no RUST_LOG setting may turn that on.
    let filter = match "lapin::io_loop=off".parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    };
    let (writer, guard) = log_writer::start();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || writer.clone());
    let _ = match format {
        LogFormat::Pretty => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // Fields at the top level, where collectors look for them.
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    LogGuard(guard)
}

/// Whether the worker is connected and consuming: `/readyz`. It is not
/// ready while connecting or reconnecting, nor once it starts draining.
/// It also carries what the delay probes found, which `/readyz` reports
/// without failing on it (`docs/operations.md` says why).
#[derive(Clone, Debug, Default)]
pub struct Health {
    consuming: Arc<AtomicBool>,
    /// Backend name → a note on it, while it is stalled.
    delay: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl Health {
    pub fn set_consuming(&self, consuming: bool) {
        self.consuming.store(consuming, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Sets (or with `None` clears) the note on a delay backend.
    pub fn set_delay(&self, backend: &'static str, note: Option<String>) {
        let mut d = self.delay.lock().unwrap_or_else(|e| e.into_inner());
        match note {
            Some(n) => d.insert(backend, n),
            None => d.remove(backend),
        };
    }

    /// One line per stalled delay backend.
    pub fn delay_notes(&self) -> Vec<String> {
        let d = self.delay.lock().unwrap_or_else(|e| e.into_inner());
        d.iter()
            .map(|(b, n)| format!("delay backend {b}: {n}"))
            .collect()
    }
}

pub const DELIVERIES: &str = "redeliver_deliveries_total";
pub const ATTEMPT_SECONDS: &str = "redeliver_attempt_duration_seconds";
pub const SUCCESS_ATTEMPT: &str = "redeliver_success_attempt_number";
pub const IN_FLIGHT: &str = "redeliver_in_flight";
pub const CONCURRENCY: &str = "redeliver_concurrency_limit";
pub const CONFIRMS_PENDING: &str = "redeliver_republish_confirms_pending";
pub const RECONNECTS: &str = "redeliver_reconnects_total";
pub const DEAD_LETTERS: &str = "redeliver_dead_letters";
pub const BACKLOG: &str = "redeliver_work_queue_messages";
pub const HELD: &str = "redeliver_held";
pub const SETTLING: &str = "redeliver_settling";
pub const ROTATIONS: &str = "redeliver_consumer_rotations_total";
pub const ACK_FRAMES: &str = "redeliver_ack_frames_total";
pub const ENDPOINT_IN_FLIGHT: &str = "redeliver_endpoint_in_flight";
pub const ENDPOINT_ATTEMPTS: &str = "redeliver_endpoint_attempts_total";
pub const ENDPOINT_PARKED: &str = "redeliver_endpoint_parked";
pub const ENDPOINT_DEFERRED: &str = "redeliver_endpoint_deferred_total";
pub const ENDPOINT_BREAKER: &str = "redeliver_endpoint_breaker_state";
pub const ENDPOINT_TRANSITIONS: &str = "redeliver_endpoint_breaker_transitions_total";
pub const ENDPOINT_LIMIT: &str = "redeliver_endpoint_limit";
pub const ENDPOINT_APP_ERRORS: &str = "redeliver_endpoint_app_error_ratio";
pub const ACTIVE_ENDPOINTS: &str = "redeliver_endpoints_active";
pub const PARKED: &str = "redeliver_parked";
pub const WAITING: &str = "redeliver_waiting";
pub const PARKING: &str = "redeliver_parking_queue_total";
pub const WAITS: &str = "redeliver_waits_total";
pub const REPUBLISHED_DEFERRALS: &str = "redeliver_deferrals_republished_total";
pub const ENDPOINTS: &str = "redeliver_endpoints_tracked";
pub const ENDPOINTS_BY_STATE: &str = "redeliver_endpoints";
pub const DELAY_STALLED: &str = "redeliver_delay_backend_stalled";
pub const DELAY_PROBE_SECONDS: &str = "redeliver_delay_probe_seconds";
pub const DELAY_FAILOVER: &str = "redeliver_delay_failover_active";
/// Distinct `endpoint` label values; the rest are counted as `other`.
pub const MAX_ENDPOINT_LABELS: usize = 100;

/// Describes the metrics, so `/metrics` carries `# HELP` lines.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        DELIVERIES,
        "Attempts by outcome (success, retry, dead) and dead-letter reason"
    );
    describe_histogram!(
        ATTEMPT_SECONDS,
        Unit::Seconds,
        "Duration of one HTTP attempt"
    );
    describe_histogram!(
        SUCCESS_ATTEMPT,
        "Attempt number at which a notification succeeded"
    );
    describe_gauge!(IN_FLIGHT, "HTTP attempts in flight");
    describe_gauge!(CONCURRENCY, "The concurrency limit (--concurrency)");
    describe_gauge!(
        CONFIRMS_PENDING,
        "Retry and dead-letter republishes waiting for the broker's confirm"
    );
    describe_counter!(
        RECONNECTS,
        "Broker connections re-established after a failure"
    );
    describe_gauge!(
        DEAD_LETTERS,
        "Messages in the dead-letter queue at the last check"
    );
    describe_gauge!(
        BACKLOG,
        "Messages ready in the work queue at the last check (the backlog; every worker of a prefix reports the same queue)"
    );
    describe_gauge!(
        HELD,
        "Short delays this worker holds until due (--delay-backend cascade)"
    );
    describe_gauge!(
        SETTLING,
        "Retried originals kept unacked for --retry-settle after their copy was confirmed"
    );
    describe_counter!(
        ROTATIONS,
        "Work-queue consumers replaced so that settling originals leave the prefetch free, or a delivery waiting in the worker leaves its lane's acks batched"
    );
    describe_endpoint_metrics();
    describe_delay_metrics();
}

fn describe_delay_metrics() {
    use metrics::{describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        DELAY_STALLED,
        "1 while a delay backend's probe is overdue (retries through it are held), by backend"
    );
    describe_histogram!(
        DELAY_PROBE_SECONDS,
        Unit::Seconds,
        "Round trip of a delay-backend probe, its delay (about 1 s) included, by backend"
    );
    describe_gauge!(
        DELAY_FAILOVER,
        "1 while new delays go through the cascade because the plugin is stalled"
    );
}

fn describe_endpoint_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(ENDPOINT_IN_FLIGHT, "HTTP attempts in flight, by endpoint");
    describe_counter!(ENDPOINT_ATTEMPTS, "HTTP attempts made, by endpoint");
    describe_gauge!(
        ENDPOINT_PARKED,
        "Deliveries waiting for their endpoint's concurrency or rate, by endpoint"
    );
    describe_counter!(
        ENDPOINT_DEFERRED,
        "Deliveries deferred without an attempt, by endpoint and reason"
    );
    describe_gauge!(
        ENDPOINT_BREAKER,
        "Circuit breaker by endpoint: 0 closed, 1 half-open, 2 open"
    );
    describe_counter!(
        ENDPOINT_TRANSITIONS,
        "Circuit breaker openings and closings, by endpoint"
    );
    describe_gauge!(
        ENDPOINT_LIMIT,
        "Attempts an endpoint may have in flight now: its adaptive limit, under the ceiling and its share"
    );
    describe_gauge!(
        ENDPOINT_APP_ERRORS,
        "Share of an endpoint's recent answers that were application errors (4xx but 429, 5xx but 502-504); gates nothing"
    );
    describe_gauge!(
        ACTIVE_ENDPOINTS,
        "Endpoints with deliveries in the last second, among which the slots are shared"
    );
    describe_gauge!(PARKED, "Deliveries parked in this worker (--max-parked)");
    describe_counter!(
        ACK_FRAMES,
        "basic.ack frames sent: one delivery each (single) or a run (multiple); each is a command for a quorum queue"
    );
    describe_gauge!(
        WAITING,
        "Deferred deliveries waiting in this worker, unacked, instead of through the delay backend (--max-waiting)"
    );
    describe_counter!(
        PARKING,
        "Paused endpoints' notifications moved by the parking queues: parked, released to their lane, or parked again by a release while still paused"
    );
    describe_counter!(
        WAITS,
        "Short waits taken in the worker instead of a round trip through the delay backend"
    );
    describe_counter!(
        REPUBLISHED_DEFERRALS,
        "Deferrals republished through the delay backend (confirmed before the original's ack)"
    );
    describe_gauge!(ENDPOINTS, "Endpoints this worker tracks (--max-endpoints)");
    describe_gauge!(
        ENDPOINTS_BY_STATE,
        "Endpoints by state: active and breaker-open (this worker's, seen in the last 10 minutes), paused and disabled (targets, shared by every worker of the prefix)"
    );
}

/// Records one attempt's outcome and duration.
pub fn record_attempt(action: &Action, attempt: u32, duration: Duration) {
    let (outcome, reason) = match action {
        Action::Ack => ("success", ""),
        Action::Retry { .. } => ("retry", ""),
        Action::DeadLetter { reason } => ("dead", reason.as_str()),
    };
    metrics::counter!(DELIVERIES, "outcome" => outcome, "reason" => reason).increment(1);
    metrics::histogram!(ATTEMPT_SECONDS).record(duration.as_secs_f64());
    if matches!(action, Action::Ack) {
        metrics::histogram!(SUCCESS_ATTEMPT).record(f64::from(attempt));
    }
}

/// An invalid message is dead-lettered without an attempt.
pub fn record_invalid() {
    metrics::counter!(DELIVERIES, "outcome" => "dead", "reason" => "invalid").increment(1);
}

/// A notification past its max age is dead-lettered without an attempt.
pub fn record_expired() {
    metrics::counter!(DELIVERIES, "outcome" => "dead", "reason" => "expired").increment(1);
}

/// The host's name, for reports (`/proc` on Linux, else `HOSTNAME`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// This process as reports name it: `host/pid`.
pub fn worker_id() -> String {
    format!("{}/{}", hostname(), std::process::id())
}

/// Counts a gauge up for as long as the guard lives: no path out of a
/// scope (an early return, a cancelled future) can leave it counted.
pub struct GaugeGuard(&'static str);

impl GaugeGuard {
    pub fn new(name: &'static str) -> Self {
        metrics::gauge!(name).increment(1.0);
        GaugeGuard(name)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}
