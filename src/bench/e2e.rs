//! Phases 3 and 4: end to end and the retry path, each against the
//! ceiling that bounds it (the ideal worker, the ideal retry loop) and
//! against itself with one default turned off, all in alternating pairs
//! (`pairs.rs`): every ratio is the median of the pairs'.

use super::options::Phase;
use super::pairs::{median, Spread};
use super::phases::Bench;
use super::sink::Mode;

/// One drain by the real worker: its rate at the sink, and the worker's
/// and the broker's CPU seconds per 10,000 notifications.
#[derive(Clone, Copy)]
pub(super) struct Drain {
    pub(super) rate: f64,
    pub(super) worker_cpu: Option<f64>,
    pub(super) broker_cpu: Option<f64>,
    rss: Option<f64>,
}

/// Medians of some runs' field.
pub(super) fn med(runs: &[Drain], f: fn(&Drain) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(f).collect();
    median(&v)
}

impl Bench {
    /// On the default flags, per-endpoint isolation included, then the
    /// ideal worker, then `--isolation off`, in turn, for each pair: what
    /// the worker costs against the ideal one, and what isolation costs
    /// the one-receiver deployment (target: nothing).
    pub(super) async fn end_to_end(&mut self) -> anyhow::Result<()> {
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let args = Self::concurrency_args(c);
        let mut off_args = args.clone();
        off_args.extend(["--isolation".into(), "off".into()]);
        let (mut on, mut ideal, mut off) = (vec![], vec![], vec![]);
        let (mut traced, mut base, mut quiet) = (vec![], vec![], vec![]);
        let collector = super::traced::Collector::start().await?;
        let quiet_args = [args.clone(), vec!["--history".into(), "off".into()]].concat();
        for _ in 0..self.pairs() {
            on.push(self.drain_once("e2e", n, &args).await?);
            ideal.push(self.ideal_worker_rate().await?);
            off.push(self.drain_once("e2e-off", n, &off_args).await?.rate);
            quiet.push(self.drain_once("e2e-no-history", n, &quiet_args).await?);
            let t = self.traced_spawner(&collector);
            traced.push(self.drain_as(t, "e2e-traced", n, &args).await?);
            if let Some(b) = self.baseline_spawner() {
                base.push(self.drain_as(b, "e2e-base", n, &args).await?);
            }
        }
        let rate = self.push_rates(c, &on, &ideal, &off);
        let cpu_of = |d: &[Drain]| med(d, |d| d.worker_cpu);
        let rates = |d: &[Drain]| d.iter().map(|d| d.rate).collect::<Vec<f64>>();
        let runs = super::traced::Runs {
            on: rates(&on),
            traced: rates(&traced),
            base: rates(&base),
            cpu: [cpu_of(&on), cpu_of(&traced), cpu_of(&base)],
        };
        self.push_traced(&runs, &collector);
        self.push_history(&on, &quiet);
        self.ceiling_ratio(rate);
        let p = Phase::E2e;
        let cpu = med(&on, |d| d.worker_cpu);
        let name = "worker CPU per 10,000 deliveries (median)";
        self.push_target(p, name, cpu, "s", "≤ 0.40", |s| s <= 0.40);
        let name = "broker CPU per 10,000 deliveries (local node, median)";
        self.push(p, name, med(&on, |d| d.broker_cpu), "s");
        self.e2e_per_s = Some(rate);
        self.e2e_cpu_per_10k = cpu;
        Ok(())
    }

