//! One delivery's path through the worker, in stages:
//! decode → admit (its endpoint: go, park or defer, [`crate::isolation`]) →
//! attempt (HTTP) → judge (pure: [`crate::policy::decide`]) → report (log,
//! metrics, events) → copy (republish the retry, deferral or dead letter,
//! confirmed; `copy.rs`) → settle (ack, hold then ack, or requeue).
//!
//! The original is acked only after its copy was confirmed, never before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::message::Delivery;

use tracing::{info, warn};

use super::admit::{admit, held_back, take_slot, Slot};
use super::context::{effective_policy, Context, Done, HttpSpan};
use super::copy::{copy, dead_letter_expired, dead_letter_invalid, defer};
use super::feed::Lease;
use super::notify;
use super::record::{self as seam, Seen};
use super::traced;
use super::wait::{wait_here, Waits};
use crate::clock::now_ms;
use crate::config::{AttemptEvent, WorkerSettings};
use crate::deliver::DeliveryHandler;
use crate::isolation::{Admission, DeferReason, Outcome, Pass, PARK_WAIT};
use crate::message::state::{AttemptRecord, RetryState};
use crate::message::{self, InvalidMessage, Notification};
use crate::policy::{
    self, decide, Action, AttemptResult, Classified, DeadReason, Decision, Verdict,
};
use crate::publish::PublishError;
use crate::telemetry;

/// How long a delivery whose republish failed waits before it is requeued,
/// so a broken broker path is not hammered with HTTP attempts.
const REQUEUE_BACKOFF: Duration = Duration::from_secs(1);

/// Processes one delivery, from decoding to its ack (or requeue). `lease`
/// keeps the channel it arrived on open until then; `pulled` is when the
/// worker took it off the consumer, for the overhead trace.
pub async fn process<H: DeliveryHandler>(
    ctx: Arc<Context<H>>,
    d: Delivery,
    lease: Lease,
    pulled: Instant,
    mut slot: Slot,
) {
    if d.redelivered {
        // At-least-once at work: an earlier delivery was not settled.
        info!(
            tag = d.delivery_tag,
            "redelivered message (a possible duplicate)"
        );
    }
    let done = tokio::select! {
        r = handle(&ctx, &d, &lease, &mut slot) => Some(r),
        _ = ctx.hard_stop.cancelled() => None,
    };
    drop(slot);
    // Only the lease (its tag) outlives the delivery: a retried original
    // held for `--retry-settle` keeps no body in memory.
    drop(d);
    settle(&ctx, lease, done, pulled).await;
}

/// Acks once the copy is confirmed; holds a retried original for the
/// settle first; requeues when the copy failed or shutdown cut it short.
async fn settle<H>(
    ctx: &Context<H>,
    lease: Lease,
    done: Option<Result<Done, PublishError>>,
    pulled: Instant,
) {
    match done {
        Some(Ok(Done::Retried)) if !ctx.settings.retry_settle.is_zero() => {
            hold_then_ack(ctx, lease)
        }
        Some(Ok(Done::Ack(span))) => {
            lease.ack();
            if let Some(span) = span {
                trace_overhead(pulled, span);
            }
        }
        Some(Ok(Done::Retried)) => lease.ack(),
        Some(Err(e)) => {
            warn!(error = %e, "republish not confirmed; requeueing the original");
            let cure = match &e {
                PublishError::Unroutable | PublishError::ConfirmTimeout(_) => true,
                PublishError::History(h) => h.wants_new_connection(),
                _ => false,
            };
            if cure {
                ctx.broken.cancel();
            }
            tokio::select! {
                _ = tokio::time::sleep(REQUEUE_BACKOFF) => {}
                _ = ctx.hard_stop.cancelled() => {}
            }
            lease.requeue()
        }
        None => lease.requeue(),
    }
}

/// Keeps a retried original unacked for `--retry-settle` after its copy was
/// confirmed: the upstream delayed-message plugin confirms before its disk
/// write, and a broker crash in that window would lose the copy. Until the
/// ack, the broker would redeliver the original instead. Counted as held
/// on its consumer, which the feed replaces when too many are.
///
/// The hold is a small task of its own on the session's tracker, so the
/// delivery's task (sized for an HTTP attempt) ends now: thousands of held
/// originals cost their leases, not thousands of attempts' state.
fn hold_then_ack<H>(ctx: &Context<H>, lease: Lease) {
    let (held, settle, stop) = (
        lease.hold(),
        ctx.settings.retry_settle,
        ctx.hard_stop.clone(),
    );
    ctx.tracker.spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(settle) => lease.ack(),
            // Shutting down before the settle is over: requeue (a duplicate at worst).
            _ = stop.cancelled() => lease.requeue(),
        }
        drop(held);
    });
}

