//! One delivery's path through the worker, in stages:
//! decode → attempt (HTTP) → judge (pure: [`crate::policy::decide`]) →
//! report (log, metrics, events) → copy (republish the retry or dead
//! letter, confirmed) → settle (ack, hold then ack, or requeue).
//!
//! The original is acked only after its copy was confirmed, never before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use lapin::types::FieldTable;
use lapin::Acker;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::amqp::requeue;
use crate::clock::now_ms;
use crate::config::{AttemptEvent, WorkerSettings};
use crate::deliver::DeliveryHandler;
use crate::message::state::{self, AttemptRecord, RetryState};
use crate::message::{self, InvalidMessage, Notification};
use crate::policy::{
    decide, Action, AttemptResult, Classified, DeadReason, Decision, EffectivePolicy,
};
use crate::publish::{republish_properties, PublishError, Publisher};
use crate::telemetry::{self, GaugeGuard};

/// What every delivery task of one connection shares.
pub struct Context<H> {
    pub handler: Arc<H>,
    pub publisher: Publisher,
    pub settings: WorkerSettings,
    /// Cancelled when the shutdown grace is over: unfinished deliveries are
    /// then nacked back to the queue.
    pub hard_stop: CancellationToken,
    /// Cancelled when republishing fails in a way a new connection (and a
    /// fresh topology declaration) may cure: unroutable or unconfirmed.
    pub broken: CancellationToken,
}

/// How long a delivery whose republish failed waits before it is requeued,
/// so a broken broker path is not hammered with HTTP attempts.
const REQUEUE_BACKOFF: Duration = Duration::from_secs(1);

/// A delivery's place in the concurrency limit. It is freed as soon as the
/// HTTP attempt is over: waiting for a republish confirm, or the retry
/// settle, is not a request in flight. The prefetch room covers those.
pub struct Slot(Option<(OwnedSemaphorePermit, GaugeGuard)>);

impl Slot {
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        Slot(Some((permit, GaugeGuard::new(telemetry::IN_FLIGHT))))
    }
    fn free(&mut self) {
        self.0.take();
    }
}

/// What became of a delivery before its own ack: the copy it needed, if
/// any, was confirmed.
enum Done {
    /// Delivered (with the HTTP attempt's span, for the overhead trace) or
    /// dead-lettered: ack it.
    Ack(Option<HttpSpan>),
    /// Its retry copy was confirmed: ack it, after `--retry-settle`.
    Retried,
}

/// Processes one delivery, from decoding to its ack (or requeue). `pulled`
/// is when the worker took it off the consumer, for the overhead trace.
pub async fn process<H: DeliveryHandler>(
    ctx: Arc<Context<H>>,
    d: Delivery,
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
        r = handle(&ctx, &d, &mut slot) => Some(r),
        _ = ctx.hard_stop.cancelled() => None,
    };
    drop(slot);
    settle(&ctx, acker_of(d), done, pulled).await;
}

/// Only the acker outlives the delivery: a retried original held for
/// `--retry-settle` keeps no body in memory.
fn acker_of(d: Delivery) -> Acker {
    d.acker
}

/// Acks once the copy is confirmed; holds a retried original for the
/// settle first; requeues when the copy failed or shutdown cut it short.
async fn settle<H>(
    ctx: &Context<H>,
    acker: Acker,
    done: Option<Result<Done, PublishError>>,
    pulled: Instant,
) {
    let result = match done {
        Some(Ok(Done::Retried)) if !ctx.settings.retry_settle.is_zero() => {
            return hold_then_ack(ctx, acker).await;
        }
        Some(Ok(Done::Ack(span))) => {
            let acked = acker.ack(BasicAckOptions::default()).await;
            if let (Some(span), Ok(_)) = (span, &acked) {
                trace_overhead(pulled, span);
            }
            acked
        }
        Some(Ok(Done::Retried)) => acker.ack(BasicAckOptions::default()).await,
        Some(Err(e)) => {
            warn!(error = %e, "republish not confirmed; requeueing the original");
            if matches!(
                e,
                PublishError::Unroutable | PublishError::ConfirmTimeout(_)
            ) {
                ctx.broken.cancel();
            }
            tokio::select! {
                _ = tokio::time::sleep(REQUEUE_BACKOFF) => {}
                _ = ctx.hard_stop.cancelled() => {}
            }
            acker.nack(requeue()).await
        }
        None => acker.nack(requeue()).await,
    };
    if let Err(e) = result {
        warn!(error = %e, "ack/nack failed; the broker will redeliver");
    }
}

/// Keeps a retried original unacked for `--retry-settle` after its copy was
/// confirmed: the upstream delayed-message plugin confirms before its disk
/// write, and a broker crash in that window would lose the copy. Until the
/// ack, the broker would redeliver the original instead.
async fn hold_then_ack<H>(ctx: &Context<H>, acker: Acker) {
    let result = tokio::select! {
        _ = tokio::time::sleep(ctx.settings.retry_settle) => acker.ack(BasicAckOptions::default()).await,
        // Shutting down before the settle is over: requeue (a duplicate at worst).
        _ = ctx.hard_stop.cancelled() => acker.nack(requeue()).await,
    };
    if let Err(e) = result {
        warn!(error = %e, "ack after the retry settle failed; the broker will redeliver");
    }
}

