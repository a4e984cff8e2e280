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
//! for each delivery, [`Control::held`] and [`Control::dead_lettered`] to
//! count what it held back, and [`Control::attach`] on each connection,
//! which reads the stream and starts following it, planning the failing
//! clock's records ([`plan`]) and publishing reports ([`reports`]) that
//! `endpoint list` merges ([`view`]).

pub mod book;
mod error;
mod follow;
pub mod plan;
pub mod record;
pub mod reports;
mod shared;
pub mod state;
pub mod stream;
pub mod table;
pub mod view;

pub use error::ControlError;
pub use table::Gate;

use std::sync::Arc;
use std::time::Duration;

use lapin::Connection;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::config::ControlSettings;
use crate::endpoint::Endpoints;
use crate::message::target::Target;
use crate::topology::Topology;
use book::Book;
use plan::PlanSettings;
use shared::{now_ms, Shared};

/// How long a worker may take to read the stream up to its marker before
/// the session gives up and reconnects.
const CATCH_UP: Duration = Duration::from_secs(60);

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

    /// Counts a notification deferred by `target`'s pause, due at `due_ms`.
    pub fn held(&self, target: &Target, due_ms: u64) {
        self.shared.held(target, due_ms);
    }

    /// Counts a notification dead-lettered because `target` is disabled.
    pub fn dead_lettered(&self, target: &Target) {
        self.shared.dead_lettered(target);
    }

    /// Reads the stream through `conn` up to a marker of its own (so the
    /// state is whole before the first delivery), then follows it and
    /// starts the planner and the reports, until `stop`. The token
    /// returned is cancelled if following ends first: a worker that no
    /// longer hears changes must reconnect rather than deliver on.
    pub async fn attach(
        &self,
        conn: &Arc<Connection>,
        t: &Topology,
        endpoints: Arc<Endpoints>,
        stop: &CancellationToken,
    ) -> Result<CancellationToken, ControlError> {
        stream::declare(conn, &t.endpoint_state).await?;
        if let Err(e) = reports::declare(conn, t).await {
            tracing::warn!(error = %e, "the endpoint-reports queue could not be declared; `endpoint list` will not show this worker");
        }
        let writer = stream::Writer::open(conn, &t.endpoint_state).await?;
        let mut reader = stream::Reader::open(conn, &t.endpoint_state).await?;
        let mut book = Book::default();
        stream::catch_up(&writer, &mut reader, &mut book, &self.shared.me, CATCH_UP).await?;
        self.shared.install(book);
        let failed = CancellationToken::new();
        let tasks = follow::Tasks {
            shared: self.shared.clone(),
            endpoints,
            topology: t.clone(),
            conn: conn.clone(),
            stop: stop.clone(),
            failed: failed.clone(),
        };
        tasks.spawn(reader, writer);
        Ok(failed)
    }
}
