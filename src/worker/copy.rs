//! The copies a delivery may need before its ack, each confirmed by the
//! broker: a retry (through the delay backend), a deferral (the same path,
//! but no attempt was made) or a dead letter.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::types::FieldTable;
use tracing::{debug, warn};

use super::context::{Context, Done, HttpSpan};
use super::notify;
use crate::clock::now_ms;
use crate::isolation::{defer_delay, DeferReason};
use crate::message::event::{Event, Last, Subject};
use crate::message::state::{self, AttemptRecord, RetryState};
use crate::message::target::Target;
use crate::message::{InvalidMessage, Notification};
use crate::policy::{Action, DeadReason, Decision};
use crate::publish::{republish_properties, PublishError};
use crate::telemetry::{self, GaugeGuard};

/// Publishes what the decision needs (its operational event, then a retry
/// copy or a dead letter) and waits for each confirm. The history
/// travels only with a copy; a success needs none.
pub(super) async fn copy<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut st: RetryState,
    decision: &Decision,
    record: AttemptRecord<'_>,
    span: HttpSpan,
    event: Option<Event>,
) -> Result<Done, PublishError> {
    let mut headers = || {
        st.record(&record);
        st.to_headers(d.properties.headers().as_ref(), Some(&decision.classified))
    };
    match decision.action {
        Action::Ack => notify::emit(ctx, event.as_ref())
            .await
            .map(|()| Done::Ack(Some(span))),
        // The event first: should it fail, the original goes back with no
        // copy made (a second retry chain); should the copy fail after it,
        // the event is published again with the same id.
        Action::Retry { delay } => {
            notify::emit(ctx, event.as_ref()).await?;
            retry(ctx, d, headers(), delay).await
        }
        Action::DeadLetter { reason } => dead_letter(ctx, d, headers(), reason, event)
            .await
            .map(|()| Done::Ack(None)),
    }
}

async fn retry<H>(
    ctx: &Context<H>,
    d: &Delivery,
    headers: FieldTable,
    delay: Duration,
) -> Result<Done, PublishError> {
    let key = lane_key(d);
    let copy = ctx
        .publisher
        .retry(&d.data, d.properties.clone(), &key, headers, delay);
    let _pending = GaugeGuard::new(telemetry::CONFIRMS_PENDING);
    copy.await.map(|()| Done::Retried)
}

/// The bucket key a copy of `d` comes back with: the one it arrived with,
/// or for a notification that came by another key (a raw producer's, the
/// lanes' alternate), its URL's.
pub(super) fn lane_key(d: &Delivery) -> String {
    let key = d.routing_key.as_str();
    match crate::topology::lanes::is_bucket_key(key) {
        true => key.to_string(),
        false => crate::topology::lanes::key_of_payload(&d.data),
    }
}

/// Republishes a delivery its endpoint cannot take now, unattempted, to
/// come back after [`defer_delay`]: the attempt count and history stay as
/// they are, `redeliver-deferrals` goes up by one. Confirmed before the
/// ack, like a retry, and held for `--retry-settle` like one.
pub(super) async fn defer<H>(
    ctx: &Context<H>,
    d: &Delivery,
    st: RetryState,
    id: &str,
    wait: Duration,
    reason: DeferReason,
) -> Result<Done, PublishError> {
    let scheduled = matches!(reason, DeferReason::Busy | DeferReason::Rate);
    let delay = defer_delay(wait, st.deferral_streak, scheduled, &mut rand::rng());
    defer_for(ctx, d, st, id, delay, reason).await
}

async fn defer_for<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut st: RetryState,
    id: &str,
    delay: Duration,
    reason: DeferReason,
) -> Result<Done, PublishError> {
    st.id = Some(id.to_string());
    st.defer(now_ms());
    debug!(
        id,
        reason = reason.as_str(),
        deferrals = st.deferrals,
        delay_ms = delay.as_millis() as u64,
        "deferred without an attempt"
    );
    let headers = st.to_headers(d.properties.headers().as_ref(), None);
    metrics::counter!(telemetry::REPUBLISHED_DEFERRALS).increment(1);
    retry(ctx, d, headers, delay).await
}

