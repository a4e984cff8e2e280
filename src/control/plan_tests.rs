use super::*;

const A: &str = "http://127.0.0.1:4000";

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn settings(after_ms: u64) -> PlanSettings {
    PlanSettings {
        disable_after: Some(Duration::from_millis(after_ms)),
        spread_ms: 0,
    }
}

fn fails(n: u64, first: u64) -> Delta {
    Delta {
        last_success_ms: None,
        failures: n,
        first_failure_ms: Some(first),
    }
}

fn ok(at: u64) -> Delta {
    Delta {
        last_success_ms: Some(at),
        failures: 0,
        first_failure_ms: None,
    }
}

/// Plans, then folds what was planned back into the book, as the stream
/// would; returns the kinds written.
fn step(now: u64, book: &mut Book, d: Delta, carry: &mut Carry, s: &PlanSettings) -> Vec<String> {
    let recs = plan(now, book, &[(t(A), d, None)], carry, s, "auto w/1");
    let mut kinds = vec![];
    for r in recs {
        kinds.push(
            serde_json::to_value(&r).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        let next = book.through().map_or(0, |o| o + 1);
        book.apply(next, r);
    }
    kinds
}

fn book() -> Book {
    let mut b = Book::default();
    b.apply(0, Record::new(0, "t", Change::Sync));
    b.settle();
    b
}

#[test]
fn a_dead_endpoint_is_disabled_once_after_the_span_with_enough_failures() {
    let (mut b, mut c, s) = (book(), Carry::default(), settings(5_000));
    assert_eq!(step(1_000, &mut b, fails(3, 900), &mut c, &s), ["failing"]);
    assert_eq!(b.get(&t(A)).unwrap().failing_since_ms, Some(900));
    assert_eq!(
        step(2_000, &mut b, fails(4, 1_500), &mut c, &s),
        ["failing"]
    );
    assert_eq!(
        step(3_000, &mut b, fails(4, 2_500), &mut c, &s),
        ["failing"]
    );
    // Ten in the book: counts now go out only once per hysteresis (250 ms).
    assert_eq!(
        step(3_100, &mut b, fails(1, 3_050), &mut c, &s),
        Vec::<String>::new()
    );
    assert_eq!(
        step(5_000, &mut b, fails(1, 4_900), &mut c, &s),
        ["failing"]
    );
    assert_eq!(
        step(6_000, &mut b, fails(1, 5_950), &mut c, &s),
        ["failing", "disable"]
    );
    let k = b.get(&t(A)).unwrap();
    let Mode::Disabled { reason, .. } = &k.control else {
        panic!("{k:?}")
    };
    let reason = reason.as_deref().unwrap();
    assert!(
        reason.starts_with("auto: no success since 1970-01-01T00:00:00Z ("),
        "{reason}"
    );
    assert!(reason.contains("14 attempts"), "{reason}");
    // Disabled: nothing more is written for it.
    assert!(step(7_000, &mut b, fails(1, 6_900), &mut c, &s).is_empty());
}

#[test]
fn a_quiet_endpoint_is_never_disabled_and_a_few_failures_are_not_enough() {
    let (mut b, mut c, s) = (book(), Carry::default(), settings(5_000));
    step(1_000, &mut b, fails(3, 900), &mut c, &s);
    // Long past the span, but no failure seen now: nothing.
    assert!(step(60_000, &mut b, Delta::default(), &mut c, &s).is_empty());
    // A failure now, but only four in all.
    assert_eq!(
        step(61_000, &mut b, fails(1, 60_900), &mut c, &s),
        ["failing"]
    );
    assert_eq!(b.get(&t(A)).unwrap().control, Mode::Active);
}

#[test]
fn a_flapping_endpoint_is_never_disabled_and_writes_little() {
    let (mut b, mut c, s) = (book(), Carry::default(), settings(5_000));
    let mut written = 0;
    // 90% failures: nine, then a success, every second, for a minute.
    for sec in 1..=60u64 {
        let now = sec * 1_000;
        let d = Delta {
            last_success_ms: Some(now - 100),
            failures: 9,
            first_failure_ms: Some(now - 90),
        };
        written += step(now, &mut b, d, &mut c, &s).len();
        assert_eq!(b.get(&t(A)).unwrap().control, Mode::Active, "at {sec} s");
    }
    assert!(written <= 3 * 60, "{written} records");
}

#[test]
fn a_success_right_after_the_failing_began_is_not_worth_a_record() {
    let (mut b, mut c, s) = (book(), Carry::default(), settings(100_000));
    step(1_000, &mut b, fails(1, 1_000), &mut c, &s);
    // The hysteresis is 5 s: a success 1 s in writes nothing.
    assert!(step(2_000, &mut b, ok(2_000), &mut c, &s).is_empty());
    assert_eq!(step(9_000, &mut b, ok(9_000), &mut c, &s), ["recovered"]);
    assert_eq!(b.get(&t(A)).unwrap().failing_since_ms, None);
}

/// The disabling worker's own later success, not yet in the book, still
/// counts: it never disables what it just saw succeed.
#[test]
fn a_local_success_after_the_start_holds_the_disable_off() {
    let (mut b, mut c, s) = (book(), Carry::default(), settings(5_000));
    step(1_000, &mut b, fails(20, 900), &mut c, &s);
    let recs = plan(
        6_000,
        &b,
        &[(t(A), fails(1, 5_900), Some(4_000))],
        &mut c,
        &s,
        "w",
    );
    assert!(recs
        .iter()
        .all(|r| !matches!(r.change, Change::Disable { .. })));
}

#[test]
fn an_expired_pause_is_closed_with_a_resume_named_after_it() {
    let mut b = book();
    let pause = Change::Pause {
        target: t(A),
        reason: None,
        until_ms: Some(50),
    };
    b.apply(1, Record::with_id("p1".into(), 10, "command", pause));
    let s = settings(5_000);
    assert!(plan(40, &b, &[], &mut Carry::default(), &s, "w").is_empty());
    let recs = plan(60, &b, &[], &mut Carry::default(), &s, "w");
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].id, "expired:p1");
    b.apply(2, recs[0].clone());
    let k = b.get(&t(A)).unwrap();
    assert_eq!(k.history.last().unwrap().what, "pause expired");
    assert!(plan(70, &b, &[], &mut Carry::default(), &s, "w").is_empty());
}
