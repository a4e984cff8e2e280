//! The README's first command, as a newcomer runs it: `redeliver demo` with
//! no broker given and none answering. The demo must start the local test
//! node itself, say so in one line, run the whole lifecycle and clean up.
//!
//! It uses a node of its own on [`PORT`], so the shared node the other tests
//! use is never touched, and takes that node down when it ends, passed or
//! failed.

mod common;

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

/// A port no other test uses (see `tests/common` and `tests/broker/ctl`).
const PORT: u16 = 5699;

fn ctl(args: &[&str]) -> std::process::Output {
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/ctl"))
        .args(args)
        .env("REDELIVER_TEST_BROKER_PORT", PORT.to_string())
        .output()
        .expect("run tests/broker/ctl")
}

fn answers() -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], PORT));
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

/// Takes the node down when the test ends, also when it fails.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let _ = ctl(&["down"]);
    }
}

#[test]
fn demo_starts_the_local_node_when_none_answers() {
    let _down = Down;
    // A node left over from an interrupted run would make this test prove
    // nothing: start from none.
    let _ = ctl(&["down"]);
    assert!(!answers(), "something else listens on 127.0.0.1:{PORT}");
    // No broker given, and none of this shell's REDELIVER_* variables.
    let out = common::redeliver_command()
        .arg("demo")
        .env("REDELIVER_TEST_BROKER_PORT", PORT.to_string())
        .output()
        .expect("run redeliver demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    let starting: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("starting the local test broker node"))
        .collect();
    assert_eq!(starting.len(), 1, "one line says so:\n{stdout}");
    assert!(
        stdout.contains(&format!("127.0.0.1:{PORT}")),
        "the demo used the node it started:\n{stdout}"
    );
    assert!(stdout.contains("have been deleted"), "{stdout}");
    assert!(answers(), "the node it started is up");
}
