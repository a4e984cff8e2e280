//! Why a delivery was deferred: the metrics' `reason` label and the
//! deferral's header.

use crate::policy::WaitReason;

/// Why a delivery was deferred without an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    /// The endpoint's breaker is open.
    Open,
    /// The endpoint asked for a pause (429, or 503 with `Retry-After`).
    Paused,
    /// The breaker is half-open and its probes are out.
    Probing,
    /// The endpoint is at its limit with a long wait, makes no progress,
    /// or no parking place was free.
    Busy,
    /// The endpoint's rate allows no turn soon.
    Rate,
    /// An operator paused it (`redeliver endpoint pause`).
    Held,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::Open => "breaker-open",
            DeferReason::Paused => "paused",
            DeferReason::Probing => "probing",
            DeferReason::Busy => "busy",
            DeferReason::Rate => "rate",
            DeferReason::Held => "endpoint-paused",
        }
    }
}

impl From<WaitReason> for DeferReason {
    fn from(w: WaitReason) -> Self {
        match w {
            WaitReason::Open => DeferReason::Open,
            WaitReason::Paused => DeferReason::Paused,
            WaitReason::Probing => DeferReason::Probing,
        }
    }
}
