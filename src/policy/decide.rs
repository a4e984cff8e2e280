//! Where the retry is decided, and nowhere else: the attempt's result, the
//! retry state (how many attempts were made) and the effective policy give
//! one [`Decision`]: the attempt's classification and the [`Action`] (ack,
//! retry after a delay, or dead-letter with a reason). Pure: no I/O, no
//! clock; the worker carries the decision out.
//!
//! Precedence, most specific first: the notification's own fields, then its
//! URL's `[[route]]`, then the worker's flags. A `Retry-After` on a 429 or
//! 503 raises the backoff's delay, up to the policy's longest delay.

use std::time::Duration;

use rand::Rng;

use super::backoff::{Backoff, RetryPolicy};
use super::classify::{classify, AttemptResult, Classified, SuccessRules, Verdict};

/// Why a notification was dead-lettered; recorded in `redeliver-dead-reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadReason {
    MaxAttempts,
    PermanentStatus,
    /// The handler refused it for good (e.g. a blocked address).
    Permanent,
    /// The message could not be decoded or validated.
    Invalid,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::MaxAttempts => "max-attempts",
            DeadReason::PermanentStatus => "permanent-status",
            DeadReason::Permanent => "permanent",
            DeadReason::Invalid => "invalid",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Ack,
    Retry { delay: Duration },
    DeadLetter { reason: DeadReason },
}

/// One layer of overrides: a notification's own fields, or its URL's
/// `[[route]]`. `None` leaves the layer below in force.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides<'a> {
    pub max_attempts: Option<u32>,
    pub schedule: Option<&'a [Duration]>,
    /// The body a 2xx must carry to count as a success.
    pub success_body: Option<&'a str>,
}

/// The policy in force for one notification: the worker's, with its
/// route's and its own overrides applied.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectivePolicy<'a> {
    pub retry: RetryPolicy,
    pub rules: &'a SuccessRules,
    /// The success-body override (route or notification); the rules' own
    /// applies when `None`.
    pub success_body: Option<&'a str>,
}

impl<'a> EffectivePolicy<'a> {
    /// `own` wins over `route`, which wins over the worker's `base` and `rules`.
    pub fn new(
        base: &RetryPolicy,
        rules: &'a SuccessRules,
        route: Overrides<'a>,
        own: Overrides<'a>,
    ) -> Self {
        let retry = RetryPolicy {
            max_attempts: own
                .max_attempts
                .or(route.max_attempts)
                .unwrap_or(base.max_attempts),
            backoff: match own.schedule.or(route.schedule) {
                Some(s) => Backoff::Schedule(s.to_vec()),
                None => base.backoff.clone(),
            },
        };
        EffectivePolicy {
            retry,
            rules,
            success_body: own.success_body.or(route.success_body),
        }
    }
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub classified: Classified,
    pub action: Action,
}

/// The retry decision. `attempt` is the 1-based number of the attempt just
/// made (the retry state's count plus one); `rng` draws the jitter.
pub fn decide(
    result: &AttemptResult,
    attempt: u32,
    policy: &EffectivePolicy,
    rng: &mut impl Rng,
) -> Decision {
    let classified = classify(result, policy.rules, policy.success_body);
    let action = action(&classified, attempt, &policy.retry, rng);
    Decision { classified, action }
}

