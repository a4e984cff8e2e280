//! Phase 12, a flaky single receiver: it answers 500 to 30% of requests
//! and hangs past the worker's 1 s timeout on 5% (a receiver that is up,
//! with a bad dependency). Three `redeliver run` workers on the default
//! flags drain a backlog, and again with `--isolation off`, in the same
//! run; the figure is the settle time (first request to last success)
//! with isolation over without. Isolation must not treat a flaky
//! receiver as a dead one: its 500s are the notifications' outcomes, and
//! a 5% share of hangs neither opens the breaker nor shrinks its limit.
//! Both runs of a pair meet the same failures, notification by
//! notification and attempt by attempt (a seed per pair, see the sink's
//! `flaky_draw`), so the ratio compares the workers, not two draws.

use super::options::Phase;
use super::pairs::{median, Spread};
use super::phases::Bench;
use super::sink::Mode;

/// The arguments both runs share: a 1 s timeout, a short retry schedule
/// and attempts enough for every notification to succeed.
const ARGS: [&str; 6] = [
    "--timeout",
    "1s",
    "--schedule",
    "100ms",
    "--max-attempts",
    "100",
];

/// Workers draining the backlog.
const WORKERS: usize = 3;

impl Bench {
    pub(super) async fn flaky(&mut self) -> anyhow::Result<()> {
        let p = Phase::Flaky;
        let n = self.sizes.flaky_n;
        let (mut on, mut off) = (vec![], vec![]);
        // Each pair meets its own failures, the same in both runs.
        for seed in 0..self.pairs() as u64 {
            on.push(self.flaky_run(n, seed, &[]).await?);
            off.push(self.flaky_run(n, seed, &["--isolation", "off"]).await?);
        }
        let name =
            format!("{n} notifications, {WORKERS} workers: settle time, default flags (median)");
        self.push(p, name, median(&on), "s");
        let name = "settle time, --isolation off (median)";
        self.push(p, name, median(&off), "s");
        let pairs: Vec<(f64, f64)> = on.into_iter().zip(off).collect();
        // Each pair, not only the median: a stall shows in one pair.
        for (k, (a, b)) in pairs.iter().enumerate() {
            let name = format!("pair {}: on {a:.2} s ÷ off {b:.2} s", k + 1);
            self.push(p, name, Some(a / b), "x");
        }
        let name = "settle time, isolation on ÷ off";
        let spread = Spread::of_pairs(&pairs);
        self.push_pairs(p, name, spread, Some("≤ 1.10"), |r| r <= 1.10);
        Ok(())
    }

    /// Drains `n` notifications to the flaky sink, failing as `seed`
    /// draws, with [`WORKERS`] workers; returns the seconds from the first
    /// request to the last success.
    async fn flaky_run(&mut self, n: usize, seed: u64, extra: &[&str]) -> anyhow::Result<f64> {
        self.sink.reset(Mode {
            flaky: Some(seed),
            ..Mode::default()
        });
        let mut args = Self::concurrency_args(self.sizes.concurrency);
        args.extend(ARGS.iter().chain(extra).map(|a| a.to_string()));
        let (_, seen) = self.preload_and_drain("flaky", n, WORKERS, &args).await?;
        Ok(seen.span_s)
    }
}
