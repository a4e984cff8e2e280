//! A dead letter as operators see it: the notification, why it died and
//! its attempt history, decoded from the message and its headers.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::message::redact::{is_secret_header, redact_url, REDACTED};
use crate::message::state::{
    self, is_broker_count_header, to_json, H_ATTEMPT, H_DEAD_AT, H_DEAD_REASON, H_FIRST_AT,
    H_HISTORY, H_ID, H_LAST_ERROR, H_LAST_STATUS,
};
use crate::message::target::Target;

/// One dead letter. Serialised as one `--json` line: the notification's own
/// fields at the top level (so `publish --file` can re-import it) plus a
/// `dead_letter` object with everything recorded about its death.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub id: String,
    pub url: Option<String>,
    pub meta: DeadMeta,
    /// The original notification object, field by field, exactly as sent;
    /// `None` when the body is not a JSON object (an `invalid` one).
    pub notification: Option<BTreeMap<String, Box<RawValue>>>,
    pub raw: Vec<u8>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeadMeta {
    pub reason: Option<String>,
    pub attempts: u32,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub first_attempt_at: Option<i64>,
    pub dead_at: Option<i64>,
    pub history: Vec<serde_json::Value>,
    /// Every other header, as JSON.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// The body as (lossy) text, present only when it is not a JSON object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_body: Option<String>,
}

impl DeadMeta {
    /// Why and when it died and its history, from redeliver's headers; every
    /// other header is kept as JSON.
    fn from_headers(headers: Option<&FieldTable>, raw_body: Option<String>) -> Self {
        let text = |k| state::get(headers, k).and_then(state::string);
        let int = |k| state::get(headers, k).and_then(state::int);
        let history = match state::get(headers, H_HISTORY) {
            Some(AMQPValue::FieldArray(a)) => a.as_slice().iter().map(to_json).collect(),
            _ => vec![],
        };
        DeadMeta {
            reason: text(H_DEAD_REASON),
            attempts: int(H_ATTEMPT)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            last_status: int(H_LAST_STATUS),
            last_error: text(H_LAST_ERROR),
            first_attempt_at: int(H_FIRST_AT),
            dead_at: int(H_DEAD_AT),
            history,
            headers: other_headers(headers),
            raw_body,
        }
    }
}

/// The headers that are not redeliver's own, as JSON.
fn other_headers(headers: Option<&FieldTable>) -> serde_json::Map<String, serde_json::Value> {
    let ours = [
        H_ATTEMPT,
        H_DEAD_AT,
        H_DEAD_REASON,
        H_FIRST_AT,
        H_HISTORY,
        H_ID,
        H_LAST_ERROR,
        H_LAST_STATUS,
    ];
    headers
        .map(|h| {
            h.inner()
                .iter()
                // Added by a quorum dead-letter queue each time a walk
                // returned the message; not the producer's.
                .filter(|(k, _)| !ours.contains(&k.as_str()) && !is_broker_count_header(k.as_str()))
                .map(|(k, v)| (k.to_string(), to_json(v)))
                .collect()
        })
        .unwrap_or_default()
}

impl DeadLetter {
    /// Decodes whatever is in the dead-letter queue: an undecodable body
    /// (an `invalid` dead letter) still lists, with its raw text.
    pub fn from_message(
        data: &[u8],
        headers: Option<&FieldTable>,
        message_id: Option<&str>,
    ) -> Self {
        let notification: Option<BTreeMap<String, Box<RawValue>>> =
            serde_json::from_slice(data).ok();
        let field = |k: &str| {
            notification
                .as_ref()
                .and_then(|n| n.get(k))
                .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
        };
        let id = field("id")
            .or_else(|| state::get(headers, H_ID).and_then(state::string))
            .or_else(|| message_id.map(str::to_string))
            .unwrap_or_else(|| crate::message::derived_id(data));
        let raw_body = notification
            .is_none()
            .then(|| String::from_utf8_lossy(data).into_owned());
        let meta = DeadMeta::from_headers(headers, raw_body);
        DeadLetter {
            id,
            url: field("url"),
            meta,
            notification,
            raw: data.to_vec(),
        }
    }

    /// Hides secrets: sensitive request-header values (Authorization,
    /// Cookie, `*-token`, ...) in the notification and any password in its URL.
    pub fn redact(&mut self) {
        if let Some(url) = &self.url {
            self.url = Some(redact_url(url));
        }
        let Some(n) = &mut self.notification else {
            return;
        };
        if let Some(u) = n
            .get("url")
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
        {
            n.insert("url".into(), raw(&redact_url(&u)));
        }
        let headers = n
            .get("headers")
            .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v.get()).ok());
        if let Some(mut h) = headers {
            for (k, v) in h.iter_mut() {
                if is_secret_header(k) {
                    *v = REDACTED.into();
                }
            }
            n.insert("headers".into(), raw(&h));
        }
    }

    /// One JSON line: the notification's fields plus `dead_letter`.
    pub fn to_json_line(&self) -> String {
        let mut out: BTreeMap<String, Box<RawValue>> =
            self.notification.clone().unwrap_or_default();
        // Always carry the id (a producer may have sent it as the AMQP
        // message-id only), so a re-import keeps what receivers dedupe on.
        out.entry("id".into()).or_insert_with(|| raw(&self.id));
        out.insert("dead_letter".into(), raw(&self.meta));
        serde_json::to_string(&out).unwrap_or_default()
    }
}

fn raw<T: Serialize>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v)
        .unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
}

/// Which dead letters an operation applies to. Empty means all.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub ids: Vec<String>,
    pub reason: Option<String>,
    pub url_contains: Option<String>,
    /// Only those to this endpoint (origin or URL prefix).
    pub endpoint: Option<Target>,
    /// Only those that died within this long before now.
    pub since: Option<Duration>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
            && self.reason.is_none()
            && self.url_contains.is_none()
            && self.endpoint.is_none()
            && self.since.is_none()
    }

    pub fn matches(&self, d: &DeadLetter, now_ms: i64) -> bool {
        (self.ids.is_empty() || self.ids.contains(&d.id))
            && self
                .reason
                .as_ref()
                .is_none_or(|r| d.meta.reason.as_deref() == Some(r.as_str()))
            && self
                .url_contains
                .as_ref()
                .is_none_or(|u| d.url.as_deref().is_some_and(|url| url.contains(u.as_str())))
            && self.endpoint.as_ref().is_none_or(|t| {
                d.url
                    .as_deref()
                    .and_then(|u| url::Url::parse(u).ok())
                    .is_some_and(|u| t.matches(&u))
            })
            && self.since.is_none_or(|s| {
                d.meta
                    .dead_at
                    .is_some_and(|at| at >= now_ms - s.as_millis() as i64)
            })
    }
}
