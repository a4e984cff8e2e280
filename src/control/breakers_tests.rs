use super::*;
use crate::message::target::Target;

const AFTER: Duration = Duration::from_secs(60);

fn t() -> Target {
    Target::parse("https://down.example").unwrap()
}

fn seen(open_since_ms: Option<u64>, closed_ms: Option<u64>) -> BreakerSeen {
    BreakerSeen {
        target: t(),
        open_since_ms,
        closed_ms,
    }
}

fn plan(now_ms: u64, book: &Book, seen: &[BreakerSeen], after: Duration, me: &str) -> Vec<Record> {
    let i = Inputs {
        now_ms,
        book,
        seen,
        after,
        hold: false,
    };
    super::plan(&i, me)
}

/// Applies `records` in order, as every reader of the stream does.
fn book(records: &[Record]) -> Book {
    let mut b = Book::default();
    for (i, r) in records.iter().enumerate() {
        b.apply(i as u64, r.clone());
    }
    b.settle();
    b
}

#[test]
fn an_endpoint_open_for_the_threshold_is_paused_for_at_most_park_for() {
    let b = book(&[]);
    assert!(plan(59_999, &b, &[seen(Some(0), None)], AFTER, "auto w1").is_empty());
    let out = plan(60_000, &b, &[seen(Some(0), None)], AFTER, "auto w1");
    assert_eq!(out.len(), 1, "{out:?}");
    let Change::Pause {
        until_ms, reason, ..
    } = &out[0].change
    else {
        panic!("{out:?}")
    };
    assert_eq!(*until_ms, Some(60_000 + 600_000));
    assert!(
        reason.as_deref().unwrap().contains("open for 1m"),
        "{reason:?}"
    );
    assert!(out[0].id.starts_with(BREAKER_PAUSE));
    // Paused: nothing more while its breaker stays open.
    let b = book(&out);
    assert!(plan(61_000, &b, &[seen(Some(0), None)], AFTER, "auto w1").is_empty());
}

#[test]
fn a_breaker_closed_after_the_pause_resumes_it_once_for_every_worker() {
    let pause = plan(60_000, &book(&[]), &[seen(Some(0), None)], AFTER, "auto w1");
    let b = book(&pause);
    // Closed before the pause began (past the clocks' slack): not its probe.
    assert!(plan(61_000, &b, &[seen(None, Some(57_000))], AFTER, "auto w2").is_empty());
    let w1 = plan(70_000, &b, &[seen(None, Some(69_000))], AFTER, "auto w1");
    let w2 = plan(70_000, &b, &[seen(None, Some(69_500))], AFTER, "auto w2");
    assert_eq!(w1[0].id, w2[0].id, "the same decision, so one change");
    let mut all = pause.clone();
    all.extend([w1[0].clone(), w2[0].clone()]);
    let b = book(&all);
    let k = b.get(&t()).unwrap();
    assert_eq!(k.control, Mode::Active);
    assert_eq!(k.history.len(), 2, "{:?}", k.history);
    assert_eq!(k.history[1].what, "resumed by a probe");
}

#[test]
fn an_operators_pause_is_neither_overridden_nor_ended() {
    let op = Record::new(
        1_000,
        "command ops@h",
        Change::Pause {
            target: t(),
            reason: None,
            until_ms: None,
        },
    );
    let b = book(std::slice::from_ref(&op));
    assert!(plan(90_000, &b, &[seen(Some(0), None)], AFTER, "w").is_empty());
    assert!(plan(90_000, &b, &[seen(None, Some(80_000))], AFTER, "w").is_empty());
    // A breaker's pause written meanwhile by a worker that had not read it.
    let late = plan(90_000, &book(&[]), &[seen(Some(0), None)], AFTER, "w");
    let b = book(&[op, late[0].clone()]);
    let k = b.get(&t()).unwrap();
    assert!(matches!(&k.control, Mode::Paused { by, .. } if by == "command ops@h"));
}

#[test]
fn after_an_expiry_the_backlog_has_the_threshold_before_a_new_pause() {
    let pause = plan(60_000, &book(&[]), &[seen(Some(0), None)], AFTER, "w");
    let expired = Record::with_id(
        format!("{}{}", crate::control::book::EXPIRED, pause[0].id),
        660_000,
        "w",
        Change::Resume { target: t() },
    );
    let b = book(&[pause[0].clone(), expired]);
    let k = b.get(&t()).unwrap();
    assert_eq!(
        k.history[1].what, "pause expired",
        "no probe: no breaker closed"
    );
    let open = [seen(Some(0), None)];
    assert!(plan(700_000, &b, &open, AFTER, "w").is_empty());
    assert_eq!(plan(720_000, &b, &open, AFTER, "w").len(), 1);
}

