//! The wire format: a notification is a JSON object (format version 1).
//! Decoding validates everything a receiver-facing request depends on, so a
//! bad message is dead-lettered as `invalid` instead of looping.

pub mod dead_letter;
pub mod event;
pub(crate) mod redact;
pub mod run;
pub mod state;
pub mod target;
pub mod trace;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use url::Url;

use crate::policy::{self, PolicyError};

/// The format version this build reads and writes (`"v"` field).
pub const FORMAT_VERSION: u64 = 1;
/// Default cap on an AMQP message body.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
const MAX_HEADERS: usize = 64;
const MAX_HEADER_BYTES: usize = 8 * 1024;
const MAX_ID_LEN: usize = 200;
/// Headers the transport owns; a notification may not set them.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

/// A validated notification, ready to deliver.
#[derive(Clone, Debug)]
pub struct Notification {
    pub id: String,
    pub url: Url,
    pub method: reqwest::Method,
    pub headers: BTreeMap<String, String>,
    /// The exact JSON text of `body`, so every attempt sends the same bytes.
    pub body: Option<Box<RawValue>>,
    pub max_attempts: Option<u32>,
    pub schedule: Option<Vec<Duration>>,
    pub success_body: Option<String>,
    /// How long it may keep being retried or deferred (`"max_age": "72h"`).
    pub max_age: Option<Duration>,
    /// The trace context this attempt's request carries (`traceparent`):
    /// never in the JSON, set by the worker for each attempt.
    pub trace: Option<trace::TraceContext>,
}

/// What a producer may send; unknown fields are ignored.
#[derive(Deserialize)]
struct Wire {
    v: Option<u64>,
    url: Option<String>,
    body: Option<Box<RawValue>>,
    id: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    method: Option<String>,
    max_attempts: Option<u64>,
    schedule: Option<Vec<String>>,
    success_body: Option<String>,
    max_age: Option<String>,
}

impl Notification {
    /// The notification's own layer of the retry policy, which wins over
    /// its route's and the worker's ([`crate::policy::EffectivePolicy`]).
    pub fn overrides(&self) -> policy::Overrides<'_> {
        policy::Overrides {
            max_attempts: self.max_attempts,
            schedule: self.schedule.as_deref(),
            success_body: self.success_body.as_deref(),
            max_age: self.max_age,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvalidMessage {
    #[error("message is {0} bytes; the limit is {1}")]
    TooLarge(usize, usize),
    #[error("body is not valid UTF-8")]
    NotUtf8,
    #[error("not a notification: {0}")]
    Json(String),
    #[error("unsupported format version {0} (this build reads {FORMAT_VERSION})")]
    Version(u64),
    #[error("missing \"url\"")]
    MissingUrl,
    #[error("bad \"url\" {0:?}: {1}")]
    BadUrl(String, String),
    #[error("bad \"id\": {0}")]
    BadId(String),
    #[error("unsupported \"method\" {0:?}")]
    BadMethod(String),
    #[error("bad header {0:?}: {1}")]
    BadHeader(String, String),
    #[error("bad policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("bad retry-state header {0}: {1}")]
    BadState(&'static str, String),
    #[error("it holds redacted secrets (\"***redacted***\"); export with `dlq export --include-secrets` to move notifications with their credentials")]
    Redacted,
}

/// Decodes and validates one AMQP body. `fallback_id` is used when the JSON
/// has no `id` (e.g. the AMQP message-id, or one the worker assigned).
pub fn decode(
    bytes: &[u8],
    max_bytes: usize,
    fallback_id: Option<&str>,
) -> Result<Notification, InvalidMessage> {
    if bytes.len() > max_bytes {
        return Err(InvalidMessage::TooLarge(bytes.len(), max_bytes));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| InvalidMessage::NotUtf8)?;
    let wire: Wire = serde_json::from_str(text).map_err(|e| InvalidMessage::Json(e.to_string()))?;
    match wire.v {
        None | Some(FORMAT_VERSION) => {}
        Some(v) => return Err(InvalidMessage::Version(v)),
    }
    let url = parse_url(wire.url.as_deref().ok_or(InvalidMessage::MissingUrl)?)?;
    let id = match wire.id.as_deref().or(fallback_id) {
        Some(id) => check_id(id)?,
        None => derived_id(bytes),
    };
    let max_attempts = wire
        .max_attempts
        .map(policy::check_max_attempts)
        .transpose()?;
    let schedule = wire.schedule.as_deref().map(parse_schedule).transpose()?;
    let max_age = wire
        .max_age
        .as_deref()
        .map(policy::parse_duration)
        .transpose()?;
    Ok(Notification {
        id,
        url,
        method: parse_method(wire.method.as_deref())?,
        headers: check_headers(wire.headers.unwrap_or_default())?,
        body: wire.body,
        max_attempts,
        schedule,
        success_body: wire.success_body,
        max_age,
        trace: None,
    })
}

/// The id of a notification that carries none (no `id`, no AMQP
/// message-id): a UUIDv5 of its bytes, so every redelivery of the same
/// message gets the same `webhook-id`. Identical bodies share an id.
pub fn derived_id(bytes: &[u8]) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x7b0c_2a4e_9d1f_4c3b_8e57_52ed_e11d_e15a);
    uuid::Uuid::new_v5(&NAMESPACE, bytes).to_string()
}

pub fn parse_url(s: &str) -> Result<Url, InvalidMessage> {
    let bad = |why: &str| InvalidMessage::BadUrl(s.to_string(), why.to_string());
    let url = Url::parse(s).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("only http and https are delivered"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(url)
}

pub fn check_id(id: &str) -> Result<String, InvalidMessage> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(InvalidMessage::BadId(format!(
            "must be 1..={MAX_ID_LEN} bytes"
        )));
    }
    // It is sent as the `webhook-id` header and signed: receivers' HTTP
    // stacks and Standard Webhooks verifiers read header values as visible
    // ASCII, and trim spaces.
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidMessage::BadId(
            "must be visible ASCII (no spaces, control or non-ASCII characters)".into(),
        ));
    }
    Ok(id.to_string())
}

