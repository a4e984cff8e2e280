use super::*;
use crate::policy::Verdict;

#[test]
fn state_round_trips_through_headers() {
    let c = Classified {
        verdict: Verdict::Retryable,
        status: Some(500),
        error: Some("HTTP 500".into()),
        retry_after: None,
    };
    let mut s = RetryState::from_headers(None).unwrap();
    for attempt in 1..=30 {
        s.record(&AttemptRecord {
            attempt,
            at_ms: 1000 + attempt as i64,
            duration_ms: 5,
            classified: &c,
            delay_ms: Some(10),
        });
    }
    let mut orig = FieldTable::default();
    orig.insert("keep".into(), long_string("me"));
    let h = s.to_headers(Some(&orig), Some(&c));
    let back = RetryState::from_headers(Some(&h)).unwrap();
    assert_eq!(back.attempts, 30);
    assert_eq!(back.first_attempt_at, Some(1001));
    assert_eq!(back.history.len(), MAX_HISTORY);
    assert_eq!(
        get(Some(&h), "keep").and_then(string).as_deref(),
        Some("me")
    );
    assert_eq!(get(Some(&h), H_LAST_STATUS).and_then(int), Some(500));
}

#[test]
fn tampered_headers_are_invalid() {
    let mut h = FieldTable::default();
    h.insert(H_ATTEMPT.into(), long_string("three"));
    assert!(RetryState::from_headers(Some(&h)).is_err());
    let mut h = FieldTable::default();
    h.insert(H_ATTEMPT.into(), AMQPValue::LongLongInt(-1));
    assert!(RetryState::from_headers(Some(&h)).is_err());
}

#[test]
fn truncate_respects_char_boundaries() {
    assert_eq!(truncate("héllo", 2), "hé");
    assert_eq!(truncate("hi", 10), "hi");
}

#[test]
fn an_attempt_ends_the_deferral_streak_and_the_header_follows() {
    let c = Classified {
        verdict: Verdict::Retryable,
        status: Some(500),
        error: None,
        retry_after: None,
    };
    let mut s = RetryState::default();
    s.defer(1_000);
    s.defer(2_000);
    let before = s.to_headers(None, None);
    let mut back = RetryState::from_headers(Some(&before)).unwrap();
    back.record(&AttemptRecord {
        attempt: 1,
        at_ms: 3_000,
        duration_ms: 5,
        classified: &c,
        delay_ms: None,
    });
    back.defer(4_000);
    // Written over the original's streak of 2.
    let again = RetryState::from_headers(Some(&back.to_headers(Some(&before), None))).unwrap();
    assert_eq!((again.deferrals, again.deferral_streak), (3, 1));
    // A copy from before the streak: its deferrals stand in.
    let mut old = FieldTable::default();
    old.insert(H_DEFERRALS.into(), AMQPValue::LongLongInt(4));
    let old = RetryState::from_headers(Some(&old)).unwrap();
    assert_eq!(old.deferral_streak, 4);
}

#[test]
fn deferrals_count_without_an_attempt_and_start_the_age() {
    let mut s = RetryState::default();
    assert_eq!(s.age_ms(5_000), 0, "a new notification has no age");
    s.defer(1_000);
    s.defer(2_000);
    let back = RetryState::from_headers(Some(&s.to_headers(None, None))).unwrap();
    assert_eq!((back.attempts, back.deferrals), (0, 2));
    assert_eq!(back.deferral_streak, 2);
    assert_eq!(
        back.first_seen_at,
        Some(1_000),
        "the first deferral starts it"
    );
    assert_eq!(back.age_ms(4_000), 3_000);
    // Once attempted, the earlier of the two counts.
    let mut a = RetryState {
        first_attempt_at: Some(500),
        ..Default::default()
    };
    a.defer(9_000);
    assert_eq!((a.first_seen_at, a.age_ms(10_000)), (None, 9_500));
    let mut bad = FieldTable::default();
    bad.insert(H_DEFERRALS.into(), long_string("many"));
    assert!(RetryState::from_headers(Some(&bad)).is_err());
}

#[test]
fn a_probe_candidate_is_marked_until_its_attempt() {
    let mut s = RetryState::from_headers(None).unwrap();
    s.probe_candidate = true;
    let h = s.to_headers(None, None);
    let mut back = RetryState::from_headers(Some(&h)).unwrap();
    assert!(back.probe_candidate);
    let c = Classified {
        verdict: Verdict::Retryable,
        status: Some(503),
        error: None,
        retry_after: None,
    };
    back.record(&AttemptRecord {
        attempt: 1,
        at_ms: 5,
        duration_ms: 1,
        classified: &c,
        delay_ms: None,
    });
    // The retry copy is written over the candidate's headers: cleared.
    let again = RetryState::from_headers(Some(&back.to_headers(Some(&h), None))).unwrap();
    assert!(!again.probe_candidate);
}
