//! The figures' own parser, checked without a cluster.

use std::time::Duration;

use crate::common::cluster;

/// The figures read the workers' JSON log lines: their time and fields.
#[test]
fn worker_log_lines_parse() {
    let text = r#"{"timestamp":"2026-11-25T08:02:06.5Z","level":"INFO","message":"attempt","id":"c-1","delay_ms":50}
not json
{"timestamp":"2026-11-25T08:02:07.5Z","level":"WARN","message":"session lost; in-flight deliveries return to the queue"}"#;
    let lines: Vec<_> = cluster::log_lines(text).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[1].at.duration_since(lines[0].at).unwrap(),
        Duration::from_secs(1)
    );
    assert_eq!(lines[0].json["delay_ms"], 50);
    assert!(lines[1].message.starts_with("session lost"));
}