/// Retry or not, and how long to wait, for a classified attempt.
fn action(c: &Classified, attempt: u32, policy: &RetryPolicy, rng: &mut impl Rng) -> Action {
    match c.verdict {
        Verdict::Success => Action::Ack,
        Verdict::Permanent if c.status.is_some() => Action::DeadLetter {
            reason: DeadReason::PermanentStatus,
        },
        Verdict::Permanent => Action::DeadLetter {
            reason: DeadReason::Permanent,
        },
        Verdict::Retryable if attempt >= policy.max_attempts => Action::DeadLetter {
            reason: DeadReason::MaxAttempts,
        },
        Verdict::Retryable => {
            let backoff = policy.delay(attempt, rng);
            let delay = match c.retry_after {
                Some(ra) => backoff.max(ra).min(policy.max_delay().max(backoff)),
                None => backoff,
            };
            Action::Retry { delay }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_schedule;
    use rand::{rngs::StdRng, SeedableRng};

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Backoff::Schedule(parse_schedule("1s,2s,4s").unwrap()),
        }
    }

    fn c(verdict: Verdict, status: Option<u16>, ra: Option<u64>) -> Classified {
        Classified {
            verdict,
            status,
            error: None,
            retry_after: ra.map(Duration::from_secs),
        }
    }

    fn d(c: &Classified, attempt: u32) -> Action {
        action(c, attempt, &policy(), &mut StdRng::seed_from_u64(1))
    }

    #[test]
    fn retries_until_max_attempts_then_dead() {
        let f = c(Verdict::Retryable, Some(500), None);
        assert_eq!(
            d(&f, 1),
            Action::Retry {
                delay: Duration::from_secs(1)
            }
        );
        assert_eq!(
            d(&f, 2),
            Action::Retry {
                delay: Duration::from_secs(2)
            }
        );
        assert_eq!(
            d(&f, 3),
            Action::DeadLetter {
                reason: DeadReason::MaxAttempts
            }
        );
    }

    #[test]
    fn success_acks_and_permanent_dead_letters() {
        assert_eq!(d(&c(Verdict::Success, Some(200), None), 3), Action::Ack);
        let p = c(Verdict::Permanent, Some(410), None);
        assert_eq!(
            d(&p, 1),
            Action::DeadLetter {
                reason: DeadReason::PermanentStatus
            }
        );
        let r = c(Verdict::Permanent, None, None);
        assert_eq!(
            d(&r, 1),
            Action::DeadLetter {
                reason: DeadReason::Permanent
            }
        );
    }

    #[test]
    fn retry_after_raises_the_delay_but_is_capped() {
        let ra = c(Verdict::Retryable, Some(429), Some(3));
        assert_eq!(
            d(&ra, 1),
            Action::Retry {
                delay: Duration::from_secs(3)
            }
        );
        let huge = c(Verdict::Retryable, Some(503), Some(3600));
        assert_eq!(
            d(&huge, 1),
            Action::Retry {
                delay: Duration::from_secs(4)
            }
        );
        let small = c(Verdict::Retryable, Some(503), Some(0));
        assert_eq!(
            d(&small, 2),
            Action::Retry {
                delay: Duration::from_secs(2)
            }
        );
    }

    fn resp(status: u16, retry_after: Option<u64>) -> AttemptResult {
        AttemptResult::Response {
            status,
            body: String::new(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    fn secs(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&s| Duration::from_secs(s)).collect()
    }

    /// Flags: 5 attempts, 10 s exponential without jitter.
    fn flags() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Exponential {
                initial: Duration::from_secs(10),
                factor: 2.0,
                max: Duration::from_secs(3600),
                jitter: crate::policy::Jitter::None,
            },
        }
    }

    fn decided(p: &EffectivePolicy, result: &AttemptResult, attempt: u32) -> Action {
        decide(result, attempt, p, &mut StdRng::seed_from_u64(1)).action
    }

    #[test]
    fn flags_apply_without_overrides() {
        let rules = SuccessRules::default();
        let p = EffectivePolicy::new(&flags(), &rules, Overrides::default(), Overrides::default());
        let delay = Duration::from_secs(20);
        assert_eq!(decided(&p, &resp(500, None), 2), Action::Retry { delay });
        let dead = Action::DeadLetter {
            reason: DeadReason::MaxAttempts,
        };
        assert_eq!(decided(&p, &resp(500, None), 5), dead);
    }

    #[test]
    fn a_route_overrides_the_flags() {
        let (rules, sched) = (SuccessRules::default(), secs(&[1, 2]));
        let route = Overrides {
            max_attempts: Some(3),
            schedule: Some(&sched),
            success_body: None,
        };
        let p = EffectivePolicy::new(&flags(), &rules, route, Overrides::default());
        let delay = Duration::from_secs(2);
        assert_eq!(decided(&p, &resp(500, None), 2), Action::Retry { delay });
        let dead = Action::DeadLetter {
            reason: DeadReason::MaxAttempts,
        };
        assert_eq!(decided(&p, &resp(500, None), 3), dead);
    }

    #[test]
    fn the_notification_overrides_its_route() {
        let rules = SuccessRules::default();
        let (route_s, own_s) = (secs(&[1, 2]), secs(&[7]));
        let route = Overrides {
            max_attempts: Some(3),
            schedule: Some(&route_s),
            success_body: Some("route-ok"),
        };
        let own = Overrides {
            max_attempts: Some(9),
            schedule: Some(&own_s),
            success_body: Some("own-ok"),
        };
        let p = EffectivePolicy::new(&flags(), &rules, route, own);
        let delay = Duration::from_secs(7);
        assert_eq!(decided(&p, &resp(500, None), 5), Action::Retry { delay });
        let ok = |body: &str| AttemptResult::Response {
            status: 200,
            body: body.into(),
            retry_after: None,
        };
        assert_eq!(decided(&p, &ok("own-ok"), 1), Action::Ack);
        assert!(matches!(
            decided(&p, &ok("route-ok"), 1),
            Action::Retry { .. }
        ));
    }

    #[test]
    fn a_route_success_body_applies_when_the_notification_has_none() {
        let rules = SuccessRules {
            success_body: Some("flag-ok".into()),
            ..Default::default()
        };
        let route = Overrides {
            success_body: Some("route-ok"),
            ..Default::default()
        };
        let p = EffectivePolicy::new(&flags(), &rules, route, Overrides::default());
        let ok = AttemptResult::Response {
            status: 200,
            body: "route-ok".into(),
            retry_after: None,
        };
        assert_eq!(decided(&p, &ok, 1), Action::Ack);
    }

    #[test]
    fn retry_after_beats_a_shorter_backoff_of_any_layer() {
        let (rules, sched) = (SuccessRules::default(), secs(&[1, 60]));
        let own = Overrides {
            schedule: Some(&sched),
            ..Default::default()
        };
        let p = EffectivePolicy::new(&flags(), &rules, Overrides::default(), own);
        let d = decide(&resp(429, Some(30)), 1, &p, &mut StdRng::seed_from_u64(1));
        assert_eq!(d.classified.status, Some(429));
        let delay = Duration::from_secs(30);
        assert_eq!(d.action, Action::Retry { delay });
        // Capped by the effective policy's longest delay (60 s here).
        let capped = Duration::from_secs(60);
        let huge = decided(&p, &resp(503, Some(86_400)), 1);
        assert_eq!(huge, Action::Retry { delay: capped });
    }
}
