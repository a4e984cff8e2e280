//! A notification from JSON, checked and given an id, ready to publish.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::message::redact::REDACTED;
use crate::message::trace::TraceContext;
use crate::message::{self, InvalidMessage};

/// A validated notification ready to publish: its id and exact bytes.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub id: String,
    pub payload: Vec<u8>,
    /// W3C trace context for its AMQP headers (`traceparent`,
    /// `tracestate`): each attempt's span continues it.
    pub trace: Option<TraceContext>,
    /// This publish's run (`redeliver-run`), drawn once: sent again, it is the same run.
    pub run: String,
    /// Its bucket key, which picks its lane ([`crate::topology::lanes`]).
    pub key: String,
}

/// Validates one JSON notification and assigns an id when it has none.
/// Every other field keeps its exact JSON text.
pub fn prepare(json: &str, max_bytes: usize) -> Result<Prepared, InvalidMessage> {
    let mut fields: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(json).map_err(|e| InvalidMessage::Json(e.to_string()))?;
    // A line from `dlq export` carries its old death record; it is history,
    // not part of the notification.
    fields.remove("dead_letter");
    if !fields.contains_key("id") {
        let id = serde_json::to_string(&uuid::Uuid::new_v4().to_string())
            .map_err(|e| InvalidMessage::Json(e.to_string()))?;
        let raw = RawValue::from_string(id).map_err(|e| InvalidMessage::Json(e.to_string()))?;
        fields.insert("id".into(), raw);
    }
    let payload = serde_json::to_vec(&fields).map_err(|e| InvalidMessage::Json(e.to_string()))?;
    let n = message::decode(&payload, max_bytes, None)?;
    let redacted = n.headers.values().any(|v| v == REDACTED) || n.url.password() == Some("***");
    if redacted {
        return Err(InvalidMessage::Redacted);
    }
    Ok(Prepared {
        id: n.id,
        payload,
        trace: None,
        run: message::run::new_run(),
        key: crate::topology::lanes::key_for_url(&n.url),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_assigns_an_id_and_keeps_fields_exact() {
        let p = prepare(r#"{"url":"http://a/","body":{"x": 1.50}}"#, 1 << 20).unwrap();
        let text = String::from_utf8(p.payload).unwrap();
        assert!(text.contains(&format!(r#""id":"{}""#, p.id)));
        assert!(text.contains(r#""body":{"x": 1.50}"#));
        let kept = prepare(r#"{"url":"http://a/","id":"mine"}"#, 1 << 20).unwrap();
        assert_eq!(kept.id, "mine");
        assert!(prepare(r#"{"url":"gopher://a/"}"#, 1 << 20).is_err());
        assert!(prepare("[]", 1 << 20).is_err());
    }
}
