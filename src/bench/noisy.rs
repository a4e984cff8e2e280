//! Phase 9, noisy neighbour: a backlog where one notification in ten goes
//! to a bad endpoint (hanging past the timeout, refusing connections,
//! answering 429 with `Retry-After: 1`, or answering in 500 ms) and the
//! rest to the healthy sink. A `redeliver run` worker on the default flags
//! drains it. The figure is the healthy endpoint's delivery rate as a
//! ratio to its rate alone, measured in the same phase; and how many HTTP
//! attempts per second the bad endpoint got (a breaker sends a dead one a
//! trickle of probes, not a stream), read from the worker's `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use tokio_util::sync::CancellationToken;

use super::load::{self, Item};
use super::options::Phase;
use super::pairs::{median, Spread};
use super::phases::Bench;
use super::sink::Mode;
use crate::topology::lanes;

/// How the bad endpoint misbehaves.
#[derive(Clone, Copy, Debug)]
enum Bad {
    Hang,
    Refuse,
    TooMany,
    Slow,
}

impl Bad {
    const ALL: [Bad; 4] = [Bad::Hang, Bad::Refuse, Bad::TooMany, Bad::Slow];

    fn name(self) -> &'static str {
        match self {
            Bad::Hang => "(a) hangs past the timeout",
            Bad::Refuse => "(b) refuses connections",
            Bad::TooMany => "(c) 429, Retry-After: 1",
            Bad::Slow => "(d) answers in 500 ms",
        }
    }
}

/// The bad endpoint, answering as its mode says. `Refuse` has no server:
/// its port was bound and released, so nothing listens.
pub(super) struct BadSink {
    url: String,
    /// Its `endpoint` metrics label (host:port).
    label: String,
    stop: CancellationToken,
}

/// The lane (of the default count) notifications to `url` travel in.
fn lane_of_url(url: &str) -> u16 {
    let key = url::Url::parse(url).map_or_else(|_| String::new(), |u| lanes::key_for_url(&u));
    lanes::lane_of_key(&key, lanes::DEFAULT_LANES)
}

impl BadSink {
    /// A bad endpoint on a port whose lane is not `healthy`'s: the phase
    /// measures a bad neighbour in another lane, which is what lanes
    /// isolate (one that hashes to the healthy one's lane, one time in
    /// eight with the default, costs what one queue did; `docs/lanes.md`).
    async fn start(bad: Bad, healthy: &str) -> std::io::Result<BadSink> {
        let mut listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        while lane_of_url(&format!("http://{}/", listener.local_addr()?)) == lane_of_url(healthy) {
            listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        }
        let label = listener.local_addr()?.to_string();
        let stop = CancellationToken::new();
        if matches!(bad, Bad::Refuse) {
            drop(listener);
        } else {
            let app = axum::Router::new().fallback(answer).with_state(bad);
            let signal = stop.clone().cancelled_owned();
            tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await;
            });
        }
        Ok(BadSink {
            url: format!("http://{label}/bad"),
            label,
            stop,
        })
    }
}

impl Drop for BadSink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(State(bad): State<Bad>) -> (StatusCode, HeaderMap) {
    let mut h = HeaderMap::new();
    match bad {
        // Far past any timeout; the worker gives up first.
        Bad::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
        Bad::Slow => tokio::time::sleep(Duration::from_millis(500)).await,
        Bad::TooMany => {
            h.insert("retry-after", HeaderValue::from_static("1"));
            return (StatusCode::TOO_MANY_REQUESTS, h);
        }
        Bad::Refuse => {}
    }
    (StatusCode::OK, h)
}

/// What one run measured.
#[derive(Clone, Copy)]
struct Run {
    healthy_per_s: f64,
    bad_attempts_per_s: f64,
    /// What the worker and the broker did for it: where the healthy
    /// endpoint's rate went.
    cost: Cost,
}

