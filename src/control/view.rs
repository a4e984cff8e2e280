//! What `redeliver endpoint list`, `endpoint show` and `status` show: the
//! live workers' reports merged per endpoint, with what the shared state
//! says of it. Pure.

use std::collections::BTreeMap;

use serde::Serialize;

use super::book::{Book, KeyState, Mode};
use super::reports::Report;
use super::table::Table;
use crate::isolation::{Counts, Failure};
use crate::message::target::Target;

/// One endpoint (or paused or disabled target), merged over the workers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Row {
    /// The target as an operator names it (or the raw key).
    pub endpoint: String,
    /// `active`, `paused`, `disabled` or `breaker-open`.
    pub state: &'static str,
    /// The target whose pause or disable applies, when it is another
    /// (shorter) one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<Mode>,
    pub in_flight: usize,
    pub limit: usize,
    /// Attempts, successes and failures over the last five minutes.
    pub last_5m: Counts,
    pub last_success_ms: Option<u64>,
    pub last_failure: Option<Failure>,
    /// No success since then (and failures since, as reported).
    pub failing_since_ms: Option<u64>,
    pub failures_since: u64,
    /// Parked, deferred or retrying: waiting on this endpoint.
    pub waiting: u64,
    /// Dead-lettered because it is disabled (by the live workers).
    pub dead_lettered: u64,
    /// Parked by its pause (by the live workers, since the pause began).
    pub parked: u64,
    /// Live workers that saw it in the last 10 minutes.
    pub workers: usize,
    pub last_seen_ms: Option<u64>,
}

/// Every endpoint a live worker saw, and every target paused or disabled,
/// one row each, sorted by endpoint.
pub fn rows(reports: &[Report], book: &Book, now_ms: u64) -> Vec<Row> {
    let mut by: BTreeMap<String, Row> = BTreeMap::new();
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    for r in reports {
        for e in &r.endpoints {
            let name = e.target.as_ref().map_or(e.key.clone(), Target::to_string);
            if let Some(t) = &e.target {
                targets.insert(name.clone(), t.clone());
            }
            let row = by.entry(name.clone()).or_default();
            row.endpoint = name;
            row.in_flight += e.in_flight;
            row.limit += e.limit;
            row.last_5m += e.counts;
            row.last_success_ms = row.last_success_ms.max(e.last_success_ms);
            if e.last_failure.as_ref().map(|f| f.at_ms) > row.last_failure.as_ref().map(|f| f.at_ms)
            {
                row.last_failure = e.last_failure.clone();
            }
            row.waiting += e.waiting;
            row.workers += 1;
            row.last_seen_ms = row.last_seen_ms.max(Some(e.seen_ms));
            if e.breaker_open {
                row.state = "breaker-open";
            }
        }
        for h in &r.held {
            let name = h.target.to_string();
            targets.insert(name.clone(), h.target.clone());
            let row = by.entry(name.clone()).or_default();
            row.endpoint = name;
            row.waiting += h.waiting;
            row.dead_lettered += h.dead_lettered;
            row.parked += h.parked;
        }
    }
    for k in book.keys().filter(|k| k.control.in_force(now_ms)) {
        let name = k.target.to_string();
        targets.insert(name.clone(), k.target.clone());
        let row = by.entry(name.clone()).or_default();
        row.endpoint = name;
    }
    let table = Table::build(book, now_ms);
    for (name, row) in by.iter_mut() {
        finish(row, targets.get(name), book, &table, now_ms);
    }
    by.into_values().collect()
}

/// The row's state and failing clock from the shared state.
fn finish(row: &mut Row, target: Option<&Target>, book: &Book, table: &Table, now_ms: u64) {
    if row.state.is_empty() {
        row.state = "active";
    }
    let Some(target) = target else {
        return;
    };
    if let Some((by, control)) = table.covering(target, now_ms) {
        row.state = control.name(now_ms);
        row.control = Some(control.clone());
        row.by_target = (by != target).then(|| by.to_string());
    }
    if let Some(k) = book.get(target).filter(|k| !k.is_stale(now_ms)) {
        failing(row, k);
    }
}

