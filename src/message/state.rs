//! Retry state carried in AMQP headers, never in the body: the attempt
//! count, timestamps, the last result and a bounded attempt history.

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

use crate::message::trace::TraceContext;
use crate::message::InvalidMessage;
use crate::policy::Classified;

pub const H_ATTEMPT: &str = "redeliver-attempt";
pub const H_ID: &str = "redeliver-id";
pub const H_FIRST_AT: &str = "redeliver-first-attempt-at";
pub const H_LAST_STATUS: &str = "redeliver-last-status";
pub const H_LAST_ERROR: &str = "redeliver-last-error";
pub const H_HISTORY: &str = "redeliver-history";
pub const H_DEAD_REASON: &str = "redeliver-dead-reason";
pub const H_DEAD_AT: &str = "redeliver-dead-at";
pub const H_DELAY: &str = "x-delay";
/// Times a worker deferred the notification without attempting it (its
/// endpoint was busy, rate-limited, paused or behind an open breaker).
/// Deferrals cost no attempt.
pub const H_DEFERRALS: &str = "redeliver-deferrals";
/// Deferrals since the last attempt: the deferral's floor doubles with
/// it (an endpoint that keeps refusing is asked less and less often), and
/// an attempt starts it again, so a notification deferred a few times
/// early in a long drain does not wait 30-45 s when deferred once more.
pub const H_DEFERRAL_STREAK: &str = "redeliver-deferral-streak";
/// When a worker first deferred a notification that had no attempt yet
/// (ms since the epoch): its age counts from there.
/// Set on the one delivery per breaker opening that is sent to wait for the
/// half-open while its endpoint is parked for that breaker: no worker
/// parks it, so it comes back as a probe (`crate::control::breakers`).
/// Cleared by its attempt.
pub const H_PROBE_CANDIDATE: &str = "redeliver-probe-candidate";
pub const H_FIRST_SEEN: &str = "redeliver-first-seen-at";
/// The cascade delay backend's headers (its digits and due time) all start
/// with this. No `x-` prefix: a headers exchange ignores `x-` binding
/// arguments.
pub const H_CASCADE_PREFIX: &str = "redeliver-cascade-";

/// Whether a header is one of the cascade's, which a copy never keeps.
pub fn is_cascade_header(name: &str) -> bool {
    name.starts_with(H_CASCADE_PREFIX)
}

/// Whether a header is one a quorum queue adds to a message it hands out
/// again: `x-delivery-count` (RabbitMQ 3.8+) and `x-acquired-count` (4.x).
/// They count one queue's returns, not the notification's attempts, so a
/// copy never carries them and nothing reads them as the producer's.
pub fn is_broker_count_header(name: &str) -> bool {
    name == "x-delivery-count" || name == "x-acquired-count"
}

/// Errors are cut to this many characters in headers.
pub const MAX_ERROR_CHARS: usize = 512;
/// Only the most recent attempts are kept, so headers stay small.
pub const MAX_HISTORY: usize = 25;

/// What the headers say about earlier attempts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetryState {
    /// Attempts already made before this delivery.
    pub attempts: u32,
    pub first_attempt_at: Option<i64>,
    pub id: Option<String>,
    /// Deferrals so far (they cost no attempt).
    pub deferrals: u32,
    /// Deferrals since the last attempt ([`H_DEFERRAL_STREAK`]).
    pub deferral_streak: u32,
    pub first_seen_at: Option<i64>,
    /// The trace every attempt joins: the producer's, or the first
    /// attempt's when the producer sent none.
    pub trace: Option<TraceContext>,
    /// The publish or replay this delivery belongs to (`redeliver-run`,
    /// [`crate::message::run`]); the worker fills it in when absent.
    pub run: Option<String>,
    /// [`H_PROBE_CANDIDATE`].
    pub probe_candidate: bool,
    history: Vec<AMQPValue>,
}

/// One attempt, as recorded in the history and the `last-*` headers.
#[derive(Clone, Debug)]
pub struct AttemptRecord<'a> {
    pub attempt: u32,
    pub at_ms: i64,
    pub duration_ms: u64,
    pub classified: &'a Classified,
    pub delay_ms: Option<u64>,
}