/// The worker's deferrals (all, those that waited in the worker, those
/// republished through the delay backend), and the CPU seconds the worker
/// and the broker used, over one drain.
#[derive(Default, Clone, Copy)]
pub(super) struct Cost {
    deferred: f64,
    waits: f64,
    republished: f64,
    pub(super) single_acks: f64,
    /// Those sent on the healthy endpoint's lane.
    own_lane_single_acks: f64,
    worker_cpu_s: f64,
    pub(super) broker_cpu_s: f64,
    /// In the parking queues when the last healthy one arrived.
    pub(super) parked: f64,
    /// The healthy endpoint's own deferrals: each holds a tag of its lane
    /// open, so its acks go alone.
    own_deferred: f64,
}

impl Cost {
    /// Each field's median over `runs`, but the healthy endpoint's own
    /// deferrals: their most in a run, since any at all is a fault (one
    /// run of 49 had 426, which a median read as 0).
    fn median(runs: &[Run]) -> Cost {
        let m = |f: fn(&Cost) -> f64| {
            let v: Vec<f64> = runs.iter().map(|r| f(&r.cost)).collect();
            median(&v).unwrap_or(0.0)
        };
        Cost {
            deferred: m(|c| c.deferred),
            waits: m(|c| c.waits),
            republished: m(|c| c.republished),
            single_acks: m(|c| c.single_acks),
            own_lane_single_acks: m(|c| c.own_lane_single_acks),
            worker_cpu_s: m(|c| c.worker_cpu_s),
            broker_cpu_s: m(|c| c.broker_cpu_s),
            parked: m(|c| c.parked),
            own_deferred: runs.iter().map(|r| r.cost.own_deferred).fold(0.0, f64::max),
        }
    }
}

/// The healthy-alone target, and the bar for each case.
const TARGET: &str = "≥ 0.90";

impl Bench {
    /// The four cases on the default flags; with the plugin backend also
    /// with `--retry-settle 0s`, since a deferral's original is held for
    /// the settle like a retry's, in the prefetch room (not under
    /// `--quick`: the same runs on other flags, twice the phase's time).
    pub(super) async fn noisy_neighbour(&mut self) -> anyhow::Result<()> {
        self.noisy_cases(&[]).await?;
        if self.opts.broker.delay == crate::config::DelayBackend::Plugin && !self.opts.quick {
            self.noisy_cases(&["--retry-settle", "0s"]).await?;
        }
        Ok(())
    }

    /// Each case in alternating pairs with the healthy endpoint alone
    /// (alone, beside, alone, beside, …), read as the median ratio. Under
    /// `--quick` one run alone serves every case: the phase only has to run.
    async fn noisy_cases(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        let p = Phase::Noisy;
        let how = match extra {
            [] => String::new(),
            _ => format!(" ({})", extra.join(" ")),
        };
        let once = match self.opts.quick {
            true => Some(self.noisy_run(None, extra).await?),
            false => None,
        };
        let mut alone_runs = vec![];
        for bad in Bad::ALL {
            let (mut pairs, mut runs) = (vec![], vec![]);
            for _ in 0..self.pairs() {
                let alone = match once {
                    Some(run) => run,
                    None => self.noisy_run(None, extra).await?,
                };
                let beside = self.noisy_run(Some(bad), extra).await?;
                pairs.push((beside.healthy_per_s, alone.healthy_per_s));
                alone_runs.push(alone);
                runs.push(beside);
            }
            let name = format!("healthy beside {}{how}: ratio to alone", bad.name());
            let spread = Spread::of_pairs(&pairs);
            self.push_pairs(p, name, spread, Some(TARGET), |r| r >= 0.9);
            let attempts: Vec<f64> = runs.iter().map(|r| r.bad_attempts_per_s).collect();
            let name = format!("{}{how}: its HTTP attempts", bad.name());
            self.push(p, name, median(&attempts), "req/s");
            self.push_cost(format!("{}{how}", bad.name()), &Cost::median(&runs));
        }
        let rates: Vec<f64> = alone_runs.iter().map(|r| r.healthy_per_s).collect();
        let name = format!("healthy endpoint alone{how} (median of {})", rates.len());
        self.push(p, name, median(&rates), "msg/s");
        self.push_cost(format!("alone{how}"), &Cost::median(&alone_runs));
        Ok(())
    }

