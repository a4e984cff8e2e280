//! The shared endpoint state, folded from the stream's records: what is
//! paused or disabled, by whom and why, since when each endpoint has been
//! failing, and each target's recent history. Pure: every worker applies
//! the same records in the same order and gets the same book.
//!
//! Reading starts at the stream's first record. When retention has cut
//! the stream's start off, the records before the first usable snapshot
//! are kept aside until it comes ([`Book::apply`]).

use std::collections::BTreeMap;

use super::record::{Change, Record};
pub use super::state::{Entry, KeyState, Mode};
use crate::message::target::Target;

/// A target with nothing in force and nothing failing is forgotten this
/// long after its last change (the stream's own retention).
pub const FORGET_AFTER_MS: u64 = 7 * 86_400_000;

/// The folded state.
#[derive(Clone, Debug, Default)]
pub struct Book {
    keys: BTreeMap<Target, KeyState>,
    /// The offset of the last record applied.
    through: Option<u64>,
    /// Everything before `through` is in: the stream started at offset 0,
    /// or a snapshot covered what retention cut off.
    complete: bool,
    first_offset: Option<u64>,
    /// Records read before a usable snapshot, while not complete.
    pending: Vec<(u64, Record)>,
    /// When the newest snapshot was made, and records since it.
    last_snapshot_ms: Option<u64>,
    since_snapshot: u64,
}

/// What applying one record did, for the caller to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A pause, resume, disable or enable took effect.
    Control,
    /// Anything else, or nothing.
    Other,
}

impl Book {
    /// Applies the record at `offset` (offsets come in increasing order).
    pub fn apply(&mut self, offset: u64, r: Record) -> Applied {
        let first = *self.first_offset.get_or_insert(offset);
        if offset == 0 {
            self.complete = true;
        }
        if let Change::Snapshot { through, keys } = &r.change {
            self.last_snapshot_ms = Some(r.at_ms);
            self.since_snapshot = 0;
            // Usable if it covers everything up to the first record read.
            if !self.complete && through.saturating_add(1) >= first {
                self.adopt(*through, keys.clone());
                return Applied::Control;
            }
            return Applied::Other;
        }
        self.since_snapshot += 1;
        if !self.complete {
            self.pending.push((offset, r));
            return Applied::Other;
        }
        self.through = Some(offset);
        self.fold(&r)
    }

    /// Takes a snapshot's keys, then the records read since it.
    fn adopt(&mut self, through: u64, keys: Vec<KeyState>) {
        self.keys = keys.into_iter().map(|k| (k.target.clone(), k)).collect();
        self.complete = true;
        self.through = Some(through);
        for (offset, r) in std::mem::take(&mut self.pending) {
            if offset > through {
                self.through = Some(offset);
                self.fold(&r);
            }
        }
    }

    /// Called once the reader caught up. If the stream's start was cut off
    /// and no snapshot covered it, folds what there is; returns `true`
    /// then (older changes may be missing).
    pub fn settle(&mut self) -> bool {
        if self.complete || self.first_offset.is_none() {
            self.complete = true;
            return false;
        }
        self.complete = true;
        for (offset, r) in std::mem::take(&mut self.pending) {
            self.through = Some(offset);
            self.fold(&r);
        }
        true
    }

    fn fold(&mut self, r: &Record) -> Applied {
        let Some(target) = r.target() else {
            return Applied::Other;
        };
        let k = self
            .keys
            .entry(target.clone())
            .or_insert_with(|| KeyState::new(target.clone()));
        k.updated_ms = k.updated_ms.max(r.at_ms);
        match &r.change {
            Change::Failing {
                since_ms, failures, ..
            } => failing(k, *since_ms, *failures),
            Change::Recovered { success_ms, .. } => recovered(k, *success_ms),
            _ => return operator(k, r),
        }
        Applied::Other
    }

    pub fn get(&self, target: &Target) -> Option<&KeyState> {
        self.keys.get(target)
    }

    pub fn keys(&self) -> impl Iterator<Item = &KeyState> {
        self.keys.values()
    }

    pub fn through(&self) -> Option<u64> {
        self.through
    }

    /// Whether a snapshot is due: one is made at most every `every`, and
    /// only when something was written since the last.
    pub fn snapshot_due(&self, now_ms: u64, every_ms: u64) -> bool {
        self.complete
            && self.since_snapshot > 0
            && self
                .last_snapshot_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= every_ms)
    }

    /// The keys worth keeping, for a snapshot; forgets the others.
    pub fn compact(&mut self, now_ms: u64) -> Vec<KeyState> {
        self.keys.retain(|_, k| {
            k.control != Mode::Active
                || k.failing_since_ms.is_some()
                || now_ms.saturating_sub(k.updated_ms) < FORGET_AFTER_MS
        });
        self.keys.values().cloned().collect()
    }
}

/// An operator's change (or the automatic disable, or a pause's end). A
/// resume of what is not paused, an enable of what is not disabled and a
/// second disable change nothing, and are not in the history.
fn operator(k: &mut KeyState, r: &Record) -> Applied {
    let entry = |what: &str, reason: &Option<String>, until_ms| Entry {
        at_ms: r.at_ms,
        what: what.into(),
        by: r.by.clone(),
        reason: reason.clone(),
        until_ms,
        id: r.id.clone(),
    };
    match &r.change {
        Change::Pause {
            reason, until_ms, ..
        } => {
            let mode = Mode::Paused {
                since_ms: r.at_ms,
                until_ms: *until_ms,
                reason: reason.clone(),
                by: r.by.clone(),
                id: r.id.clone(),
            };
            k.set(mode, entry("paused", reason, *until_ms));
        }
        Change::Resume { .. } if matches!(k.control, Mode::Paused { .. }) => {
            let what = match r.id.starts_with(EXPIRED) {
                true => "pause expired",
                false => "resumed",
            };
            k.set(Mode::Active, entry(what, &None, None));
        }
        Change::Disable { reason, .. } if !matches!(k.control, Mode::Disabled { .. }) => {
            let mode = Mode::Disabled {
                since_ms: r.at_ms,
                reason: reason.clone(),
                by: r.by.clone(),
            };
            k.set(mode, entry("disabled", reason, None));
        }
        Change::Enable { .. } if matches!(k.control, Mode::Disabled { .. }) => {
            k.set(Mode::Active, entry("enabled", &None, None));
        }
        _ => return Applied::Other,
    }
    Applied::Control
}

/// The id prefix of the resume that ends an expired pause.
pub const EXPIRED: &str = "expired:";

/// A worker's failures. While a target is paused or disabled no attempt is
/// made; a report from before the change says nothing now.
fn failing(k: &mut KeyState, since_ms: u64, failures: u64) {
    if k.control != Mode::Active {
        return;
    }
    match k.failing_since_ms {
        Some(_) => k.failures = k.failures.saturating_add(failures),
        None => {
            // Not before the last success another worker reported.
            let after = k.last_success_ms.map_or(0, |s| s + 1);
            k.failing_since_ms = Some(since_ms.max(after));
            k.failures = failures;
        }
    }
}

/// A worker's success ends the failing, unless it is older than it.
fn recovered(k: &mut KeyState, success_ms: u64) {
    k.last_success_ms = Some(k.last_success_ms.map_or(success_ms, |s| s.max(success_ms)));
    if k.failing_since_ms.is_some_and(|since| success_ms >= since) {
        k.failing_since_ms = None;
        k.failures = 0;
    }
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