impl RetryState {
    /// Reads the state; a header of the wrong type is a tampered message.
    pub fn from_headers(h: Option<&FieldTable>) -> Result<Self, InvalidMessage> {
        let Some(h) = h else {
            return Ok(Self::default());
        };
        let m = h.inner();
        let attempts = match m.get(H_ATTEMPT) {
            None => 0,
            Some(v) => int(v)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| InvalidMessage::BadState(H_ATTEMPT, shown(v)))?,
        };
        let first_attempt_at = optional_int(m.get(H_FIRST_AT), H_FIRST_AT)?;
        let first_seen_at = optional_int(m.get(H_FIRST_SEEN), H_FIRST_SEEN)?;
        let deferrals = optional_int(m.get(H_DEFERRALS), H_DEFERRALS)?
            .map_or(Ok(0), u32::try_from)
            .map_err(|_| InvalidMessage::BadState(H_DEFERRALS, "out of range".into()))?;
        // A copy from before the streak had none: its deferrals stand in.
        let deferral_streak = optional_int(m.get(H_DEFERRAL_STREAK), H_DEFERRAL_STREAK)?
            .map_or(Ok(deferrals), u32::try_from)
            .map_err(|_| InvalidMessage::BadState(H_DEFERRAL_STREAK, "out of range".into()))?;
        let id = m.get(H_ID).and_then(string);
        let run = m.get(super::run::H_RUN).and_then(string);
        let history = match m.get(H_HISTORY) {
            Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
            _ => Vec::new(),
        };
        Ok(RetryState {
            attempts,
            first_attempt_at,
            id,
            deferrals,
            deferral_streak,
            first_seen_at,
            trace: TraceContext::from_headers(Some(h)),
            run,
            probe_candidate: matches!(m.get(H_PROBE_CANDIDATE), Some(AMQPValue::Boolean(true))),
            history,
        })
    }

    /// How long ago (at `now_ms`) it was first attempted or first
    /// deferred, whichever was earlier; zero for a new notification.
    pub fn age_ms(&self, now_ms: i64) -> u64 {
        let start = match (self.first_attempt_at, self.first_seen_at) {
            (Some(a), Some(s)) => a.min(s),
            (a, s) => a.or(s).unwrap_or(now_ms),
        };
        u64::try_from(now_ms.saturating_sub(start)).unwrap_or(0)
    }

    /// Counts a deferral; its age starts now if nothing started it before.
    pub fn defer(&mut self, now_ms: i64) {
        self.deferrals = self.deferrals.saturating_add(1);
        self.deferral_streak = self.deferral_streak.saturating_add(1);
        if self.first_attempt_at.is_none() {
            self.first_seen_at.get_or_insert(now_ms);
        }
    }

    /// Adds one attempt to the state.
    pub fn record(&mut self, r: &AttemptRecord<'_>) {
        self.attempts = r.attempt;
        self.deferral_streak = 0;
        self.probe_candidate = false;
        self.first_attempt_at.get_or_insert(r.at_ms);
        let mut e = FieldTable::default();
        e.insert("attempt".into(), AMQPValue::LongLongInt(r.attempt.into()));
        e.insert("at".into(), AMQPValue::LongLongInt(r.at_ms));
        e.insert(
            "duration_ms".into(),
            AMQPValue::LongLongInt(r.duration_ms as i64),
        );
        if let Some(s) = r.classified.status {
            e.insert("status".into(), AMQPValue::LongInt(s.into()));
        }
        if let Some(err) = &r.classified.error {
            e.insert("error".into(), long_string(truncate(err, 200)));
        }
        if let Some(d) = r.delay_ms {
            e.insert("delay_ms".into(), AMQPValue::LongLongInt(d as i64));
        }
        self.history.push(AMQPValue::FieldTable(e));
        let excess = self.history.len().saturating_sub(MAX_HISTORY);
        self.history.drain(..excess);
    }

    /// The original headers with this state written over them.
    pub fn to_headers(
        &self,
        original: Option<&FieldTable>,
        last: Option<&Classified>,
    ) -> FieldTable {
        let mut h = original.cloned().unwrap_or_default();
        h.insert(
            H_ATTEMPT.into(),
            AMQPValue::LongLongInt(self.attempts.into()),
        );
        if let Some(at) = self.first_attempt_at {
            h.insert(H_FIRST_AT.into(), AMQPValue::LongLongInt(at));
        }
        if let Some(id) = &self.id {
            h.insert(H_ID.into(), long_string(id));
        }
        if let Some(at) = self.first_seen_at {
            h.insert(H_FIRST_SEEN.into(), AMQPValue::LongLongInt(at));
        }
        if let Some(run) = &self.run {
            h.insert(super::run::H_RUN.into(), long_string(run));
        }
        if self.deferrals > 0 {
            h.insert(
                H_DEFERRALS.into(),
                AMQPValue::LongLongInt(self.deferrals.into()),
            );
        }
        if self.deferrals > 0 {
            // Written even at 0: the original's value must not stand.
            h.insert(
                H_DEFERRAL_STREAK.into(),
                AMQPValue::LongLongInt(self.deferral_streak.into()),
            );
        }
        if self.probe_candidate || h.contains_key(H_PROBE_CANDIDATE) {
            // Written false too: the original's value must not stand.
            let v = AMQPValue::Boolean(self.probe_candidate);
            h.insert(H_PROBE_CANDIDATE.into(), v);
        }
        if let Some(c) = last {
            set_last(&mut h, c.status, c.error.as_deref());
        }
        h.insert(
            H_HISTORY.into(),
            AMQPValue::FieldArray(FieldArray::from(self.history.clone())),
        );
        if let Some(t) = &self.trace {
            t.write(&mut h);
        }
        h
    }
}