/// The worker's own time around a successful attempt, at debug level on
/// target `redeliver::timing`: from taking the delivery to calling the
/// handler, and from its answer to the ack being handed to its channel's
/// ack task. `redeliver bench`
/// reads it; it is off unless asked for (`RUST_LOG=redeliver::timing=debug`).
fn trace_overhead(pulled: Instant, span: HttpSpan) {
    tracing::debug!(
        target: "redeliver::timing",
        pre_us = span.start.saturating_duration_since(pulled).as_micros() as u64,
        post_us = span.end.elapsed().as_micros() as u64,
        "worker overhead"
    );
}

/// Decodes, then admits and attempts; what cannot be decoded is
/// dead-lettered as `invalid`, what is past its max age as `expired`.
/// `Ok` means: ack it (after the settle, for a retry or deferral).
async fn handle<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    lease: &Lease,
    slot: &mut Slot,
) -> Result<Done, PublishError> {
    let (n, mut st) = match decode(&ctx.settings, d) {
        Ok(decoded) => decoded,
        Err(e) => {
            slot.free();
            let id = d.properties.message_id().as_ref().map(|m| m.to_string());
            let record = seam::of_invalid(ctx, id.as_deref(), &e.to_string());
            let dead = async {
                dead_letter_invalid(ctx, d, &e)
                    .await
                    .map(|()| Done::Ack(None))
            };
            return seam::confirmed(ctx, record, dead).await;
        }
    };
    let age = Duration::from_millis(st.age_ms(now_ms()));
    if effective_policy(&ctx.settings, &n).expired(age) {
        slot.free();
        let record = seam::of_unattempted(ctx, &n, &st, DeadReason::Expired);
        return seam::confirmed(ctx, record, dead_letter_expired(ctx, d, &st, &n)).await;
    }
    let mut waits = Waits::default();
    loop {
        // Back from a wait in the worker: a slot first, so that an
        // endpoint's admission never waits for one (its pass would count
        // as an attempt in flight meanwhile).
        if slot.permit.is_none() {
            slot.permit = take_slot(&ctx.slots, &ctx.slot_wanted).await;
        }
        if let Some(done) = held_back(ctx, d, &mut st, &n, slot, false).await {
            return done;
        }
        let (admission, waited) = admit(ctx, &n, slot).await;
        let (wait, reason) = match admission {
            Admission::Go(pass) => return go(ctx, d, n, st, slot, pass, waited).await,
            Admission::Defer { wait, reason } => (wait, reason),
            // `wait` never parks again; treat it as a short deferral if it did.
            Admission::Park(_) => (PARK_WAIT, DeferReason::Busy),
        };
        slot.free();
        // A short wait is taken here, then the endpoint is asked again.
        let room = (&*ctx.waiting, &ctx.stopping);
        if !wait_here(room, lease, d.data.len(), wait, &mut waits).await {
            return defer(ctx, d, st, &n.id, wait, reason).await;
        }
    }
}

/// Attempts a delivery its endpoint admitted. One that parked is checked
/// against the operator's gate again, since a pause may have come
/// meanwhile.
async fn go<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    n: Notification,
    mut st: RetryState,
    slot: &mut Slot,
    pass: Pass,
    waited: bool,
) -> Result<Done, PublishError> {
    if waited {
        let probe = pass.is_probe();
        if let Some(done) = held_back(ctx, d, &mut st, &n, slot, probe).await {
            return done;
        }
    }
    attempt(ctx, d, n, st, slot, pass).await
}

/// The notification and its retry state. The id falls back to the
/// retry state's, then the AMQP message id.
fn decode(
    settings: &WorkerSettings,
    d: &Delivery,
) -> Result<(Notification, RetryState), InvalidMessage> {
    let mut st = RetryState::from_headers(d.properties.headers().as_ref())?;
    let fallback = st
        .id
        .clone()
        .or_else(|| d.properties.message_id().as_ref().map(|m| m.to_string()));
    let n = message::decode(&d.data, settings.max_message_bytes, fallback.as_deref())?;
    // A plain AMQP client's message has no run: every delivery of it
    // derives the same one, and its copies carry it on.
    st.run
        .get_or_insert_with(|| message::run::derived(&n.id, &d.data));
    Ok((n, st))
}

