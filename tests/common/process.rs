//! A running `redeliver` child process whose output lines are collected,
//! killed when dropped so a failed test leaves no worker behind.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

type Lines = Arc<Mutex<Vec<String>>>;

pub struct Proc {
    pub child: Child,
    out: Lines,
    err: Lines,
    /// One message from each reader when its pipe closes.
    eof: mpsc::Receiver<()>,
}

impl Proc {
    /// Spawns `cmd` (from [`super::TestApp::command`] or
    /// [`super::redeliver_command`]) with stdout and stderr collected.
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn redeliver");
        let (tx, eof) = mpsc::channel();
        let out = collect(child.stdout.take().unwrap(), tx.clone());
        let err = collect(child.stderr.take().unwrap(), tx);
        Proc {
            child,
            out,
            err,
            eof,
        }
    }

    /// Stdout lines so far.
    pub fn stdout(&self) -> Vec<String> {
        self.out.lock().unwrap().clone()
    }

    /// Stderr lines so far.
    pub fn stderr(&self) -> Vec<String> {
        self.err.lock().unwrap().clone()
    }

    /// Stderr lines so far that contain `needle`.
    pub fn stderr_count(&self, needle: &str) -> usize {
        let err = self.err.lock().unwrap();
        err.iter().filter(|l| l.contains(needle)).count()
    }

    /// The JSON log objects so far; every stderr line must be one (it is
    /// not a terminal, so the logs are JSON).
    pub fn json(&self) -> Vec<Value> {
        self.stderr()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    pub fn sigterm(&self) {
        super::harness::sigterm(&self.child);
    }

    /// SIGINT, as Ctrl-C sends.
    pub fn sigint(&self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
    }

    /// Waits for the exit; kills it and fails the test after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let st = super::harness::wait_exit(&mut self.child, within);
        // All the output is in once both pipes are closed.
        for _ in 0..2 {
            let _ = self.eof.recv_timeout(Duration::from_secs(5));
        }
        st
    }

    /// `kill -9`, and waits for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many of its last log lines a process shows when its test fails.
const SHOWN_ON_FAILURE: usize = 80;

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        // A failing test's own message rarely says why a worker did what
        // it did; its last log lines usually do (CI keeps only the output).
        if std::thread::panicking() {
            if let Ok(err) = self.err.lock() {
                let from = err.len().saturating_sub(SHOWN_ON_FAILURE);
                eprintln!(
                    "--- the last {} log lines of pid {}:",
                    err.len() - from,
                    self.child.id()
                );
                err[from..].iter().for_each(|l| eprintln!("{l}"));
            }
        }
    }
}

fn collect(pipe: impl Read + Send + 'static, eof: mpsc::Sender<()>) -> Lines {
    let lines: Lines = Arc::default();
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
        let _ = eof.send(());
    });
    lines
}