/// Invalid messages keep their original bytes and headers, plus the reason.
pub(super) async fn dead_letter_invalid<H>(
    ctx: &Context<H>,
    d: &Delivery,
    e: &InvalidMessage,
) -> Result<(), PublishError> {
    warn!(error = %e, "invalid message; dead-lettering it");
    telemetry::record_invalid();
    let mut headers = d.properties.headers().clone().unwrap_or_default();
    let error = e.to_string();
    state::set_last(&mut headers, None, Some(&error));
    let id = d.properties.message_id().as_ref().map(|m| m.to_string());
    let about = Subject {
        id: id.as_deref(),
        url: None,
        attempt: 0,
        last: Last {
            status: None,
            error: Some(&error),
        },
        // Its bytes tell it from another invalid message with no id.
        run: &d.data,
    };
    let reason = DeadReason::Invalid;
    let event = notify::build(ctx, d, Some(notify::dead_kind(reason)), about, Some(reason));
    dead_letter(ctx, d, headers, reason, event).await
}

/// Dead-letters a notification past its max age without attempting it
/// again; its history is kept as it was.
pub(super) async fn dead_letter_expired<H>(
    ctx: &Context<H>,
    d: &Delivery,
    st: &RetryState,
    n: &Notification,
) -> Result<Done, PublishError> {
    warn!(
        id = n.id,
        attempts = st.attempts,
        "past its max age; dead-lettering it as expired"
    );
    telemetry::record_expired();
    let headers = st.to_headers(d.properties.headers().as_ref(), None);
    let event = unattempted_event(ctx, d, st, n, DeadReason::Expired);
    dead_letter(ctx, d, headers, DeadReason::Expired, event)
        .await
        .map(|()| Done::Ack(None))
}

/// Dead-letters a notification whose target is disabled, unattempted; its
/// history is kept as it was.
pub(super) async fn dead_letter_disabled<H>(
    ctx: &Context<H>,
    d: &Delivery,
    st: &RetryState,
    n: &Notification,
    target: &Target,
) -> Result<Done, PublishError> {
    debug!(id = n.id, %target, "endpoint disabled; dead-lettering without an attempt");
    metrics::counter!(telemetry::DELIVERIES, "outcome" => "dead", "reason" => "endpoint-disabled")
        .increment(1);
    let headers = st.to_headers(d.properties.headers().as_ref(), None);
    let reason = DeadReason::EndpointDisabled;
    let event = unattempted_event(ctx, d, st, n, reason);
    dead_letter(ctx, d, headers, reason, event).await?;
    ctx.control.dead_lettered(target);
    Ok(Done::Ack(None))
}

/// The event of a notification dead-lettered without an attempt now: the
/// last attempt's outcome is the one its headers carry.
fn unattempted_event<H>(
    ctx: &Context<H>,
    d: &Delivery,
    st: &RetryState,
    n: &Notification,
    reason: DeadReason,
) -> Option<Event> {
    let (status, error) = state::last(d.properties.headers().as_ref());
    let run = notify::run_of(st);
    let about = Subject {
        id: Some(&n.id),
        url: Some(&n.url),
        attempt: st.attempts,
        last: Last {
            status,
            error: error.as_deref(),
        },
        run: run.as_bytes(),
    };
    notify::build(ctx, d, Some(notify::dead_kind(reason)), about, Some(reason))
}

/// The event, then the dead letter, each confirmed.
async fn dead_letter<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut headers: FieldTable,
    reason: DeadReason,
    event: Option<Event>,
) -> Result<(), PublishError> {
    state::mark_dead(&mut headers, reason.as_str(), now_ms());
    let props = republish_properties(&d.properties, headers);
    let _pending = GaugeGuard::new(telemetry::CONFIRMS_PENDING);
    // The event first, for the reason given at the retry in `copy`.
    notify::emit(ctx, event.as_ref()).await?;
    ctx.publisher.dead_letter(&d.data, props).await
}
