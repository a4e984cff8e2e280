//! Workers under test run as separate `redeliver run` processes, so their
//! CPU time and memory are their own and can be read from `/proc`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::config::BrokerSettings;

/// Linux's user-space clock tick (USER_HZ), fixed at 100 by its ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// One `redeliver run` process.
pub struct WorkerProc {
    child: Child,
    /// `pre_us`/`post_us` pairs from the `redeliver::timing` trace, when asked for.
    timings: Option<tokio::task::JoinHandle<Vec<(u64, u64)>>>,
}

/// How to start workers.
#[derive(Clone, Debug)]
pub struct Spawner {
    pub exe: PathBuf,
    pub broker: BrokerSettings,
    /// Variables the worker gets (the traced run's OTLP endpoint).
    pub env: Vec<(String, String)>,
}

impl Spawner {
    /// The caller's REDELIVER_* settings would silently change what is
    /// measured, and so would OTEL_* (trace export) and TRACEPARENT: the
    /// worker gets only what the bench sets.
    fn only_our_env(&self, cmd: &mut Command) {
        for (k, _) in std::env::vars_os() {
            let name = k.to_string_lossy();
            if ["REDELIVER_", "OTEL_", "TRACE"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
    }

    /// Starts `redeliver run` on `prefix` with `args`. With `timings`, the
    /// worker traces its own overhead and this process collects it.
    pub fn spawn(
        &self,
        prefix: &str,
        args: &[String],
        timings: bool,
    ) -> anyhow::Result<WorkerProc> {
        let mut cmd = Command::new(&self.exe);
        self.only_our_env(&mut cmd);
        // Through the environment, not argv, where `ps` would show the password.
        cmd.env("REDELIVER_AMQP_URL", self.broker.url.expose())
            .args(["--prefix", prefix])
            .arg("--queue-type")
            .arg(self.broker.queue_type.as_str())
            .arg("--delay-backend")
            .arg(self.broker.delay.as_str())
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        // Nothing is measured once a worker is told to stop; a short grace
        // (unless the phase sets its own) keeps a slow stop within `stop`'s 40 s.
        if !args.iter().any(|a| a == "--shutdown-grace") {
            cmd.args(["--shutdown-grace", "5s"]);
        }
        if timings {
            // The production log level plus the overhead trace, so the
            // measured worker pays for its per-attempt log line as usual.
            cmd.env("RUST_LOG", "info,lapin=off,redeliver::timing=debug")
                // `read_timings` reads `key=value` text lines.
                .env("REDELIVER_LOG_FORMAT", "pretty")
                .env("NO_COLOR", "1")
                .stderr(Stdio::piped());
        } else if let Some(log) = std::env::var_os("REDELIVER_BENCH_WORKER_LOG") {
            // For a reader chasing an odd figure: the workers' logs,
            // appended to this file.
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .with_context(|| format!("cannot open {}", log.to_string_lossy()))?;
            cmd.stderr(file);
        } else {
            // The worker's default logging, as in production, but not on
            // this terminal.
            cmd.env_remove("RUST_LOG").stderr(Stdio::null());
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.exe.display()))?;
        let timings = child.stderr.take().map(|e| tokio::spawn(read_timings(e)));
        Ok(WorkerProc { child, timings })
    }
}

async fn read_timings(stderr: tokio::process::ChildStderr) -> Vec<(u64, u64)> {
    let mut lines = BufReader::new(stderr).lines();
    let mut out = vec![];
    while let Ok(Some(line)) = lines.next_line().await {
        if let (Some(pre), Some(post)) = (field(&line, "pre_us="), field(&line, "post_us=")) {
            out.push((pre, post));
        }
    }
    out
}

fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The CPU seconds (user and system) process `pid` has used so far, from
/// `/proc` (`None` off Linux or once it exited).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may hold spaces);
    // utime and stime are the 14th and 15th fields of the whole line.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / TICKS_PER_SECOND)
}

/// A process's CPU seconds and peak resident memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_s: f64,
    pub peak_rss_mib: f64,
}

impl WorkerProc {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// CPU time and peak RSS so far (`None` off Linux or once it exited).
    pub fn usage(&self) -> Option<Usage> {
        let pid = self.pid()?;
        let proc_dir = Path::new("/proc").join(pid.to_string());
        let cpu_s = cpu_seconds(pid)?;
        let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
        let hwm_kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(Usage {
            cpu_s,
            peak_rss_mib: hwm_kb / 1024.0,
        })
    }

    /// SIGKILL, as a crash: no graceful stop, no ack or nack of what it
    /// held, so the broker redelivers its unacked messages. Waits for it.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("kill -9 of a worker")
    }

    /// The exit status once the process ended on its own (`None` while it runs).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM (a graceful stop), then waits; returns the timings collected.
    pub async fn stop(mut self) -> anyhow::Result<Vec<(u64, u64)>> {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                anyhow::ensure!(status.success(), "a worker exited with {status}");
            }
            Err(_) => {
                let _ = self.child.kill().await;
                anyhow::bail!("a worker did not stop within 40 s of SIGTERM");
            }
        }
        Ok(match self.timings.take() {
            Some(t) => t.await.unwrap_or_default(),
            None => vec![],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn timing_fields_are_read_from_a_log_line() {
        let l =
            "2026-11-22T04:00:00Z DEBUG redeliver::timing: worker overhead pre_us=42 post_us=317";
        assert_eq!(field(l, "pre_us="), Some(42));
        assert_eq!(field(l, "post_us="), Some(317));
        assert_eq!(field(l, "missing="), None);
    }
}
