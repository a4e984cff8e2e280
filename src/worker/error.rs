//! Why a worker stopped, or why its session ended and it reconnects.

use crate::topology::TopologyError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot connect to the broker at {url}")]
    Connect { url: String, source: lapin::Error },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker cancelled the consumer (was the work queue deleted?)")]
    ConsumerCancelled,
    #[error("the publishing channel closed")]
    PublisherClosed,
    #[error(
        "republishing failed (unroutable or unconfirmed); reconnecting to re-declare the topology"
    )]
    RepublishFailing,
    #[error("the broker connection was lost")]
    ConnectionLost,
    #[error("holding short delays failed: {0}")]
    Hold(#[from] crate::delay::hold::HoldError),
    #[error("the short-delay holder stopped; reconnecting")]
    HolderStopped,
    #[error("the events-url relay stopped; reconnecting")]
    RelayStopped,
    #[error("the delay probe stopped; reconnecting")]
    ProbeStopped,
    #[error(transparent)]
    History(#[from] crate::history::HistoryError),
    #[error("the shared endpoint state: {0}")]
    Control(#[from] crate::control::ControlError),
    #[error("concurrency must be at least 1")]
    Concurrency,
    #[error("invalid broker URL {url}: {reason}")]
    BadUrl { url: String, reason: String },
}

impl WorkerError {
    /// Errors an operator must fix; everything else is retried.
    pub(super) fn is_fatal(&self) -> bool {
        match self {
            WorkerError::Connect { source, .. } => {
                crate::config::is_permanent_connect_error(&source.to_string())
            }
            WorkerError::History(h) => h.is_fatal(),
            WorkerError::Concurrency
            | WorkerError::BadUrl { .. }
            | WorkerError::Topology(TopologyError::DelayedExchangeMissing)
            | WorkerError::Topology(TopologyError::Mismatch { .. })
            // The broker refused the stream itself (no streams, or one of
            // this name with other settings): retrying will not help.
            | WorkerError::Control(crate::control::ControlError::Declare { .. }) => true,
            _ => false,
        }
    }
}

/// A topology refusal while starting the probe is one like any other
/// (fatal when an operator must fix it); the rest is AMQP.
impl From<crate::delay::probe::ProbeError> for WorkerError {
    fn from(e: crate::delay::probe::ProbeError) -> Self {
        match e {
            crate::delay::probe::ProbeError::Amqp(e) => WorkerError::Amqp(e),
            crate::delay::probe::ProbeError::Topology(t) => WorkerError::Topology(t),
            crate::delay::probe::ProbeError::Timeout(_) => WorkerError::ProbeStopped,
        }
    }
}
