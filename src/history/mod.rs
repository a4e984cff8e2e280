//! Delivery history: a record of every attempt, so that "what happened to
//! notification X?" has an answer outside the workers' logs. A room of its
//! own: the worker records through one narrow seam ([`Recorder::record`]),
//! and the console (`crate::console`) indexes and queries the
//! `<prefix>.history` stream.
//!
//! The pure parts: the record's shape and what it may keep (`record`),
//! what a query may ask and what it means (`query`), how records are
//! packed into stream messages (`wire`). The effectful ones: the stream's
//! declaration (`stream`) and the confirmed, batching writer (`writer`).

pub mod query;
pub mod record;
pub mod stream;
pub mod wire;
mod writer;

pub use stream::{declare, stream_name, HistoryError};
pub use writer::Recorder;

use std::time::Duration;

/// What the worker records and how long the stream keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct HistorySettings {
    /// `--history on|off`: on by default.
    pub enabled: bool,
    /// `--history-max-age`: the stream's `x-max-age`.
    pub max_age: Duration,
    /// `--history-max-bytes`: the stream's `x-max-length-bytes`.
    pub max_bytes: u64,
    /// `--history-response-bytes`: the response body's first bytes kept.
    pub response_bytes: usize,
    /// `--history-request-bytes`: the request body kept on a run's first
    /// attempt; 0 keeps none.
    pub request_bytes: usize,
    /// `--history-redact-headers`: request headers never recorded, besides
    /// the credentials every record leaves out.
    pub redact_headers: Vec<String>,
}

/// 7 days.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// 10 GB.
pub const DEFAULT_MAX_BYTES: u64 = 10_000_000_000;
pub const DEFAULT_RESPONSE_BYTES: usize = 1024;
pub const DEFAULT_REQUEST_BYTES: usize = 64 * 1024;

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings {
            enabled: true,
            max_age: DEFAULT_MAX_AGE,
            max_bytes: DEFAULT_MAX_BYTES,
            response_bytes: DEFAULT_RESPONSE_BYTES,
            request_bytes: DEFAULT_REQUEST_BYTES,
            redact_headers: vec![],
        }
    }
}
