//! One worker's copy of the shared state, across its connections: the
//! folded book, the table every delivery asks, the planner's carry, and
//! what this worker held back. The follow and tick tasks (`follow.rs`)
//! write to it; [`super::Control`] reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use super::book::{Applied, Book};
use super::plan::{Carry, PlanSettings};
use super::record::Record;
use super::reports::HeldReport;
use super::table::Table;
use crate::message::target::Target;

pub(super) struct Shared {
    pub(super) plan: PlanSettings,
    /// `auto host/pid`: how this worker signs its records.
    pub(super) me: String,
    /// `host/pid`, in its reports.
    pub(super) worker: String,
    /// What is in force now; replaced whole when a control changes. Read
    /// by every delivery without a lock or a shared counter's write.
    table: ArcSwap<Table>,
    /// Whether the table holds anything: with nothing paused or disabled,
    /// a delivery pays one atomic load.
    any: AtomicBool,
    /// Whether the state was read whole at least once.
    installed: AtomicBool,
    pub(super) book: Mutex<Book>,
    pub(super) carry: Mutex<Carry>,
    held: Mutex<HashMap<Target, Held>>,
    /// Pauses lifted by a record, for the worker's unpark to release
    /// ([`Shared::take_released`]); `release_wanted` wakes it.
    released: Mutex<Vec<Target>>,
    pub(super) release_wanted: tokio::sync::Notify,
    /// Changes this worker wrote that took effect, whose events are still
    /// to be published (by the tick, `follow.rs`).
    pub(super) to_announce: Mutex<Vec<Record>>,
    /// Changes this worker is writing or wrote, not yet read back: a
    /// reader opened afresh meanwhile (`install`) may take them in
    /// without `apply`, and their events must not be lost with it.
    pub(super) written: Mutex<Vec<Record>>,
}

/// What this worker held back for one paused or disabled target.
#[derive(Default)]
struct Held {
    dead: u64,
    /// Parked by this worker since the pause began.
    parked: u64,
}

impl Shared {
    pub(super) fn new(plan: PlanSettings, worker: String) -> Shared {
        Shared {
            plan,
            me: format!("auto {worker}"),
            worker,
            table: ArcSwap::from_pointee(Table::default()),
            any: AtomicBool::new(false),
            installed: AtomicBool::new(false),
            book: Mutex::new(Book::default()),
            carry: Mutex::new(Carry::default()),
            held: Mutex::new(HashMap::new()),
            released: Mutex::new(Vec::new()),
            release_wanted: tokio::sync::Notify::new(),
            to_announce: Mutex::new(Vec::new()),
            written: Mutex::new(Vec::new()),
        }
    }

    /// Whether anything is paused or disabled (then ask [`Shared::table`]).
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub(super) fn table(&self) -> Arc<Table> {
        self.table.load_full()
    }

    /// The table for one lookup, cheaper than [`Shared::table`].
    pub(super) fn with_table<T>(&self, f: impl FnOnce(&Table) -> T) -> T {
        f(&self.table.load())
    }

    /// Installs what is in force now, then hands the pauses it lifted to
    /// the unpark (after the store: a park that starts later sees them
    /// lifted, and one under way is waited for, `crate::worker`'s park).
    fn set_table(&self, table: Table) {
        let any = !table.is_empty();
        let before = self.table.swap(Arc::new(table));
        self.any.store(any, Ordering::Release);
        if before.is_empty() {
            return;
        }
        let now = now_ms();
        let mut lifted = super::release::released(&before, &self.table.load(), now);
        // Pauses that ran out before this table replaced theirs, in case
        // the unpark had not looked yet (a second release costs one read).
        lifted.extend(super::release::ended(&before, 0, now));
        if !lifted.is_empty() {
            lock(&self.released).extend(lifted);
            self.release_wanted.notify_one();
        }
    }

    /// The pauses lifted by records since the last call.
    pub(super) fn take_released(&self) -> Vec<Target> {
        std::mem::take(&mut *lock(&self.released))
    }

    /// Replaces the whole state (a new connection read it afresh).
    pub(super) fn install(&self, book: Book) {
        // What this worker wrote is in the book, or comes after it.
        let mut announce = lock(&self.to_announce);
        for r in lock(&self.written).drain(..) {
            let queued = announce.iter().any(|a| a.id == r.id);
            if !queued && super::announce::took(&book, &r) {
                announce.push(r);
            }
        }
        drop(announce);
        let table = Table::build(&book, now_ms());
        *lock(&self.book) = book;
        self.set_table(table);
        self.installed.store(true, Ordering::Release);
    }

    /// Whether the state was read whole at least once.
    pub(super) fn has_state(&self) -> bool {
        self.installed.load(Ordering::Acquire)
    }

    /// Applies one record from the stream; a change of this worker's own
    /// that took effect is queued for its event.
    pub(super) fn apply(&self, offset: u64, r: Record) {
        let mut book = lock(&self.book);
        let mine = (r.by == self.me).then(|| r.clone());
        if mine.is_some() {
            lock(&self.written).retain(|w| w.id != r.id);
        }
        if book.apply(offset, r) == Applied::Control {
            self.set_table(Table::build(&book, now_ms()));
            if let Some(r) = mine.filter(|r| super::announce::took(&book, r)) {
                lock(&self.to_announce).push(r);
            }
        }
    }

    /// Notes a stream message that is no record.
    pub(super) fn skip(&self, offset: u64) {
        lock(&self.book).skip(offset);
    }

    pub(super) fn parked(&self, target: &Target) {
        lock(&self.held).entry(target.clone()).or_default().parked += 1;
    }

    pub(super) fn dead_lettered(&self, target: &Target) {
        lock(&self.held).entry(target.clone()).or_default().dead += 1;
    }

    /// This worker's held-back counts per target still paused or
    /// disabled, for its report; the others are forgotten.
    pub(super) fn held_reports(&self) -> Vec<HeldReport> {
        let now = now_ms();
        let table = self.table();
        let in_force = |t: &Target| table.covering(t, now).is_some_and(|(by, _)| by == t);
        let mut held = lock(&self.held);
        held.retain(|t, _| in_force(t));
        held.iter_mut()
            .map(|(t, h)| HeldReport {
                target: t.clone(),
                // Parked now, not deferred: kept for earlier readers.
                waiting: 0,
                dead_lettered: h.dead,
                parked: h.parked,
            })
            .collect()
    }
}

/// A lock even if a holder panicked: the state is whole between records.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The wall clock in ms, as records carry it.
pub(super) fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}