fn parse_method(m: Option<&str>) -> Result<reqwest::Method, InvalidMessage> {
    let m = m.unwrap_or("POST").to_ascii_uppercase();
    match m.as_str() {
        "POST" | "PUT" | "PATCH" | "GET" | "DELETE" => {
            reqwest::Method::from_bytes(m.as_bytes()).map_err(|_| InvalidMessage::BadMethod(m))
        }
        _ => Err(InvalidMessage::BadMethod(m)),
    }
}

fn check_headers(h: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, InvalidMessage> {
    if h.len() > MAX_HEADERS {
        return Err(InvalidMessage::BadHeader(
            format!("{} headers", h.len()),
            format!("at most {MAX_HEADERS}"),
        ));
    }
    for (k, v) in &h {
        let bad =
            |why: &str| InvalidMessage::BadHeader(k.chars().take(64).collect(), why.to_string());
        reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| bad("not a valid header name"))?;
        reqwest::header::HeaderValue::from_str(v).map_err(|_| bad("not a valid header value"))?;
        if k.len() + v.len() > MAX_HEADER_BYTES {
            return Err(bad("too long"));
        }
        if FORBIDDEN_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
            return Err(bad("set by the transport, not by a notification"));
        }
    }
    Ok(h)
}

/// A per-notification schedule obeys the same limits as `--schedule`.
fn parse_schedule(entries: &[String]) -> Result<Vec<Duration>, PolicyError> {
    let schedule: Vec<Duration> = entries
        .iter()
        .map(|e| policy::parse_duration(e))
        .collect::<Result<_, _>>()?;
    let check = policy::RetryPolicy {
        max_attempts: 1,
        backoff: policy::Backoff::Schedule(schedule),
    };
    check.validate()?;
    match check.backoff {
        policy::Backoff::Schedule(s) => Ok(s),
        policy::Backoff::Exponential { .. } => unreachable!("built as a schedule above"),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
