use super::*;

fn ok(s: &str) -> Notification {
    decode(s.as_bytes(), DEFAULT_MAX_MESSAGE_BYTES, None).expect("valid")
}

fn err(s: &[u8]) -> InvalidMessage {
    decode(s, DEFAULT_MAX_MESSAGE_BYTES, None).expect_err("invalid")
}

#[test]
fn minimal_and_full_notifications_decode() {
    let n = ok(r#"{"url":"http://127.0.0.1:9/x"}"#);
    assert_eq!(n.method, reqwest::Method::POST);
    assert!(n.body.is_none());
    assert_eq!(n.id.len(), 36, "a UUID is assigned");
    let again = ok(r#"{"url":"http://127.0.0.1:9/x"}"#);
    assert_eq!(
        n.id, again.id,
        "derived from the bytes, so redeliveries keep it"
    );

    let n = ok(
        r#"{"v":1,"id":"pay-1","url":"https://example.com/cb","method":"put",
        "headers":{"X-A":"b"},"body":{"b": 1.50, "a":[1,2]},"max_attempts":4,
        "schedule":["15s","3m"],"success_body":"success","extra":"ignored"}"#,
    );
    assert_eq!(n.id, "pay-1");
    assert_eq!(n.method, reqwest::Method::PUT);
    assert_eq!(
        n.body.unwrap().get(),
        r#"{"b": 1.50, "a":[1,2]}"#,
        "exact bytes kept"
    );
    assert_eq!(n.max_attempts, Some(4));
    assert_eq!(n.schedule.unwrap()[1], Duration::from_secs(180));
    assert_eq!(n.success_body.as_deref(), Some("success"));
}

#[test]
fn fallback_id_is_used_when_json_has_none() {
    let n = decode(br#"{"url":"http://a/"}"#, 100, Some("amqp-id")).unwrap();
    assert_eq!(n.id, "amqp-id");
}

#[test]
fn bad_input_is_invalid_not_a_panic() {
    assert_eq!(err(b"\xff\xfe"), InvalidMessage::NotUtf8);
    assert!(matches!(err(b"not json"), InvalidMessage::Json(_)));
    assert!(matches!(err(b"[1,2]"), InvalidMessage::Json(_)));
    assert_eq!(err(b"{}"), InvalidMessage::MissingUrl);
    assert!(matches!(err(br#"{"url":5}"#), InvalidMessage::Json(_)));
    assert!(matches!(
        err(br#"{"url":"/relative"}"#),
        InvalidMessage::BadUrl(..)
    ));
    assert!(matches!(
        err(br#"{"url":"ftp://a/"}"#),
        InvalidMessage::BadUrl(..)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","v":2}"#),
        InvalidMessage::Version(2)
    ));
}

#[test]
fn bad_fields_are_invalid_not_a_panic() {
    assert!(matches!(
        err(br#"{"url":"http://a/","method":"TRACE"}"#),
        InvalidMessage::BadMethod(_)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","headers":{"bad name":"x"}}"#),
        InvalidMessage::BadHeader(..)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","headers":{"a":"x\ny"}}"#),
        InvalidMessage::BadHeader(..)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","headers":{"Host":"x"}}"#),
        InvalidMessage::BadHeader(..)
    ));
}

#[test]
fn bad_policies_ids_and_sizes_are_invalid_not_a_panic() {
    assert!(matches!(
        err(br#"{"url":"http://a/","max_attempts":0}"#),
        InvalidMessage::Policy(_)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","max_attempts":1000000000}"#),
        InvalidMessage::Policy(_)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","max_attempts":-1}"#),
        InvalidMessage::Json(_)
    ));
    assert!(matches!(
        err(br#"{"url":"http://a/","schedule":["-5s"]}"#),
        InvalidMessage::Policy(_)
    ));
    for bad in ["\"\"", "\"café\"", "\"a b\"", "\"a\\tb\""] {
        let json = format!(r#"{{"url":"http://a/","id":{bad}}}"#);
        assert!(
            matches!(err(json.as_bytes()), InvalidMessage::BadId(_)),
            "{bad}"
        );
    }
    let big = format!(r#"{{"url":"http://a/","body":"{}"}}"#, "x".repeat(200));
    assert!(matches!(
        decode(big.as_bytes(), 100, None),
        Err(InvalidMessage::TooLarge(..))
    ));
}
