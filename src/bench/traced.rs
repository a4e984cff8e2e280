//! Phase 3's extra runs: the worker exporting OTLP traces to a local
//! collector (what tracing costs), and, with `--baseline-exe`, another
//! build on the same flags (what this build costs against it). Both run
//! inside phase 3's pairs, so every ratio is a median of alternating pairs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::State;

use super::options::Phase;
use super::pairs::Spread;
use super::phases::Bench;
use super::procs::Spawner;

/// A bare OTLP/HTTP collector on 127.0.0.1:0: answers 200 to every
/// `POST /v1/traces` and counts them, so the exporter does its whole job
/// (encode, send, wait for the answer) and nothing is decoded here.
pub(super) struct Collector {
    pub endpoint: String,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    _server: tokio::task::JoinHandle<()>,
}

type Counts = (Arc<AtomicU64>, Arc<AtomicU64>);

/// Phase 3's rates (one per pair) of the default, traced and baseline
/// runs, and their median worker CPU per 10,000 deliveries.
pub(super) struct Runs {
    pub on: Vec<f64>,
    pub traced: Vec<f64>,
    pub base: Vec<f64>,
    pub cpu: [Option<f64>; 3],
}

impl Collector {
    pub async fn start() -> anyhow::Result<Collector> {
        let (requests, bytes): Counts = Default::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state((requests.clone(), bytes.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the bench's OTLP collector")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Collector {
            endpoint,
            requests,
            bytes,
            _server: server,
        })
    }

    /// Export requests and bytes received so far.
    pub fn received(&self) -> (u64, u64) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (load(&self.requests), load(&self.bytes))
    }
}

async fn receive(State((requests, bytes)): State<Counts>, body: Bytes) -> &'static str {
    requests.fetch_add(1, Ordering::Relaxed);
    bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    ""
}

impl Bench {
    /// The phase's worker, exporting traces to `collector`.
    pub(super) fn traced_spawner(&self, collector: &Collector) -> Spawner {
        let mut s = self.spawner.clone();
        s.env = vec![(
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            collector.endpoint.clone(),
        )];
        s
    }

    /// The phase's worker from `--baseline-exe`, if given.
    pub(super) fn baseline_spawner(&self) -> Option<Spawner> {
        let exe = self.opts.baseline_exe.clone()?;
        Some(Spawner {
            exe,
            ..self.spawner.clone()
        })
    }

    /// Makes `spawner` the phase's worker; returns the one it replaces.
    pub(super) fn swap_spawner(&mut self, spawner: Spawner) -> Spawner {
        std::mem::replace(&mut self.spawner, spawner)
    }

    /// The figures of the traced and baseline runs against the default.
    pub(super) fn push_traced(&mut self, runs: &Runs, c: &Collector) {
        let (on, traced, base) = (&runs.on, &runs.traced, &runs.base);
        let p = Phase::E2e;
        let name = "deliveries, OTLP traces to a local collector (median)";
        self.push(p, name, super::pairs::median(traced), "msg/s");
        let name = "worker CPU per 10,000, traced (median)";
        self.push(p, name, runs.cpu[1], "s");
        if !base.is_empty() {
            let name = "deliveries, --baseline-exe (median)";
            self.push(p, name, super::pairs::median(base), "msg/s");
            let name = "worker CPU per 10,000, --baseline-exe (median)";
            self.push(p, name, runs.cpu[2], "s");
        }
        let (requests, bytes) = c.received();
        let name = "OTLP export requests received (all traced runs)";
        self.push(p, name, Some(requests as f64), "req");
        let name = "OTLP bytes received (all traced runs)";
        self.push(p, name, Some(bytes as f64), "B");
        let pairs =
            |b: &[f64]| -> Vec<(f64, f64)> { b.iter().copied().zip(on.iter().copied()).collect() };
        let spread = Spread::of_pairs(&pairs(traced));
        self.push_pairs(p, "traced ÷ untraced", spread, None, |_| true);
        if !base.is_empty() {
            let spread = Spread::of_pairs(
                &on.iter()
                    .copied()
                    .zip(base.iter().copied())
                    .collect::<Vec<_>>(),
            );
            self.push_pairs(
                p,
                "this build ÷ --baseline-exe",
                spread,
                Some("≥ 0.98"),
                |r| r >= 0.98,
            );
        }
    }
}
