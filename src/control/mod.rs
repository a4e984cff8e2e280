//! Endpoint control: what operators decide per endpoint (pause, resume,
//! disable, enable: `redeliver endpoint ...`), and the failing clock the
//! workers share for the automatic disable (`--disable-after`).
//!
//! The state lives in one RabbitMQ stream per prefix,
//! `<prefix>.endpoint-state` ([`stream`]): every change is a record
//! ([`record`]), and every worker reads the stream from its first record
//! and folds it ([`book`]), so all of them agree, a change reaches each
//! within milliseconds, a worker that starts later has it before its first
//! delivery (it reads up to a marker of its own first), and the state is
//! as durable and replicated as the broker's streams. A delivery asks an
//! in-memory table ([`table`]); nothing is asked of the broker.
//!
//! This module is the room's one door for the worker: [`Control::gate`]
//! for each delivery, [`Control::parked`] and [`Control::dead_lettered`] to
//! count what it held back, and [`Control::attach`] on each connection,
//! which reads the stream and starts following it, planning the failing
//! clock's records ([`plan`]) and publishing reports ([`reports`]) that
//! `endpoint list` merges ([`view`]).

mod announce;
pub mod book;
pub mod breakers;
mod error;
mod fold;
mod follow;
pub mod plan;
pub mod record;
pub mod release;
pub mod reports;
mod shared;
pub mod state;
pub mod stream;
pub mod table;
pub mod view;

pub use error::ControlError;
pub use table::Gate;

use std::sync::Arc;

use lapin::Connection;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::config::ControlSettings;
use crate::events::Emitter;
use crate::isolation::Endpoints;
use crate::message::target::Target;
use crate::topology::Topology;
use plan::PlanSettings;
use shared::{now_ms, Shared};

/// How often [`Control::released`] looks again with no pause due to end: a
/// pause record read meanwhile wakes it.
const RELEASE_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// A worker's view of the shared state, across its connections.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl Control {
    pub fn new(settings: &ControlSettings) -> Control {
        let worker = crate::telemetry::worker_id();
        // A spread of up to half a second per worker, from its id.
        let spread_ms = worker
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
            % 500;
        let plan = PlanSettings {
            disable_after: settings.disable_after,
            breaker_park_after: settings.breaker_park_after,
            spread_ms,
        };
        Control {
            shared: Arc::new(Shared::new(plan, worker)),
        }
    }

    /// May a notification to `url` be attempted now? An in-memory lookup.
    pub fn gate(&self, url: &Url) -> Gate {
        if !self.shared.any() {
            return Gate::Go;
        }
        self.shared.with_table(|t| t.gate(url, now_ms()))
    }

    /// The operational event of a change a command made, once it took.
    pub fn announce(
        prefix: &str,
        book: &book::Book,
        r: &record::Record,
    ) -> Option<crate::message::event::Event> {
        announce::took(book, r)
            .then(|| announce::event(prefix, r))
            .flatten()
    }

    /// Counts a notification parked by `target`'s pause.
    pub fn parked(&self, target: &Target) {
        self.shared.parked(target);
    }

    /// Waits until pauses end (a resume, a disable, or a pause's time run
    /// out after `*since_ms`, which it moves on), then returns the targets
    /// they held, or `None` once `stop` is cancelled.
    pub async fn released(
        &self,
        since_ms: &mut u64,
        stop: &CancellationToken,
    ) -> Option<Vec<Target>> {
        loop {
            let wanted = self.shared.release_wanted.notified();
            let now = now_ms();
            let table = self.shared.table();
            let mut lifted = self.shared.take_released();
            lifted.extend(release::ended(&table, *since_ms, now));
            *since_ms = now;
            if !lifted.is_empty() {
                return Some(lifted);
            }
            let next = release::next_end(&table, now).map_or(RELEASE_CHECK, |end| {
                std::time::Duration::from_millis(end - now).min(RELEASE_CHECK)
            });
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = wanted => {}
                _ = tokio::time::sleep(next) => {}
            }
        }
    }

    /// Counts a notification dead-lettered because `target` is disabled.
    pub fn dead_lettered(&self, target: &Target) {
        self.shared.dead_lettered(target);
    }

    /// Reads the stream through `conn` up to a marker of its own (so the
    /// state is whole before the first delivery), then follows it and
    /// starts the planner and the reports, until `stop`. Should following
    /// break later (a stream leader moving, the stream deleted), the
    /// worker reads it afresh by itself and delivers on meanwhile, with
    /// the state it last had. A worker that has read the state before
    /// (an earlier connection) also starts when the stream cannot be read
    /// now; one that never has cannot: its first delivery waits for it.
    pub async fn attach(
        &self,
        conn: &Arc<Connection>,
        t: &Topology,
        endpoints: Arc<Endpoints>,
        events: &Emitter,
        stop: &CancellationToken,
    ) -> Result<(), ControlError> {
        let (name, me) = (&t.endpoint_state, &self.shared.me);
        let (reader, writer) = match stream::open_and_read(conn, name, me, stream::CATCH_UP).await {
            Ok((book, reader, writer)) => {
                self.shared.install(book);
                (Some(reader), Some(writer))
            }
            Err(e) if self.shared.has_state() => {
                tracing::warn!(error = %e, "the endpoint-state stream cannot be read now; delivering with the state last read, and reading it again in the background");
                (None, None)
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = reports::declare(conn, t).await {
            tracing::warn!(error = %e, "the endpoint-reports queue could not be declared; `endpoint list` will not show this worker");
        }
        let tasks = follow::Tasks {
            shared: self.shared.clone(),
            endpoints,
            topology: t.clone(),
            conn: conn.clone(),
            events: events.clone(),
            stop: stop.clone(),
        };
        tasks.spawn(reader, writer);
        Ok(())
    }
}
