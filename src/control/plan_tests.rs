use super::*;

const A: &str = "http://127.0.0.1:4000";

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn settings(after_ms: u64) -> PlanSettings {
    PlanSettings {
        disable_after: Some(Duration::from_millis(after_ms)),
        breaker_park_after: None,
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

/// One worker: its book, carry and name.
struct W {
    carry: Carry,
    me: &'static str,
}

impl W {
    fn new(me: &'static str) -> W {
        W {
            carry: Carry::default(),
            me,
        }
    }

    /// Plans what it saw (`local`: its last success), without folding.
    fn plan(
        &mut self,
        now: u64,
        b: &Book,
        d: Delta,
        local: Option<u64>,
        s: &PlanSettings,
    ) -> Vec<Record> {
        let deltas = [(t(A), d, local)];
        let deltas: &[_] = if deltas[0].1.is_empty() { &[] } else { &deltas };
        let i = Inputs {
            now_ms: now,
            book: b,
            deltas,
            hold_disables: false,
        };
        plan(&i, &mut self.carry, s, self.me)
    }
}

/// Folds records into the book as the stream would; returns their kinds.
fn fold(b: &mut Book, recs: Vec<Record>) -> Vec<String> {
    let mut kinds = vec![];
    for r in recs {
        kinds.push(
            serde_json::to_value(&r).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        let next = b.through().map_or(0, |o| o + 1);
        b.apply(next, r);
    }
    kinds
}

fn step(now: u64, b: &mut Book, d: Delta, w: &mut W, s: &PlanSettings) -> Vec<String> {
    let recs = w.plan(now, b, d, None, s);
    fold(b, recs)
}

fn book() -> Book {
    let mut b = Book::default();
    b.apply(0, Record::new(0, "t", Change::Sync));
    b.settle();
    b
}

#[test]
fn a_dead_endpoint_is_claimed_then_disabled_once_after_the_span() {
    let (mut b, mut w, s) = (book(), W::new("auto w/1"), settings(5_000));
    assert_eq!(step(1_000, &mut b, fails(3, 900), &mut w, &s), ["failing"]);
    assert_eq!(b.get(&t(A)).unwrap().failing_since_ms, Some(900));
    assert_eq!(
        step(2_000, &mut b, fails(4, 1_500), &mut w, &s),
        ["failing"]
    );
    assert_eq!(
        step(3_000, &mut b, fails(4, 2_500), &mut w, &s),
        ["failing"]
    );
    // Ten in the book: counts now go out only once per hysteresis (250 ms).
    assert!(step(3_100, &mut b, fails(1, 3_050), &mut w, &s).is_empty());
    assert_eq!(
        step(5_000, &mut b, fails(1, 4_900), &mut w, &s),
        ["failing"]
    );
    assert_eq!(
        step(6_000, &mut b, fails(1, 5_950), &mut w, &s),
        ["failing", "claim"]
    );
    // The claim came back its own: the disable follows, with no new failure.
    assert_eq!(
        step(7_000, &mut b, Delta::default(), &mut w, &s),
        ["disable"]
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
    assert!(
        step(8_000, &mut b, fails(1, 7_900), &mut w, &s).is_empty(),
        "disabled: nothing more"
    );
}

/// Two workers decide at once: both claim, the stream's order picks one,
/// and only that one writes the disable.
#[test]
fn of_two_workers_deciding_at_once_only_the_first_claim_disables() {
    let (mut b, s) = (book(), settings(5_000));
    let (mut w1, mut w2) = (W::new("auto w/1"), W::new("auto w/2"));
    let first = w1.plan(1_000, &b, fails(12, 900), None, &s);
    fold(&mut b, first);
    let c2 = w2.plan(6_000, &b, fails(1, 5_900), None, &s);
    let c1 = w1.plan(6_000, &b, fails(1, 5_900), None, &s);
    // w2's claim reached the stream first.
    assert!(fold(&mut b, c2).contains(&"claim".to_string()));
    assert!(fold(&mut b, c1).contains(&"claim".to_string()));
    let mut written = vec![];
    for (first, now) in [(true, 7_000), (false, 7_000), (true, 8_000)] {
        let w = if first { &mut w1 } else { &mut w2 };
        let recs = w.plan(now, &b, Delta::default(), None, &s);
        written.extend(fold(&mut b, recs));
    }
    assert_eq!(written, ["disable"]);
    let k = b.get(&t(A)).unwrap();
    assert_eq!(k.history.len(), 1);
    assert_eq!(k.history[0].by, "auto w/2");
}

#[test]
fn a_quiet_endpoint_is_never_disabled_and_a_few_failures_are_not_enough() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(5_000));
    step(1_000, &mut b, fails(3, 900), &mut w, &s);
    // Long past the span, but no failure seen now: nothing.
    assert!(step(60_000, &mut b, Delta::default(), &mut w, &s).is_empty());
    // A failure now, but only four in all.
    assert_eq!(
        step(61_000, &mut b, fails(1, 60_900), &mut w, &s),
        ["failing"]
    );
    assert_eq!(b.get(&t(A)).unwrap().control, Mode::Active);
}

/// A receiver that fails 90% of the time: never disabled, and with a
/// hysteresis of 5 s (a 100 s span), a record or two per hysteresis.
#[test]
fn a_flapping_endpoint_is_never_disabled_and_writes_little() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(100_000));
    let mut written = 0;
    for sec in 1..=300u64 {
        let now = sec * 1_000;
        let d = Delta {
            last_success_ms: Some(now - 100),
            failures: 9,
            first_failure_ms: Some(now - 90),
        };
        written += step(now, &mut b, d, &mut w, &s).len();
        assert_eq!(b.get(&t(A)).unwrap().control, Mode::Active, "at {sec} s");
    }
    // 300 s over a 5 s hysteresis: 60 spans, a recovered and a failing
    // (and a count) each at most.
    assert!(written <= 3 * 60 + 3, "{written} records");
    assert!(written >= 60, "{written}: the clock was never restarted");
}

