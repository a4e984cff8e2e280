//! An attempt's span: started before the request, so the request carries
//! its `traceparent`, and ended with the decision. Off, the producer's
//! context is passed through to the receiver untouched.

use crate::message::state::RetryState;
use crate::message::Notification;
use crate::policy::{Action, Decision};
use crate::telemetry::trace::{AttemptEnd, AttemptSpan, AttemptStart, Tracing};

/// Starts the span under the notification's trace and sets the context
/// the request carries. A notification that came without one joins the
/// trace its first attempt starts, so its retries share it.
pub(super) fn start(
    t: &Tracing,
    n: &mut Notification,
    st: &mut RetryState,
    attempt: u32,
) -> AttemptSpan {
    let span = t.attempt(
        st.trace.as_ref(),
        &AttemptStart {
            id: &n.id,
            method: n.method.as_str(),
            scheme: n.url.scheme(),
            host: n.url.host_str().unwrap_or(""),
            port: n.url.port_or_known_default().unwrap_or(0),
            attempt,
        },
    );
    n.trace = span.context().cloned();
    if st.trace.is_none() {
        st.trace = span.context().cloned();
    }
    span
}

/// Ends the span with what was decided.
pub(super) fn end(span: AttemptSpan, decision: &Decision) {
    let c = &decision.classified;
    let (outcome, delay, dead_reason) = match decision.action {
        Action::Ack => ("delivered", None, None),
        Action::Retry { delay } => ("retry", Some(delay), None),
        Action::DeadLetter { reason } => ("dead", None, Some(reason.as_str())),
    };
    span.end(&AttemptEnd {
        status: c.status,
        error: c.error.as_deref(),
        outcome,
        delay,
        dead_reason,
    });
}