/// When the delivery handler was called and when it returned.
#[derive(Clone, Copy)]
struct HttpSpan {
    start: Instant,
    end: Instant,
}

impl HttpSpan {
    fn millis(&self) -> u64 {
        self.end.duration_since(self.start).as_millis() as u64
    }
}

/// The worker's own time around a successful attempt, at debug level on
/// target `redeliver::timing`: from taking the delivery to calling the
/// handler, and from its answer to the ack being sent. `redeliver bench`
/// reads it; it is off unless asked for (`RUST_LOG=redeliver::timing=debug`).
fn trace_overhead(pulled: Instant, span: HttpSpan) {
    tracing::debug!(
        target: "redeliver::timing",
        pre_us = span.start.saturating_duration_since(pulled).as_micros() as u64,
        post_us = span.end.elapsed().as_micros() as u64,
        "worker overhead"
    );
}

/// Decodes, then attempts; what cannot be decoded is dead-lettered as
/// `invalid`. `Ok` means: ack it (after the settle, for a retry).
async fn handle<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    slot: &mut Slot,
) -> Result<Done, PublishError> {
    match decode(&ctx.settings, d) {
        Ok((n, st)) => attempt(ctx, d, n, st, slot).await,
        Err(e) => {
            slot.free();
            dead_letter_invalid(ctx, d, &e)
                .await
                .map(|()| Done::Ack(None))
        }
    }
}

/// The notification and its retry state. The id falls back to the
/// retry state's, then the AMQP message id.
fn decode(
    settings: &WorkerSettings,
    d: &Delivery,
) -> Result<(Notification, RetryState), InvalidMessage> {
    let st = RetryState::from_headers(d.properties.headers().as_ref())?;
    let fallback = st
        .id
        .clone()
        .or_else(|| d.properties.message_id().as_ref().map(|m| m.to_string()));
    let n = message::decode(&d.data, settings.max_message_bytes, fallback.as_deref())?;
    Ok((n, st))
}

/// Delivers once (the slot is freed as soon as the handler returns), then
/// judges, reports and makes the copy the decision needs.
async fn attempt<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    n: Notification,
    mut st: RetryState,
    slot: &mut Slot,
) -> Result<Done, PublishError> {
    st.id = Some(n.id.clone());
    let attempt = st.attempts.saturating_add(1);
    let (at_ms, start) = (now_ms(), Instant::now());
    let result = ctx.handler.deliver(&n, attempt).await;
    slot.free();
    let span = HttpSpan {
        start,
        end: Instant::now(),
    };
    let decision = judge(&ctx.settings, &n, attempt, &result);
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
    copy(ctx, d, st, &decision, record, span).await
}

/// The retry decision for this notification under its effective policy:
/// its own fields, then its URL's `[[route]]`, then the worker's flags.
fn judge(
    settings: &WorkerSettings,
    n: &Notification,
    attempt: u32,
    result: &AttemptResult,
) -> Decision {
    let route = settings.routes.find(&n.url);
    let policy = EffectivePolicy::new(
        &settings.policy,
        &settings.rules,
        route.map(|r| r.overrides()).unwrap_or_default(),
        n.overrides(),
    );
    decide(result, attempt, &policy, &mut rand::rng())
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

/// Publishes what the decision needs (a retry copy or a dead letter) and
/// waits for its confirm. The history travels only with a copy; a success
/// needs none.
async fn copy<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut st: RetryState,
    decision: &Decision,
    record: AttemptRecord<'_>,
    span: HttpSpan,
) -> Result<Done, PublishError> {
    let mut headers = || {
        st.record(&record);
        st.to_headers(d.properties.headers().as_ref(), Some(&decision.classified))
    };
    match decision.action {
        Action::Ack => Ok(Done::Ack(Some(span))),
        Action::Retry { delay } => {
            let copy = ctx
                .publisher
                .retry(&d.data, d.properties.clone(), headers(), delay);
            let _pending = GaugeGuard::new(telemetry::CONFIRMS_PENDING);
            copy.await.map(|()| Done::Retried)
        }
        Action::DeadLetter { reason } => dead_letter(ctx, d, headers(), reason)
            .await
            .map(|()| Done::Ack(None)),
    }
}

/// Invalid messages keep their original bytes and headers, plus the reason.
async fn dead_letter_invalid<H>(
    ctx: &Context<H>,
    d: &Delivery,
    e: &InvalidMessage,
) -> Result<(), PublishError> {
    warn!(error = %e, "invalid message; dead-lettering it");
    telemetry::record_invalid();
    let mut headers = d.properties.headers().clone().unwrap_or_default();
    state::set_last(&mut headers, None, Some(&e.to_string()));
    dead_letter(ctx, d, headers, DeadReason::Invalid).await
}

async fn dead_letter<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut headers: FieldTable,
    reason: DeadReason,
) -> Result<(), PublishError> {
    state::mark_dead(&mut headers, reason.as_str(), now_ms());
    let props = republish_properties(&d.properties, headers);
    let _pending = GaugeGuard::new(telemetry::CONFIRMS_PENDING);
    ctx.publisher.dead_letter(&d.data, props).await
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
