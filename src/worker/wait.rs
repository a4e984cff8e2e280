//! Short deferrals taken in the worker: the executor of
//! [`crate::policy::wait`]. A delivery its endpoint defers for a short
//! wait keeps its place here, unacked, holding a seat in the worker's
//! [`WaitRoom`], and asks its endpoint again when the wait is over. It
//! holds no concurrency slot and no parking place meanwhile, and counts
//! as held on its consumer, which the feed replaces when too many are
//! (`feed.rs`), so waiting deliveries never take the prefetch from the
//! ones to attempt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::feed::{Held, Lease};
use crate::policy::wait::{plan, WaitPlan, BYTES_MAX};
use crate::telemetry;

/// The worker's room for waiting deliveries: `--max-waiting` seats and
/// [`BYTES_MAX`] of bodies (counted in KiB). Shared by every session.
pub struct WaitRoom {
    seats: Arc<Semaphore>,
    kib: Arc<Semaphore>,
}

impl WaitRoom {
    pub fn new(max_waiting: usize) -> Self {
        metrics::gauge!(telemetry::WAITING).set(0.0);
        metrics::counter!(telemetry::WAITS).increment(0);
        metrics::counter!(telemetry::REPUBLISHED_DEFERRALS).increment(0);
        WaitRoom {
            seats: Arc::new(Semaphore::new(max_waiting)),
            kib: Arc::new(Semaphore::new(BYTES_MAX / 1024)),
        }
    }

    /// A seat for a delivery of `bytes`, if one is free now (never waits:
    /// without room the delivery goes through the delay backend).
    fn enter(&self, bytes: usize, lease: &Lease) -> Option<Seat> {
        let seat = self.seats.clone().try_acquire_owned().ok()?;
        let kib = u32::try_from(bytes / 1024 + 1).ok()?;
        let body = self.kib.clone().try_acquire_many_owned(kib).ok()?;
        Some(Seat {
            _permits: (seat, body),
            _held: lease.hold_waiting(),
        })
    }
}

/// A waiting delivery's place: given back when it is dropped.
struct Seat {
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    _held: Held,
}

/// One delivery's waits in the worker so far.
#[derive(Default)]
pub(super) struct Waits {
    total: Duration,
}

/// Waits here for a deferral of `wait` when the plan says so and the room
/// has a seat: `true` once the wait is over (or the worker began to stop),
/// to ask the endpoint again; `false`: defer it through the delay backend.
/// The seat is held only for the wait itself: a delivery asking its
/// endpoint again, or attempted, no longer counts as waiting.
pub(super) async fn wait_here(
    (room, stopping): (&WaitRoom, &CancellationToken),
    lease: &Lease,
    bytes: usize,
    wait: Duration,
    waits: &mut Waits,
) -> bool {
    let stop = stopping.is_cancelled();
    let turn = match plan(wait, waits.total, stop, rand::rng().random()) {
        WaitPlan::InWorker(turn) => turn,
        WaitPlan::Republish => return false,
    };
    let Some(_seat) = room.enter(bytes, lease) else {
        return false;
    };
    metrics::counter!(telemetry::WAITS).increment(1);
    let started = Instant::now();
    tokio::select! {
        _ = tokio::time::sleep(turn) => {}
        // Stopping: ask again now, and go through the delay backend.
        _ = stopping.cancelled() => {}
    }
    waits.total += started.elapsed();
    true
}
