use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::history::query::{Filter, Status};
use crate::history::record::sample;

fn row(offset: u64, line: u32, id: &str, at_s: u64, status: Option<u16>, o: Outcome) -> Row {
    let mut a = sample();
    a.notification_id = id.into();
    a.started_at =
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_secs(at_s)).to_string();
    a.status = status;
    a.outcome = o;
    a.endpoint = format!("http://h{}:80", offset % 3);
    a.attempt = line + 1;
    let json = serde_json::to_string(&a).unwrap();
    Row {
        offset,
        line,
        attempt: a,
        json,
    }
}

fn ids(records: Vec<String>) -> Vec<(String, u32)> {
    records
        .iter()
        .map(|r| {
            let a: Attempt = serde_json::from_str(r).unwrap();
            (a.notification_id, a.attempt)
        })
        .collect()
}

fn mem() -> Connection {
    init(Connection::open_in_memory().unwrap()).unwrap()
}

#[test]
fn rows_and_the_resume_offset_go_in_together_and_twice_is_once() {
    let mut c = mem();
    assert_eq!(next_offset(&c).unwrap(), None);
    let rows = vec![row(5, 0, "a", 100, Some(500), Outcome::Retry)];
    ingest(&mut c, &rows, 6).unwrap();
    ingest(&mut c, &rows, 6).unwrap();
    assert_eq!(count(&c).unwrap(), 1);
    assert_eq!(next_offset(&c).unwrap(), Some(6));
}

#[test]
fn show_is_oldest_first() {
    let mut c = mem();
    let rows = vec![
        row(9, 0, "a", 300, Some(200), Outcome::Delivered),
        row(1, 0, "a", 100, Some(500), Outcome::Retry),
        row(4, 1, "b", 200, Some(500), Outcome::Retry),
    ];
    ingest(&mut c, &rows, 10).unwrap();
    assert_eq!(
        ids(show(&c, "a").unwrap()),
        vec![("a".into(), 1), ("a".into(), 1)]
    );
    let starts: Vec<i64> = show(&c, "a")
        .unwrap()
        .iter()
        .map(|r| started_ms(&serde_json::from_str::<Attempt>(r).unwrap().started_at))
        .collect();
    assert_eq!(starts, vec![100_000, 300_000]);
    assert!(show(&c, "nobody").unwrap().is_empty());
}

/// Every filter gives what `Filter::matches` says, newest first.
#[test]
fn list_means_what_filter_matches_says() {
    let mut c = mem();
    let outcomes = [Outcome::Delivered, Outcome::Retry, Outcome::Dead];
    let statuses = [Some(200), Some(503), Some(500), Some(404), None];
    let rows: Vec<Row> = (0..60u64)
        .map(|i| {
            let (s, o) = (statuses[i as usize % 5], outcomes[i as usize % 3]);
            row(i, 0, &format!("n{i}"), 1000 + i * 7 % 50, s, o)
        })
        .collect();
    ingest(&mut c, &rows, 60).unwrap();
    let at = |s| UNIX_EPOCH + Duration::from_secs(s);
    let filters = [
        Filter::default(),
        Filter {
            status: Some(Status::Class(5)),
            ..Filter::default()
        },
        Filter {
            outcome: Some(Outcome::Dead),
            status: Some(Status::Exact(404)),
            ..Filter::default()
        },
        Filter {
            endpoint: Some("http://h1:80".into()),
            since: Some(at(1010)),
            until: Some(at(1030)),
            limit: 5,
            ..Filter::default()
        },
    ];
    for f in filters {
        let mut want: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                f.matches(
                    &r.attempt,
                    at(0) + Duration::from_millis(started_ms(&r.attempt.started_at) as u64),
                )
            })
            .collect();
        want.sort_by_key(|r| std::cmp::Reverse((started_ms(&r.attempt.started_at), r.offset)));
        want.truncate(f.limit as usize);
        let want: Vec<_> = want
            .iter()
            .map(|r| (r.attempt.notification_id.clone(), r.attempt.attempt))
            .collect();
        assert_eq!(ids(list(&c, &f).unwrap()), want, "{f:?}");
    }
}

#[test]
fn prune_removes_what_started_before() {
    let mut c = mem();
    let rows = vec![
        row(1, 0, "old", 100, None, Outcome::Dead),
        row(2, 0, "new", 200, None, Outcome::Dead),
    ];
    ingest(&mut c, &rows, 3).unwrap();
    assert_eq!(prune(&c, UNIX_EPOCH + Duration::from_secs(150)).unwrap(), 1);
    assert_eq!(
        ids(list(&c, &Filter::default()).unwrap()),
        vec![("new".into(), 1)]
    );
}
