//! The stages of one delivery before its attempt: its concurrency
//! [`Slot`], the operator's gate (a paused or disabled target,
//! [`crate::control`]) and its endpoint's admission ([`crate::isolation`]).

use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::context::{Context, Done};
use super::copy::dead_letter_disabled;
use super::park::park;
use super::record as seam;
use crate::control::Gate;
use crate::isolation::{Admission, ProbeTurn};
use crate::message::state::RetryState;
use crate::message::Notification;
use crate::policy::DeadReason;
use crate::publish::PublishError;
use crate::telemetry::{self, GaugeGuard};

/// A delivery's place in the concurrency limit. It is freed as soon as the
/// HTTP attempt is over: waiting for a republish confirm, or the retry
/// settle, is not a request in flight. The prefetch room covers those.
/// Until its endpoint admits it, it also holds a parking place, which it
/// keeps only if it parks.
pub struct Slot {
    pub(super) permit: Option<SlotPermit>,
    pub(super) place: Option<OwnedSemaphorePermit>,
}

impl Slot {
    pub fn new(permit: OwnedSemaphorePermit, place: Option<OwnedSemaphorePermit>) -> Self {
        Slot {
            permit: Some((permit, GaugeGuard::new(telemetry::IN_FLIGHT))),
            place,
        }
    }

    pub(super) fn free(&mut self) {
        self.permit.take();
        self.place.take();
    }
}

/// A slot for a delivery that was parked, in turn with the consumer. While
/// every slot is taken it keeps asking the pump (`wanted`) to give back
/// the one it holds while it waits for the next delivery: with
/// `--concurrency 1` on a quiet queue that one would never come back.
pub(super) async fn take_slot(slots: &Arc<Semaphore>, wanted: &Notify) -> Option<SlotPermit> {
    let guard = |p| (p, GaugeGuard::new(telemetry::IN_FLIGHT));
    if let Ok(p) = slots.clone().try_acquire_owned() {
        return Some(guard(p));
    }
    let mut acquire = std::pin::pin!(slots.clone().acquire_owned());
    loop {
        // Ask at once: a pump that is never idle (a backlog) would
        // otherwise keep every slot a parked delivery waits for.
        wanted.notify_one();
        tokio::select! {
            p = &mut acquire => return p.ok().map(guard),
            _ = tokio::time::sleep(SLOT_NUDGE) => {}
        }
    }
}

/// How long a parked delivery waits for a slot before it nudges the pump.
const SLOT_NUDGE: Duration = Duration::from_millis(20);

type SlotPermit = (OwnedSemaphorePermit, GaugeGuard);

/// Its endpoint's answer, after waiting in its queue if it parked (then
/// `true`): go or defer.
pub(super) async fn admit<H>(
    ctx: &Context<H>,
    n: &Notification,
    slot: &mut Slot,
) -> (Admission, bool) {
    match ctx.endpoints.try_admit(&n.url, slot.place.take()) {
        // Alone, it waits for its endpoint with its slot: nobody else
        // needs it, and winning it back from the pump would cost time.
        Admission::Park(parked) if parked.keeps_slot() => {
            (parked.wait(|| std::future::ready(())).await.0, true)
        }
        Admission::Park(parked) => {
            // Waiting for its endpoint is not a request in flight.
            slot.free();
            let (slots, wanted) = (&ctx.slots, &ctx.slot_wanted);
            let (admission, permit) = parked.wait(|| take_slot(slots, wanted)).await;
            slot.permit = permit.flatten();
            (admission, true)
        }
        other => (other, false),
    }
}

/// A notification whose target an operator (or the automatic disable)
/// paused or disabled: parked without an attempt (`park.rs`), or dead-lettered as
/// `endpoint-disabled` with its history. `None`: neither, attempt it.
/// `probe`: it holds its breaker's probe already (it waited for its
/// endpoint after taking it).
pub(super) async fn held_back<H>(
    ctx: &Context<H>,
    d: &Delivery,
    st: &mut RetryState,
    n: &Notification,
    slot: &mut Slot,
    probe: bool,
) -> Option<Result<Done, PublishError>> {
    if ctx.control.gate(&n.url) == Gate::Go {
        return None;
    }
    // Asked again under the lock: a release waits for this park.
    let _entered = ctx.parking.read().await;
    let done = match ctx.control.gate(&n.url) {
        Gate::Go => return None,
        // Parked for its long-open breaker: this worker's breaker lets
        // one through as its probe when it is due (`control::breakers`).
        Gate::Paused {
            breaker_since: Some(since),
            ..
        } if probe || st.probe_candidate || probe_turn(ctx, n, st, since) => return None,
        Gate::Paused { target, .. } => {
            slot.free();
            park(ctx, d, st.clone(), n, &target).await
        }
        Gate::Disabled { target } => {
            slot.free();
            let record = seam::of_unattempted(ctx, n, st, DeadReason::EndpointDisabled);
            seam::confirmed(ctx, record, dead_letter_disabled(ctx, d, st, n, &target)).await
        }
    };
    Some(done)
}

/// Whether a delivery that meets its endpoint parked for its breaker goes
/// on: as its probe, or as this opening's candidate, marked so (`st`) for
/// whichever worker it comes back to.
fn probe_turn<H>(ctx: &Context<H>, n: &Notification, st: &mut RetryState, since: u64) -> bool {
    match ctx.endpoints.probe_turn(&n.url, since) {
        ProbeTurn::Go => true,
        ProbeTurn::Candidate => {
            st.probe_candidate = true;
            true
        }
        ProbeTurn::Park => false,
    }
}
