//! [`Watch`]: what a worker's probes have seen, shared by its sessions
//! (a reconnect forgets the probes out, not a stall), and what a change
//! does: the log line, the gauge, `/readyz`, the report and failover.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use super::book::{Book, Change, State};
use crate::config::{DelayBackend, DelayFailover, ProbeSettings};
use crate::delay::cascade;
use crate::delay::failover::Switch;
use crate::delay::report::{BackendReport, ProbeState, Report};
use crate::telemetry::{self, Health};
use crate::topology::Topology;

/// The plugin probe's delay: long enough to be held and timed like a
/// retry, short enough to be cheap to wait for.
pub const PLUGIN_PROBE_DELAY_MS: u32 = 1_000;
/// The delay a probe through `backend` waits.
pub fn probe_delay(backend: DelayBackend) -> Duration {
    Duration::from_millis(u64::from(match backend {
        DelayBackend::Plugin => PLUGIN_PROBE_DELAY_MS,
        DelayBackend::Cascade => cascade::PROBE_DELAY_MS,
    }))
}

/// What the docs call the page an operator needs.
const DOCS: &str = "docs/operations.md, \"A delay backend stalls\"";

/// A worker's probe state; cheap to clone.
#[derive(Clone)]
pub struct Watch {
    books: Arc<Mutex<[Option<Book>; 2]>>,
    settings: ProbeSettings,
    primary: DelayBackend,
    switch: Switch,
    health: Health,
    worker: Arc<str>,
}

/// One backend's change.
pub(super) struct Event {
    pub(super) backend: DelayBackend,
    pub(super) change: Change,
}

/// What a change asks of failover.
pub(super) enum Failover {
    Engage,
    Release,
    Stay,
}

fn index(b: DelayBackend) -> usize {
    match b {
        DelayBackend::Plugin => 0,
        DelayBackend::Cascade => 1,
    }
}

impl Watch {
    /// For a worker whose delays go through `primary`.
    pub fn new(settings: ProbeSettings, primary: DelayBackend, health: Health) -> Self {
        if settings.every.is_some() {
            // Present from the start: dashboards see 0, not "no data".
            metrics::gauge!(telemetry::DELAY_STALLED, "backend" => primary.as_str()).set(0.0);
            metrics::gauge!(telemetry::DELAY_FAILOVER).set(0.0);
        }
        Watch {
            books: Arc::new(Mutex::new([None, None])),
            settings,
            primary,
            switch: Switch::default(),
            health,
            worker: crate::telemetry::worker_id().into(),
        }
    }

    /// The failover switch, which the worker's publisher reads.
    pub fn switch(&self) -> Switch {
        self.switch.clone()
    }

    pub fn settings(&self) -> ProbeSettings {
        self.settings
    }

