//! Phases 5–8 of `redeliver bench`: latency, delay accuracy, memory and
//! CPU, horizontal scaling.

use std::time::Duration;

use rand::seq::SliceRandom;

use super::load;
use super::options::Phase;
use super::pairs::{median, Spread};
use super::phases::Bench;
use super::procs::WorkerProc;
use super::report::percentiles;
use super::sink::{now_us, Mode};

/// A target's text and its test.
type Target = (&'static str, fn(f64) -> bool);

/// Delayed publishes awaiting confirms at once in phase 6 (see
/// [`load::preload_windowed`]).
const DELAY_WINDOW: usize = 16;
/// The paced short-delay run's publish rate: well within what either
/// backend confirms on the 2-core development machine.
const SHORT_DELAY_RATE: f64 = 1_000.0;

/// Phase 5's light load, and its rate when phase 3 did not run to halve.
const LIGHT_RATE: f64 = 500.0;

fn ms(samples_us: &[i64]) -> Vec<f64> {
    samples_us.iter().map(|&us| us as f64 / 1000.0).collect()
}

impl Bench {
    /// p50, p99 and max of `v` as three figures (none when `v` is empty).
    fn push_spread(&mut self, p: Phase, what: &str, v: &mut [f64], unit: &'static str) {
        self.push_spread_target(p, what, v, unit, None);
    }

    /// The same, with a target on the p99.
    fn push_spread_target(
        &mut self,
        p: Phase,
        what: &str,
        v: &mut [f64],
        unit: &'static str,
        target: Option<Target>,
    ) {
        let some = !v.is_empty();
        let (p50, p99, max) = percentiles(v);
        self.push(p, format!("{what} p50"), some.then_some(p50), unit);
        match target {
            Some((t, met)) => {
                self.push_target(p, format!("{what} p99"), some.then_some(p99), unit, t, met)
            }
            None => self.push(p, format!("{what} p99"), some.then_some(p99), unit),
        }
        self.push(p, format!("{what} max"), some.then_some(max), unit);
    }

    /// At a light 500/s (the target applies there: what the worker adds
    /// when the machine's cores are not all busy), and at half the
    /// end-to-end rate, reported only: on a small machine the worker, the
    /// broker and the sink then share busy cores, and the figure measures
    /// the cores more than the worker.
    pub(super) async fn latency(&mut self) -> anyhow::Result<()> {
        self.latency_at(LIGHT_RATE, "light load: ", true).await?;
        let rate = self.e2e_per_s.map_or(LIGHT_RATE, |r| r / 2.0);
        if rate > LIGHT_RATE * 1.5 {
            self.latency_at(rate, "half load: ", false).await?;
        }
        Ok(())
    }

    async fn latency_at(&mut self, rate: f64, label: &str, target: bool) -> anyhow::Result<()> {
        let prefix = self.prefix("latency");
        let (worker, warmed) = self.warm_worker(&prefix).await?;
        self.sink.reset(Mode {
            measure: true,
            ..Mode::default()
        });
        let url = self.sink.url("/ok");
        let json = |i: usize| {
            format!(
                r#"{{"url":"{url}","id":"l-{i}","body":{{"t":{}}}}}"#,
                now_us()
            )
        };
        let run = self.sizes.latency_run;
        let published = if warmed {
            load::paced(&self.conn, &self.opts.broker, &prefix, rate, run, json).await
        } else {
            Err(anyhow::anyhow!(
                "the worker did not start delivering within 30 s"
            ))
        };
        let arrived = match &published {
            Ok(n) => self.sink.wait_for(*n as u64, Duration::from_secs(60)).await,
            Err(_) => false,
        };
        let timings = worker.stop().await;
        load::remove(&self.conn, &prefix).await;
        let published = published?;
        anyhow::ensure!(arrived, "only {} of {published} arrived", self.sink.ok());
        let offered = published as f64 / run.as_secs_f64();
        let timings = timings?;
        self.push_latency(label, target, offered, &timings);
        Ok(())
    }

    /// A worker on `prefix` that has delivered one warm-up notification, so
    /// its start-up is not measured; and whether it did within 30 s.
    async fn warm_worker(&mut self, prefix: &str) -> anyhow::Result<(WorkerProc, bool)> {
        self.sink.reset(Mode::default());
        let warm = self.items(1, "/ok", |_| None, |_, _| "{}".into());
        let args = Self::concurrency_args(self.sizes.concurrency);
        let started = load::preload(&self.conn, &self.opts.broker, prefix, warm)
            .await
            .and_then(|_| self.spawner.spawn(prefix, &args, true));
        let worker = match started {
            Ok(w) => w,
            Err(e) => {
                load::remove(&self.conn, prefix).await;
                return Err(e);
            }
        };
        let warmed = self.sink.wait_for(1, Duration::from_secs(30)).await;
        Ok((worker, warmed))
    }

    /// The latency figures: publish → delivery, and the worker's own time
    /// before and after the HTTP attempt (from its timing trace).
    fn push_latency(&mut self, label: &str, target: bool, offered: f64, timings: &[(u64, u64)]) {
        let p = Phase::Latency;
        self.push(p, format!("{label}offered rate"), Some(offered), "msg/s");
        let mut e2e = ms(&self.sink.seen().samples_us);
        self.push_spread(p, &format!("{label}publish → delivery"), &mut e2e, "ms");
        let us = |f: fn(&(u64, u64)) -> u64| {
            timings
                .iter()
                .map(|t| f(t) as f64 / 1000.0)
                .collect::<Vec<_>>()
        };
        let pre = format!("{label}worker: receipt → HTTP start");
        self.push_spread(p, &pre, &mut us(|t| t.0), "ms");
        let post = format!("{label}worker: response → ack queued");
        self.push_spread(p, &post, &mut us(|t| t.1), "ms");
        let both = format!("{label}worker added (both)");
        let target: Option<Target> = target.then_some(("≤ 1", |v| v <= 1.0));
        self.push_spread_target(p, &both, &mut us(|t| t.0 + t.1), "ms", target);
    }

    /// Long delays (the issue's 5–30 s), then short ones (1 ms – 1 s), each
    /// on its own prefix: a backend's accuracy for short delays is a
    /// figure of its own. The short ones run twice: as fast as the backend
    /// confirms them (a burst, whose rate differs by backend), and at
    /// [`SHORT_DELAY_RATE`], the same load for both backends.
    pub(super) async fn delay_accuracy(&mut self) -> anyhow::Result<()> {
        let s = &self.sizes;
        let (ms, sec) = (Duration::from_millis(1), Duration::from_secs(1));
        let runs = [
            (s.delay_n, s.delay_min, s.delay_max, None),
            (s.short_delay_n, ms, sec, None),
            (s.short_delay_n, ms, sec, Some(SHORT_DELAY_RATE)),
        ];
        for (n, lo, hi, rate) in runs {
            self.delay_run(n, (lo, hi), rate).await?;
        }
        Ok(())
    }

    async fn delay_run(
        &mut self,
        n: usize,
        (lo, hi): (Duration, Duration),
        rate: Option<f64>,
    ) -> anyhow::Result<()> {
        let prefix = self.prefix("delay");
        self.sink.reset(Mode {
            measure: true,
            ..Mode::default()
        });
        let args = Self::concurrency_args(self.sizes.concurrency);
        let worker = self.spawner.spawn(&prefix, &args, false)?;
        let published = self.publish_delays(&prefix, n, (lo, hi), rate).await;
        let arrived = match &published {
            Ok(_) => {
                self.sink
                    .wait_for(n as u64, hi + Duration::from_secs(90))
                    .await
            }
            Err(_) => false,
        };
        let stopped = worker.stop().await;
        load::remove(&self.conn, &prefix).await;
        let published = published?;
        anyhow::ensure!(
            arrived,
            "only {} of {n} delayed notifications arrived",
            self.sink.ok()
        );
        stopped?;
        let range = match rate {
            Some(r) => format!("{lo:?}–{hi:?} at {r}/s"),
            None => format!("{lo:?}–{hi:?}"),
        };
        self.push_delay_figures(n, &range, &published);
        Ok(())
    }

    /// Publishes `n` delays spread evenly over `lo..=hi`, in random order,
    /// once the worker consumes, each carrying its due time.
    async fn publish_delays(
        &mut self,
        prefix: &str,
        n: usize,
        (lo, hi): (Duration, Duration),
        rate: Option<f64>,
    ) -> anyhow::Result<load::Published> {
        let mut delays: Vec<Duration> = (0..n)
            .map(|i| lo + (hi - lo).mul_f64(i as f64 / n.max(2).saturating_sub(1) as f64))
            // Whole milliseconds: `x-delay` is in ms, so a fractional delay
            // would be truncated on the wire and its due time would seem to
            // be up to 1 ms "early".
            .map(|d| Duration::from_millis(d.as_millis() as u64))
            .collect();
        delays.shuffle(&mut rand::rng());
        let items = self.items(
            n,
            "/ok",
            move |i| Some(delays[i]),
            |_, d| {
                format!(
                    r#"{{"due":{}}}"#,
                    now_us() + d.unwrap_or_default().as_micros() as u64
                )
            },
        );
        let broker = &self.opts.broker;
        // The last queue a worker starts consuming: the hold queue with
        // the cascade, the last lane with the plugin.
        let t = crate::topology::Topology::new(prefix);
        let last = match broker.delay {
            crate::delay::DelayBackend::Cascade => crate::delay::cascade::hold(&t),
            crate::delay::DelayBackend::Plugin => t.lane(t.lanes - 1),
        };
        load::wait_for_consumer(&self.conn, &last).await?;
        load::preload_windowed(&self.conn, broker, prefix, items, (DELAY_WINDOW, rate)).await
    }

    /// Lateness, early count and publish figures of one delay run.
    fn push_delay_figures(&mut self, n: usize, range: &str, published: &load::Published) {
        let seen = self.sink.seen();
        // Lateness is measured from the publish instant; the broker starts
        // its clock at receipt, at most `max_confirm` later, so that span is
        // the measurement's uncertainty.
        // Early means by more than the broker's clock tick: `x-delay` is
        // whole milliseconds counted on a millisecond clock, so a message
        // published late in one millisecond is due up to 1 ms before the
        // publisher's microsecond due time (tests/cascade.rs allows the
        // same).
        let early = seen.samples_us.iter().filter(|&&l| l < -1000).count();
        let lag_ms = published.max_confirm.as_micros() as f64 / 1000.0;
        let p = Phase::Delay;
        let took = Some(published.took.as_secs_f64());
        self.push(p, format!("{n} delays of {range}, published in"), took, "s");
        let longest = format!("{range}: longest publish → confirm");
        self.push(p, longest, Some(lag_ms), "ms");
        let mut late = ms(&seen.samples_us);
        self.push_spread_target(
            p,
            &format!("{range}: lateness"),
            &mut late,
            "ms",
            Some(("≤ 100", |v| v <= 100.0)),
        );
        self.push_target(
            p,
            format!("{range}: delivered early (by > 1 ms)"),
            Some(early as f64),
            "count",
            "= 0",
            |v| v == 0.0,
        );
    }

    pub(super) async fn memory(&mut self) -> anyhow::Result<()> {
        let p = Phase::Memory;
        // (concurrency, backlog, peak RSS) of every run, pair after pair.
        let mut peaks = vec![];
        for _ in 0..self.pairs() {
            for backlog in self.sizes.backlogs {
                let prefix = self.prefix("memory");
                let measured = self.memory_runs(&prefix, backlog).await;
                load::remove(&self.conn, &prefix).await;
                peaks.extend(measured?.into_iter().map(|(c, rss)| (c, backlog, rss)));
            }
        }
        let runs = |c: usize, b: usize| -> Vec<f64> {
            let at = peaks.iter().filter(|x| x.0 == c && x.1 == b);
            at.filter_map(|x| x.2).collect()
        };
        for backlog in self.sizes.backlogs {
            for c in self.sizes.memory_concurrency {
                let name = format!("peak RSS, concurrency {c}, backlog {backlog} (median)");
                self.push(p, name, median(&runs(c, backlog)), "MiB");
            }
        }
        let [small, large] = self.sizes.backlogs;
        for c in self.sizes.memory_concurrency {
            let pairs: Vec<(f64, f64)> = runs(c, large).into_iter().zip(runs(c, small)).collect();
            let name = format!("RSS growth with backlog, concurrency {c}");
            let spread = Spread::of_pairs(&pairs);
            self.push_pairs(p, name, spread, Some("≤ 1.25"), |g| g <= 1.25);
        }
        let worst = peaks
            .iter()
            .filter(|x| x.0 == 256)
            .filter_map(|x| x.2)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let name = "peak RSS at concurrency 256 (highest run)";
        self.push_target(p, name, worst, "MiB", "≤ 64", |v| v <= 64.0);
        self.push(
            p,
            "worker CPU per 10,000 deliveries (phase 3)",
            self.e2e_cpu_per_10k,
            "s",
        );
        Ok(())
    }

    /// For each concurrency: fills the queue to `backlog`, runs one worker
    /// for the memory window (or until it drained everything), reads its peak RSS.
    async fn memory_runs(
        &mut self,
        prefix: &str,
        backlog: usize,
    ) -> anyhow::Result<Vec<(usize, Option<f64>)>> {
        let mut out = vec![];
        let t = crate::topology::Topology::new(prefix);
        for c in self.sizes.memory_concurrency {
            // Missing lanes (the first run) hold nothing.
            let lanes = crate::ops::status::read_lanes(&self.conn, &t).await;
            let have = lanes.map_or(0, |l| crate::ops::status::sum(prefix, &l).ready as usize);
            let top_up = backlog.saturating_sub(have);
            let items = self.items(top_up, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
            load::preload(&self.conn, &self.opts.broker, prefix, items).await?;
            self.sink.reset(Mode::default());
            let args = Self::concurrency_args(c);
            let worker = self.spawner.spawn(prefix, &args, false)?;
            // Its start first (a busy machine once took longer than the
            // quick window to connect): the window is for delivering.
            let started = backlog.min(c) as u64;
            let _ = self.sink.wait_for(started, WORKER_START).await;
            let _ = self
                .sink
                .wait_for(backlog as u64, self.sizes.memory_window)
                .await;
            let usage = worker.usage();
            worker.stop().await?;
            // A worker that delivered next to nothing (still connecting, say)
            // would show only its start-up memory.
            let delivered = self.sink.ok() as usize;
            anyhow::ensure!(
                delivered >= backlog.min(c),
                "the concurrency-{c} worker delivered only {delivered} of a {backlog} backlog"
            );
            out.push((c, usage.map(|u| u.peak_rss_mib)));
        }
        Ok(out)
    }
}

/// How long a memory run's worker may take to deliver its first
/// notifications before its window starts.
const WORKER_START: std::time::Duration = std::time::Duration::from_secs(60);
