//! The admin endpoint (`--admin-addr`): `/metrics` for Prometheus,
//! `/healthz` for liveness and `/readyz` for readiness. It is off by
//! default: it tells anyone who can reach it how the worker is doing.

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::telemetry::{self, Health};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot listen on the admin address {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot set up the metrics recorder: {0}")]
    Recorder(String),
}

/// The process's Prometheus recorder. The `metrics` facade has one global
/// recorder per process, so it is installed once and shared by every
/// worker the process runs.
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

fn recorder() -> Result<PrometheusHandle, AdminError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    // Attempts take milliseconds to the 15 s default timeout and beyond;
    // attempt numbers run from 1 to the max attempts (1000 at most).
    let seconds = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0,
    ];
    let attempts = [
        1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0, 50.0, 100.0, 1000.0,
    ];
    // A probe waits about 1 s; how late it comes back is what matters.
    let probe_seconds = [
        1.0, 1.01, 1.025, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(telemetry::ATTEMPT_SECONDS.into()), &seconds)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(telemetry::SUCCESS_ATTEMPT.into()), &attempts)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(telemetry::DELAY_PROBE_SECONDS.into()),
                &probe_seconds,
            )
        })
        .map_err(|e| AdminError::Recorder(e.to_string()))?
        .install_recorder()
        .map_err(|e| AdminError::Recorder(e.to_string()))?;
    telemetry::describe_metrics();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

#[derive(Clone)]
struct AdminState {
    metrics: PrometheusHandle,
    health: Health,
    /// The standard `process_*` metrics (CPU seconds, resident memory,
    /// open fds, threads), read from `/proc` at each scrape.
    process: std::sync::Arc<metrics_process::Collector>,
}

/// Binds `addr` (port 0 picks a free one), installs the recorder, and
/// serves until `shutdown`. Returns the bound address, which is also logged.
pub async fn spawn(
    addr: &str,
    health: Health,
    shutdown: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    let bind_err = |source| AdminError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
    let local = listener.local_addr().map_err(bind_err)?;
    let process = metrics_process::Collector::default();
    let state = AdminState {
        metrics: recorder()?,
        health,
        process: std::sync::Arc::new(process),
    };
    state.process.describe();
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    info!(addr = %local, "admin endpoint listening (/metrics, /healthz, /readyz)");
    tokio::spawn(async move {
        let stop = shutdown.cancelled_owned();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::warn!(error = %e, "admin endpoint stopped");
        }
    });
    Ok(local)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    s.process.collect();
    s.metrics.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

/// 503 while connecting, reconnecting or draining: an orchestrator then
/// sends no traffic and does not count the worker as available.
///
/// A stalled delay backend is reported in the body, one line each, but
/// does not fail readiness: it is the broker's fault, every worker sees
/// it at once, and a restarted or removed worker cures nothing; first
/// attempts still go out (docs/operations.md).
async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let mut body = if s.health.is_ready() {
        "ready\n".to_string()
    } else {
        "not ready: not consuming\n".to_string()
    };
    for note in s.health.delay_notes() {
        body.push_str(&note);
        body.push('\n');
    }
    let status = if s.health.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}
