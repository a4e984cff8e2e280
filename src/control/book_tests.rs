use super::*;
use crate::control::record::Record;
use crate::control::state::CLAIM_TTL_MS;

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn rec(at: u64, change: Change) -> Record {
    Record::new(at, "command ops@h", change)
}

fn pause(target: &str, until: Option<u64>) -> Change {
    Change::Pause {
        target: t(target),
        reason: Some("maintenance".into()),
        until_ms: until,
    }
}

fn disable(target: &str) -> Change {
    Change::Disable {
        target: t(target),
        reason: None,
        failing_since_ms: None,
    }
}

fn auto_disable(target: &str, since: u64) -> Change {
    Change::Disable {
        target: t(target),
        reason: Some("auto".into()),
        failing_since_ms: Some(since),
    }
}

fn failing(target: &str, since: u64, n: u64) -> Change {
    Change::Failing {
        target: t(target),
        since_ms: since,
        failures: n,
    }
}

fn fold(records: Vec<Record>) -> Book {
    let mut b = Book::default();
    for (i, r) in records.into_iter().enumerate() {
        b.apply(i as u64, r);
    }
    b.settle();
    b
}

#[test]
fn a_pause_holds_until_resumed_or_its_time_is_up() {
    let b = fold(vec![rec(1, pause("https://a.example", None))]);
    let k = b.get(&t("https://a.example")).unwrap();
    assert!(k.control.in_force(1_000_000));
    let b = fold(vec![
        rec(1, pause("https://a.example", None)),
        rec(
            2,
            Change::Resume {
                target: t("https://a.example"),
            },
        ),
    ]);
    let k = b.get(&t("https://a.example")).unwrap();
    assert_eq!(k.control, Mode::Active);
    let what: Vec<&str> = k.history.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(what, ["paused", "resumed"]);
    let b = fold(vec![rec(1, pause("https://a.example", Some(50)))]);
    let c = &b.get(&t("https://a.example")).unwrap().control;
    assert!(c.in_force(49) && !c.in_force(50));
    assert_eq!(c.name(50), "active");
}

/// However many workers decide to disable the same endpoint, the history
/// holds one disable: a repeat changes nothing.
#[test]
fn a_second_disable_records_nothing() {
    let id = "auto:x".to_string();
    let by = "auto h/1";
    let b = fold(vec![
        Record::with_id(id.clone(), 1, by, disable("https://a.example")),
        Record::with_id(id, 2, "auto h/2", disable("https://a.example")),
    ]);
    let k = b.get(&t("https://a.example")).unwrap();
    assert_eq!(k.history.len(), 1);
    assert!(matches!(k.control, Mode::Disabled { .. }));
    let b = fold(vec![
        rec(1, disable("https://a.example")),
        rec(
            2,
            Change::Resume {
                target: t("https://a.example"),
            },
        ),
    ]);
    let k = b.get(&t("https://a.example")).unwrap();
    assert!(
        matches!(k.control, Mode::Disabled { .. }),
        "resume does not enable"
    );
}

#[test]
fn failing_since_is_the_first_failure_after_the_last_success() {
    let a = "http://127.0.0.1:4000";
    let b = fold(vec![rec(10, failing(a, 10, 3)), rec(11, failing(a, 12, 4))]);
    let k = b.get(&t(a)).unwrap();
    assert_eq!((k.failing_since_ms, k.failures), (Some(10), 7));
    let ok = |at| Change::Recovered {
        target: t(a),
        success_ms: at,
    };
    // A success older than the failing changes nothing; a newer one ends it.
    let b = fold(vec![
        rec(10, failing(a, 10, 3)),
        rec(11, ok(5)),
        rec(20, ok(20)),
    ]);
    let k = b.get(&t(a)).unwrap();
    assert_eq!((k.failing_since_ms, k.failures), (None, 0));
    // Failures another worker saw before that success do not count.
    let b = fold(vec![rec(20, ok(20)), rec(21, failing(a, 15, 2))]);
    assert_eq!(b.get(&t(a)).unwrap().failing_since_ms, Some(21));
}

