//! Unit tests of the cascade's digits, routes and bindings.

use super::*;

fn digits(h: &FieldTable) -> Vec<(String, String)> {
    let mut v: Vec<_> = h
        .inner()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with(HEADER))
        .map(|(k, v)| match v {
            AMQPValue::LongString(s) => (k.to_string(), s.to_string()),
            other => panic!("digit header of type {other:?}"),
        })
        .collect();
    v.sort();
    v
}

#[test]
fn entry_stage_and_digits_follow_base_16() {
    let t = Topology::new("p");
    let mut h = FieldTable::default();
    assert_eq!(entry(&t, 0, &mut h), "p.cascade.out");
    assert!(digits(&h).is_empty());
    assert_eq!(entry(&t, 15, &mut h), "p.cascade.0");
    assert_eq!(digits(&h), [("redeliver-cascade-0".into(), "15".into())]);
    // 0x1a0 = 416 ms: 1 × 256 + 10 × 16 + 0.
    assert_eq!(entry(&t, 0x1a0, &mut h), "p.cascade.2");
    let want: Vec<(String, String)> = [("0", "0"), ("1", "10"), ("2", "1")]
        .iter()
        .map(|(s, d)| (format!("redeliver-cascade-{s}"), d.to_string()))
        .collect();
    assert_eq!(digits(&h), want, "earlier digits are replaced");
    assert_eq!(entry(&t, u32::MAX, &mut h), "p.cascade.7");
    assert_eq!(digits(&h).len(), 8);
    assert!(digits(&h).iter().all(|(_, d)| d == "15"));
}

#[test]
fn short_delays_are_held_with_a_due_time() {
    assert!(!is_held(0) && is_held(1) && is_held(HOLD_MAX_MS));
    assert!(!is_held(HOLD_MAX_MS + 1));
    let mut h = FieldTable::default();
    hold_entry(250, 1_700_000_000_000_001, &mut h);
    let due = h.inner().get(DUE_HEADER);
    assert_eq!(due, Some(&AMQPValue::LongLongInt(1_700_000_000_250_001)));
    assert!(is_cascade_header(DUE_HEADER));
    let mut h = FieldTable::default();
    hold_entry(250, 0, &mut h);
    assert!(h.inner().is_empty(), "a clock before 1970 sets no due time");
}

#[test]
fn the_queues_add_up_to_every_delay() {
    // The TTLs of the queues a delay waits in sum to the delay itself.
    for delay in [1u32, 15, 16, 255, 256, 1000, 4095, 4096, 15_000, u32::MAX] {
        let sum: u64 = (0..STAGES).map(|s| ttl_ms(s, digit(delay, s))).sum();
        assert_eq!(sum, u64::from(delay));
    }
    assert_eq!(hops(0x1a0 + 4096), 3);
    assert_eq!(hops(1001), 3);
    assert_eq!(hops(1000), 0, "held, not cascaded");
    assert_eq!(ttl_ms(7, MAX_DIGIT), 0xF000_0000);
    assert_eq!(queues(&Topology::new("p")).count(), 120);
}
