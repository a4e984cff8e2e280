//! Where the retry is decided: a classified attempt, the attempt number and
//! the policy give one [`Action`]. No I/O here; the worker carries it out.

use std::time::Duration;

use rand::Rng;

use crate::policy::RetryPolicy;
use crate::policy::{Classified, Verdict};

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

/// `attempt` is the 1-based number of the attempt just made.
pub fn decide(c: &Classified, attempt: u32, policy: &RetryPolicy, rng: &mut impl Rng) -> Action {
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
    use crate::policy::{parse_schedule, Backoff};
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
        decide(c, attempt, &policy(), &mut StdRng::seed_from_u64(1))
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
}
