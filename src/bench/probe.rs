//! Phase 13, probe cost: what the delay backend's liveness probe
//! (`crate::delay::probe`) costs. An idle `redeliver run` worker on the
//! default flags (a probe every 5 s) against one with
//! `--delay-probe-every 0s`, alternating in the same run; the figures are
//! each one's worker and broker CPU over the same window, as a share of
//! one core, and what the probes add. Idle, because that is where a fixed
//! cost shows: under load it drowns in the deliveries' own.

use std::time::{Duration, Instant};

use super::load;
use super::options::Phase;
use super::phases::Bench;

/// Each idle run is measured for this long (after a warm-up in which the
/// worker connects and declares its topology).
const WINDOW: Duration = Duration::from_secs(30);
const QUICK_WINDOW: Duration = Duration::from_secs(6);
const WARM_UP: Duration = Duration::from_secs(3);
/// Runs of each kind, alternated so drift hits both alike (one under
/// `--quick`, which only shows the phase runs, like every phase's pairs).
const ROUNDS: usize = 2;

/// CPU seconds over a window, as a share of one core.
#[derive(Clone, Copy, Default)]
struct Share {
    worker: f64,
    broker: Option<f64>,
}

impl Bench {
    pub(super) async fn probe_cost(&mut self) -> anyhow::Result<()> {
        let window = if self.opts.quick {
            QUICK_WINDOW
        } else {
            WINDOW
        };
        let rounds = if self.opts.quick { 1 } else { ROUNDS };
        let (mut on, mut off) = (vec![], vec![]);
        for _ in 0..rounds {
            off.push(self.idle(&["--delay-probe-every", "0s"], window).await?);
            on.push(self.idle(&[], window).await?);
        }
        let (on, off) = (mean(&on), mean(&off));
        let p = Phase::ProbeCost;
        let pct = |x: f64| x * 100.0;
        self.push(p, "worker CPU, probes off", Some(pct(off.worker)), "% core");
        self.push(
            p,
            "worker CPU, probes on (every 5s)",
            Some(pct(on.worker)),
            "% core",
        );
        let added = pct(on.worker - off.worker);
        self.push_target(
            p,
            "worker CPU the probes add",
            Some(added),
            "% core",
            "< 1",
            |v| v < 1.0,
        );
        let broker_added = on.broker.zip(off.broker).map(|(a, b)| pct(a - b));
        self.push(p, "broker CPU, probes off", off.broker.map(pct), "% core");
        self.push(p, "broker CPU, probes on", on.broker.map(pct), "% core");
        self.push_target(
            p,
            "broker CPU the probes add",
            broker_added,
            "% core",
            "< 1",
            |v| v < 1.0,
        );
        Ok(())
    }

    /// One idle worker with `extra` on a fresh prefix: its CPU and the
    /// broker's over `window`, after the warm-up.
    async fn idle(&self, extra: &[&str], window: Duration) -> anyhow::Result<Share> {
        let prefix = self.prefix("probe");
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let broker_cpu = || self.opts.broker_pid.and_then(super::procs::cpu_seconds);
        let worker = self.spawner.spawn(&prefix, &args, false)?;
        tokio::time::sleep(WARM_UP).await;
        let (w0, b0, t0) = (worker.usage(), broker_cpu(), Instant::now());
        tokio::time::sleep(window).await;
        let (w1, b1) = (worker.usage(), broker_cpu());
        let secs = t0.elapsed().as_secs_f64();
        worker.stop().await?;
        load::remove(&self.conn, &prefix).await;
        let (w0, w1) = (w0.map_or(0.0, |u| u.cpu_s), w1.map_or(0.0, |u| u.cpu_s));
        Ok(Share {
            worker: (w1 - w0) / secs,
            broker: b0.zip(b1).map(|(a, b)| (b - a) / secs),
        })
    }
}

fn mean(runs: &[Share]) -> Share {
    let n = runs.len().max(1) as f64;
    let broker: Option<Vec<f64>> = runs.iter().map(|r| r.broker).collect();
    Share {
        worker: runs.iter().map(|r| r.worker).sum::<f64>() / n,
        broker: broker.map(|b| b.iter().sum::<f64>() / n),
    }
}
