//! The records of the endpoint-state stream (`<prefix>.endpoint-state`):
//! one JSON object each, format version 1, documented in
//! `docs/operations.md#endpoint-state-on-the-wire`. Every worker folds the
//! same records in the same order ([`super::book`]), so every worker ends
//! in the same state.

use serde::{Deserialize, Serialize};

use super::state::KeyState;
use crate::message::target::Target;

/// The format version this build writes (`"v"`).
pub const VERSION: u32 = 1;
/// Operator reasons are cut to this many characters.
pub const MAX_REASON: usize = 500;

/// One change to the shared state.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub v: u32,
    /// Unique per change, and the same for repeats of one decision (two
    /// workers disabling the same failing endpoint, or ending the same
    /// expired pause), so a repeat changes nothing and readers can tell.
    pub id: String,
    /// When it was made (ms since the Unix epoch).
    pub at_ms: u64,
    /// Who made it: `command <user>@<host>`, or `auto <worker>`.
    pub by: String,
    #[serde(flatten)]
    pub change: Change,
}

/// What changed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Change {
    /// No attempt starts for the target until `until_ms` (or a resume).
    Pause {
        target: Target,
        reason: Option<String>,
        until_ms: Option<u64>,
    },
    Resume {
        target: Target,
    },
    /// Its notifications are dead-lettered as `endpoint-disabled`. An
    /// automatic disable names the failing it judged (`failing_since_ms`),
    /// and applies only while that failing stands and nothing else holds
    /// the target.
    Disable {
        target: Target,
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failing_since_ms: Option<u64>,
    },
    Enable {
        target: Target,
    },
    /// A worker saw `failures` failed attempts, the first at `since_ms`,
    /// and no success after them.
    Failing {
        target: Target,
        since_ms: u64,
        failures: u64,
    },
    /// A worker saw a successful attempt at `success_ms`.
    Recovered {
        target: Target,
        success_ms: u64,
    },
    /// A worker claims the automatic disable of the failing that began at
    /// `failing_since_ms`; the first claim wins ([`super::state::Claim`]).
    Claim {
        target: Target,
        failing_since_ms: u64,
    },
    /// The whole state as its writer had folded it through offset
    /// `through`: a reader that finds the stream's start cut off by its
    /// retention starts from here.
    Snapshot {
        through: u64,
        keys: Vec<KeyState>,
    },
    /// A reader's marker: once its own comes back, it has read everything
    /// written before it.
    Sync,
    /// A type a newer build writes; skipped.
    #[serde(other)]
    Unknown,
}

impl Record {
    /// A new record with a fresh id.
    pub fn new(at_ms: u64, by: &str, change: Change) -> Record {
        Record::with_id(uuid::Uuid::new_v4().to_string(), at_ms, by, change)
    }

    pub fn with_id(id: String, at_ms: u64, by: &str, change: Change) -> Record {
        Record {
            v: VERSION,
            id,
            at_ms,
            by: by.to_string(),
            change,
        }
    }

    /// The target it is about, if any.
    pub fn target(&self) -> Option<&Target> {
        match &self.change {
            Change::Pause { target, .. }
            | Change::Resume { target }
            | Change::Disable { target, .. }
            | Change::Enable { target }
            | Change::Failing { target, .. }
            | Change::Recovered { target, .. }
            | Change::Claim { target, .. } => Some(target),
            _ => None,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// An operator's reason, trimmed and bounded; `None` when empty.
pub fn reason(text: Option<&str>) -> Option<String> {
    let t = text?.trim();
    (!t.is_empty()).then(|| t.chars().take(MAX_REASON).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_the_documented_wire_names() {
        let text = r#"{"v":1,"id":"a","at_ms":5,"by":"command ops@h","type":"pause",
            "target":"https://h.example/m/1/","reason":"maintenance","until_ms":99}"#;
        let r: Record = serde_json::from_str(text).expect("a pause");
        let Change::Pause {
            target, until_ms, ..
        } = &r.change
        else {
            panic!("{r:?}")
        };
        assert_eq!(target.to_string(), "https://h.example:443/m/1/");
        assert_eq!(*until_ms, Some(99));
        let back: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(back["type"], "pause");
        assert_eq!(back["target"], "https://h.example:443/m/1/");
        let newer =
            r#"{"v":2,"id":"b","at_ms":5,"by":"x","type":"quarantine","target":"https://h"}"#;
        let r: Record = serde_json::from_str(newer).expect("an unknown type reads");
        assert_eq!(r.change, Change::Unknown);
    }

    #[test]
    fn reasons_are_trimmed_and_bounded() {
        assert_eq!(reason(Some("  ")), None);
        assert_eq!(reason(Some(" x ")).as_deref(), Some("x"));
        assert_eq!(reason(Some(&"y".repeat(900))).unwrap().len(), MAX_REASON);
    }
}
