use super::*;
use crate::console::rollup::bucket;
use crate::isolation::{Counts, Failure};

#[test]
fn the_chart_has_a_bar_for_every_minute_of_the_hour() {
    let now = 100 * 60_000 + 30_000;
    let counts = vec![
        (100, "delivered".to_string(), 8),
        (100, "retry".to_string(), 2),
        (41, "dead".to_string(), 1),
        (40, "delivered".to_string(), 99), // more than an hour ago
    ];
    let c = Chart::build(&counts, now);
    assert_eq!(c.bars.len(), 60);
    assert_eq!(c.bars[0].minute, 41);
    assert_eq!(c.bars[0].dead, 1);
    let last = c.bars.last().unwrap();
    assert_eq!((last.minute, last.delivered, last.retry), (100, 8, 2));
    assert_eq!(c.max, 10);
    assert_eq!(c.totals(), (8, 2, 1));
    assert_eq!(Chart::build(&[], now).max, 1, "never a division by zero");
}

#[test]
fn an_endpoint_row_gives_its_hour_and_its_pause() {
    let mut s = EndpointStats {
        delivered: 199,
        retry: 1,
        ..EndpointStats::default()
    };
    s.buckets[bucket(30)] = 197;
    s.buckets[bucket(3_000)] = 3;
    let now = 1_000_000;
    let r = Row {
        endpoint: "https://shop.example:443".into(),
        state: "paused",
        control: Some(Mode::Paused {
            since_ms: 0,
            until_ms: Some(now + 3_600_000),
            reason: Some("maintenance".into()),
            by: "me".into(),
            id: "x".into(),
        }),
        last_5m: Counts {
            attempts: 3,
            successes: 1,
            failures: 2,
        },
        last_failure: Some(Failure {
            at_ms: now - 5_000,
            status: Some(503),
            error: None,
        }),
        ..Row::default()
    };
    let e = EndpointRow::build(&r, Some(&s), now);
    assert_eq!(e.success, "99.5%");
    assert_eq!((e.p50.as_str(), e.p99.as_str()), ("≤ 50 ms", "≤ 5 s"));
    assert_eq!(e.last_error, "HTTP 503 (5s ago)");
    assert!(e.paused_until.ends_with("(in 1h)"), "{}", e.paused_until);
    assert_eq!(e.reason, "maintenance");
    let quiet = EndpointRow::build(&r, None, now);
    assert_eq!((quiet.success.as_str(), quiet.p99.as_str()), ("-", "-"));
}

fn dead(id: &str, endpoint: &str, reason: &str, dead_at_ms: i64) -> Dead {
    Dead {
        id: id.into(),
        url: Some(format!("{endpoint}/hook")),
        endpoint: Some(endpoint.into()),
        reason: Some(reason.into()),
        attempts: 3,
        last_status: Some(500),
        last_error: None,
        dead_at_ms: Some(dead_at_ms),
    }
}

#[test]
fn dead_letters_filter_by_endpoint_reason_and_age() {
    let now = 10 * 3_600_000;
    let list = DeadList {
        at_ms: now,
        total: 3,
        rows: vec![
            dead("a", "http://x:80", "max-attempts", now as i64 - 60_000),
            dead("b", "http://y:80", "permanent-status", now as i64 - 60_000),
            dead("c", "http://x:80", "max-attempts", now as i64 - 7_200_000),
        ],
        error: None,
    };
    let all = DeadLetters::build(&list, &DeadFilter::default(), now);
    assert_eq!((all.matching, all.total), (3, 3));
    assert_eq!(all.reasons, ["max-attempts", "permanent-status"]);
    let f = DeadFilter {
        endpoint: "http://x:80".into(),
        reason: "max-attempts".into(),
        since: "1h".into(),
    };
    let ids: Vec<_> = DeadLetters::build(&list, &f, now)
        .rows
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids, ["a"]);
    let by_origin = DeadFilter {
        endpoint: "http://x".into(),
        ..DeadFilter::default()
    };
    let ids: Vec<_> = select(&list, &by_origin, now)
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(ids, ["a", "c"], "an origin as a replay or purge takes it");
    let huge = DeadFilter {
        since: "300000000y".into(),
        ..DeadFilter::default()
    };
    assert_eq!(select(&list, &huge, now).unwrap().len(), 3, "no overflow");
    let bad = DeadFilter {
        since: "soon".into(),
        ..DeadFilter::default()
    };
    let b = DeadLetters::build(&list, &bad, now);
    assert_eq!(b.matching, 0);
    assert!(b.error.unwrap().contains("not a duration"));
}

#[test]
fn a_notification_whose_last_record_is_dead_offers_a_replay() {
    let mut a = crate::history::record::sample();
    a.outcome = Outcome::Retry;
    a.request_body = Some("{}".into());
    let mut b = a.clone();
    b.attempt = 2;
    b.outcome = Outcome::Dead;
    b.request_body = None;
    let n = Notification::build("n1", &[a.clone(), b]);
    assert!(n.dead);
    assert_eq!(n.attempts.len(), 2);
    assert_eq!(n.request_body.as_deref(), Some("{}"));
    assert!(!Notification::build("n1", &[a]).dead);
}
