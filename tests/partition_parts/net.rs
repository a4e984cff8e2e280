//! The partition harness's network (`tests/partition/net`) as the tests
//! drive it: three nodes and three worker namespaces on a bridge, cut,
//! throttled, killed and healed. Dropping [`Net`] takes it all down, also
//! when a test fails.

use std::process::{Command, Output};
use std::time::Instant;

/// Where the test process, the producer and the receiver sit: the host's
/// end of the bridge.
pub const HOST: &str = "10.213.47.1";

fn script() -> String {
    format!("{}/tests/partition/net", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the script; panics with its output when it fails.
pub fn net(args: &[&str]) -> String {
    let out = net_output(args);
    assert!(
        out.status.success(),
        "tests/partition/net {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn net_output(args: &[&str]) -> Output {
    Command::new(script())
        .args(args)
        .output()
        .expect("run tests/partition/net")
}

/// The address of node `k` (1-3).
pub fn node_ip(k: usize) -> String {
    format!("10.213.47.1{k}")
}

/// The running harness. Its URL list names all three nodes.
pub struct Net {
    pub urls: String,
}

impl Net {
    /// A fresh cluster (whatever an earlier run left is taken down first).
    pub fn up() -> Net {
        let _ = net_output(&["down"]);
        let out = net(&["up"]);
        let urls = out.lines().last().unwrap_or_default().trim().to_string();
        assert!(urls.contains(&node_ip(3)), "no URL list from `up`: {out}");
        Net { urls }
    }

    /// The node worker namespace `w` (1-3) is connected to, read from the cluster's connection list (its
    /// `peer_host` is the worker's address, its `host` the node's).
    pub fn node_of_worker(&self, w: usize) -> Option<usize> {
        let worker = format!("10.213.47.2{w}");
        for k in 1..=3 {
            let out = net_output(&[
                "ctl",
                &k.to_string(),
                "-q",
                "list_connections",
                "peer_host",
                "host",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            for line in text.lines() {
                let mut it = line.split_whitespace();
                if it.next() == Some(worker.as_str()) {
                    let host = it.next().unwrap_or_default();
                    return (1..=3).find(|n| node_ip(*n) == host);
                }
            }
        }
        None
    }
}

impl Net {
    /// The prefix's queues that still hold messages, with their types, as
    /// the first node that answers lists them: where a notification the
    /// checker counts as lost still is, if anywhere.
    pub fn queues_holding(&self, prefix: &str) -> String {
        for k in 1..=3 {
            let out = net_output(&[
                "ctl",
                &k.to_string(),
                "-q",
                "list_queues",
                "name",
                "type",
                "messages",
            ]);
            if !out.status.success() {
                continue;
            }
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let held: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(prefix) && !l.trim_end().ends_with("\t0"))
                .collect();
            return format!("queues holding messages (node {k}): {held:?}\n");
        }
        "queues holding messages: no node answered\n".into()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if std::env::var_os("REDELIVER_PARTITION_KEEP").is_none() {
            let _ = net_output(&["down"]);
        }
    }
}

/// One fault: applied, held, then healed.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Node `k` cut from the other two nodes (workers and host still reach it).
    Isolate(usize),
    /// Node `k` cut from the other nodes, and worker `w` from every node but `k`.
    WorkerMinority { node: usize, worker: usize },
    /// The cluster split: node `k` and worker `w` on one side, the other
    /// nodes, workers and the host (the producer) on the other.
    Split { node: usize, worker: usize },
    /// A slow link that drops what overflows, between nodes `a` and `b`.
    Slow(usize, usize),
    /// `kill -9` of node `k`, restarted at the heal.
    Kill(usize),
}

impl Fault {
    pub fn apply(&self) {
        match self {
            Fault::Isolate(k) => {
                net(&["isolate", &k.to_string()]);
            }
            Fault::WorkerMinority { node, worker } => {
                net(&["isolate", &node.to_string()]);
                for other in others(*node) {
                    net(&["cut", &format!("w{worker}"), &format!("n{other}")]);
                }
            }
            Fault::Split { node, worker } => {
                net(&["isolate", &node.to_string()]);
                net(&["cut", "host", &format!("n{node}")]);
                for other in others(*node) {
                    net(&["cut", &format!("w{worker}"), &format!("n{other}")]);
                }
                for other in others(*worker) {
                    net(&["cut", &format!("w{other}"), &format!("n{node}")]);
                }
            }
            Fault::Slow(a, b) => {
                net(&["slow", &format!("n{a}"), &format!("n{b}")]);
            }
            Fault::Kill(k) => {
                net(&["kill", &k.to_string()]);
            }
        }
    }

    pub fn heal(&self) {
        match self {
            Fault::Kill(k) => {
                net(&["start", &k.to_string()]);
            }
            _ => {
                net(&["heal"]);
            }
        }
    }
}

fn others(k: usize) -> impl Iterator<Item = usize> {
    (1..=3).filter(move |n| *n != k)
}

/// What was done when, for the report of a loss: which fault was active
/// when an id was last seen.
#[derive(Default, Debug)]
pub struct Timeline {
    pub spans: Vec<(String, Instant, Option<Instant>)>,
}

impl Timeline {
    pub fn begin(&mut self, what: String) {
        self.spans.push((what, Instant::now(), None));
    }
    pub fn end(&mut self) {
        if let Some(last) = self.spans.last_mut() {
            last.2.get_or_insert_with(Instant::now);
        }
    }
    /// The fault active at `t`, or "none".
    pub fn at(&self, t: Instant) -> String {
        self.spans
            .iter()
            .find(|(_, from, to)| *from <= t && to.is_none_or(|to| t <= to))
            .map(|(w, _, _)| w.clone())
            .unwrap_or_else(|| "none".into())
    }
    pub fn last_heal(&self) -> Option<Instant> {
        self.spans.iter().filter_map(|s| s.2).max()
    }
}
