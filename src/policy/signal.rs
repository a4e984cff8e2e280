//! What one attempt says about its endpoint, as the breaker
//! (`breaker.rs`) and the adaptive limit (`limit.rs`) read it: up, down,
//! or asking for a pause. Pure.

use std::time::Duration;

use super::classify::AttemptResult;

/// How long a 429 without `Retry-After` pauses its endpoint.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// What one attempt says about its endpoint (not about the notification:
/// that is `classify`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// It answered with a 1xx, 2xx or 3xx.
    Alive,
    /// It answered with an application error: 4xx but 429, 5xx but
    /// 502/503/504. The endpoint is up; only the notification failed.
    AppError,
    /// Down or overloaded: no answer (connect error, timeout, TLS), or a
    /// 502, 503 (without `Retry-After`) or 504.
    Failure,
    /// 429, or 503 with `Retry-After`: come back after this long.
    Pause(Duration),
    /// Nothing about the endpoint (an address the worker refused).
    Nothing,
}

pub fn signal(result: &AttemptResult) -> Signal {
    match result {
        AttemptResult::Failed { .. } => Signal::Failure,
        AttemptResult::Refused { .. } => Signal::Nothing,
        // It answered, on purpose: up, and the notification is the matter.
        AttemptResult::Aborted { .. } => Signal::AppError,
        AttemptResult::Response {
            status: 429,
            retry_after,
            ..
        } => Signal::Pause(retry_after.unwrap_or(DEFAULT_PAUSE)),
        AttemptResult::Response {
            status: 503,
            retry_after: Some(ra),
            ..
        } => Signal::Pause(*ra),
        AttemptResult::Response {
            status: 502..=504, ..
        } => Signal::Failure,
        AttemptResult::Response { status, .. } if *status >= 400 => Signal::AppError,
        AttemptResult::Response { .. } => Signal::Alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    use crate::policy::decide::tests::resp;

    #[test]
    fn signals_say_what_an_attempt_tells_about_the_endpoint() {
        let failed = AttemptResult::Failed {
            error: "timeout".into(),
        };
        assert_eq!(signal(&failed), Signal::Failure);
        // Down or overloaded: a gateway's answers for a dead upstream.
        for down in [502, 503, 504] {
            assert_eq!(signal(&resp(down, None)), Signal::Failure, "{down}");
        }
        // An application error is the endpoint answering: it is up.
        for app in [400, 401, 404, 409, 410, 422, 500, 501, 505] {
            assert_eq!(signal(&resp(app, None)), Signal::AppError, "{app}");
        }
        assert_eq!(signal(&resp(503, Some(7))), Signal::Pause(secs(7.0)));
        assert_eq!(signal(&resp(429, Some(2))), Signal::Pause(secs(2.0)));
        assert_eq!(signal(&resp(429, None)), Signal::Pause(DEFAULT_PAUSE));
        for alive in [200, 204, 302] {
            assert_eq!(signal(&resp(alive, None)), Signal::Alive, "{alive}");
        }
        let refused = AttemptResult::Refused { error: "x".into() };
        assert_eq!(signal(&refused), Signal::Nothing);
    }
}