    /// The runs' profile: deferrals, and worker and broker CPU per 10,000
    /// healthy deliveries (what a deferral costs shows against alone).
    fn push_cost(&mut self, what: String, c: &Cost) {
        let p = Phase::Noisy;
        let per_10k = 10_000.0 / self.sizes.noisy_n.max(1) as f64;
        let name = format!("{what}: deferrals per 10,000 healthy");
        self.push(p, name, Some(c.deferred * per_10k), "n");
        let name =
            format!("{what}: the healthy endpoint's own deferrals per 10,000 (most in a run)");
        self.push(p, name, Some(c.own_deferred * per_10k), "n");
        let name = format!("{what}: waits taken in the worker per 10,000 healthy");
        self.push(p, name, Some(c.waits * per_10k), "n");
        let name = format!("{what}: deferrals republished per 10,000 healthy");
        self.push(p, name, Some(c.republished * per_10k), "n");
        let name = format!("{what}: single ack frames per 10,000 healthy");
        self.push(p, name, Some(c.single_acks * per_10k), "n");
        let name = format!("{what}: of them on the healthy endpoint's lane");
        self.push(p, name, Some(c.own_lane_single_acks * per_10k), "n");
        let name = format!("{what}: worker CPU per 10,000 healthy");
        self.push(p, name, Some(c.worker_cpu_s * per_10k), "s");
        let name = format!("{what}: broker CPU per 10,000 healthy");
        let broker = Some(c.broker_cpu_s * per_10k).filter(|s| *s > 0.0);
        self.push(p, name, broker, "s");
        let name = format!("{what}: parked at the end (nothing is paused)");
        self.push(p, name, Some(c.parked), "n");
    }

