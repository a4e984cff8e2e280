//! What the shared state holds per target: the [`Mode`] in force (active,
//! paused or disabled), the failing clock, and a short history. Written
//! whole into snapshots (`record.rs`), folded by `book.rs`.

use serde::{Deserialize, Serialize};

use crate::message::target::Target;

/// The id prefix of a worker's pause of an endpoint whose breaker has been
/// open long (`super::breakers`).
pub const BREAKER_PAUSE: &str = "breaker:";

/// The id prefix of the resume a worker writes when its probe closed the
/// breaker of such a pause.
pub const PROBED: &str = "probed:";

/// A breaker pause's id: `breaker:<target>:<ms the breaker opened>`.
pub fn breaker_pause_id(target: &Target, opened_ms: u64) -> String {
    format!("{BREAKER_PAUSE}{target}:{opened_ms}")
}

/// When the breaker behind a breaker pause's id opened (its last field:
/// a target can hold colons, the time cannot).
pub fn breaker_opened_ms(id: &str) -> Option<u64> {
    id.strip_prefix(BREAKER_PAUSE)?
        .rsplit_once(':')?
        .1
        .parse()
        .ok()
}

/// Changes kept per target for `endpoint show`.
const MAX_HISTORY: usize = 10;

/// What is in force for a target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Active,
    Paused {
        since_ms: u64,
        until_ms: Option<u64>,
        reason: Option<String>,
        by: String,
        id: String,
    },
    Disabled {
        since_ms: u64,
        reason: Option<String>,
        by: String,
    },
}

impl Mode {
    /// Paused or disabled at `now_ms` (a pause past its `until` is over).
    pub fn in_force(&self, now_ms: u64) -> bool {
        match self {
            Mode::Active => false,
            Mode::Paused { until_ms, .. } => until_ms.is_none_or(|u| now_ms < u),
            Mode::Disabled { .. } => true,
        }
    }

    /// Whether the failing clock runs: active, or parked for a breaker
    /// (its probes still fail or succeed, and an endpoint down for days
    /// must still reach `--disable-after`).
    pub fn clock_runs(&self) -> bool {
        match self {
            Mode::Active => true,
            Mode::Paused { id, .. } => id.starts_with(BREAKER_PAUSE),
            Mode::Disabled { .. } => false,
        }
    }

    pub fn name(&self, now_ms: u64) -> &'static str {
        match self {
            Mode::Paused { .. } if self.in_force(now_ms) => "paused",
            Mode::Disabled { .. } => "disabled",
            _ => "active",
        }
    }
}

/// One change in a target's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub at_ms: u64,
    /// `paused`, `resumed`, `pause expired`, `disabled` or `enabled`.
    pub what: String,
    pub by: String,
    pub reason: Option<String>,
    pub until_ms: Option<u64>,
    /// The record's id.
    pub id: String,
}

/// Everything shared about one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    pub target: Target,
    pub control: Mode,
    /// The first failed attempt after the last success, if it failed since.
    pub failing_since_ms: Option<u64>,
    /// Failed attempts since then, as the workers reported them.
    pub failures: u64,
    pub last_success_ms: Option<u64>,
    /// Its last record.
    pub updated_ms: u64,
    pub history: Vec<Entry>,
    /// The worker that won the right to write the automatic disable for
    /// the current failing, if one claimed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
}

/// A worker's claim on the automatic disable of a failing that began at
/// `since_ms`: the first claim in the stream wins, so exactly one worker
/// writes the disable. A claim older than [`CLAIM_TTL_MS`] (its worker
/// died before writing) gives way to the next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub since_ms: u64,
    pub by: String,
    pub at_ms: u64,
}

/// How long a claim holds without its disable.
pub const CLAIM_TTL_MS: u64 = 30_000;

/// A target with nothing in force and no record for this long (the
/// stream's own retention) is as good as new: every reader forgets it at
/// its next record ([`KeyState::is_stale`]), and snapshots leave it out.
/// A failing endpoint's records come at least daily while it has traffic.
pub const FORGET_AFTER_MS: u64 = 7 * 86_400_000;

impl KeyState {
    pub(super) fn new(target: Target) -> Self {
        KeyState {
            target,
            control: Mode::Active,
            failing_since_ms: None,
            failures: 0,
            last_success_ms: None,
            updated_ms: 0,
            history: vec![],
            claim: None,
        }
    }

    /// Nothing in force and no record for [`FORGET_AFTER_MS`] at `now_ms`:
    /// a reader that kept it and one that never had it (it read a
    /// snapshot that left it out) must judge alike.
    pub fn is_stale(&self, now_ms: u64) -> bool {
        self.control == Mode::Active && now_ms >= self.updated_ms.saturating_add(FORGET_AFTER_MS)
    }

    /// Whether a probe's resume (`probed:`) came after `opened_ms`: it
    /// closed every worker's breaker for the target, so a breaker that
    /// opened before it is closed, and its pause is stale. (Two workers
    /// can write their pauses 30 ms apart; the second, landing after the
    /// first's probed resume, would otherwise pause again with no breaker
    /// left open to probe it, and hold the backlog for the pause's cap.)
    pub fn probed_after(&self, opened_ms: u64) -> bool {
        self.history
            .iter()
            .any(|e| e.id.starts_with(PROBED) && e.at_ms > opened_ms)
    }

    /// An operator's change starts the failing clock afresh: failures
    /// before a pause or a disable say nothing about the endpoint after it.
    pub(super) fn set(&mut self, control: Mode, entry: Entry) {
        self.failing_since_ms = None;
        self.failures = 0;
        self.claim = None;
        self.keep_clock(control, entry);
    }

    /// A breaker's pause and its end leave the failing clock as it is.
    pub(super) fn keep_clock(&mut self, control: Mode, entry: Entry) {
        self.control = control;
        self.history.push(entry);
        let excess = self.history.len().saturating_sub(MAX_HISTORY);
        self.history.drain(..excess);
    }
}
