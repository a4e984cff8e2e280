//! The shared endpoint state, folded from the stream's records: what is
//! paused or disabled, by whom and why, since when each endpoint has been
//! failing, and each target's recent history. Pure: every worker applies
//! the same records in the same order ([`super::fold`]) and gets the same
//! book.
//!
//! Reading starts at the stream's first record. When retention has cut
//! the stream's start off, the records before the first snapshot that
//! covers them are kept aside until it comes ([`Book::apply`]); a reader
//! that finds none folds what there is ([`Book::settle`]) and still takes
//! the next snapshot that covers it.

use std::collections::{BTreeMap, VecDeque};

use super::fold;
pub use super::fold::{BREAKER_PAUSE, EXPIRED, PROBED};
use super::record::{Change, Record};
pub use super::state::{Claim, Entry, KeyState, Mode, FORGET_AFTER_MS};
use crate::message::target::Target;

/// Records kept aside at most while no snapshot covers the start.
const MAX_PENDING: usize = 100_000;

/// How far the book is from the whole stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// The start was cut off: records wait for a covering snapshot.
    #[default]
    Reading,
    /// Everything is in: the stream starts at offset 0, or a snapshot
    /// covered what retention cut off.
    Whole,
    /// Settled without a covering snapshot: records are folded, and kept
    /// aside too, for the next snapshot that covers them. Such a book
    /// writes no snapshot: it would pass its gap on as whole.
    Lossy,
}

/// The folded state.
#[derive(Clone, Debug, Default)]
pub struct Book {
    keys: BTreeMap<Target, KeyState>,
    /// The offset of the last record applied.
    through: Option<u64>,
    phase: Phase,
    /// Records read while not whole, and the first offset they (or the
    /// ones dropped past [`MAX_PENDING`]) started at.
    pending: VecDeque<(u64, Record)>,
    kept_from: Option<u64>,
    /// When the newest snapshot was made, its size, and records since it.
    last_snapshot_ms: Option<u64>,
    last_snapshot_keys: usize,
    since_snapshot: u64,
}

/// What applying one record did, for the caller to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A pause, resume, disable or enable took effect (or a snapshot
    /// replaced the state).
    Control,
    /// Anything else, or nothing.
    Other,
}

impl Book {
    /// Applies the record at `offset` (offsets come in increasing order).
    pub fn apply(&mut self, offset: u64, r: Record) -> Applied {
        let from = self.start_at(offset);
        if let Change::Snapshot { through, keys } = &r.change {
            return self.snapshot(offset, from, *through, keys, r.at_ms);
        }
        self.since_snapshot += 1;
        if self.phase != Phase::Whole {
            self.keep(offset, r.clone());
            if self.phase == Phase::Reading {
                return Applied::Other;
            }
        }
        self.through = Some(offset);
        self.fold(&r)
    }

    /// Notes a message at `offset` that is no record (someone else's on
    /// the stream): it still tells where the stream starts.
    pub fn skip(&mut self, offset: u64) {
        self.start_at(offset);
        if self.phase == Phase::Whole {
            self.through = Some(offset);
        }
    }

    /// The first offset read; a stream read from offset 0 is whole.
    fn start_at(&mut self, offset: u64) -> u64 {
        let from = *self.kept_from.get_or_insert(offset);
        if offset == 0 && self.phase == Phase::Reading {
            self.phase = Phase::Whole;
        }
        from
    }

    /// A snapshot: adopted if the book is not whole and it covers the
    /// records kept aside; else a whole book forgets what is stale, as its
    /// writer left it out.
    fn snapshot(
        &mut self,
        offset: u64,
        from: u64,
        through: u64,
        keys: &[KeyState],
        at: u64,
    ) -> Applied {
        (self.last_snapshot_ms, self.last_snapshot_keys) = (Some(at), keys.len());
        self.since_snapshot = 0;
        if self.phase != Phase::Whole && through.saturating_add(1) >= from {
            self.adopt(through, keys.to_vec());
            return Applied::Control;
        }
        if self.phase == Phase::Whole {
            self.through = Some(offset);
            self.keys.retain(|_, k| !k.is_stale(at));
        }
        Applied::Other
    }

    fn keep(&mut self, offset: u64, r: Record) {
        self.pending.push_back((offset, r));
        if self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
            self.kept_from = self.pending.front().map(|(o, _)| *o);
        }
    }

    /// Takes a snapshot's keys, then the records read since it.
    fn adopt(&mut self, through: u64, keys: Vec<KeyState>) {
        self.keys = keys.into_iter().map(|k| (k.target.clone(), k)).collect();
        self.phase = Phase::Whole;
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
    /// then (older changes may be missing until a snapshot covers them).
    pub fn settle(&mut self) -> bool {
        if self.phase != Phase::Reading {
            return self.phase == Phase::Lossy;
        }
        if self.kept_from.is_none() {
            self.phase = Phase::Whole;
            return false;
        }
        self.phase = Phase::Lossy;
        let kept: Vec<_> = self.pending.iter().cloned().collect();
        for (offset, r) in kept {
            self.through = Some(offset);
            self.fold(&r);
        }
        true
    }

    /// Whether everything in the stream is in (see [`Book::settle`]).
    pub fn is_whole(&self) -> bool {
        self.phase == Phase::Whole
    }

    fn fold(&mut self, r: &Record) -> Applied {
        let Some(target) = r.target() else {
            return Applied::Other;
        };
        let k = self
            .keys
            .entry(target.clone())
            .or_insert_with(|| KeyState::new(target.clone()));
        match fold::apply(k, r) {
            true => Applied::Control,
            false => Applied::Other,
        }
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

    /// Whether a snapshot is due: from a whole book only, when something
    /// was written since the last, and at most every [`snapshot_every`]
    /// for the state's size (plus `spread_ms`, this writer's share).
    pub fn snapshot_due(&self, now_ms: u64, spread_ms: u64) -> bool {
        let every = snapshot_every(self.last_snapshot_keys.max(self.keys.len())) + spread_ms;
        self.phase == Phase::Whole
            && self.since_snapshot > 0
            && self
                .last_snapshot_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= every)
    }

    /// The keys a snapshot made now keeps: none that is stale.
    pub fn snapshot_keys(&self, now_ms: u64) -> Vec<KeyState> {
        self.keys
            .values()
            .filter(|k| !k.is_stale(now_ms))
            .cloned()
            .collect()
    }
}

/// How often a snapshot is written: hourly for a small state, less often
/// for a large one (two minutes per target), so that a week of snapshots
/// stays a few megabytes, but at least every 3 days, well within the
/// stream's 7 days of retention.
pub fn snapshot_every(keys: usize) -> u64 {
    (keys as u64 * 120_000).clamp(3_600_000, 3 * 86_400_000)
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