#[test]
fn a_success_right_after_the_failing_began_is_not_worth_a_record() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(100_000));
    step(1_000, &mut b, fails(1, 1_000), &mut w, &s);
    // The hysteresis is 5 s: a success 1 s in writes nothing.
    assert!(step(2_000, &mut b, ok(2_000), &mut w, &s).is_empty());
    assert_eq!(step(9_000, &mut b, ok(9_000), &mut w, &s), ["recovered"]);
    assert_eq!(b.get(&t(A)).unwrap().failing_since_ms, None);
}

/// The deciding worker's own later success, not yet in the book, still
/// counts: it never disables what it just saw succeed.
#[test]
fn a_local_success_after_the_start_holds_the_disable_off() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(5_000));
    step(1_000, &mut b, fails(20, 900), &mut w, &s);
    let recs = w.plan(6_000, &b, fails(1, 5_900), Some(4_000), &s);
    assert!(recs
        .iter()
        .all(|r| !matches!(r.change, Change::Claim { .. })));
}

#[test]
fn no_disable_is_claimed_while_most_endpoints_fail() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(5_000));
    step(1_000, &mut b, fails(20, 900), &mut w, &s);
    let deltas = [(t(A), fails(1, 5_900), None)];
    let i = Inputs {
        now_ms: 6_000,
        book: &b,
        deltas: &deltas,
        hold_disables: true,
    };
    let recs = plan(&i, &mut w.carry, &s, w.me);
    assert!(recs
        .iter()
        .all(|r| !matches!(r.change, Change::Claim { .. })));
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
    let (mut w, s) = (W::new("w"), settings(5_000));
    assert!(w.plan(40, &b, Delta::default(), None, &s).is_empty());
    let recs = w.plan(60, &b, Delta::default(), None, &s);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].id, "expired:p1");
    b.apply(2, recs[0].clone());
    let k = b.get(&t(A)).unwrap();
    assert_eq!(k.history.last().unwrap().what, "pause expired");
    assert!(w.plan(70, &b, Delta::default(), None, &s).is_empty());
}

/// A success within the hysteresis is not written at once, but once the
/// hysteresis is over: the failing never stands as older than it.
#[test]
fn a_success_within_the_hysteresis_is_written_once_it_is_over() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(100_000));
    step(1_000, &mut b, fails(1, 1_000), &mut w, &s);
    assert!(step(2_000, &mut b, ok(2_000), &mut w, &s).is_empty());
    // No more traffic: at 6 s (the 5 s hysteresis over), it is written.
    assert!(step(5_000, &mut b, Delta::default(), &mut w, &s).is_empty());
    assert_eq!(
        step(6_000, &mut b, Delta::default(), &mut w, &s),
        ["recovered"]
    );
    let k = b.get(&t(A)).unwrap();
    assert_eq!((k.failing_since_ms, k.last_success_ms), (None, Some(2_000)));
}

/// A won disable whose confirm was lost is written again (a repeat
/// changes nothing in the book).
#[test]
fn a_disable_that_did_not_reach_the_book_is_written_again() {
    let (mut b, mut w, s) = (book(), W::new("auto w/1"), settings(5_000));
    let first = w.plan(1_000, &b, fails(12, 900), None, &s);
    fold(&mut b, first);
    let claim = w.plan(6_000, &b, fails(1, 5_900), None, &s);
    fold(&mut b, claim);
    let lost = w.plan(7_000, &b, Delta::default(), None, &s);
    assert_eq!(
        lost.len(),
        1,
        "the disable, not folded: its confirm was lost"
    );
    assert!(w.plan(8_000, &b, Delta::default(), None, &s).is_empty());
    let again = w.plan(17_000, &b, Delta::default(), None, &s);
    assert_eq!(fold(&mut b, again), ["disable"]);
    assert!(matches!(
        b.get(&t(A)).unwrap().control,
        Mode::Disabled { .. }
    ));
}

/// Failures held back before a pause start nothing after it.
#[test]
fn failures_from_before_a_pause_are_forgotten() {
    let (mut b, mut w, s) = (book(), W::new("w"), settings(100_000));
    step(1_000, &mut b, fails(12, 900), &mut w, &s);
    // Ten in the book: counts wait for the hysteresis (5 s).
    assert!(step(2_000, &mut b, fails(20, 1_500), &mut w, &s).is_empty());
    let pause = Change::Pause {
        target: t(A),
        reason: None,
        until_ms: None,
    };
    fold(&mut b, vec![Record::new(3_000, "ops", pause)]);
    assert!(step(4_000, &mut b, Delta::default(), &mut w, &s).is_empty());
    fold(
        &mut b,
        vec![Record::new(5_000, "ops", Change::Resume { target: t(A) })],
    );
    step(6_000, &mut b, fails(1, 5_900), &mut w, &s);
    let k = b.get(&t(A)).unwrap();
    assert_eq!((k.failing_since_ms, k.failures), (Some(5_900), 1));
}