/// An integer header that may be absent; any other type is tampering.
fn optional_int(v: Option<&AMQPValue>, name: &'static str) -> Result<Option<i64>, InvalidMessage> {
    v.map(|v| int(v).ok_or_else(|| InvalidMessage::BadState(name, shown(v))))
        .transpose()
}

/// Records the last status and error (or clears a stale status).
pub fn set_last(h: &mut FieldTable, status: Option<u16>, error: Option<&str>) {
    let mut m = std::mem::take(h).inner().clone();
    m.remove(H_LAST_STATUS);
    *h = FieldTable::from(m);
    if let Some(s) = status {
        h.insert(H_LAST_STATUS.into(), AMQPValue::LongInt(s.into()));
    }
    if let Some(e) = error {
        h.insert(
            H_LAST_ERROR.into(),
            long_string(truncate(e, MAX_ERROR_CHARS)),
        );
    }
}

/// The last attempt's status and error, as the `last-*` headers carry them.
pub fn last(h: Option<&FieldTable>) -> (Option<u16>, Option<String>) {
    let status = get(h, H_LAST_STATUS)
        .and_then(int)
        .and_then(|s| u16::try_from(s).ok());
    (status, get(h, H_LAST_ERROR).and_then(string))
}

/// Marks headers as dead-lettered.
pub fn mark_dead(h: &mut FieldTable, reason: &str, now_ms: i64) {
    h.insert(H_DEAD_REASON.into(), long_string(reason));
    h.insert(H_DEAD_AT.into(), AMQPValue::LongLongInt(now_ms));
}

pub fn truncate(s: &str, max_chars: usize) -> &str {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

pub fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// A header value as an operator should read it (JSON), not a debug dump.
fn shown(v: &AMQPValue) -> String {
    to_json(v).to_string()
}

/// Any AMQP integer type.
pub fn int(v: &AMQPValue) -> Option<i64> {
    Some(match v {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    })
}

pub fn string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// Header lookup by name.
pub fn get<'a>(h: Option<&'a FieldTable>, name: &str) -> Option<&'a AMQPValue> {
    h.and_then(|h| h.inner().get(&ShortString::from(name)))
}

/// AMQP field values as JSON (byte strings as UTF-8, lossily).
pub fn to_json(v: &AMQPValue) -> serde_json::Value {
    use serde_json::Value as J;
    if let Some(n) = int(v) {
        return J::from(n);
    }
    match v {
        AMQPValue::Boolean(b) => J::from(*b),
        AMQPValue::Float(f) => J::from(*f as f64),
        AMQPValue::Double(f) => J::from(*f),
        AMQPValue::Timestamp(t) => J::from(*t),
        AMQPValue::LongString(s) => J::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => J::from(s.as_str()),
        AMQPValue::ByteArray(b) => J::from(String::from_utf8_lossy(b.as_slice()).into_owned()),
        AMQPValue::FieldArray(a) => J::Array(a.as_slice().iter().map(to_json).collect()),
        AMQPValue::FieldTable(t) => J::Object(
            t.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), to_json(v)))
                .collect(),
        ),
        AMQPValue::DecimalValue(d) => J::from(format!("{d:?}")),
        _ => J::Null,
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
