//! The phases of `redeliver bench`. Phases 1–4 here; 5–8 in `timed.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lapin::Connection;

use super::load::{self, Ceiling, Item};
use super::options::{BenchOptions, Phase, Sizes};
use super::pairs::Spread;
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
                env: vec![],
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
            Phase::HistoryIndex => self.history_index().await,
            Phase::ConsolePages => self.console_pages().await,
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
            spread: None,
        });
    }

    /// A ratio of alternating pairs: its median read against the target,
    /// its spread beside it (`pairs.rs`).
    pub(super) fn push_pairs(
        &mut self,
        phase: Phase,
        name: impl Into<String>,
        spread: Option<Spread>,
        target: Option<&'static str>,
        met: impl Fn(f64) -> bool,
    ) {
        let value = spread.map(|s| s.median);
        self.push(phase, name, value, "x");
        if let Some(f) = self.figures.last_mut() {
            f.spread = spread;
            f.target = target;
            f.met = target.and(value.map(met));
        }
    }

    /// The broker's CPU seconds over the last drain ([`Self::drain_on`]);
    /// `None` when unknown.
    pub(super) fn last_broker_cpu(&self) -> Option<f64> {
        let bits = self.last_broker_cpu.load(Ordering::Relaxed);
        Some(f64::from_bits(bits)).filter(|s| !s.is_nan())
    }

    /// Alternating pairs per ratio (`pairs.rs`).
    pub(super) fn pairs(&self) -> usize {
        super::pairs::pairs(self.opts.quick)
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
    pub(super) async fn fresh_drain(
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
}