#[test]
fn one_workers_trouble_parks_nothing() {
    let open = [seen(Some(0), None)];
    let b = book(&[]);
    let held = Inputs {
        now_ms: 90_000,
        book: &b,
        seen: &open,
        after: AFTER,
        hold: true,
    };
    assert!(
        super::plan(&held, "w").is_empty(),
        "its own network is in doubt"
    );
    let ok = Record::new(
        5,
        "auto w2",
        Change::Recovered {
            target: t(),
            success_ms: 30_000,
        },
    );
    assert!(
        plan(90_000, &book(&[ok]), &open, AFTER, "w").is_empty(),
        "up for another"
    );
    let wider = Record::new(
        5,
        "command ops@h",
        Change::Disable {
            target: Target::parse("https://down.example/").unwrap(),
            reason: None,
            failing_since_ms: None,
        },
    );
    let route = BreakerSeen {
        target: Target::parse("https://down.example/hooks/").unwrap(),
        ..seen(Some(0), None)
    };
    assert!(
        plan(90_000, &book(&[wider]), &[route], AFTER, "w").is_empty(),
        "disabled above"
    );
}

#[test]
fn the_failing_clock_runs_through_a_breakers_pause_to_the_automatic_disable() {
    let failing = |at, failures| {
        let f = Change::Failing {
            target: t(),
            since_ms: 1_000,
            failures,
        };
        Record::new(at, "auto w1", f)
    };
    let mut all = vec![failing(1_000, 20)];
    all.extend(plan(
        60_000,
        &book(&all),
        &[seen(Some(0), None)],
        AFTER,
        "auto w1",
    ));
    all.push(failing(70_000, 5));
    let b = book(&all);
    let k = b.get(&t()).unwrap();
    assert!(matches!(k.control, Mode::Paused { .. }));
    assert_eq!(
        (k.failing_since_ms, k.failures),
        (Some(1_000), 25),
        "the clock ran on"
    );
    let disable = Change::Disable {
        target: t(),
        reason: Some("no success".into()),
        failing_since_ms: Some(1_000),
    };
    all.push(Record::new(80_000, "auto w1", disable));
    let b = book(&all);
    assert!(matches!(
        b.get(&t()).unwrap().control,
        Mode::Disabled { .. }
    ));
}

/// The race of CI's chaos outage: two workers write their pauses 30 ms
/// apart, and the second lands after the first's probed resume. That
/// resume closed every worker's breaker, so nothing would probe the second
/// pause, and the backlog would stay parked for the pause's cap.
#[test]
fn a_pause_from_a_breaker_a_probe_closed_is_stale() {
    let w1 = plan(60_000, &book(&[]), &[seen(Some(0), None)], AFTER, "auto w1");
    // w2's breaker opened 100 ms before w1's; it writes before it reads w1's.
    let w2 = plan(
        60_130,
        &book(&[]),
        &[seen(Some(100), None)],
        AFTER,
        "auto w2",
    );
    let probed = plan(70_000, &book(&w1), &[seen(None, Some(69_000))], AFTER, "w3");
    let all = [w1[0].clone(), probed[0].clone(), w2[0].clone()];
    let b = book(&all);
    let k = b.get(&t()).unwrap();
    assert_eq!(k.control, Mode::Active, "{:?}", k.history);
    assert_eq!(k.history.len(), 2, "the stale pause leaves no entry");
    // w2, still holding the breaker open before it reads the resume, plans
    // no pause from a book that has it (and writes nothing every tick).
    let open = [seen(Some(100), None)];
    assert!(plan(200_000, &b, &open, AFTER, "auto w2").is_empty());
    // A breaker that opens after the resume parks again, the threshold on.
    let fresh = [seen(Some(80_000), None)];
    let again = plan(140_000, &b, &fresh, AFTER, "auto w2");
    assert_eq!(again.len(), 1, "{again:?}");
    let mut all = all.to_vec();
    all.push(again[0].clone());
    assert!(matches!(
        book(&all).get(&t()).unwrap().control,
        Mode::Paused { .. }
    ));
}

#[test]
fn a_breaker_pause_id_carries_when_its_breaker_opened() {
    let target = Target::parse("https://down.example:8443/a:b").unwrap();
    let id = crate::control::state::breaker_pause_id(&target, 1_234);
    assert_eq!(crate::control::state::breaker_opened_ms(&id), Some(1_234));
    assert_eq!(crate::control::state::breaker_opened_ms("ops-pause"), None);
}
