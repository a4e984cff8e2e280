//! One delivery's path through the worker, in stages:
//! decode → deliver → classify → decide → settle (republish, then ack).

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
use crate::config::routes::Route;
use crate::config::{AttemptEvent, WorkerSettings};
use crate::deliver::DeliveryHandler;
use crate::message::state::{self, AttemptRecord, RetryState};
use crate::message::{self, InvalidMessage, Notification};
use crate::policy::{classify, Classified};
use crate::policy::{decide, Action, DeadReason};
use crate::policy::{Backoff, RetryPolicy};
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

/// What became of a delivery once its attempt is over.
pub enum Settled {
    /// Acked or nacked already.
    Done,
    /// Its retry copy was confirmed; ack it after `--retry-settle`
    /// ([`hold_then_ack`]), without holding a concurrency slot. Only the
    /// acker is kept, not the message.
    Hold(Acker),
}

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

/// Processes one delivery: it is acked only after any republish was
/// confirmed, and nacked (requeued) when that republish failed. `pulled` is
/// when the worker took it off the consumer, for the overhead trace.
pub async fn process<H: DeliveryHandler>(
    ctx: Arc<Context<H>>,
    d: Delivery,
    pulled: Instant,
    mut slot: Slot,
) -> Settled {
    if d.redelivered {
        // At-least-once at work: an earlier delivery was not settled.
        info!(
            tag = d.delivery_tag,
            "redelivered message (a possible duplicate)"
        );
    }
    let settled = tokio::select! {
        s = settle(&ctx, &d, &mut slot) => Some(s),
        _ = ctx.hard_stop.cancelled() => None,
    };
    let result = match settled {
        Some(Ok(Outcome::Retried)) if !ctx.settings.retry_settle.is_zero() => {
            return Settled::Hold(d.acker)
        }
        Some(Ok(Outcome::Acked(span))) => {
            let acked = d.acker.ack(BasicAckOptions::default()).await;
            if let (Some(span), Ok(_)) = (span, &acked) {
                trace_overhead(pulled, span);
            }
            acked
        }
        Some(Ok(Outcome::Retried)) => d.acker.ack(BasicAckOptions::default()).await,
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
            d.acker.nack(requeue()).await
        }
        None => d.acker.nack(requeue()).await,
    };
    if let Err(e) = result {
        warn!(error = %e, "ack/nack failed; the broker will redeliver");
    }
    Settled::Done
}

/// Keeps a retried original unacked for `--retry-settle` after its copy was
/// confirmed: the upstream delayed-message plugin confirms before its disk
/// write, and a broker crash in that window would lose the copy. Until the
/// ack, the broker would redeliver the original instead.
pub async fn hold_then_ack<H>(ctx: &Context<H>, acker: Acker) {
    let result = tokio::select! {
        _ = tokio::time::sleep(ctx.settings.retry_settle) => acker.ack(BasicAckOptions::default()).await,
        // Shutting down before the settle is over: requeue (a duplicate at worst).
        _ = ctx.hard_stop.cancelled() => acker.nack(requeue()).await,
    };
    if let Err(e) = result {
        warn!(error = %e, "ack after the retry settle failed; the broker will redeliver");
    }
}

/// How an attempt ended, when it ended well enough to ack.
enum Outcome {
    /// With the HTTP attempt's span when there was one.
    Acked(Option<HttpSpan>),
    Retried,
}

/// When the delivery handler was called and when it returned.
#[derive(Clone, Copy)]
struct HttpSpan {
    start: Instant,
    end: Instant,
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

/// Decodes, then attempts or dead-letters. `Ok` means: ack it.
async fn settle<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    slot: &mut Slot,
) -> Result<Outcome, PublishError> {
    let headers = d.properties.headers().as_ref();
    let decoded = RetryState::from_headers(headers).and_then(|st| {
        let fallback = st
            .id
            .clone()
            .or_else(|| d.properties.message_id().as_ref().map(|m| m.to_string()));
        message::decode(&d.data, ctx.settings.max_message_bytes, fallback.as_deref())
            .map(|n| (n, st))
    });
    match decoded {
        Ok((n, st)) => attempt(ctx, d, n, st, slot).await,
        Err(e) => {
            slot.free();
            dead_letter_invalid(ctx, d, &e)
                .await
                .map(|()| Outcome::Acked(None))
        }
    }
}

/// Deliver once, decide, and republish when needed. `Ok` means: ack it.
async fn attempt<H: DeliveryHandler>(
    ctx: &Context<H>,
    d: &Delivery,
    n: Notification,
    mut st: RetryState,
    slot: &mut Slot,
) -> Result<Outcome, PublishError> {
    st.id = Some(n.id.clone());
    let attempt = st.attempts.saturating_add(1);
    let (at_ms, started) = (now_ms(), Instant::now());
    let result = ctx.handler.deliver(&n, attempt).await;
    slot.free();
    let span = HttpSpan {
        start: started,
        end: Instant::now(),
    };
    let duration_ms = span.end.duration_since(started).as_millis() as u64;
    let route = ctx.settings.routes.find(&n.url);
    let success_body = n
        .success_body
        .as_deref()
        .or(route.and_then(|r| r.success_body.as_deref()));
    let c = classify(&result, &ctx.settings.rules, success_body);
    let policy = effective_policy(&ctx.settings.policy, route, &n);
    let action = decide(&c, attempt, &policy, &mut rand::rng());
    let delay_ms = match action {
        Action::Retry { delay } => Some(delay.as_millis() as u64),
        _ => None,
    };
    let record = AttemptRecord {
        attempt,
        at_ms,
        duration_ms,
        classified: &c,
        delay_ms,
    };
    log_attempt(&n, attempt, &c, &action, duration_ms);
    telemetry::record_attempt(&action, attempt, span.end.duration_since(started));
    if let Some(tx) = &ctx.settings.events {
        let _ = tx.send(AttemptEvent {
            id: n.id.clone(),
            attempt,
            host: n.url.host_str().unwrap_or("").to_string(),
            status: c.status,
            error: c.error.clone(),
            duration: Duration::from_millis(duration_ms),
            action,
        });
    }
    // The history travels only with a republished copy; a success needs none.
    let mut headers = || {
        st.record(&record);
        st.to_headers(d.properties.headers().as_ref(), Some(&c))
    };
    match action {
        Action::Ack => Ok(Outcome::Acked(Some(span))),
        Action::Retry { delay } => {
            let copy = ctx
                .publisher
                .retry(&d.data, d.properties.clone(), headers(), delay);
            let _pending = GaugeGuard::new(telemetry::CONFIRMS_PENDING);
            copy.await.map(|()| Outcome::Retried)
        }
        Action::DeadLetter { reason } => dead_letter(ctx, d, headers(), reason)
            .await
            .map(|()| Outcome::Acked(None)),
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

/// Per-notification fields win over the URL's route, which wins over the
/// worker's policy.
fn effective_policy(base: &RetryPolicy, route: Option<&Route>, n: &Notification) -> RetryPolicy {
    let route_schedule = route.and_then(|r| r.schedule.as_ref());
    RetryPolicy {
        max_attempts: n
            .max_attempts
            .or(route.and_then(|r| r.max_attempts))
            .unwrap_or(base.max_attempts),
        backoff: match n.schedule.as_ref().or(route_schedule) {
            Some(s) => Backoff::Schedule(s.clone()),
            None => base.backoff.clone(),
        },
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
