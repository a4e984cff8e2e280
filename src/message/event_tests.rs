use super::*;

fn url(s: &str) -> Url {
    Url::parse(s).unwrap()
}

fn subject<'a>(id: &'a str, u: &'a Url, attempt: u32, run: &'a [u8]) -> Subject<'a> {
    Subject {
        id: Some(id),
        url: Some(u),
        attempt,
        run,
        ..Subject::default()
    }
}

#[test]
fn a_notification_event_has_every_documented_field() {
    let u = url("https://h.example/pay/cb?token=secret");
    let mut s = subject("n1", &u, 8, b"");
    s.last = Last {
        status: Some(503),
        error: None,
    };
    let e = notification(Kind::Exhausted, "p", s, Some("max-attempts"));
    let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
    assert_eq!(v["v"], 1);
    assert_eq!(v["type"], "notification.exhausted");
    assert_eq!(v["prefix"], "p");
    assert!(v["id"].as_str().unwrap().starts_with("evt_"));
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    let d = &v["data"];
    assert_eq!(d["notification_id"], "n1");
    assert_eq!(d["webhook_id"], "n1");
    assert_eq!(d["endpoint"], "https://h.example:443");
    assert_eq!(d["attempt"], 8);
    assert_eq!(d["status"], 503);
    assert!(d["error"].is_null(), "present, null");
    assert_eq!(d["reason"], "max-attempts");
    assert!(!String::from_utf8(e.to_json()).unwrap().contains("secret"));
}

#[test]
fn ids_are_stable_for_the_same_event_and_differ_otherwise() {
    let u = url("http://h/");
    let e = |k, p: &str, id: &str, n, run: &[u8]| notification(k, p, subject(id, &u, n, run), None);
    let a = e(Kind::Failing, "p", "n1", 4, b"17");
    assert_eq!(
        a.id,
        e(Kind::Failing, "p", "n1", 4, b"17").id,
        "republished: same id"
    );
    // A chain forked by a crash announces its run's outcome at another
    // attempt count: still the same event.
    assert_eq!(
        e(Kind::Exhausted, "p", "n1", 8, b"17").id,
        e(Kind::Exhausted, "p", "n1", 9, b"17").id,
        "one run, one exhaustion"
    );
    for other in [
        e(Kind::Failing, "q", "n1", 4, b"17"),
        e(Kind::Failing, "p", "n2", 4, b"17"),
        e(Kind::Exhausted, "p", "n1", 4, b"17"),
        // A replay from the dead-letter queue: another run.
        e(Kind::Failing, "p", "n1", 4, b"99"),
    ] {
        assert_ne!(a.id, other.id);
    }
    let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let s = delay(Kind::DelayStalled, "p", "plugin", t0, None);
    assert_eq!(s.id, delay(Kind::DelayStalled, "p", "plugin", t0, None).id);
    let r = delay(
        Kind::DelayRecovered,
        "p",
        "plugin",
        t0,
        Some(Duration::from_secs(61)),
    );
    assert_ne!(s.id, r.id);
    let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
    assert_eq!(v["data"]["backend"], "plugin");
    assert_eq!(v["data"]["since"], "2023-11-14T22:13:20.000Z");
    assert_eq!(v["data"]["lasted_seconds"], 61);
}

#[test]
fn an_endpoint_event_names_who_and_why() {
    let data = EndpointData {
        endpoint: "https://h.example:443/m/1/".into(),
        by: "command ops@h".into(),
        automatic: false,
        reason: Some("maintenance".into()),
        until: None,
    };
    let e = endpoint(Kind::Paused, "p", "rec-1", data.clone());
    let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
    assert_eq!(v["type"], "endpoint.paused");
    assert_eq!(v["data"]["by"], "command ops@h");
    assert_eq!(v["data"]["reason"], "maintenance");
    assert!(v["data"]["until"].is_null());
    assert_eq!(e.id, endpoint(Kind::Paused, "p", "rec-1", data).id);
}

#[test]
fn times_past_year_9999_do_not_panic() {
    let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
    assert_eq!(rfc3339_ms(far), "9999-12-31T23:59:59.000Z");
}