    /// The default's rate (returned), `--isolation off`'s and the ideal
    /// worker's, and the default's ratio to each, as medians of pairs.
    fn push_rates(&mut self, c: usize, on: &[Drain], ideal: &[f64], off: &[f64]) -> f64 {
        let p = Phase::E2e;
        let rate = med(on, |d| Some(d.rate)).unwrap_or(0.0);
        let name = format!("deliveries, 1 worker, concurrency {c} (median)");
        self.push(p, name, Some(rate), "msg/s");
        self.push(
            p,
            "deliveries, --isolation off (median)",
            median(off),
            "msg/s",
        );
        let name = "ideal worker (bare lapin + hyper + ack) (median)";
        self.push(p, name, median(ideal), "msg/s");
        let pairs = |b: &[f64]| -> Vec<(f64, f64)> {
            on.iter().map(|d| d.rate).zip(b.iter().copied()).collect()
        };
        let spread = Spread::of_pairs(&pairs(ideal));
        self.push_pairs(p, "ratio to ideal worker", spread, Some("≥ 0.90"), |r| {
            r >= 0.90
        });
        let spread = Spread::of_pairs(&pairs(off));
        self.push_pairs(p, "isolation on ÷ off", spread, Some("≥ 0.97"), |r| {
            r >= 0.97
        });
        rate
    }

    /// End to end against the ceilings of phases 1 and 2 (run once each,
    /// before: a bare broker and a bare HTTP client are not what varies).
    fn ceiling_ratio(&mut self, rate: f64) {
        let ceiling = match (&self.ceiling, self.sink_per_s) {
            (Some(b), Some(s)) => Some(b.drain_per_s.min(s)),
            _ => None,
        };
        let name = "ratio to min(broker drain, sink)";
        let ratio = ceiling.map(|m| rate / m);
        self.push_target(Phase::E2e, name, ratio, "x", "≥ 0.70", |r| r >= 0.70);
    }

    /// [`Self::drain_once`] with `spawner` as the worker.
    async fn drain_as(
        &mut self,
        spawner: super::procs::Spawner,
        phase: &str,
        n: usize,
        args: &[String],
    ) -> anyhow::Result<Drain> {
        let saved = self.swap_spawner(spawner);
        let drained = self.drain_once(phase, n, args).await;
        self.swap_spawner(saved);
        drained
    }

    /// One drain of `n` by one worker with `args`, the sink cleared first.
    async fn drain_once(&self, phase: &str, n: usize, args: &[String]) -> anyhow::Result<Drain> {
        let (usage, seen) = self.fresh_drain(phase, n, args).await?;
        let per_10k = |s: f64| s / n as f64 * 10_000.0;
        let u = usage.first();
        Ok(Drain {
            rate: seen.rate(),
            worker_cpu: u.map(|u| per_10k(u.cpu_s)),
            broker_cpu: self.last_broker_cpu().map(per_10k),
            rss: u.map(|u| u.peak_rss_mib).filter(|r| r.is_finite()),
        })
    }

