//! Outcome classification: is an attempt's result a success, worth a retry,
//! or permanent? One input of the retry decision, which is made in
//! `decide.rs` only; how long to wait is `backoff.rs`'s.

use std::time::Duration;

/// What one delivery attempt produced, whatever the transport.
/// An embedded [`crate::DeliveryHandler`] returns this too.
#[derive(Clone, Debug, PartialEq)]
pub enum AttemptResult {
    /// The receiver answered.
    Response {
        status: u16,
        /// The (size-capped) response body, for the success-body rule.
        body: String,
        /// Parsed `Retry-After`, when the receiver sent one.
        retry_after: Option<Duration>,
        /// The response's `Content-Type`, for the history.
        content_type: Option<String>,
    },
    /// No answer: connection refused, timeout, TLS failure, ...
    Failed { error: String },
    /// The handler refuses this notification for good (e.g. a blocked address).
    Refused { error: String },
    /// The receiver answered `status` (not a 2xx) and asked for no further
    /// attempt: the response header `webhook-delivery: abort-message`
    /// (Svix's delivery control). Dead-lettered as `aborted-by-receiver`.
    Aborted { status: u16 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Retryable,
    Permanent,
    /// The receiver asked for no further attempt.
    Aborted,
}

/// The rules that turn an [`AttemptResult`] into a [`Verdict`].
#[derive(Clone, Debug, PartialEq)]
pub struct SuccessRules {
    /// Statuses that dead-letter at once (default: 410 Gone).
    pub permanent_status: Vec<u16>,
    /// When set, a 2xx also needs this trimmed body to count as success.
    pub success_body: Option<String>,
}

impl Default for SuccessRules {
    fn default() -> Self {
        SuccessRules {
            permanent_status: vec![410],
            success_body: None,
        }
    }
}

/// A classified attempt: the verdict plus what is recorded about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Classified {
    pub verdict: Verdict,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// Only honoured on 429 and 503.
    pub retry_after: Option<Duration>,
}

/// `success_body` is the per-notification override, which wins over the rules'.
pub fn classify(
    result: &AttemptResult,
    rules: &SuccessRules,
    success_body: Option<&str>,
) -> Classified {
    match result {
        AttemptResult::Failed { error } => failed(Verdict::Retryable, None, error.clone()),
        AttemptResult::Refused { error } => failed(Verdict::Permanent, None, error.clone()),
        AttemptResult::Aborted { status } => failed(
            Verdict::Aborted,
            Some(*status),
            format!("HTTP {status}; the receiver asked for no further attempt (webhook-delivery: abort-message)"),
        ),
        AttemptResult::Response {
            status,
            body,
            retry_after,
            ..
        } => {
            let status = *status;
            let expected = success_body.or(rules.success_body.as_deref());
            if (200..300).contains(&status) {
                match expected {
                    Some(want) if body.trim() != want.trim() => failed(
                        Verdict::Retryable,
                        Some(status),
                        format!(
                            "response body {:?} is not the expected {want:?}",
                            short(body)
                        ),
                    ),
                    _ => Classified {
                        verdict: Verdict::Success,
                        status: Some(status),
                        error: None,
                        retry_after: None,
                    },
                }
            } else if rules.permanent_status.contains(&status) {
                failed(Verdict::Permanent, Some(status), format!("HTTP {status}"))
            } else {
                let mut c = failed(Verdict::Retryable, Some(status), format!("HTTP {status}"));
                if status == 429 || status == 503 {
                    c.retry_after = *retry_after;
                }
                c
            }
        }
    }
}

fn failed(verdict: Verdict, status: Option<u16>, error: String) -> Classified {
    Classified {
        verdict,
        status,
        error: Some(error),
        retry_after: None,
    }
}

fn short(s: &str) -> String {
    s.trim().chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, body: &str) -> AttemptResult {
        AttemptResult::Response {
            status,
            body: body.into(),
            retry_after: Some(Duration::from_secs(30)),
            content_type: None,
        }
    }

    #[test]
    fn two_xx_is_success_and_others_retry() {
        let r = SuccessRules::default();
        assert_eq!(classify(&resp(204, ""), &r, None).verdict, Verdict::Success);
        assert_eq!(
            classify(&resp(500, ""), &r, None).verdict,
            Verdict::Retryable
        );
        assert_eq!(
            classify(&resp(302, ""), &r, None).verdict,
            Verdict::Retryable
        );
        assert_eq!(
            classify(&resp(404, ""), &r, None).verdict,
            Verdict::Retryable
        );
        let f = AttemptResult::Failed {
            error: "timeout".into(),
        };
        assert_eq!(classify(&f, &r, None).verdict, Verdict::Retryable);
    }

    #[test]
    fn permanent_statuses_dead_letter() {
        let r = SuccessRules::default();
        let c = classify(&resp(410, ""), &r, None);
        assert_eq!((c.verdict, c.status), (Verdict::Permanent, Some(410)));
        let custom = SuccessRules {
            permanent_status: vec![400, 404],
            success_body: None,
        };
        assert_eq!(
            classify(&resp(404, ""), &custom, None).verdict,
            Verdict::Permanent
        );
        assert_eq!(
            classify(&resp(410, ""), &custom, None).verdict,
            Verdict::Retryable
        );
    }

    #[test]
    fn success_body_must_match_trimmed_and_override_wins() {
        let r = SuccessRules {
            success_body: Some("success".into()),
            ..Default::default()
        };
        assert_eq!(
            classify(&resp(200, " success\n"), &r, None).verdict,
            Verdict::Success
        );
        assert_eq!(
            classify(&resp(200, "ok"), &r, None).verdict,
            Verdict::Retryable
        );
        assert_eq!(
            classify(&resp(200, "ok"), &r, Some("ok")).verdict,
            Verdict::Success
        );
    }

    #[test]
    fn an_abort_is_its_own_verdict_with_the_status() {
        let c = classify(
            &AttemptResult::Aborted { status: 500 },
            &SuccessRules::default(),
            None,
        );
        assert_eq!((c.verdict, c.status), (Verdict::Aborted, Some(500)));
        assert!(c.error.unwrap().contains("abort-message"));
    }

    #[test]
    fn retry_after_only_on_429_and_503() {
        let r = SuccessRules::default();
        assert_eq!(
            classify(&resp(429, ""), &r, None).retry_after,
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            classify(&resp(503, ""), &r, None).retry_after,
            Some(Duration::from_secs(30))
        );
        assert_eq!(classify(&resp(500, ""), &r, None).retry_after, None);
    }
}