    fn lock(&self) -> MutexGuard<'_, [Option<Book>; 2]> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn failover_on(&self) -> bool {
        self.switch.is_on()
    }

    pub(super) fn forget_out(&self) {
        self.lock().iter_mut().flatten().for_each(Book::forget_out);
    }

    pub(super) fn sent(&self, backend: DelayBackend) -> u64 {
        let limit = probe_delay(backend) + self.settings.grace;
        let mut books = self.lock();
        let book = books[index(backend)].get_or_insert_with(|| Book::new(limit));
        book.sent(Instant::now(), SystemTime::now())
    }

    pub(super) fn back(&self, backend: DelayBackend, seq: u64) -> Option<Event> {
        let mut books = self.lock();
        let book = books[index(backend)].as_mut()?;
        let (rtt, change) = book.back(seq, Instant::now(), SystemTime::now());
        if let Some(rtt) = rtt {
            metrics::histogram!(telemetry::DELAY_PROBE_SECONDS, "backend" => backend.as_str())
                .record(rtt.as_secs_f64());
        }
        (change != Change::None).then_some(Event { backend, change })
    }

    pub(super) fn check(&self) -> Vec<Event> {
        let now = Instant::now();
        let mut books = self.lock();
        [DelayBackend::Plugin, DelayBackend::Cascade]
            .into_iter()
            .filter_map(|backend| {
                let change = books[index(backend)].as_mut()?.check(now);
                Some(Event { backend, change })
            })
            .filter(|e| e.change != Change::None)
            .collect()
    }

    /// Logs and records a change; says whether to fail over or back.
    pub(super) fn apply(&self, e: &Event, t: &Topology) -> Failover {
        let name = e.backend.as_str();
        let gauge = metrics::gauge!(telemetry::DELAY_STALLED, "backend" => name);
        let from_plugin =
            e.backend == DelayBackend::Plugin && self.settings.failover == DelayFailover::Cascade;
        match e.change {
            Change::Stalled { sent, waited } => {
                gauge.set(1.0);
                let since = humantime::format_rfc3339_seconds(sent).to_string();
                let what = stalled_hint(e.backend, t);
                error!(backend = name, since = %since, waited = ?waited, "the delay backend stopped routing: a probe sent at {since} has not come back after {}; retries through it are held until it routes again. {what} See {DOCS}.", humantime::format_duration(std::time::Duration::from_secs(waited.as_secs())));
                self.health
                    .set_delay(name, Some(format!("stalled since {since}")));
                if from_plugin {
                    Failover::Engage
                } else {
                    Failover::Stay
                }
            }
            Change::Cleared { lasted } => {
                gauge.set(0.0);
                info!(backend = name, lasted = ?lasted, "the delay backend routes again: a probe came back");
                self.health.set_delay(name, None);
                if from_plugin {
                    Failover::Release
                } else {
                    Failover::Stay
                }
            }
            Change::Routing => {
                gauge.set(0.0);
                tracing::debug!(backend = name, "the first delay probe came back");
                Failover::Stay
            }
            Change::None => Failover::Stay,
        }
    }

    /// At a session's start: when failover is asked for and another
    /// worker reports the plugin stalled (`reports`, fresh ones), this one
    /// takes its word, so a worker started during a stall does not send
    /// its first retries into it. Its own probes clear it if it is wrong.
    /// Whether this worker could fail over on other workers' reports (a
    /// plugin worker with `--delay-failover cascade`); only then are they
    /// read at a session's start.
    pub(super) fn can_adopt(&self) -> bool {
        self.settings.failover == DelayFailover::Cascade && self.primary == DelayBackend::Plugin
    }

    pub(super) fn adopt_reported_stall(&self, reports: &[Report]) -> bool {
        if !self.can_adopt() {
            return false;
        }
        let since = reports
            .iter()
            .flat_map(|r| &r.backends)
            .filter(|b| b.backend == DelayBackend::Plugin && b.state == ProbeState::Stalled)
            .filter_map(|b| b.since_ms)
            .min();
        let Some(since_ms) = since else {
            return false;
        };
        let since = UNIX_EPOCH + Duration::from_millis(since_ms);
        let limit = probe_delay(DelayBackend::Plugin) + self.settings.grace;
        let adopted = {
            let mut books = self.lock();
            let book = books[index(DelayBackend::Plugin)].get_or_insert_with(|| Book::new(limit));
            book.assume_stalled(since, Instant::now())
        };
        if adopted {
            let at = humantime::format_rfc3339_seconds(since);
            warn!(backend = "plugin", since = %at, "other workers report the delay backend stalled since {at}; failing over from the start (this worker's own probes will clear it if it routes)");
            metrics::gauge!(telemetry::DELAY_STALLED, "backend" => "plugin").set(1.0);
            self.health
                .set_delay("plugin", Some(format!("stalled since {at}")));
        }
        adopted
    }

    /// Whether the plugin is stalled and failover is asked for.
    pub(super) fn wants_failover(&self) -> bool {
        self.settings.failover == DelayFailover::Cascade
            && self.primary == DelayBackend::Plugin
            && self.lock()[index(DelayBackend::Plugin)]
                .as_ref()
                .is_some_and(Book::is_stalled)
    }

    pub(super) fn engage_failover(&self) {
        if !self.switch.is_on() {
            self.switch.set(true);
            metrics::gauge!(telemetry::DELAY_FAILOVER).set(1.0);
            warn!("failing over: new retries and deferrals go through the cascade until probes come back through the plugin; copies already inside the plugin stay there until the broker is repaired");
        }
    }

    pub(super) fn release_failover(&self) {
        if self.switch.is_on() {
            self.switch.set(false);
            metrics::gauge!(telemetry::DELAY_FAILOVER).set(0.0);
            info!("failing back: new retries go through the plugin again; those in the cascade come out on time");
        }
    }

    /// This worker's report for `status`.
    pub(super) fn report(&self) -> Report {
        let books = self.lock();
        let mut backends = vec![];
        for backend in [DelayBackend::Plugin, DelayBackend::Cascade] {
            let Some(book) = &books[index(backend)] else {
                continue;
            };
            let (state, since) = match book.state() {
                State::Unknown => (ProbeState::Unknown, None),
                State::Routing { since } => (ProbeState::Routing, Some(since)),
                State::Stalled { since, .. } => (ProbeState::Stalled, Some(since)),
            };
            backends.push(BackendReport {
                backend,
                state,
                since_ms: since.map(epoch_ms),
                last_round_trip_ms: book.last_round_trip().map(|d| d.as_millis() as u64),
            });
        }
        Report {
            worker: self.worker.to_string(),
            at_ms: epoch_ms(SystemTime::now()),
            backends,
            failover_active: self.switch.is_on(),
        }
    }
}

/// What to check, in the stall's log line.
fn stalled_hint(backend: DelayBackend, t: &Topology) -> String {
    match backend {
        DelayBackend::Plugin => format!(
            "Check the x-delayed-message plugin on the node this worker is connected to: the exchange {}'s messages_delayed (management API) grows while nothing arrives; a broker crash can leave the upstream plugin's index with an entry whose message is gone.",
            t.retry
        ),
        DelayBackend::Cascade => format!(
            "Check the cascade's queues ({}.cascade.*; `redeliver status`): a queue that only grows, a policy that caps its length or changes its TTL, or a binding or queue deleted by hand.",
            t.prefix
        ),
    }
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
