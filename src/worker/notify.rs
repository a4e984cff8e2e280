//! Which outcome of a delivery gets an operational event ([`kind`], pure),
//! and the event itself. The event is published before the outcome's copy
//! and confirmed before the original's ack (`copy.rs`), so an exhausted
//! notification never leaves the work queue without its event.

use lapin::message::Delivery;

use super::context::Context;
use crate::message::event::{self, Event, Kind, Last, Subject};
use crate::message::state::RetryState;
use crate::message::Notification;
use crate::policy::{Action, DeadReason, Decision};
use crate::publish::PublishError;

/// The event an attempt's decision gets, if any, with `--failing-after`
/// `failing_after` (0: never failing, nor recovered):
/// - a retry after exactly `failing_after` failed attempts: failing;
/// - a success after more failed attempts than that: recovered;
/// - a dead letter: exhausted (max attempts, or past its max age), or
///   dead-lettered (any other reason).
///
/// A plain success gets none.
pub(super) fn kind(action: &Action, attempt: u32, failing_after: u32) -> Option<Kind> {
    match action {
        Action::Ack => (failing_after > 0 && attempt > failing_after).then_some(Kind::Recovered),
        Action::Retry { .. } => {
            (failing_after > 0 && attempt == failing_after).then_some(Kind::Failing)
        }
        Action::DeadLetter { reason } => Some(dead_kind(*reason)),
    }
}

/// Exhausted for the reasons that mean "tried for as long as allowed".
pub(super) fn dead_kind(reason: DeadReason) -> Kind {
    match reason {
        DeadReason::MaxAttempts | DeadReason::Expired => Kind::Exhausted,
        _ => Kind::DeadLettered,
    }
}

/// The event for `kind`, unless the delivery carries an event itself.
pub(super) fn build<H>(
    ctx: &Context<H>,
    d: &Delivery,
    kind: Option<Kind>,
    about: Subject<'_>,
    reason: Option<DeadReason>,
) -> Option<Event> {
    let kind = kind?;
    let headers = d.properties.headers().as_ref();
    if ctx.events.is_event_delivery(about.url, headers) {
        return None;
    }
    let (prefix, reason) = (ctx.events.prefix(), reason.map(DeadReason::as_str));
    Some(event::notification(kind, prefix, about, reason))
}

/// [`Subject::run`] for a notification with this state: its run, which
/// `process::decode` always fills in.
pub(super) fn run_of(st: &RetryState) -> String {
    st.run.clone().unwrap_or_default()
}

/// The event for an attempt's decision, if it gets one.
pub(super) fn for_attempt<H>(
    ctx: &Context<H>,
    d: &Delivery,
    n: &Notification,
    st: &RetryState,
    decision: &Decision,
) -> Option<Event> {
    let attempt = st.attempts.saturating_add(1);
    let failing_after = ctx.settings.ops_events.failing_after;
    let kind = kind(&decision.action, attempt, failing_after);
    let reason = match decision.action {
        Action::DeadLetter { reason } => Some(reason),
        _ => None,
    };
    let c = &decision.classified;
    let run = run_of(st);
    let about = Subject {
        id: Some(&n.id),
        url: Some(&n.url),
        attempt,
        last: Last {
            status: c.status,
            error: c.error.as_deref(),
        },
        run: run.as_bytes(),
    };
    build(ctx, d, kind, about, reason)
}

/// Publishes the event, if any, and waits for its confirm.
pub(super) async fn emit<H>(ctx: &Context<H>, e: Option<&Event>) -> Result<(), PublishError> {
    match e {
        None => Ok(()),
        Some(e) => {
            let _pending = crate::telemetry::GaugeGuard::new(crate::telemetry::CONFIRMS_PENDING);
            ctx.events.emit(e).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const RETRY: Action = Action::Retry {
        delay: Duration::from_secs(1),
    };

    fn dead(reason: DeadReason) -> Action {
        Action::DeadLetter { reason }
    }

    #[test]
    fn failing_once_on_the_nth_failure_and_recovered_after_it() {
        let kinds: Vec<_> = (1..=6).map(|n| kind(&RETRY, n, 4)).collect();
        assert_eq!(kinds, [None, None, None, Some(Kind::Failing), None, None]);
        assert_eq!(kind(&Action::Ack, 1, 4), None, "a plain success: none");
        assert_eq!(
            kind(&Action::Ack, 4, 4),
            None,
            "3 failures: no failing was sent"
        );
        assert_eq!(kind(&Action::Ack, 5, 4), Some(Kind::Recovered));
        assert_eq!(kind(&RETRY, 4, 0), None, "0: never failing");
        assert_eq!(kind(&Action::Ack, 9, 0), None);
    }

    #[test]
    fn dead_letters_are_exhausted_or_dead_lettered() {
        let exhausted = [DeadReason::MaxAttempts, DeadReason::Expired];
        for r in exhausted {
            assert_eq!(kind(&dead(r), 1, 4), Some(Kind::Exhausted), "{r:?}");
        }
        for r in [
            DeadReason::PermanentStatus,
            DeadReason::Permanent,
            DeadReason::Invalid,
            DeadReason::AbortedByReceiver,
            DeadReason::EndpointDisabled,
        ] {
            assert_eq!(kind(&dead(r), 1, 4), Some(Kind::DeadLettered), "{r:?}");
        }
    }
}
