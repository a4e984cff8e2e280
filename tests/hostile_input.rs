//! Property tests: the message decoder, the retry-state reader and the
//! policy parser never panic, whatever a producer sends. Each property
//! runs `CASES` generated cases (run with --nocapture to see the count).

use lapin::types::{AMQPValue, FieldTable, LongString};
use proptest::prelude::*;
use redeliver::message::state::RetryState;
use redeliver::message::{decode, InvalidMessage};
use redeliver::policy::{parse_duration, parse_schedule};

const CASES: u32 = 4000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    }
}

/// JSON-ish notification objects with fields of random types.
fn notification_json() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("null".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() {
            f.to_string()
        } else {
            "1e999".into()
        }),
        ".{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        prop::collection::vec(".{0,8}", 0..4).prop_map(|v| serde_json::to_string(&v).unwrap()),
        prop::collection::btree_map(".{0,12}", ".{0,12}", 0..4)
            .prop_map(|m| serde_json::to_string(&m).unwrap()),
        Just(r#""http://127.0.0.1:9/x""#.to_string()),
        Just(r#"["1s","-5s","abc","99999999h"]"#.to_string()),
    ];
    let field = prop_oneof![
        Just("url"),
        Just("body"),
        Just("id"),
        Just("headers"),
        Just("method"),
        Just("max_attempts"),
        Just("schedule"),
        Just("success_body"),
        Just("v"),
        Just("other"),
    ];
    prop::collection::vec((field, value), 0..8).prop_map(|fields| {
        let inner: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", inner.join(","))
    })
}

fn amqp_value() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<f64>().prop_map(AMQPValue::Double),
        ".{0,10}".prop_map(|s| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))),
        Just(AMQPValue::Void),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decoding_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes, 256, None);
    }

    #[test]
    fn decoding_random_notifications_never_panics(json in notification_json()) {
        match decode(json.as_bytes(), 1 << 20, None) {
            Ok(n) => {
                prop_assert!(matches!(n.url.scheme(), "http" | "https"));
                prop_assert!(n.max_attempts.is_none_or(|m| (1..=1000).contains(&m)));
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn retry_state_from_random_headers_never_panics(
        entries in prop::collection::vec((prop_oneof![
            Just("redeliver-attempt"), Just("redeliver-first-attempt-at"),
            Just("redeliver-id"), Just("redeliver-history"), Just("x-delay"),
        ], amqp_value()), 0..6)
    ) {
        let mut h = FieldTable::default();
        for (k, v) in entries {
            h.insert(k.into(), v);
        }
        if let Ok(s) = RetryState::from_headers(Some(&h)) {
            // A valid state survives a round trip.
            let back = RetryState::from_headers(Some(&s.to_headers(None, None)));
            prop_assert_eq!(back.map(|b| b.attempts), Ok::<u32, InvalidMessage>(s.attempts));
        }
    }

    #[test]
    fn policy_parser_never_panics(s in ".{0,40}") {
        let _ = parse_duration(&s);
        let _ = parse_schedule(&s);
    }
}

/// Each property really runs `CASES` cases: the runner the `proptest!`
/// block uses, under the same config, runs a counting property that often.
#[test]
fn report_case_count() {
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let ran = std::cell::Cell::new(0u32);
    let counted = runner.run(&any::<u8>(), |_| {
        ran.set(ran.get() + 1);
        Ok(())
    });
    assert!(counted.is_ok(), "{counted:?}");
    assert_eq!(ran.get(), CASES, "cases run per property");
    println!("hostile input: 4 properties x {CASES} generated cases each");
}
