//! Dead letters as a worker would have written them, for the `dlq` tests.

use lapin::types::{AMQPValue, FieldTable};
use redeliver::message::state::*;

/// A dead letter as a worker would have written it.
pub fn dead(id: &str, url: &str, reason: &str, dead_at: i64) -> (Vec<u8>, FieldTable) {
    let body = serde_json::json!({"v": 1, "id": id, "url": url, "body": {"n": id}}).to_string();
    let mut h = FieldTable::default();
    h.insert(H_ATTEMPT.into(), AMQPValue::LongLongInt(3));
    h.insert(H_DEAD_REASON.into(), long_string(reason));
    h.insert(H_DEAD_AT.into(), AMQPValue::LongLongInt(dead_at));
    h.insert(H_LAST_STATUS.into(), AMQPValue::LongInt(500));
    h.insert(H_LAST_ERROR.into(), long_string("HTTP 500"));
    h.insert("x-custom".into(), long_string(id));
    let mut attempt = FieldTable::default();
    attempt.insert("attempt".into(), AMQPValue::LongLongInt(1));
    attempt.insert("status".into(), AMQPValue::LongInt(500));
    let history = vec![AMQPValue::FieldTable(attempt)];
    h.insert(H_HISTORY.into(), AMQPValue::FieldArray(history.into()));
    (body.into_bytes(), h)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Four dead letters (a, b, c, d) for receivers under `rx`: reasons,
/// paths and ages that the `dlq` filters tell apart.
pub fn fixture(rx: &str) -> Vec<(Vec<u8>, FieldTable)> {
    let now = now_ms();
    vec![
        dead("a", &format!("{rx}/shop/1"), "max-attempts", now - 1_000),
        dead(
            "b",
            &format!("{rx}/bank/2"),
            "permanent-status",
            now - 2_000,
        ),
        dead(
            "c",
            &format!("{rx}/shop/3"),
            "max-attempts",
            now - 7_200_000,
        ),
        dead("d", &format!("{rx}/shop/4"), "invalid", now - 3_000),
    ]
}

/// The ids of `dlq list --json` (or `export`) output, in order.
pub fn ids_of(json_lines: &str) -> Vec<String> {
    let rows = json_lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    rows.map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// `after` (drained from a dead-letter queue) holds exactly `items`, in
/// order, with the same bytes and headers, but for the counts a quorum
/// queue adds each time a walk returns a message (`x-delivery-count`, and
/// on 4.3 `x-acquired-count`).
pub fn assert_unchanged(after: &[super::harness::DeadLetter], items: &[(Vec<u8>, FieldTable)]) {
    assert_eq!(after.len(), items.len(), "every dead letter is still there");
    for (got, (body, headers)) in after.iter().zip(items) {
        assert_eq!(&got.body, body, "same order, same bytes");
        let mut got = got.headers.clone();
        redeliver::publish::retain_headers(&mut got, |k| !is_broker_count_header(k));
        assert_eq!(&got, headers, "headers unchanged");
    }
}

/// Ready, unacked and consumers of each queue, as `rabbitmqctl` on the
/// test node lists them (empty for a queue it does not list).
pub fn rabbitmqctl_counts(queues: &[String]) -> Vec<Vec<u64>> {
    let args = [
        "rabbitmqctl",
        "list_queues",
        "-q",
        "--no-table-headers",
        "name",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
    ];
    let listed = super::ctl_output(super::default_port(), &args);
    let row = |q: &str| -> Vec<u64> {
        let line = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(q));
        let counts = line.map(|l| l.split_whitespace().skip(1).map(|n| n.parse().unwrap()));
        counts.map(Iterator::collect).unwrap_or_default()
    };
    queues.iter().map(|q| row(q)).collect()
}
