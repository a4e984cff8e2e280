//! The record of one attempt, as the `<prefix>.history` stream carries it
//! (one JSON object per message; the format is documented for other
//! consumers of the stream), and the pure rules for what it may keep: no
//! query value, no credential header, bodies cut at a byte budget.

use serde::{Deserialize, Serialize};
use url::Url;

use crate::message::redact::is_secret_header;

/// What became of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// A 2xx the success rule accepted: the notification is done.
    Delivered,
    /// Failed and scheduled again (`next_attempt_at`).
    Retry,
    /// Dead-lettered (`dead_reason`), after this attempt or without one.
    Dead,
}

/// One attempt. A dead letter made without an attempt (endpoint disabled,
/// expired, invalid) is a record too, with `attempt` 0 and no status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub notification_id: String,
    /// What the receiver got as `webhook-id`, to deduplicate by.
    pub webhook_id: String,
    /// The publish or replay this attempt belongs to: a chain forked by a
    /// crash shows as duplicate attempts of one run.
    pub run: Option<String>,
    pub attempt: u32,
    /// The origin (`scheme://host:port`), as endpoints are keyed.
    pub endpoint: String,
    /// The target with every query value replaced ([`url_for_record`]).
    pub url: String,
    /// RFC 3339, milliseconds, UTC.
    pub started_at: String,
    pub duration_ms: u64,
    pub status: Option<u16>,
    /// The failure's class and message when there was no status to judge.
    pub error: Option<String>,
    pub outcome: Outcome,
    pub next_attempt_at: Option<String>,
    pub dead_reason: Option<String>,
    /// The response body's first bytes (lossy UTF-8) and its content type.
    pub response_body: Option<String>,
    pub response_content_type: Option<String>,
    /// The request body, on a run's first attempt only.
    pub request_body: Option<String>,
    /// The request headers the notification set, credentials left out.
    pub request_headers: Vec<(String, String)>,
    pub worker: String,
    pub trace_id: Option<String>,
}

/// Written in place of each query value.
pub const QUERY_VALUE: &str = "***";

/// `url` with each query value replaced by [`QUERY_VALUE`] (keys stay: they
/// say what was sent, values may be tokens), and any user or password
/// dropped.
pub fn url_for_record(url: &Url) -> String {
    // Most targets have neither: a copy on every attempt, not a rebuild.
    if url.query().is_none() && url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    if u.query().is_some() {
        let keys: Vec<String> = u.query_pairs().map(|(k, _)| k.into_owned()).collect();
        u.query_pairs_mut()
            .clear()
            .extend_pairs(keys.iter().map(|k| (k.as_str(), QUERY_VALUE)));
    }
    u.to_string()
}

/// Whether a header may be recorded: never a credential (the house's list,
/// [`is_secret_header`]) nor one named in `--history-redact-headers`.
pub fn header_kept(name: &str, also_redacted: &[String]) -> bool {
    !is_secret_header(name) && !also_redacted.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// The first `max` bytes of `body`, cut back to a character boundary, as
/// text; `None` for an empty body or a budget of 0.
pub fn body_for_record(body: &[u8], max: usize) -> Option<String> {
    if body.is_empty() || max == 0 {
        return None;
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(max)]);
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(text[..end].to_string())
}

/// A record with every field set, for tests.
#[cfg(test)]
pub(crate) fn sample() -> Attempt {
    Attempt {
        notification_id: "n1".into(),
        webhook_id: "msg_n1".into(),
        run: Some("r1".into()),
        attempt: 1,
        endpoint: "https://h.example:443".into(),
        url: "https://h.example/cb".into(),
        started_at: "2026-11-28T08:00:00.000Z".into(),
        duration_ms: 12,
        status: Some(500),
        error: None,
        outcome: Outcome::Retry,
        next_attempt_at: Some("2026-11-28T08:00:15.000Z".into()),
        dead_reason: None,
        response_body: Some("oops".into()),
        response_content_type: Some("text/plain".into()),
        request_body: None,
        request_headers: vec![],
        worker: "w1".into(),
        trace_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_and_credentials_never_reach_a_record() {
        let record = |u: &str| url_for_record(&Url::parse(u).unwrap());
        assert_eq!(
            record("https://u:pw@h.example/cb?token=s3cret&order=42#x"),
            "https://h.example/cb?token=***&order=***#x"
        );
        assert_eq!(record("https://u@h.example/cb"), "https://h.example/cb");
        assert_eq!(record("http://h:8080/a"), "http://h:8080/a");
    }

    #[test]
    fn credential_headers_are_left_out() {
        let extra = vec!["X-Merchant-Key".to_string()];
        for h in [
            "Authorization",
            "cookie",
            "Proxy-Authorization",
            "X-Api-Key",
        ] {
            assert!(!header_kept(h, &extra), "{h}");
        }
        assert!(!header_kept("x-merchant-key", &extra));
        assert!(header_kept("Content-Type", &extra));
    }

    #[test]
    fn bodies_are_cut_at_a_character_boundary() {
        assert_eq!(body_for_record(b"", 10), None);
        assert_eq!(body_for_record(b"abc", 0), None);
        assert_eq!(body_for_record(b"abcdef", 4).as_deref(), Some("abcd"));
        // "é" is two bytes: a budget of 2 keeps "a" only.
        assert_eq!(body_for_record("aé".as_bytes(), 2).as_deref(), Some("a"));
    }

    #[test]
    fn the_wire_format_names_the_documented_fields() {
        let a = sample();
        let v = serde_json::to_value(&a).unwrap();
        for k in [
            "notification_id",
            "webhook_id",
            "run",
            "attempt",
            "endpoint",
            "url",
            "started_at",
            "duration_ms",
            "status",
            "error",
            "outcome",
            "response_body",
            "worker",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert_eq!(v["outcome"], "retry");
        assert_eq!(serde_json::from_value::<Attempt>(v).unwrap(), a);
    }
}
