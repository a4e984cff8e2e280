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

/// An abort ends the notification on its first attempt, however many
/// attempts the policy has left.
#[test]
fn an_abort_dead_letters_at_once() {
    let a = c(Verdict::Aborted, Some(500), None);
    let dead = Action::DeadLetter {
        reason: DeadReason::AbortedByReceiver,
    };
    assert_eq!(d(&a, 1), dead);
    assert_eq!(dead_reason_name(&dead), "aborted-by-receiver");
}

fn dead_reason_name(a: &Action) -> &'static str {
    match a {
        Action::DeadLetter { reason } => reason.as_str(),
        _ => "",
    }
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

/// A response with `status` and `Retry-After` seconds (also used by
/// `signal.rs`'s tests).
pub(in crate::policy) fn resp(status: u16, retry_after: Option<u64>) -> AttemptResult {
    AttemptResult::Response {
        status,
        body: String::new(),
        retry_after: retry_after.map(Duration::from_secs),
        content_type: None,
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
    decide(
        result,
        attempt,
        Duration::ZERO,
        p,
        &mut StdRng::seed_from_u64(1),
    )
    .action
}

#[test]
fn flags_apply_without_overrides() {
    let rules = SuccessRules::default();
    let p = EffectivePolicy::new(
        &flags(),
        &rules,
        None,
        Overrides::default(),
        Overrides::default(),
    );
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
        max_age: None,
    };
    let p = EffectivePolicy::new(&flags(), &rules, None, route, Overrides::default());
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
        max_age: None,
    };
    let own = Overrides {
        max_attempts: Some(9),
        schedule: Some(&own_s),
        success_body: Some("own-ok"),
        max_age: None,
    };
    let p = EffectivePolicy::new(&flags(), &rules, None, route, own);
    let delay = Duration::from_secs(7);
    assert_eq!(decided(&p, &resp(500, None), 5), Action::Retry { delay });
    let ok = |body: &str| AttemptResult::Response {
        status: 200,
        body: body.into(),
        retry_after: None,
        content_type: None,
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
    let p = EffectivePolicy::new(&flags(), &rules, None, route, Overrides::default());
    let ok = AttemptResult::Response {
        status: 200,
        body: "route-ok".into(),
        retry_after: None,
        content_type: None,
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
    let p = EffectivePolicy::new(&flags(), &rules, None, Overrides::default(), own);
    let d = decide(
        &resp(429, Some(30)),
        1,
        Duration::ZERO,
        &p,
        &mut StdRng::seed_from_u64(1),
    );
    assert_eq!(d.classified.status, Some(429));
    let delay = Duration::from_secs(30);
    assert_eq!(d.action, Action::Retry { delay });
    // Capped by the effective policy's longest delay (60 s here).
    let capped = Duration::from_secs(60);
    let huge = decided(&p, &resp(503, Some(86_400)), 1);
    assert_eq!(huge, Action::Retry { delay: capped });
}

#[test]
fn max_age_expires_instead_of_retrying_with_the_usual_precedence() {
    let rules = SuccessRules::default();
    let (day, hour) = (Duration::from_secs(86_400), Duration::from_secs(3600));
    let flags_only = EffectivePolicy::new(
        &flags(),
        &rules,
        Some(day),
        Overrides::default(),
        Overrides::default(),
    );
    let expired = Action::DeadLetter {
        reason: DeadReason::Expired,
    };
    let at = |p: &EffectivePolicy, age: Duration, r: &AttemptResult| {
        decide(r, 1, age, p, &mut StdRng::seed_from_u64(1)).action
    };
    assert!(matches!(
        at(&flags_only, hour, &resp(500, None)),
        Action::Retry { .. }
    ));
    assert_eq!(at(&flags_only, day, &resp(500, None)), expired);
    // A success or a permanent failure is what it is, whatever the age.
    assert_eq!(at(&flags_only, 2 * day, &resp(200, None)), Action::Ack);
    let gone = at(&flags_only, 2 * day, &resp(410, None));
    assert_eq!(
        gone,
        Action::DeadLetter {
            reason: DeadReason::PermanentStatus
        }
    );
    // The route's max age beats the flag; the notification's beats both.
    let route = Overrides {
        max_age: Some(hour),
        ..Default::default()
    };
    let by_route = EffectivePolicy::new(&flags(), &rules, Some(day), route, Overrides::default());
    assert_eq!(at(&by_route, hour, &resp(500, None)), expired);
    let own = Overrides {
        max_age: Some(2 * day),
        ..Default::default()
    };
    let by_own = EffectivePolicy::new(&flags(), &rules, Some(day), route, own);
    assert!(matches!(
        at(&by_own, day, &resp(500, None)),
        Action::Retry { .. }
    ));
    // Zero is no limit.
    let off = EffectivePolicy::new(
        &flags(),
        &rules,
        Some(Duration::ZERO),
        Overrides::default(),
        Overrides::default(),
    );
    assert!(!off.expired(100 * day));
}