    /// Drains a backlog of `noisy_n` healthy notifications (plus one in
    /// ten to `bad`) with one worker; measures until the last healthy one.
    async fn noisy_run(&self, bad: Option<Bad>, extra: &[&str]) -> anyhow::Result<Run> {
        let healthy = self.sizes.noisy_n;
        self.sink.reset(Mode::default());
        let bad_sink = match bad {
            Some(b) => Some(BadSink::start(b, &self.sink.url("/ok")).await?),
            None => None,
        };
        let ok_url = self.sink.url("/ok");
        let bad_url = bad_sink.as_ref().map(|b| b.url.clone());
        let total = healthy + bad_url.as_ref().map_or(0, |_| healthy / 9);
        let items = (0..total).map(|i| {
            let url = match &bad_url {
                Some(u) if i % 10 == 9 => u,
                _ => &ok_url,
            };
            Item {
                json: format!(r#"{{"url":"{url}","id":"n-{i}","body":{{"i":{i}}}}}"#),
                delay: None,
            }
        });
        let prefix = self.prefix("noisy");
        let drained = match load::preload(&self.conn, &self.opts.broker, &prefix, items).await {
            Ok(_) => {
                let bad = bad_sink.as_ref();
                self.drain_and_count(&prefix, healthy, bad, extra).await
            }
            Err(e) => Err(e),
        };
        load::remove(&self.conn, &prefix).await;
        let (bad_attempts, cost) = drained?;
        let seen = self.sink.seen();
        Ok(Run {
            healthy_per_s: seen.rate(),
            bad_attempts_per_s: bad_attempts as f64 / seen.span_s.max(1e-9),
            cost,
        })
    }

    /// One worker on the default flags (but a short shutdown grace, so that
    /// stopping does not wait for hanging attempts) until the sink saw
    /// `healthy`; returns the bad endpoint's HTTP attempts, read from the
    /// worker's own `/metrics` (a refused connection reaches no server),
    /// and what the drain cost.
    pub(super) async fn drain_and_count(
        &self,
        prefix: &str,
        healthy: usize,
        bad: Option<&BadSink>,
        extra: &[&str],
    ) -> anyhow::Result<(u64, Cost)> {
        let admin = free_port()?;
        let mut args = Self::concurrency_args(self.sizes.concurrency);
        args.extend(["--shutdown-grace", "1s", "--admin-addr"].map(String::from));
        args.push(format!("127.0.0.1:{admin}"));
        args.extend(extra.iter().map(|a| a.to_string()));
        let broker_cpu = || self.opts.broker_pid.and_then(super::procs::cpu_seconds);
        let worker = self.spawner.spawn(prefix, &args, false)?;
        let broker_before = broker_cpu();
        let within = Duration::from_secs(120) + Duration::from_millis(healthy as u64 * 5);
        let done = self.sink.wait_for(healthy as u64, within).await;
        let mut cost = Cost {
            worker_cpu_s: worker.usage().map_or(0.0, |u| u.cpu_s),
            broker_cpu_s: match (broker_before, broker_cpu()) {
                (Some(a), Some(b)) => b - a,
                _ => 0.0,
            },
            ..Cost::default()
        };
        cost.single_acks = metric(admin, ACK_FRAMES, "kind=\"single\"").await as f64;
        let t = crate::topology::Topology::new(prefix);
        let own = format!("queue=\"{}\"", t.lane(lane_of_url(&self.sink.url("/ok"))));
        let series = ["kind=\"single\"", own.as_str()];
        cost.own_lane_single_acks = metric_all(admin, ACK_FRAMES, &series).await as f64;
        cost.parked = crate::topology::ready_total(&self.conn, t.park_names()).await as f64;
        let own = format!("endpoint=\"{}\"", self.sink.addr);
        cost.own_deferred = metric(admin, DEFERRED, &own).await as f64;
        if let Ok(path) = std::env::var("REDELIVER_BENCH_METRICS") {
            let _ = std::fs::write(format!("{path}.{prefix}"), metrics_text(admin).await);
        }
        let attempts = match bad {
            Some(b) => {
                let series = format!("endpoint=\"{}\"", b.label);
                let m = metric(admin, ATTEMPTS, &series).await;
                cost.deferred = metric(admin, DEFERRED, &series).await as f64;
                cost.waits = metric(admin, WAITS, "").await as f64;
                cost.republished = metric(admin, REPUBLISHED, "").await as f64;
                m
            }
            None => 0,
        };
        worker.stop().await?;
        anyhow::ensure!(
            done,
            "only {} of {healthy} healthy notifications arrived within {within:?}",
            self.sink.ok()
        );
        Ok((attempts, cost))
    }
}

/// A port nothing listens on (bound, then released).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The counters read off the worker's `/metrics` per endpoint.
const ATTEMPTS: &str = crate::telemetry::ENDPOINT_ATTEMPTS;
const DEFERRED: &str = crate::telemetry::ENDPOINT_DEFERRED;
const WAITS: &str = crate::telemetry::WAITS;
const ACK_FRAMES: &str = crate::telemetry::ACK_FRAMES;
const REPUBLISHED: &str = crate::telemetry::REPUBLISHED_DEFERRALS;

/// The sum of counter `name` over its series that contain `series` (an
/// endpoint's label, say: every deferral reason; `""`: all), from the
/// worker's `/metrics`; 0 when unreadable.
async fn metric(admin: u16, name: &str, series: &str) -> u64 {
    metric_all(admin, name, &[series]).await
}

/// The worker's `/metrics` page; empty when unreadable.
async fn metrics_text(admin: u16) -> String {
    match reqwest::get(format!("http://127.0.0.1:{admin}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// [`metric`] over the series that have every one of `labels`.
async fn metric_all(admin: u16, name: &str, labels: &[&str]) -> u64 {
    let sum: f64 = metrics_text(admin)
        .await
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|s| l.contains(s)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    sum as u64
}