#[test]
fn a_pause_restarts_the_failing_clock_and_holds_failures_off() {
    let a = "http://127.0.0.1:4000";
    let b = fold(vec![
        rec(10, failing(a, 10, 30)),
        rec(11, pause(a, None)),
        rec(12, failing(a, 11, 5)),
    ]);
    let k = b.get(&t(a)).unwrap();
    assert_eq!((k.failing_since_ms, k.failures), (None, 0));
}

/// A reader that finds the stream's start cut off takes the first snapshot
/// that covers it, then the records after the snapshot's offset, also
/// those read before the snapshot itself.
#[test]
fn a_cut_off_stream_starts_from_a_snapshot_that_covers_it() {
    let a = "https://a.example";
    let mut whole = Book::default();
    whole.apply(0, rec(1, pause(a, None)));
    whole.apply(1, rec(2, disable("https://b.example")));
    let keys = whole.snapshot_keys(3);
    let mut b = Book::default();
    // Retention removed offsets 0..=1; offset 2 was written while the
    // snapshot's writer was folding through 1.
    b.apply(2, rec(3, Change::Resume { target: t(a) }));
    assert!(b.get(&t(a)).is_none(), "kept aside until a snapshot");
    b.apply(3, rec(4, Change::Snapshot { through: 1, keys }));
    assert!(!b.settle(), "complete");
    assert_eq!(
        b.get(&t(a)).unwrap().control,
        Mode::Active,
        "the resume after it"
    );
    assert!(b.get(&t("https://b.example")).unwrap().control.in_force(5));
    assert_eq!(b.through(), Some(2));
}

#[test]
fn without_a_covering_snapshot_settle_says_changes_may_be_missing() {
    let mut b = Book::default();
    b.apply(7, rec(1, pause("https://a.example", None)));
    assert!(b.settle());
    assert!(b.get(&t("https://a.example")).is_some());
}

#[test]
fn snapshots_are_due_only_when_something_changed_since_the_last() {
    let hour = 3_600_000;
    let mut b = Book::default();
    assert!(!b.snapshot_due(0, 0), "nothing read");
    b.apply(0, rec(1, pause("https://a.example", None)));
    assert!(b.snapshot_due(5, 0));
    let empty = Change::Snapshot {
        through: 0,
        keys: vec![],
    };
    b.apply(1, rec(5, empty));
    assert!(!b.snapshot_due(2 * hour, 0), "nothing since");
    b.apply(2, rec(6, Change::Sync));
    assert!(!b.snapshot_due(hour, 0), "an hour at the least");
    assert!(b.snapshot_due(hour + 5, 0));
    // Two minutes per target, within an hour and three days.
    assert_eq!(snapshot_every(10), hour);
    assert_eq!(snapshot_every(100), 12_000_000);
    assert_eq!(snapshot_every(1_000_000), 3 * 86_400_000);
}

/// A reader that settled without a covering snapshot takes the next one
/// that covers what it read, and the records after it.
#[test]
fn a_lossy_book_takes_the_next_covering_snapshot() {
    let a = "https://a.example";
    let mut b = Book::default();
    b.apply(5, rec(1, Change::Resume { target: t(a) }));
    assert!(b.settle(), "lossy");
    let mut whole = Book::default();
    whole.apply(0, rec(1, pause("https://b.example", None)));
    let keys = whole.snapshot_keys(2);
    b.apply(6, rec(2, Change::Snapshot { through: 5, keys }));
    assert!(!b.settle(), "whole now");
    assert!(b.get(&t("https://b.example")).unwrap().control.in_force(3));
}

/// Every whole book forgets the same stale targets at the same snapshot.
#[test]
fn a_snapshot_record_compacts_every_reader_alike() {
    let a = "http://127.0.0.1:4000";
    let mut b = Book::default();
    b.apply(0, rec(1, failing(a, 1, 3)));
    b.apply(1, rec(2, pause("https://kept.example", None)));
    let later = 1 + FORGET_AFTER_MS;
    let empty = Change::Snapshot {
        through: 1,
        keys: vec![],
    };
    b.apply(2, rec(later, empty));
    assert!(
        b.get(&t(a)).is_none(),
        "a quiet failing target is forgotten"
    );
    assert!(
        b.get(&t("https://kept.example")).is_some(),
        "what is in force stays"
    );
}

