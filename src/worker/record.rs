//! The worker's one seam into the history ([`crate::history`]): the record
//! of an attempt (or of a dead letter made without one) is built here from
//! what the delivery's stages know, and [`confirmed`] makes the ack wait
//! for it. Nothing else in the worker knows the history exists.

use std::future::Future;

use lapin::Connection;
use std::time::{Duration, UNIX_EPOCH};

use super::context::{Context, Done};
use crate::config::WorkerSettings;
use crate::history::record::{body_for_record, header_kept, url_for_record, Attempt, Outcome};
use crate::history::{self, HistorySettings, Recorder};
use crate::message::state::RetryState;
use crate::message::target::Target;
use crate::message::Notification;
use crate::policy::{Action, AttemptResult, DeadReason, Decision};
use crate::publish::PublishError;

/// What one attempt was, besides its decision.
pub(super) struct Seen<'a> {
    pub attempt: u32,
    pub at_ms: i64,
    pub duration_ms: u64,
    pub result: &'a AttemptResult,
}

/// Runs `copy` (the retry copy or dead letter, with its event) beside the
/// record's append, and is `Ok` only once both are confirmed: a delivery
/// is acked only after its record is safe. Without a record (history off)
/// it is `copy` alone.
pub(super) async fn confirmed<H>(
    ctx: &Context<H>,
    record: Option<Attempt>,
    copy: impl Future<Output = Result<Done, PublishError>>,
) -> Result<Done, PublishError> {
    let (Some(recorder), Some(record)) = (&ctx.history, record) else {
        return copy.await;
    };
    let (done, recorded) = tokio::join!(copy, recorder.record(&record));
    recorded?;
    done
}

/// The record of an attempt, or `None` with the history off.
pub(super) fn of_attempt<H>(
    ctx: &Context<H>,
    n: &Notification,
    st: &RetryState,
    seen: Seen<'_>,
    decision: &Decision,
) -> Option<Attempt> {
    let s = &ctx.settings.history;
    ctx.history.as_ref()?;
    let c = &decision.classified;
    let mut a = base(s, n, st, &ctx.worker);
    a.attempt = seen.attempt;
    a.started_at = rfc3339(seen.at_ms);
    a.duration_ms = seen.duration_ms;
    a.status = c.status;
    a.error = c.error.clone();
    (a.outcome, a.next_attempt_at, a.dead_reason) = match decision.action {
        Action::Ack => (Outcome::Delivered, None, None),
        Action::Retry { delay } => {
            let due = seen.at_ms + seen.duration_ms as i64 + delay.as_millis() as i64;
            (Outcome::Retry, Some(rfc3339(due)), None)
        }
        Action::DeadLetter { reason } => (Outcome::Dead, None, Some(reason.as_str().into())),
    };
    if let AttemptResult::Response {
        body, content_type, ..
    } = seen.result
    {
        a.response_body = body_for_record(body.as_bytes(), s.response_bytes);
        a.response_content_type = content_type.clone();
    }
    // The request body once per run: on its first attempt.
    if seen.attempt == 1 {
        let sent = n.body.as_ref().map(|b| b.get().as_bytes()).unwrap_or(b"");
        a.request_body = body_for_record(sent, s.request_bytes);
    }
    a.trace_id = n.trace.as_ref().map(|t| t.trace_id().to_string());
    Some(a)
}

/// The record of a notification dead-lettered with no attempt now
/// (expired, its endpoint disabled): attempt 0, no status, its reason.
pub(super) fn of_unattempted<H>(
    ctx: &Context<H>,
    n: &Notification,
    st: &RetryState,
    reason: DeadReason,
) -> Option<Attempt> {
    ctx.history.as_ref()?;
    let mut a = base(&ctx.settings.history, n, st, &ctx.worker);
    a.dead_reason = Some(reason.as_str().into());
    Some(a)
}

/// The record of a message that is no notification (`invalid`): what the
/// broker knew of it, its id if it had one.
pub(super) fn of_invalid<H>(ctx: &Context<H>, id: Option<&str>, error: &str) -> Option<Attempt> {
    ctx.history.as_ref()?;
    let id = id.unwrap_or("").to_string();
    Some(Attempt {
        webhook_id: id.clone(),
        notification_id: id,
        error: Some(error.to_string()),
        dead_reason: Some(DeadReason::Invalid.as_str().into()),
        ..blank(&ctx.worker)
    })
}

/// What every record of `n` holds: outcome `dead` with no attempt until
/// the caller says otherwise.
fn base(s: &HistorySettings, n: &Notification, st: &RetryState, worker: &str) -> Attempt {
    Attempt {
        notification_id: n.id.clone(),
        webhook_id: n.id.clone(),
        run: st.run.clone(),
        endpoint: Target::origin_of(&n.url)
            .map(|t| t.origin_key())
            .unwrap_or_default(),
        url: url_for_record(&n.url),
        request_headers: n
            .headers
            .iter()
            .filter(|(k, _)| header_kept(k, &s.redact_headers))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..blank(worker)
    }
}

fn blank(worker: &str) -> Attempt {
    Attempt {
        notification_id: String::new(),
        webhook_id: String::new(),
        run: None,
        attempt: 0,
        endpoint: String::new(),
        url: String::new(),
        started_at: rfc3339(crate::clock::now_ms()),
        duration_ms: 0,
        status: None,
        error: None,
        outcome: Outcome::Dead,
        next_attempt_at: None,
        dead_reason: None,
        response_body: None,
        response_content_type: None,
        request_body: None,
        request_headers: vec![],
        worker: worker.to_string(),
        trace_id: None,
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC, to the millisecond.
fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// The history stream declared and its writer open, unless `--history off`.
pub(super) async fn open(
    conn: &Connection,
    prefix: &str,
    settings: &WorkerSettings,
) -> Result<Option<Recorder>, super::error::WorkerError> {
    if !settings.history.enabled {
        return Ok(None);
    }
    let name = history::stream_name(prefix);
    history::declare(conn, &name, &settings.history).await?;
    Ok(Some(Recorder::open(conn, &name).await?))
}
