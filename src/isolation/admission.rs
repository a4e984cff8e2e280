//! What becomes of a delivery before its attempt ([`Admission`]), and a
//! delivery waiting for its endpoint: a [`Parked`] place in the
//! endpoint's queue, in arrival order, holding one of the worker's
//! parking places and no concurrency slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit};

use super::pass::{self, Pass};
use super::reason::DeferReason;
use super::state::{rate_wait_at, wake_front, Endpoint, State, PARK_TIMEOUT, PARK_WAIT};
use crate::policy::Gate;
use crate::telemetry;

/// How often a parked delivery looks whether its endpoint stalled, even
/// when no attempt ended.
const STALL_CHECK: Duration = Duration::from_millis(100);

/// What to do with a delivery before its attempt.
pub enum Admission {
    /// Attempt it now and report the result through the pass.
    Go(Pass),
    /// Give the concurrency slot back and [`Parked::wait`].
    Park(Parked),
    /// Republish it to come back after `wait` (at least; the worker adds
    /// jitter and backoff, see [`defer_delay`]). No attempt is spent.
    Defer { wait: Duration, reason: DeferReason },
}

/// The deferral for `wait` (see [`Endpoint::deferral`]).
pub(super) fn defer(
    ep: &Endpoint,
    st: &mut State,
    now: Instant,
    wait: Duration,
    reason: DeferReason,
) -> Admission {
    let (wait, reason) = ep.deferral(st, now, wait, reason);
    let now_ms = crate::clock::now_ms().max(0) as u64;
    st.activity
        .wait_until(now_ms, now_ms + wait.as_millis() as u64);
    Admission::Defer { wait, reason }
}

/// Lets the delivery go ([`pass::go`]), or defers it if the breaker says
/// no after all.
pub(super) fn go(ep: &Arc<Endpoint>, st: &mut State, now: Instant) -> Admission {
    match pass::go(ep, st, now) {
        Ok(p) => Admission::Go(p),
        Err((wait, reason)) => {
            let now_ms = crate::clock::now_ms().max(0) as u64;
            st.activity
                .wait_until(now_ms, now_ms + wait.as_millis() as u64);
            Admission::Defer { wait, reason }
        }
    }
}

/// A delivery waiting for its endpoint, holding one of the worker's
/// parking places (and no concurrency slot) until [`Parked::wait`] ends.
pub struct Parked {
    ep: Arc<Endpoint>,
    _place: OwnedSemaphorePermit,
    ticket: u64,
    /// Woken when it is first in the queue and room may have come.
    wake: Arc<Notify>,
    /// Keeps its concurrency slot while it waits: parked when no other
    /// endpoint had work, nobody needs the slot, and handing it back and
    /// winning it again from the worker's pump would only cost time.
    keeps_slot: bool,
    /// Still in the endpoint's queue.
    queued: bool,
    /// Let go by the endpoint (counted in its `reserved`), not attempted yet.
    reserved: bool,
}

impl Parked {
    pub(super) fn new(
        ep: Arc<Endpoint>,
        st: &mut State,
        place: OwnedSemaphorePermit,
        keeps_slot: bool,
    ) -> Self {
        st.next_ticket += 1;
        let (ticket, wake) = (st.next_ticket, Arc::new(Notify::new()));
        st.queue.push_back((ticket, wake.clone()));
        metrics::gauge!(telemetry::PARKED).increment(1.0);
        metrics::gauge!(telemetry::ENDPOINT_PARKED, "endpoint" => ep.label.clone()).increment(1.0);
        Parked {
            ep,
            _place: place,
            ticket,
            wake,
            keeps_slot,
            queued: true,
            reserved: false,
        }
    }

    /// Whether it waits holding its concurrency slot (see the field).
    pub fn keeps_slot(&self) -> bool {
        self.keeps_slot
    }

    /// Waits, in arrival order, until the endpoint has room, then for its
    /// rate turn, then for a worker slot from `take_slot` (dropping what
    /// it returns gives the slot back). The rate turn is taken only with
    /// the slot in hand, so deliveries that waited for slots never start
    /// together above the rate. Ends in `Go` with the slot, or in `Defer`
    /// (without one) when the endpoint stalled or its wait grew too long
    /// ([`gives_up`]), its breaker opened or paused it meanwhile, its
    /// rate turn is far, or no worker slot came within [`PARK_TIMEOUT`].
    pub async fn wait<S, F, Fut>(mut self, mut take_slot: F) -> (Admission, Option<S>)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = S>,
    {
        if let Err(deferred) = self.acquire().await {
            return (deferred, None);
        }
        loop {
            if let Err(deferred) = self.until_turn().await {
                return (deferred, None);
            }
            // Bounded: the worker's slots may all be held by deliveries
            // parked behind this one that kept theirs (they parked while
            // their endpoint was alone, `keeps_slot`), each waiting for
            // the room this one holds. Neither side would ever let go
            // (the likely cause of a worker CI saw go silent for minutes
            // with 70 deliveries unfinished). Giving the turn back breaks it.
            let Ok(slot) = tokio::time::timeout(PARK_TIMEOUT, take_slot()).await else {
                return (self.no_slot(), None);
            };
            let now = Instant::now();
            let mut st = self.ep.state();
            if !rate_wait_at(&self.ep, &st, now).is_zero() {
                // Another delivery took this turn meanwhile.
                continue;
            }
            st.reserved = st.reserved.saturating_sub(1);
            self.reserved = false;
            return (go(&self.ep, &mut st, now), Some(slot));
        }
    }