/// Delivers once (the slot and the endpoint's pass are given back as soon
/// as the handler returns, the pass with what the attempt said about the
/// endpoint), then judges, reports and makes the copy the decision needs.
async fn attempt<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    mut n: Notification,
    mut st: RetryState,
    slot: &mut Slot,
    mut pass: Pass,
) -> Result<Done, PublishError> {
    st.id = Some(n.id.clone());
    let attempt = st.attempts.saturating_add(1);
    let (at_ms, start) = (now_ms(), Instant::now());
    let age = Duration::from_millis(st.age_ms(at_ms));
    let traced = traced::start(&ctx.settings.tracing, &mut n, &mut st, attempt);
    pass.start();
    let result = ctx.handler.deliver(&n, attempt).await;
    let span = HttpSpan {
        start,
        end: Instant::now(),
    };
    let decision = judge(&ctx.settings, &n, attempt, age, &result);
    traced::end(traced, &decision);
    // The endpoint's permit before the slot: a delivery pulled into the
    // freed slot must not find its endpoint still counting this one.
    pass.finish(policy::signal(&result), &outcome(&decision));
    slot.free();
    report(&ctx.settings, &n, attempt, &decision, span);
    let record = AttemptRecord {
        attempt,
        at_ms,
        duration_ms: span.millis(),
        classified: &decision.classified,
        delay_ms: match decision.action {
            Action::Retry { delay } => Some(delay.as_millis() as u64),
            _ => None,
        },
    };
    let event = notify::for_attempt(ctx, d, &n, &st, &decision);
    let seen = Seen {
        attempt,
        at_ms,
        duration_ms: span.millis(),
        result: &result,
    };
    let history = seam::of_attempt(ctx, &n, &st, seen, &decision);
    let copied = copy(ctx, d, st, &decision, record, span, event);
    seam::confirmed(ctx, history, copied).await
}

/// What the attempt came to, for its endpoint's recent activity.
fn outcome(decision: &Decision) -> Outcome {
    let c = &decision.classified;
    let retry_due_ms = match decision.action {
        Action::Retry { delay } => Some(now_ms().max(0) as u64 + delay.as_millis() as u64),
        _ => None,
    };
    Outcome {
        success: c.verdict == Verdict::Success,
        status: c.status,
        error: c.error.clone(),
        retry_due_ms,
    }
}

/// The retry decision for this attempt under the effective policy.
fn judge(
    settings: &WorkerSettings,
    n: &Notification,
    attempt: u32,
    age: Duration,
    result: &AttemptResult,
) -> Decision {
    let policy = effective_policy(settings, n);
    decide(result, attempt, age, &policy, &mut rand::rng())
}

/// The attempt's log line, metrics and (when asked for) event.
fn report(
    settings: &WorkerSettings,
    n: &Notification,
    attempt: u32,
    decision: &Decision,
    span: HttpSpan,
) {
    let (c, action) = (&decision.classified, decision.action);
    log_attempt(n, attempt, c, &action, span.millis());
    telemetry::record_attempt(&action, attempt, span.end.duration_since(span.start));
    if let Some(tx) = &settings.events {
        let _ = tx.send(AttemptEvent {
            id: n.id.clone(),
            attempt,
            host: n.url.host_str().unwrap_or("").to_string(),
            status: c.status,
            error: c.error.clone(),
            duration: Duration::from_millis(span.millis()),
            action,
        });
    }
}

fn log_attempt(n: &Notification, attempt: u32, c: &Classified, action: &Action, duration_ms: u64) {
    let (outcome, delay_ms, reason) = match action {
        Action::Ack => ("delivered", None, None),
        Action::Retry { delay } => ("retry", Some(delay.as_millis() as u64), None),
        Action::DeadLetter { reason } => ("dead", None, Some(reason.as_str())),
    };
    info!(
        id = %n.id,
        attempt,
        host = n.url.host_str().unwrap_or(""),
        status = c.status,
        duration_ms,
        outcome,
        delay_ms,
        reason,
        error = c.error.as_deref(),
        "attempt"
    );
}