/// "Failing since", unless a live worker saw a success after it.
fn failing(row: &mut Row, k: &KeyState) {
    let Some(since) = k.failing_since_ms else {
        return;
    };
    if row.last_success_ms.is_some_and(|ok| ok >= since) {
        return;
    }
    row.failing_since_ms = Some(since);
    row.failures_since = k.failures;
    row.last_success_ms = row.last_success_ms.max(k.last_success_ms);
}

/// How many rows are in each state: active, paused, disabled, breaker open.
pub fn tally(rows: &[Row]) -> [usize; 4] {
    let mut n = [0; 4];
    for r in rows {
        let i = match r.state {
            "paused" => 1,
            "disabled" => 2,
            "breaker-open" => 3,
            _ => 0,
        };
        n[i] += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::record::{Change, Record};
    use crate::control::reports::{EndpointReport, HeldReport};

    fn t(s: &str) -> Target {
        Target::parse(s).unwrap()
    }

    fn ep(key: &str, attempts: u64, failures: u64, ok: Option<u64>) -> EndpointReport {
        EndpointReport {
            key: key.into(),
            target: Target::parse(key).ok(),
            seen_ms: 100,
            in_flight: 1,
            limit: 4,
            breaker_open: false,
            counts: Counts {
                attempts,
                successes: attempts - failures,
                failures,
            },
            last_success_ms: ok,
            last_failure: None,
            waiting: 2,
        }
    }

    fn report(worker: &str, endpoints: Vec<EndpointReport>, held: Vec<HeldReport>) -> Report {
        Report {
            worker: worker.into(),
            at_ms: 1,
            through: None,
            part: 0,
            parts: 1,
            endpoints,
            held,
        }
    }

    #[test]
    fn two_workers_views_of_one_endpoint_add_up() {
        let a = "http://127.0.0.1:4000";
        let reports = [
            report("w/1", vec![ep(a, 10, 2, Some(50))], vec![]),
            report(
                "w/2",
                vec![ep(a, 5, 5, None), ep("http://127.0.0.1:5000", 1, 0, None)],
                vec![],
            ),
        ];
        let rows = rows(&reports, &Book::default(), 1_000);
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!((r.endpoint.as_str(), r.state), (a, "active"));
        assert_eq!((r.last_5m.attempts, r.last_5m.failures), (15, 7));
        assert_eq!((r.in_flight, r.limit, r.waiting, r.workers), (2, 8, 4, 2));
        assert_eq!(r.last_success_ms, Some(50));
        assert_eq!(tally(&rows), [2, 0, 0, 0]);
    }

    #[test]
    fn a_paused_target_shows_without_traffic_and_covers_its_urls() {
        let mut b = Book::default();
        let pause = Change::Pause {
            target: t("http://127.0.0.1:4000"),
            reason: Some("maintenance".into()),
            until_ms: None,
        };
        b.apply(0, Record::new(1, "command", pause));
        let failing = Change::Failing {
            target: t("http://127.0.0.1:5000"),
            since_ms: 40,
            failures: 12,
        };
        b.apply(1, Record::new(1, "auto", failing));
        let held = HeldReport {
            parked: 0,
            target: t("http://127.0.0.1:4000"),
            waiting: 7,
            dead_lettered: 0,
        };
        let reports = [report(
            "w/1",
            vec![ep("http://127.0.0.1:5000", 3, 3, Some(10))],
            vec![held],
        )];
        let rows = rows(&reports, &b, 1_000);
        assert_eq!(rows[0].state, "paused");
        assert_eq!(rows[0].waiting, 7);
        assert_eq!(
            (rows[1].failing_since_ms, rows[1].failures_since),
            (Some(40), 12)
        );
        assert_eq!(tally(&rows), [1, 1, 0, 0]);
    }
}
