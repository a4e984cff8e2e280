//! The phases of `redeliver bench`. Phases 1–4 here; 5–8 in `timed.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lapin::Connection;

use super::load::{self, Ceiling, Item};
use super::options::{BenchOptions, Phase, Sizes};
use super::procs::{Spawner, Usage, WorkerProc};
use super::report::{Figure, Machine, Report};
use super::sink::{Mode, Seen, Sink};
use crate::deliver::{DeliveryHandler, HttpDeliverer};

/// Everything the phases share, and what earlier phases measured.
pub struct Bench {
    pub(super) opts: BenchOptions,
    pub(super) sizes: Sizes,
    pub(super) conn: Connection,
    pub(super) sink: Sink,
    pub(super) spawner: Spawner,
    figures: Vec<Figure>,
    started: Instant,
    pub(super) ceiling: Option<Ceiling>,
    pub(super) sink_per_s: Option<f64>,
    pub(super) e2e_per_s: Option<f64>,
    pub(super) e2e_cpu_per_10k: Option<f64>,
    /// The broker's CPU seconds over the last drain (`f64` bits; NaN:
    /// unknown), set by [`Bench::drain_on`], which takes `&self`.
    last_broker_cpu: AtomicU64,
}

impl Bench {
    pub async fn new(opts: &BenchOptions) -> anyhow::Result<Bench> {
        let url = &opts.broker.url;
        let conn = url
            .connect("redeliver bench")
            .await
            .with_context(|| format!("cannot connect to the broker at {url}"))?;
        Ok(Bench {
            opts: opts.clone(),
            sizes: Sizes::new(opts),
            conn,
            sink: Sink::start().await.context("starting the HTTP sink")?,
            spawner: Spawner {
                exe: opts.worker_exe.clone(),
                broker: opts.broker.clone(),
            },
            figures: vec![],
            started: Instant::now(),
            ceiling: None,
            sink_per_s: None,
            e2e_per_s: None,
            e2e_cpu_per_10k: None,
            last_broker_cpu: AtomicU64::new(f64::NAN.to_bits()),
        })
    }

    pub async fn run_phase(&mut self, phase: Phase) -> anyhow::Result<()> {
        match phase {
            Phase::Broker => self.broker_ceiling().await,
            Phase::Sink => self.sink_ceiling().await,
            Phase::E2e => self.end_to_end().await,
            Phase::Retry => self.retry_path().await,
            Phase::Latency => self.latency().await,
            Phase::Delay => self.delay_accuracy().await,
            Phase::Memory => self.memory().await,
            Phase::Horizontal => self.horizontal().await,
            Phase::Noisy => self.noisy_neighbour().await,
            Phase::Cluster => self.cluster().await,
            Phase::Crash => self.crash().await,
            Phase::Flaky => self.flaky().await,
            Phase::ProbeCost => self.probe_cost().await,
            Phase::ConfirmWindow => self.confirm_window().await,
            Phase::EndpointState => self.endpoint_state().await,
            Phase::Events => self.events().await,
        }
    }

    pub async fn finish(self) -> Report {
        let _ = self.conn.close(200, "bench done".into()).await;
        Report {
            machine: Machine::here(),
            broker: self.opts.broker.url.redacted(),
            queue_type: self.opts.broker.queue_type.as_str(),
            sizes: self.sizes,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            figures: self.figures,
        }
    }

    /// A fresh prefix for one phase's queues and exchanges.
    pub(super) fn prefix(&self, phase: &str) -> String {
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
        format!("{}-bench-{phase}-{tag}", self.opts.broker.prefix)
    }

    pub(super) fn push(
        &mut self,
        phase: Phase,
        name: impl Into<String>,
        value: Option<f64>,
        unit: &'static str,
    ) {
        self.figures.push(Figure {
            phase: phase.name(),
            name: name.into(),
            value,
            unit,
            target: None,
            met: None,
        });
    }

