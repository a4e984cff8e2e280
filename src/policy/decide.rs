//! Where the retry is decided, and nowhere else: the attempt's result, the
//! retry state (how many attempts were made) and the effective policy give
//! one [`Decision`]: the attempt's classification and the [`Action`] (ack,
//! retry after a delay, or dead-letter with a reason). Pure: no I/O, no
//! clock; the worker carries the decision out.
//!
//! Precedence, most specific first: the notification's own fields, then its
//! URL's `[[route]]`, then the worker's flags. A `Retry-After` on a 429 or
//! 503 raises the backoff's delay, up to the policy's longest delay. A
//! notification older than its `max_age` is dead-lettered as `expired`
//! instead of retried ([`EffectivePolicy::expired`], which the worker also
//! asks before an attempt).

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
    /// Older than its `max_age` (counted from its first attempt, or from
    /// when a worker first deferred it).
    Expired,
    /// The receiver answered `webhook-delivery: abort-message`.
    AbortedByReceiver,
    /// Its endpoint is disabled (`redeliver endpoint disable`, or the
    /// automatic disable after `--disable-after` without a success).
    EndpointDisabled,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::MaxAttempts => "max-attempts",
            DeadReason::PermanentStatus => "permanent-status",
            DeadReason::Permanent => "permanent",
            DeadReason::Invalid => "invalid",
            DeadReason::Expired => "expired",
            DeadReason::AbortedByReceiver => "aborted-by-receiver",
            DeadReason::EndpointDisabled => "endpoint-disabled",
        }
    }

    /// Every reason, as `dlq --reason` accepts them.
    pub const ALL: [&'static str; 7] = [
        "max-attempts",
        "permanent-status",
        "permanent",
        "invalid",
        "expired",
        "aborted-by-receiver",
        "endpoint-disabled",
    ];
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
    /// How long the notification may keep being retried or deferred.
    pub max_age: Option<Duration>,
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
    /// `None` or zero: no limit.
    pub max_age: Option<Duration>,
}

impl<'a> EffectivePolicy<'a> {
    /// `own` wins over `route`, which wins over the worker's `base`,
    /// `rules` and `max_age` (`--max-age`).
    pub fn new(
        base: &RetryPolicy,
        rules: &'a SuccessRules,
        max_age: Option<Duration>,
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
            max_age: own.max_age.or(route.max_age).or(max_age),
        }
    }

    /// Whether a notification of this age is past its `max_age`.
    pub fn expired(&self, age: Duration) -> bool {
        self.max_age.is_some_and(|m| !m.is_zero() && age >= m)
    }
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub classified: Classified,
    pub action: Action,
}

/// The retry decision. `attempt` is the 1-based number of the attempt just
/// made (the retry state's count plus one); `age` how long ago the
/// notification was first attempted or deferred; `rng` draws the jitter.
pub fn decide(
    result: &AttemptResult,
    attempt: u32,
    age: Duration,
    policy: &EffectivePolicy,
    rng: &mut impl Rng,
) -> Decision {
    let classified = classify(result, policy.rules, policy.success_body);
    let action = match action(&classified, attempt, &policy.retry, rng) {
        Action::Retry { .. } if policy.expired(age) => Action::DeadLetter {
            reason: DeadReason::Expired,
        },
        a => a,
    };
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
        Verdict::Aborted => Action::DeadLetter {
            reason: DeadReason::AbortedByReceiver,
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
#[path = "decide_tests.rs"]
pub(super) mod tests;
