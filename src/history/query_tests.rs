use std::time::{Duration, SystemTime};

use super::*;

fn attempt(endpoint: &str, status: Option<u16>, outcome: Outcome) -> Attempt {
    Attempt {
        notification_id: "n1".into(),
        webhook_id: "n1".into(),
        run: None,
        attempt: 1,
        endpoint: endpoint.into(),
        url: format!("{endpoint}/cb"),
        started_at: String::new(),
        duration_ms: 3,
        status,
        error: status.is_none().then(|| "connect: refused".into()),
        outcome,
        next_attempt_at: None,
        dead_reason: None,
        response_body: None,
        response_content_type: None,
        request_body: None,
        request_headers: vec![],
        worker: "w".into(),
        trace_id: None,
    }
}

#[test]
fn statuses_are_exact_or_a_class() {
    assert_eq!(Status::parse("503"), Ok(Status::Exact(503)));
    assert_eq!(Status::parse("5xx"), Ok(Status::Class(5)));
    assert_eq!(Status::parse(" 4XX "), Ok(Status::Class(4)));
    assert_eq!(Status::Class(5).range(), (500, 599));
    for bad in ["", "5x", "6xx", "0xx", "55xx", "99", "600", "abc", "-1"] {
        assert!(Status::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn times_are_rfc3339_or_a_duration_back_from_now() {
    let now = humantime::parse_rfc3339("2026-11-28T08:00:00Z").unwrap();
    let hour_ago = humantime::parse_rfc3339("2026-11-28T07:00:00Z").unwrap();
    assert_eq!(parse_time("1h", now), Ok(hour_ago));
    assert_eq!(parse_time("2026-11-28T07:00:00Z", now), Ok(hour_ago));
    for bad in ["yesterday", "", "1 parsec", "2026-13-01T00:00:00Z"] {
        assert!(parse_time(bad, now).is_err(), "{bad:?}");
    }
}

#[test]
fn outcomes_limits_and_windows_are_checked() {
    assert_eq!(parse_outcome("dead"), Ok(Outcome::Dead));
    assert!(parse_outcome("failed").is_err());
    assert_eq!(parse_limit("50"), Ok(50));
    for bad in ["0", "10001", "-3", "many"] {
        assert!(parse_limit(bad).is_err(), "{bad:?}");
    }
    let now = SystemTime::now();
    let backwards = Filter {
        since: Some(now),
        until: Some(now - Duration::from_secs(60)),
        ..Filter::default()
    };
    assert!(matches!(
        backwards.checked(),
        Err(QueryError::Window { .. })
    ));
}

#[test]
fn a_filter_takes_what_it_names_and_nothing_else() {
    let t = humantime::parse_rfc3339("2026-11-28T08:00:00Z").unwrap();
    let a = attempt("https://a.example:443", Some(503), Outcome::Retry);
    let refused = attempt("https://a.example:443", None, Outcome::Retry);
    let all = Filter::default();
    assert!(all.matches(&a, t) && all.matches(&refused, t));
    let five = Filter {
        status: Some(Status::Class(5)),
        ..Filter::default()
    };
    assert!(five.matches(&a, t));
    assert!(!five.matches(&refused, t), "no status is no 5xx");
    let other = Filter {
        endpoint: Some("https://b.example:443".into()),
        ..Filter::default()
    };
    assert!(!other.matches(&a, t));
    let dead = Filter {
        outcome: Some(Outcome::Dead),
        ..Filter::default()
    };
    assert!(!dead.matches(&a, t));
    let window = Filter {
        since: Some(t),
        until: Some(t + Duration::from_secs(1)),
        ..Filter::default()
    };
    assert!(window.matches(&a, t), "since is inclusive");
    assert!(
        !window.matches(&a, t + Duration::from_secs(1)),
        "until is not"
    );
}