    /// The deferral of a delivery let go by its endpoint that found no
    /// worker slot within [`PARK_TIMEOUT`]; the room it held goes to the
    /// next in the queue when it is dropped.
    fn no_slot(&self) -> Admission {
        let now = Instant::now();
        let mut st = self.ep.state();
        defer(&self.ep, &mut st, now, PARK_WAIT, DeferReason::Busy)
    }

    /// Waits until it is first in its endpoint's queue and the endpoint
    /// has room, woken when an attempt ends and every [`STALL_CHECK`];
    /// `Err` with the deferral when it gives up.
    async fn acquire(&mut self) -> Result<(), Admission> {
        let started = Instant::now();
        let wake = self.wake.clone();
        loop {
            if let Some(done) = self.try_take(started) {
                return done;
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(STALL_CHECK) => {}
            }
        }
    }

    /// Takes the endpoint's room if it is this one's turn (`Ok`), gives up
    /// (`Err`, the deferral), or neither (`None`: keep waiting).
    fn try_take(&mut self, started: Instant) -> Option<Result<(), Admission>> {
        let now = Instant::now();
        let ep = self.ep.clone();
        let mut st = ep.state();
        ep.check(&mut st, now);
        let first = st.queue.front().map(|(t, _)| *t);
        if first == Some(self.ticket) && ep.has_room(&st) {
            st.queue.pop_front();
            st.reserved += 1;
            (self.queued, self.reserved) = (false, true);
            // The next one may have room too.
            wake_front(&st);
            return Some(Ok(()));
        }
        let ahead = st.queue.iter().position(|(t, _)| *t == self.ticket);
        let ahead = ahead.unwrap_or(0);
        let estimate = ep.park_estimate(&st, now, ahead);
        if !gives_up(&ep, &st, now, estimate, started) {
            return None;
        }
        st.queue.retain(|(t, _)| *t != self.ticket);
        self.queued = false;
        wake_front(&st);
        let wait = estimate.max(PARK_WAIT);
        Some(Err(defer(&ep, &mut st, now, wait, DeferReason::Busy)))
    }

    /// Sleeps until the endpoint's rate allows an attempt, if that is near
    /// ([`PARK_WAIT`]); `Err` with the deferral otherwise, or when its
    /// breaker is open or it is paused.
    async fn until_turn(&self) -> Result<(), Admission> {
        let wait = {
            let now = Instant::now();
            let mut st = self.ep.state();
            let breaker = &self.ep.limits.breaker;
            if let Gate::Wait(wait, why) = st.breaker.gate(now, breaker, false) {
                return Err(defer(&self.ep, &mut st, now, wait, why.into()));
            }
            match rate_wait_at(&self.ep, &st, now) {
                w if w > PARK_WAIT => {
                    return Err(defer(&self.ep, &mut st, now, w, DeferReason::Rate))
                }
                w => w,
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

/// Whether a parked delivery stops waiting and is deferred: its endpoint
/// makes no progress, its turn is further off than it may wait
/// ([`Endpoint::park_bound`]), or, while other endpoints have work, it
/// waited [`PARK_TIMEOUT`] already.
fn gives_up(ep: &Endpoint, st: &State, now: Instant, estimate: Duration, since: Instant) -> bool {
    let waited = now.saturating_duration_since(since);
    ep.stalled(st, now)
        || estimate > ep.park_bound()
        || (ep.shares.contended() && waited >= PARK_TIMEOUT)
}

impl Drop for Parked {
    fn drop(&mut self) {
        {
            let mut st = self.ep.state();
            if self.queued {
                st.queue.retain(|(t, _)| *t != self.ticket);
            }
            if self.reserved {
                st.reserved = st.reserved.saturating_sub(1);
            }
            if self.queued || self.reserved {
                wake_front(&st);
            }
        }
        metrics::gauge!(telemetry::PARKED).decrement(1.0);
        let label = self.ep.label.clone();
        metrics::gauge!(telemetry::ENDPOINT_PARKED, "endpoint" => label).decrement(1.0);
    }
}