#[test]
fn a_workers_decisions_apply_only_while_what_they_judged_stands() {
    let a = "https://a.example";
    // An expired pause's resume closes that pause, not a newer one.
    let resume = Change::Resume { target: t(a) };
    let b = fold(vec![
        Record::with_id("p1".into(), 1, "ops", pause(a, Some(5))),
        Record::with_id("p2".into(), 6, "ops", pause(a, None)),
        Record::with_id("expired:p1".into(), 7, "auto w/1", resume),
    ]);
    assert!(b.get(&t(a)).unwrap().control.in_force(100), "p2 holds");
    // An automatic disable after an operator's enable, over a pause, or
    // for another failing, changes nothing.
    let f = "http://127.0.0.1:4000";
    let enable = Change::Enable { target: t(f) };
    let b = fold(vec![
        rec(1, failing(f, 1, 20)),
        rec(2, disable(f)),
        rec(3, enable),
        rec(4, auto_disable(f, 1)),
    ]);
    assert_eq!(b.get(&t(f)).unwrap().control, Mode::Active);
    let paused = vec![
        rec(1, failing(f, 1, 20)),
        rec(2, pause(f, None)),
        rec(3, auto_disable(f, 1)),
    ];
    assert!(matches!(
        fold(paused).get(&t(f)).unwrap().control,
        Mode::Paused { .. }
    ));
    let other = vec![rec(1, failing(f, 1, 20)), rec(3, auto_disable(f, 2))];
    assert_eq!(fold(other).get(&t(f)).unwrap().control, Mode::Active);
    let judged = vec![rec(1, failing(f, 1, 20)), rec(3, auto_disable(f, 1))];
    assert!(matches!(
        fold(judged).get(&t(f)).unwrap().control,
        Mode::Disabled { .. }
    ));
    // A disable wins over a pause that comes after it.
    let b = fold(vec![rec(1, disable(a)), rec(2, pause(a, None))]);
    assert!(matches!(
        b.get(&t(a)).unwrap().control,
        Mode::Disabled { .. }
    ));
}

#[test]
fn the_first_claim_wins_until_it_goes_stale() {
    let f = "http://127.0.0.1:4000";
    let claim = |at, by: &str| {
        let c = Change::Claim {
            target: t(f),
            failing_since_ms: 1,
        };
        Record::new(at, by, c)
    };
    let b = fold(vec![
        rec(1, failing(f, 1, 20)),
        claim(10, "w/1"),
        claim(11, "w/2"),
    ]);
    assert_eq!(b.get(&t(f)).unwrap().claim.as_ref().unwrap().by, "w/1");
    let stale = 10 + CLAIM_TTL_MS;
    let b = fold(vec![
        rec(1, failing(f, 1, 20)),
        claim(10, "w/1"),
        claim(stale, "w/2"),
    ]);
    assert_eq!(b.get(&t(f)).unwrap().claim.as_ref().unwrap().by, "w/2");
}

/// A reader that kept a stale target and one that never had it (its
/// snapshot left it out) judge the next records alike.
#[test]
fn a_stale_target_folds_as_new() {
    let a = "http://127.0.0.1:4000";
    let mut kept = Book::default();
    kept.apply(0, rec(1, failing(a, 1, 30)));
    let mut fresh = Book::default();
    fresh.apply(0, rec(1, Change::Sync));
    let later = 2 + FORGET_AFTER_MS;
    for b in [&mut kept, &mut fresh] {
        b.apply(1, rec(later, failing(a, later, 2)));
    }
    let (k, f) = (kept.get(&t(a)).unwrap(), fresh.get(&t(a)).unwrap());
    assert_eq!((k.failing_since_ms, k.failures), (Some(later), 2));
    assert_eq!(
        (k.failing_since_ms, k.failures),
        (f.failing_since_ms, f.failures)
    );
}
