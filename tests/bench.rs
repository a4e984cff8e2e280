//! `redeliver bench --quick` runs every phase against the local node and
//! reports a figure for each (the figures themselves are never judged here:
//! see BENCHMARKS.md for a full run). The crash phase kills its own worker
//! only: under `--quick` it never restarts this node, which other tests share.
//!
//! The cluster phase runs on this node named three times (`--cluster-url`):
//! its code (a worker a URL, alternating pairs, CPU per node) runs as on a
//! cluster, and the pass does not boot three more nodes for a figure
//! nobody reads (that start took 60–170 s of a CI pass). A full run starts
//! the local cluster itself; `tests/cluster.rs` tests the cluster.

mod common;

use common::TestApp;
use redeliver::delay::DelayBackend;

#[test]
fn quick_bench_runs_every_phase() {
    let app = TestApp::new("bench", DelayBackend::Plugin);
    let json = std::env::temp_dir().join(format!("{}.json", app.prefix));
    let thrice = [app.url.as_str(); 3].join(",");
    let out = app
        .command()
        .args(["bench", "--quick", "--cluster-url", &thrice, "--json"])
        .arg(&json)
        .output()
        .expect("run redeliver bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    // Each phase's time, for CI's log: this test is the pass's longest.
    for line in stderr.lines().filter(|l| l.contains(" done in ")) {
        println!("{line}");
    }
    let table = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the --json file")).unwrap();
    let _ = std::fs::remove_file(&json);
    let figures = report["figures"].as_array().expect("figures");
    for phase in [
        "1 broker ceiling",
        "2 sink ceiling",
        "3 end to end",
        "4 retry path",
        "5 latency",
        "6 delay accuracy",
        "7 memory and CPU",
        "8 horizontal",
        "9 noisy neighbour",
        "10 cluster",
        "11 crash",
        "12 flaky receiver",
        "13 probe cost",
        "15 endpoint state",
        "17 history index",
        "18 console pages",
    ] {
        let measured = figures
            .iter()
            .filter(|f| f["phase"] == phase)
            .filter(|f| f["value"].as_f64().is_some())
            .count();
        assert!(measured > 0, "phase {phase} has figures:\n{table}");
        assert!(table.contains(phase), "the table shows {phase}");
    }
    // One count per delay run (5s–30s scaled down, 1 ms – 1 s as a burst
    // and paced).
    let early: Vec<Option<f64>> = figures
        .iter()
        .filter(|f| {
            f["name"]
                .as_str()
                .is_some_and(|n| n.contains("delivered early"))
        })
        .map(|f| f["value"].as_f64())
        .collect();
    assert_eq!(
        early,
        [Some(0.0), Some(0.0), Some(0.0)],
        "no delayed notification arrived early"
    );
}
