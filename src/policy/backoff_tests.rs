use super::*;
use rand::{rngs::StdRng, SeedableRng};

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

fn s(v: u64) -> Duration {
    Duration::from_secs(v)
}

#[test]
fn schedule_takes_nth_entry_then_repeats_last() {
    let p = RetryPolicy {
        max_attempts: 20,
        backoff: Backoff::Schedule(parse_schedule("15s,15s,30s,3m").unwrap()),
    };
    let got: Vec<_> = (1..=6).map(|n| p.delay(n, &mut rng())).collect();
    assert_eq!(got, vec![s(15), s(15), s(30), s(180), s(180), s(180)]);
}

#[test]
fn wechat_schedule_parses() {
    let sched = parse_schedule("15s,15s,30s,3m,10m,20m,30m,30m,30m,60m,3h,3h,3h,6h,6h").unwrap();
    assert_eq!(sched.len(), 15);
    assert_eq!(sched[13], s(6 * 3600));
}

#[test]
fn exponential_without_jitter_doubles_and_caps() {
    let p = RetryPolicy {
        max_attempts: 50,
        backoff: Backoff::Exponential {
            initial: s(10),
            factor: 2.0,
            max: s(60),
            jitter: Jitter::None,
        },
    };
    let got: Vec<_> = (1..=5).map(|n| p.delay(n, &mut rng())).collect();
    assert_eq!(got, vec![s(10), s(20), s(40), s(60), s(60)]);
    // Huge n saturates instead of overflowing.
    assert_eq!(p.delay(u32::MAX, &mut rng()), s(60));
}

#[test]
fn full_jitter_stays_within_zero_and_delay() {
    let b = Backoff::Exponential {
        initial: s(8),
        factor: 2.0,
        max: s(3600),
        jitter: Jitter::Full,
    };
    let p = RetryPolicy {
        max_attempts: 5,
        backoff: b,
    };
    let mut r = rng();
    let draws: Vec<_> = (0..500).map(|_| p.delay(2, &mut r)).collect();
    assert!(draws.iter().all(|d| *d <= s(16)));
    assert!(
        draws.iter().any(|d| *d < s(8)),
        "full jitter must spread below d/2"
    );
}

#[test]
fn equal_jitter_keeps_at_least_half() {
    let b = Backoff::Exponential {
        initial: s(8),
        factor: 2.0,
        max: s(3600),
        jitter: Jitter::Equal,
    };
    let p = RetryPolicy {
        max_attempts: 5,
        backoff: b,
    };
    let mut r = rng();
    let draws: Vec<_> = (0..500).map(|_| p.delay(2, &mut r)).collect();
    assert!(draws.iter().all(|d| *d >= s(8) && *d <= s(16)));
    assert!(draws.iter().any(|d| *d > s(12)));
}

#[test]
fn validate_rejects_delays_beyond_the_exchange_limit() {
    let p = RetryPolicy {
        max_attempts: 3,
        backoff: Backoff::Schedule(vec![s(60 * 24 * 3600)]),
    };
    assert!(matches!(p.validate(), Err(PolicyError::DelayTooLong(_))));
    let ok = RetryPolicy {
        max_attempts: 3,
        backoff: Backoff::Schedule(vec![Duration::from_millis(u32::MAX as u64)]),
    };
    assert_eq!(ok.validate(), Ok(()));
}

#[test]
fn validate_rejects_absurd_values() {
    let mut p = RetryPolicy {
        max_attempts: 0,
        ..Default::default()
    };
    assert_eq!(p.validate(), Err(PolicyError::MaxAttempts(0)));
    p.max_attempts = 1_000_000_000;
    assert!(p.validate().is_err());
    p.max_attempts = 3;
    p.backoff = Backoff::Schedule(vec![]);
    assert_eq!(p.validate(), Err(PolicyError::EmptySchedule));
    p.backoff = Backoff::Exponential {
        initial: s(1),
        factor: 0.5,
        max: s(10),
        jitter: Jitter::None,
    };
    assert_eq!(p.validate(), Err(PolicyError::Factor(0.5)));
    assert_eq!(RetryPolicy::default().validate(), Ok(()));
}

#[test]
fn bad_durations_are_errors() {
    assert!(parse_duration("abc").is_err());
    assert!(parse_duration("-5s").is_err());
    assert!(parse_schedule("1s,,2s").is_err());
    assert_eq!(
        parse_duration(" 250ms ").unwrap(),
        Duration::from_millis(250)
    );
}
