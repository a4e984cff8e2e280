use super::*;
use crate::control::book::Book;
use crate::control::record::{Change, Record};

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn table(changes: &[Change]) -> Table {
    let mut b = Book::default();
    for (i, c) in changes.iter().enumerate() {
        b.apply(i as u64, Record::new(1, "test", c.clone()));
    }
    b.settle();
    Table::build(&b, 10)
}

fn pause(s: &str, until_ms: Option<u64>) -> Change {
    Change::Pause {
        target: t(s),
        reason: None,
        until_ms,
    }
}

#[test]
fn a_resume_or_a_disable_releases_a_pause() {
    let before = table(&[
        pause("https://a.example", None),
        pause("https://b.example", None),
    ]);
    let after = table(&[
        pause("https://a.example", None),
        Change::Disable {
            target: t("https://b.example"),
            reason: None,
            failing_since_ms: None,
        },
    ]);
    assert_eq!(released(&before, &after, 20), vec![t("https://b.example")]);
    assert!(released(&before, &Table::default(), 20).len() == 2);
    assert!(released(&before, &before, 20).is_empty());
}

#[test]
fn a_prefix_resumed_inside_a_paused_origin_stays_parked() {
    let before = table(&[
        pause("https://a.example", None),
        pause("https://a.example/m/1/", None),
    ]);
    let after = table(&[pause("https://a.example", None)]);
    assert!(released(&before, &after, 20).is_empty());
}

#[test]
fn a_pause_that_runs_out_is_released_once_at_its_end() {
    let tab = table(&[
        pause("https://a.example", Some(500)),
        pause("https://b.example", None),
    ]);
    assert_eq!(next_end(&tab, 20), Some(500));
    assert!(ended(&tab, 20, 499).is_empty());
    assert_eq!(ended(&tab, 20, 500), vec![t("https://a.example")]);
    assert!(ended(&tab, 500, 900).is_empty());
    assert_eq!(next_end(&tab, 500), None);
}

#[test]
fn a_pause_run_out_under_a_longer_one_stays_parked() {
    let tab = table(&[
        pause("https://a.example", None),
        pause("https://a.example/m/", Some(50)),
    ]);
    assert!(ended(&tab, 20, 60).is_empty());
}
