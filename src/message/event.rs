//! Operational events on the wire: one JSON object each, schema version 1,
//! documented in `docs/operations.md#operational-events`. Pure: the worker,
//! the endpoint commands and the delay probe build them here; `crate::events`
//! publishes them.
//!
//! An event's `id` is derived from what it is about (the prefix, its type
//! and the notification's id and run, the endpoint-state record, or
//! the stall), never drawn at random: an event published again after a
//! crash carries the same `id`, so consumers deduplicate by it. A
//! notification event is about its run's logical outcome, not about one
//! attempt: a retry chain forked by a crash (both copies attempted on)
//! announces its exhaustion with one id, however many times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use url::Url;

use super::target::Target;

/// The schema version this build writes (`"v"`).
pub const SCHEMA_VERSION: u32 = 1;

/// Every type of event; the routing key on `<prefix>.events` is its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Failing,
    Exhausted,
    DeadLettered,
    Recovered,
    Paused,
    Resumed,
    Disabled,
    Enabled,
    DelayStalled,
    DelayRecovered,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Failing,
        Kind::Exhausted,
        Kind::DeadLettered,
        Kind::Recovered,
        Kind::Paused,
        Kind::Resumed,
        Kind::Disabled,
        Kind::Enabled,
        Kind::DelayStalled,
        Kind::DelayRecovered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Failing => "notification.failing",
            Kind::Exhausted => "notification.exhausted",
            Kind::DeadLettered => "notification.dead-lettered",
            Kind::Recovered => "notification.recovered",
            Kind::Paused => "endpoint.paused",
            Kind::Resumed => "endpoint.resumed",
            Kind::Disabled => "endpoint.disabled",
            Kind::Enabled => "endpoint.enabled",
            Kind::DelayStalled => "delay-backend.stalled",
            Kind::DelayRecovered => "delay-backend.recovered",
        }
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One operational event.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Event {
    pub v: u32,
    /// Stable: the same event published again keeps it.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: Kind,
    /// When it happened, RFC 3339 UTC with milliseconds.
    pub time: String,
    pub prefix: String,
    pub data: Data,
}

/// What an event is about, by its type's family.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Data {
    Notification(NotificationData),
    Endpoint(EndpointData),
    Delay(DelayData),
}

/// `notification.*`: every field is present, `null` when unknown.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NotificationData {
    pub notification_id: Option<String>,
    /// The `webhook-id` its receiver got (the notification's id).
    pub webhook_id: Option<String>,
    /// Its URL's origin (`https://h.example:443`), as `redeliver
    /// endpoint` names it; the full URL is not given, as its path or query
    /// may hold a token.
    pub endpoint: Option<String>,
    /// Attempts made so far (this one included).
    pub attempt: u32,
    /// The last attempt's HTTP status, or its error.
    pub status: Option<u16>,
    pub error: Option<String>,
    /// `failing` and `recovered`: null; otherwise its dead-letter reason.
    pub reason: Option<String>,
}

/// `endpoint.*`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EndpointData {
    /// The ORIGIN or URL prefix the change is about.
    pub endpoint: String,
    /// Who did it: `command <user>@<host>`, or `auto <host>/<pid>` (the
    /// automatic disable, or a pause's `--for` ending).
    pub by: String,
    pub automatic: bool,
    pub reason: Option<String>,
    /// A pause's end, if it has one (RFC 3339).
    pub until: Option<String>,
}

/// `delay-backend.*`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DelayData {
    /// `plugin` or `cascade`.
    pub backend: String,
    /// When the stall began: the send time of the first probe that did
    /// not come back (RFC 3339).
    pub since: String,
    /// `recovered` only: how long it lasted, in seconds.
    pub lasted_seconds: Option<u64>,
}

impl Event {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The last attempt's outcome, for a notification event.
#[derive(Clone, Copy, Debug, Default)]
pub struct Last<'a> {
    pub status: Option<u16>,
    pub error: Option<&'a str>,
}

/// What a `notification.*` event is about.
#[derive(Clone, Copy, Debug, Default)]
pub struct Subject<'a> {
    /// The notification's id, when it could be read.
    pub id: Option<&'a str>,
    pub url: Option<&'a Url>,
    /// Attempts made so far.
    pub attempt: u32,
    pub last: Last<'a>,
    /// Which run of the notification this is (`redeliver-run`: its
    /// publish or replay, [`super::run`]); for a message that could not be
    /// read, its bytes.
    pub run: &'a [u8],
}

/// A `notification.*` event.
pub fn notification(kind: Kind, prefix: &str, s: Subject<'_>, reason: Option<&str>) -> Event {
    let mut seed = format!("{}\n", s.id.unwrap_or("")).into_bytes();
    seed.extend_from_slice(s.run);
    Event {
        v: SCHEMA_VERSION,
        id: event_id(prefix, kind, &seed),
        kind,
        time: rfc3339_ms(SystemTime::now()),
        prefix: prefix.to_string(),
        data: Data::Notification(NotificationData {
            notification_id: s.id.map(str::to_string),
            webhook_id: s.id.map(str::to_string),
            endpoint: s.url.and_then(Target::origin_of).map(|t| t.to_string()),
            attempt: s.attempt,
            status: s.last.status,
            error: s.last.error.map(str::to_string),
            reason: reason.map(str::to_string),
        }),
    }
}

/// An `endpoint.*` event for the endpoint-state record `record_id`.
pub fn endpoint(kind: Kind, prefix: &str, record_id: &str, data: EndpointData) -> Event {
    Event {
        v: SCHEMA_VERSION,
        id: event_id(prefix, kind, record_id.as_bytes()),
        kind,
        time: rfc3339_ms(SystemTime::now()),
        prefix: prefix.to_string(),
        data: Data::Endpoint(data),
    }
}

/// A `delay-backend.*` event for the stall of `backend` that began at
/// `since`; `lasted` for a recovery.
pub fn delay(
    kind: Kind,
    prefix: &str,
    backend: &str,
    since: SystemTime,
    lasted: Option<Duration>,
) -> Event {
    let since_ms = since
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Event {
        v: SCHEMA_VERSION,
        id: event_id(prefix, kind, format!("{backend}\n{since_ms}").as_bytes()),
        kind,
        time: rfc3339_ms(SystemTime::now()),
        prefix: prefix.to_string(),
        data: Data::Delay(DelayData {
            backend: backend.to_string(),
            since: rfc3339_ms(since),
            lasted_seconds: lasted.map(|d| d.as_secs()),
        }),
    }
}

/// `evt_` and a UUID (v5) of the prefix, the type and `seed`.
fn event_id(prefix: &str, kind: Kind, seed: &[u8]) -> String {
    let mut name = Vec::with_capacity(prefix.len() + seed.len() + 40);
    name.extend_from_slice(prefix.as_bytes());
    name.push(b'\n');
    name.extend_from_slice(kind.as_str().as_bytes());
    name.push(b'\n');
    name.extend_from_slice(seed);
    format!(
        "evt_{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &name)
    )
}

/// RFC 3339 in UTC with milliseconds, within years 1970 to 9999 (the
/// format has four digits for the year).
pub fn rfc3339_ms(t: SystemTime) -> String {
    let latest = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_millis(t.clamp(UNIX_EPOCH, latest)).to_string()
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
