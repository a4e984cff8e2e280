//! The local three-node cluster of the test broker (`tests/broker/ctl
//! cluster ...`): its URLs, its nodes, killing and restarting one, and the
//! figures of a node loss (how long deliveries and workers stopped).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use super::receiver::Recorded;

/// The first node's AMQP port (`REDELIVER_TEST_CLUSTER_PORT`, default
/// 5684); the others are the two after it.
pub fn base_port() -> u16 {
    std::env::var("REDELIVER_TEST_CLUSTER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(5684)
}

/// Node `n`'s (1-3) AMQP port.
pub fn port(n: usize) -> u16 {
    base_port() + n as u16 - 1
}

pub fn ports() -> Vec<u16> {
    (1..=3).map(port).collect()
}

/// Node `n`'s Erlang name, as the management API reports it.
pub fn node_name(n: usize) -> String {
    format!("redeliver_test_{}@localhost", port(n))
}

/// The node number (1-3) of an Erlang node name.
pub fn node_number(name: &str) -> Option<usize> {
    (1..=3).find(|n| node_name(*n) == name)
}

/// Node `n`'s AMQP URL alone.
pub fn url(n: usize) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", port(n))
}

/// Node `n`'s management API.
pub fn management_url(n: usize) -> String {
    format!("http://127.0.0.1:{}", port(n) + 10000)
}

/// `tests/broker/ctl cluster ARGS`; returns its last line of output.
pub fn ctl(args: &[&str]) -> String {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/ctl"))
        .arg("cluster")
        .args(args)
        .env("REDELIVER_TEST_CLUSTER_PORT", base_port().to_string())
        .output()
        .expect("tests/broker/ctl could not be run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/broker/ctl cluster {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_string()
}

/// Starts the cluster when it is not running; its comma-separated URLs.
pub fn up() -> String {
    ctl(&["up"])
}

/// `kill -9` of node `n`; returns the moment of the kill.
pub fn kill(n: usize) -> (Instant, SystemTime) {
    let at = (Instant::now(), SystemTime::now());
    ctl(&["kill", &n.to_string()]);
    at
}

/// Brings node `n` back and waits until it is ready.
pub fn start(n: usize) {
    ctl(&["start", &n.to_string()]);
}

/// How deliveries fared after a node was killed at `killed`: the longest
/// pause between successive requests the receiver saw in the `window`
/// after it, and when that pause ended (deliveries flowing again); `None`
/// when no request came in the window at all.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    pub longest_pause: Duration,
    pub flowing_again_after: Duration,
}

pub fn stall_after(requests: &[Recorded], killed: Instant, window: Duration) -> Option<Stall> {
    let mut at: Vec<Instant> = requests
        .iter()
        .map(|r| r.at)
        .filter(|t| *t >= killed && *t <= killed + window)
        .collect();
    at.sort();
    let mut prev = killed;
    let mut s = Stall {
        longest_pause: Duration::ZERO,
        flowing_again_after: Duration::ZERO,
    };
    for t in &at {
        if *t - prev > s.longest_pause {
            s.longest_pause = *t - prev;
            s.flowing_again_after = *t - killed;
        }
        prev = *t;
    }
    (!at.is_empty()).then_some(s)
}

/// One line of a worker's JSON log.
pub struct LogLine {
    pub at: SystemTime,
    pub message: String,
    pub json: serde_json::Value,
}

/// The lines of a worker log (`--log-format json`, as the fleet writes it).
pub fn log_lines(text: &str) -> impl Iterator<Item = LogLine> + '_ {
    text.lines().filter_map(|l| {
        let json: serde_json::Value = serde_json::from_str(l).ok()?;
        let at = humantime::parse_rfc3339_weak(json["timestamp"].as_str()?.trim_end_matches('Z'))
            .ok()?;
        let message = json["message"].as_str()?.to_string();
        Some(LogLine { at, message, json })
    })
}

/// Of the workers whose logs are in `logs` (one file each), those that
/// lost their session in the `window` after `killed` (wall clock): how
/// many, and how long until the last of them was consuming again (`None`:
/// one was not).
pub fn workers_back(
    logs: &Path,
    killed: SystemTime,
    window: Duration,
) -> (usize, Option<Duration>) {
    let mut lost = 0;
    let mut slowest = Some(Duration::ZERO);
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let after: Vec<LogLine> = log_lines(&text)
            .filter(|l| l.at >= killed && l.at <= killed + window)
            .collect();
        let Some(drop) = after
            .iter()
            .position(|l| l.message.starts_with("session lost"))
        else {
            continue;
        };
        lost += 1;
        let back = after[drop..].iter().find(|l| l.message == "consuming");
        let took = back.and_then(|l| l.at.duration_since(killed).ok());
        slowest = match (slowest, took) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    (lost, slowest)
}

/// When each retry fell due, from the workers' `attempt` lines (the
/// attempt's time plus its `delay_ms`): every id's retries, in log order.
pub fn retries_due(logs: &Path) -> std::collections::HashMap<String, Vec<SystemTime>> {
    let mut due = std::collections::HashMap::new();
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for l in log_lines(&text).filter(|l| l.message == "attempt") {
            let (Some(id), Some(delay)) = (l.json["id"].as_str(), l.json["delay_ms"].as_u64())
            else {
                continue;
            };
            let at = l.at + Duration::from_millis(delay);
            due.entry(id.to_string()).or_insert_with(Vec::new).push(at);
        }
    }
    due
}
