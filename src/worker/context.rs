//! What the stages of one delivery share: the session's [`Context`], what
//! became of a delivery ([`Done`]) and its HTTP attempt's [`HttpSpan`].

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::wait::WaitRoom;
use crate::config::WorkerSettings;
use crate::control::Control;
use crate::events::Emitter;
use crate::history::Recorder;
use crate::isolation::Endpoints;
use crate::message::Notification;
use crate::policy::EffectivePolicy;
use crate::publish::Publisher;

/// What every delivery task of one connection shares.
pub struct Context<H> {
    pub handler: Arc<H>,
    pub publisher: Publisher,
    /// Operational events, on the publisher's channels.
    pub events: Emitter,
    /// Appends each attempt's record to `<prefix>.history`; `None` with
    /// `--history off`.
    pub history: Option<Recorder>,
    /// This process as records name it (`host/pid`).
    pub worker: String,
    pub settings: WorkerSettings,
    /// Cancelled when the shutdown grace is over: unfinished deliveries are
    /// then nacked back to the queue.
    pub hard_stop: CancellationToken,
    /// Cancelled when republishing fails in a way a new connection (and a
    /// fresh topology declaration) may cure: unroutable or unconfirmed.
    pub broken: CancellationToken,
    /// The worker's concurrency slots, which a parked delivery takes again.
    pub slots: Arc<Semaphore>,
    /// Per-endpoint limits and breakers, shared by every session.
    pub endpoints: Arc<Endpoints>,
    /// What operators paused or disabled, shared by every session.
    pub control: Control,
    /// Notified when a parked delivery waits for a slot (see `process::take_slot`).
    pub slot_wanted: Arc<Notify>,
    /// The session's tasks: deliveries, and originals held for the settle.
    pub tracker: TaskTracker,
    /// Seats for deliveries waiting in the worker (`wait.rs`), shared by
    /// every session.
    pub waiting: Arc<WaitRoom>,
    /// Cancelled when the session begins to stop: nothing waits in the
    /// worker any more.
    pub stopping: CancellationToken,
    /// Parks against releases (`park.rs`), shared by every session.
    pub(crate) parking: Parking,
}

/// What became of a delivery before its own ack: the copy it needed, if
/// any, was confirmed.
pub(crate) enum Done {
    /// Delivered (with the HTTP attempt's span, for the overhead trace) or
    /// dead-lettered: ack it.
    Ack(Option<HttpSpan>),
    /// Its retry copy was confirmed: ack it, after `--retry-settle`.
    Retried,
}

/// When the delivery handler was called and when it returned.
#[derive(Clone, Copy)]
pub(crate) struct HttpSpan {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

impl HttpSpan {
    pub(crate) fn millis(&self) -> u64 {
        self.end.duration_since(self.start).as_millis() as u64
    }
}

/// Parks hold it for reading, a release for writing (`park.rs`).
pub type Parking = Arc<tokio::sync::RwLock<()>>;

/// The policy in force for this notification: its own fields, then its
/// URL's `[[route]]`, then the worker's flags.
pub(super) fn effective_policy<'a>(
    settings: &'a WorkerSettings,
    n: &'a Notification,
) -> EffectivePolicy<'a> {
    let route = settings.routes.find(&n.url);
    EffectivePolicy::new(
        &settings.policy,
        &settings.rules,
        settings.max_age,
        route.map(|r| r.overrides()).unwrap_or_default(),
        n.overrides(),
    )
}