    /// For each pair: the ideal retry loop, then the real worker on the
    /// default flags with `--retry-settle 3s` (the safe path for the
    /// upstream plugin, and its default), with `0s` (the cascade's
    /// default), and with `--breaker-failures 0` at the backend's default
    /// settle. The targets apply to the backend's default. The broker's
    /// CPU per 10,000 retries shows what the worker adds to the inherent
    /// path (the ideal loop's).
    pub(super) async fn retry_path(&mut self) -> anyhow::Result<()> {
        let n = self.sizes.retry_n;
        let plugin = self.opts.broker.delay == crate::config::DelayBackend::Plugin;
        let s = super::options::plugin_settle();
        let (mut ideal, mut ideal_cpu, mut settled, mut zero, mut nob) =
            (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..self.pairs() {
            let (rate, cpu) = self.ideal_retry_run(n).await?;
            ideal.push(rate);
            ideal_cpu.extend(cpu.map(|c| c / n as f64 * 10_000.0));
            settled.push(self.retry_run(n, &["--retry-settle", &s]).await?);
            zero.push(self.retry_run(n, &["--retry-settle", "0s"]).await?);
            nob.push(self.retry_run(n, &["--breaker-failures", "0"]).await?);
        }
        let default = if plugin { &settled } else { &zero };
        let p = Phase::Retry;
        let name = self.ideal_retry_name() + " (median)";
        self.push(p, name, median(&ideal), "msg/s");
        let name = format!("successes, --retry-settle {s} (the plugin's default; median)");
        self.push(p, name, med(&settled, |d| Some(d.rate)), "msg/s");
        let name = format!("worker peak RSS, settle {s}");
        self.push(p, name, med(&settled, |d| d.rss), "MiB");
        let name = "successes, --retry-settle 0s (median)";
        self.push(p, name, med(&zero, |d| Some(d.rate)), "msg/s");
        let name = "successes, --breaker-failures 0 (median)";
        self.push(p, name, med(&nob, |d| Some(d.rate)), "msg/s");
        let vs = |a: &[Drain], b: &[f64]| -> Vec<(f64, f64)> {
            a.iter().map(|d| d.rate).zip(b.iter().copied()).collect()
        };
        let rates = |a: &[Drain]| -> Vec<f64> { a.iter().map(|d| d.rate).collect() };
        let name = format!("ratio to ideal retry loop (settle {s})");
        let target = plugin.then_some("≥ 0.85");
        let spread = Spread::of_pairs(&vs(&settled, &ideal));
        self.push_pairs(p, name, spread, target, |r| r >= 0.85);
        let target = (!plugin).then_some("≥ 0.85");
        let spread = Spread::of_pairs(&vs(&zero, &ideal));
        self.push_pairs(
            p,
            "ratio to ideal retry loop (settle 0s)",
            spread,
            target,
            |r| r >= 0.85,
        );
        let spread = Spread::of_pairs(&vs(&settled, &rates(&zero)));
        let name = format!("settle {s} ÷ settle 0s");
        self.push_pairs(p, name, spread, Some("≥ 0.80"), |r| r >= 0.80);
        let spread = Spread::of_pairs(&vs(default, &rates(&nob)));
        let name = "default breaker ÷ --breaker-failures 0";
        self.push_pairs(p, name, spread, Some("≥ 0.95"), |r| r >= 0.95);
        let e2e = self.e2e_per_s;
        let to_e2e = med(default, |d| Some(d.rate)).zip(e2e).map(|(r, e)| r / e);
        self.push(p, "default's ratio to end to end (reported)", to_e2e, "x");
        self.retry_cpu(default, &ideal_cpu);
        Ok(())
    }

    /// Broker and worker CPU per 10,000 retries: the worker on its
    /// backend's defaults beside the ideal retry loop.
    fn retry_cpu(&mut self, default: &[Drain], ideal_cpu: &[f64]) {
        let p = Phase::Retry;
        let worker_broker = med(default, |d| d.broker_cpu);
        let name = "broker CPU per 10,000 retries, worker (median)";
        self.push(p, name, worker_broker, "s");
        let name = "broker CPU per 10,000 retries, ideal retry loop (median)";
        self.push(p, name, median(ideal_cpu), "s");
        let name = "worker CPU per 10,000 retries (median)";
        self.push(p, name, med(default, |d| d.worker_cpu), "s");
    }

    /// `n` notifications that each fail once (a quick 500, then a 1 ms
    /// schedule), then succeed, on the default flags plus `extra`.
    async fn retry_run(&mut self, n: usize, extra: &[&str]) -> anyhow::Result<Drain> {
        let c = self.sizes.concurrency;
        self.sink.reset(Mode {
            fail_first: true,
            ..Mode::default()
        });
        let mut args = Self::concurrency_args(c);
        args.extend(["--schedule".to_string(), "1ms".to_string()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        let (usage, seen) = self.preload_and_drain("retry", n, 1, &args).await?;
        anyhow::ensure!(
            seen.failed == n as u64,
            "the sink failed {} first attempts, not {n}",
            seen.failed
        );
        let per_10k = |s: f64| s / n as f64 * 10_000.0;
        let u = usage.first();
        Ok(Drain {
            rate: seen.rate(),
            worker_cpu: u.map(|u| per_10k(u.cpu_s)),
            broker_cpu: self.last_broker_cpu().map(per_10k),
            rss: u.map(|u| u.peak_rss_mib).filter(|r| r.is_finite()),
        })
    }
}