    /// A figure read against a target; `met` says whether it was reached.
    pub(super) fn push_target(
        &mut self,
        phase: Phase,
        name: impl Into<String>,
        value: Option<f64>,
        unit: &'static str,
        target: &'static str,
        met: impl Fn(f64) -> bool,
    ) {
        self.push(phase, name, value, unit);
        if let Some(f) = self.figures.last_mut() {
            f.target = Some(target);
            f.met = value.map(met);
        }
    }

    /// `n` notifications to the sink's `path`; `body` makes each one's body
    /// when it is published (so timestamps are taken at publish time).
    pub(super) fn items<'a>(
        &self,
        n: usize,
        path: &str,
        delay: impl Fn(usize) -> Option<Duration> + 'a,
        body: impl Fn(usize, Option<Duration>) -> String + 'a,
    ) -> impl Iterator<Item = Item> + 'a {
        let url = self.sink.url(path);
        (0..n).map(move |i| {
            let d = delay(i);
            Item {
                json: format!(r#"{{"url":"{url}","id":"b-{i}","body":{}}}"#, body(i, d)),
                delay: d,
            }
        })
    }

    pub(super) fn concurrency_args(c: usize) -> Vec<String> {
        vec!["--concurrency".into(), c.to_string()]
    }

    /// Preloads `n` notifications under a fresh prefix, drains them with
    /// `workers` processes ([`Self::drain_with`]), and deletes the prefix,
    /// also when a step failed. Returns the workers' usage and what the sink saw.
    pub(super) async fn preload_and_drain(
        &self,
        phase: &str,
        n: usize,
        workers: usize,
        args: &[String],
    ) -> anyhow::Result<(Vec<Usage>, Seen)> {
        let prefix = self.prefix(phase);
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let drained = match load::preload(&self.conn, &self.opts.broker, &prefix, items).await {
            Ok(_) => self.drain_with(&prefix, workers, args, n).await,
            Err(e) => Err(e),
        };
        load::remove(&self.conn, &prefix).await;
        Ok((drained?, self.sink.seen()))
    }

    /// [`Self::preload_and_drain`] with one worker, the sink's counters
    /// cleared first.
    async fn fresh_drain(
        &self,
        phase: &str,
        n: usize,
        args: &[String],
    ) -> anyhow::Result<(Vec<Usage>, Seen)> {
        self.sink.reset(Mode::default());
        self.preload_and_drain(phase, n, 1, args).await
    }

    /// Runs `workers` processes on `prefix` until the sink saw `n`
    /// successes; returns their usage just before they were stopped.
    pub(super) async fn drain_with(
        &self,
        prefix: &str,
        workers: usize,
        args: &[String],
        n: usize,
    ) -> anyhow::Result<Vec<Usage>> {
        let spawners = vec![self.spawner.clone(); workers];
        self.drain_on(prefix, &spawners, args, n).await
    }

    /// [`Self::drain_with`], one worker started by each of `spawners`.
    pub(super) async fn drain_on(
        &self,
        prefix: &str,
        spawners: &[Spawner],
        args: &[String],
        n: usize,
    ) -> anyhow::Result<Vec<Usage>> {
        let broker_cpu = || self.opts.broker_pid.and_then(super::procs::cpu_seconds);
        let broker_before = broker_cpu();
        let procs: Vec<WorkerProc> = spawners
            .iter()
            .map(|s| s.spawn(prefix, args, false))
            .collect::<anyhow::Result<_>>()?;
        let within = Duration::from_secs(120) + Duration::from_millis(n as u64 * 5);
        let done = self.sink.wait_for(n as u64, within).await;
        let usage = procs.iter().filter_map(WorkerProc::usage).collect();
        let used = match (broker_before, broker_cpu()) {
            (Some(a), Some(b)) => b - a,
            _ => f64::NAN,
        };
        self.last_broker_cpu
            .store(used.to_bits(), Ordering::Relaxed);
        for p in procs {
            p.stop().await?;
        }
        anyhow::ensure!(
            done,
            "only {} of {n} notifications arrived within {within:?}",
            self.sink.ok()
        );
        Ok(usage)
    }

    async fn broker_ceiling(&mut self) -> anyhow::Result<()> {
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let queue = format!("{}.ceiling", self.prefix("broker"));
        let prefetch = u16::try_from(c).unwrap_or(u16::MAX);
        let sample = self.items(1, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let size = sample.map(|i| i.json.len()).sum::<usize>();
        let ceiling =
            load::broker_ceiling(&self.conn, &self.opts.broker, &queue, n, size, prefetch).await?;
        let p = Phase::Broker;
        self.push(
            p,
            format!("publish with confirms ({size} B)"),
            Some(ceiling.publish_per_s),
            "msg/s",
        );
        self.push(
            p,
            format!("consume + ack, prefetch {c}"),
            Some(ceiling.drain_per_s),
            "msg/s",
        );
        self.ceiling = Some(ceiling);
        Ok(())
    }

    async fn sink_ceiling(&mut self) -> anyhow::Result<()> {
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        self.sink.reset(Mode::default());
        let handler = std::sync::Arc::new(HttpDeliverer::new(Duration::from_secs(15), c)?);
        let json = format!(
            r#"{{"url":"{}","id":"b","body":{{"i":0}}}}"#,
            self.sink.url("/ok")
        );
        let notification =
            std::sync::Arc::new(crate::message::decode(json.as_bytes(), 1 << 20, None)?);
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = (0..c)
            .map(|_| {
                let (h, n0, next) = (handler.clone(), notification.clone(), next.clone());
                tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < n {
                        h.deliver(&n0, 1).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await?;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        anyhow::ensure!(
            self.sink.ok() == n as u64,
            "the sink answered {} of {n}",
            self.sink.ok()
        );
        self.push(
            Phase::Sink,
            format!("HTTP requests, concurrency {c}"),
            Some(rate),
            "req/s",
        );
        self.sink_per_s = Some(rate);
        Ok(())
    }

    /// On the default flags, per-endpoint isolation included, and once
    /// more with `--isolation off`, alternating, two runs each: what
    /// isolation costs the one-receiver deployment (target: nothing).
    async fn end_to_end(&mut self) -> anyhow::Result<()> {
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let args = Self::concurrency_args(c);
        let mut off_args = args.clone();
        off_args.extend(["--isolation".into(), "off".into()]);
        let (usage, seen) = self.fresh_drain("e2e", n, &args).await?;
        let (_, off1) = self.fresh_drain("e2e-off", n, &off_args).await?;
        let (_, on2) = self.fresh_drain("e2e", n, &args).await?;
        let (_, off2) = self.fresh_drain("e2e-off", n, &off_args).await?;
        let rate = seen.rate();
        let p = Phase::E2e;
        self.push(
            p,
            format!("deliveries, 1 worker, concurrency {c}"),
            Some(rate),
            "msg/s",
        );
        let on = (rate + on2.rate()) / 2.0;
        let off = (off1.rate() + off2.rate()) / 2.0;
        self.push(
            p,
            "deliveries, --isolation off (mean of 2)",
            Some(off),
            "msg/s",
        );
        let name = "isolation on ÷ off (means of 2 alternating runs)";
        self.push_target(p, name, Some(on / off), "x", "≥ 0.97", |r| r >= 0.97);
        let ceiling = match (&self.ceiling, self.sink_per_s) {
            (Some(b), Some(s)) => Some(b.drain_per_s.min(s)),
            _ => None,
        };
        let ratio = ceiling.map(|m| rate / m);
        self.push_target(
            p,
            "ratio to min(broker drain, sink)",
            ratio,
            "x",
            "≥ 0.70",
            |r| r >= 0.70,
        );
        let cpu = usage.first().map(|u| u.cpu_s / n as f64 * 10_000.0);
        let name = "worker CPU per 10,000 deliveries";
        self.push_target(p, name, cpu, "s", "≤ 0.40", |s| s <= 0.40);
        let bits = self.last_broker_cpu.load(Ordering::Relaxed);
        let broker = Some(f64::from_bits(bits)).filter(|s| !s.is_nan());
        let per_10k = broker.map(|s| s / n as f64 * 10_000.0);
        self.push(
            p,
            "broker CPU per 10,000 deliveries (local node)",
            per_10k,
            "s",
        );
        self.e2e_per_s = Some(rate);
        self.e2e_cpu_per_10k = cpu;
        self.ideal_worker(rate).await
    }

    /// The ideal retry loop first, then the real worker on the default
    /// flags: with `--retry-settle 3s` (the safe path for the upstream
    /// plugin, and its default) and with `0s` (the cascade's default), to
    /// show what the settle costs; then with `--breaker-failures 0` at the
    /// backend's default settle, to show the breaker costs a receiver that
    /// fails every first attempt nothing. The targets apply to the
    /// backend's default.
    async fn retry_path(&mut self) -> anyhow::Result<()> {
        let p = Phase::Retry;
        let n = self.sizes.retry_n;
        let ideal = self.ideal_retry(n).await?;
        let plugin = self.opts.broker.delay == crate::config::DelayBackend::Plugin;
        // Explicit: it is the plugin backend's default, not the cascade's.
        let s = super::options::plugin_settle();
        let (settled, rss) = self.retry_run(n, &["--retry-settle", &s]).await?;
        let name = format!("successes, --retry-settle {s} (the plugin's default)");
        self.push(p, name, Some(settled), "msg/s");
        // Held originals keep only their leases: memory stays flat.
        let rss = Some(rss).filter(|r| r.is_finite());
        self.push(p, format!("worker peak RSS, settle {s}"), rss, "MiB");
        self.retry_ratios(&format!("settle {s}"), settled, ideal, plugin);
        let (off, _) = self.retry_run(n, &["--retry-settle", "0s"]).await?;
        self.push(p, "successes, --retry-settle 0s", Some(off), "msg/s");
        self.retry_ratios("settle 0s", off, ideal, !plugin);
        // What the settle costs in rate: held originals must not take the
        // prefetch from deliveries waiting for an attempt.
        let name = format!("settle {s} ÷ settle 0s");
        self.push_target(p, name, Some(settled / off), "x", "≥ 0.80", |r| r >= 0.80);
        let (no_breaker, _) = self.retry_run(n, &["--breaker-failures", "0"]).await?;
        let default = if plugin { settled } else { off };
        self.push(
            p,
            "successes, --breaker-failures 0",
            Some(no_breaker),
            "msg/s",
        );
        let name = "default breaker ÷ --breaker-failures 0";
        let ratio = Some(default / no_breaker);
        self.push_target(p, name, ratio, "x", "≥ 0.95", |r| r >= 0.95);
        Ok(())
    }

    /// A retry run's ratios to end to end (reported only: a retry is two
    /// broker round trips and a timer, so the ideal retry loop itself is a
    /// fraction of end to end) and to the ideal retry loop, with its target
    /// when `targeted` (the backend's default settle).
    fn retry_ratios(&mut self, run: &str, rate: f64, ideal: f64, targeted: bool) {
        let p = Phase::Retry;
        let e2e = self.e2e_per_s.map(|e| rate / e);
        self.push(p, format!("ratio to end to end ({run})"), e2e, "x");
        let to_ideal = Some(rate / ideal);
        let ideal_name = format!("ratio to ideal retry loop ({run})");
        if targeted {
            self.push_target(p, ideal_name, to_ideal, "x", "≥ 0.85", |r| r >= 0.85);
        } else {
            self.push(p, ideal_name, to_ideal, "x");
        }
    }

    /// `n` notifications that each fail once (a quick 500, then a 1 ms
    /// schedule), then succeed, on the default flags plus `extra`; returns
    /// successes per second from the first attempt, and the worker's peak
    /// RSS.
    async fn retry_run(&mut self, n: usize, extra: &[&str]) -> anyhow::Result<(f64, f64)> {
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
        let rss = usage.first().map_or(f64::NAN, |u| u.peak_rss_mib);
        Ok((seen.rate(), rss))
    }
}
