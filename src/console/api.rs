//! The console's HTTP routes: `/readyz`, the history as JSON arrays of
//! records, the endpoints, and the changes (`actions`), all behind the
//! guard (`app`); the pages are merged in from `web`. Reads run on
//! blocking threads against the index's reading connection.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::actions;
use super::app::{self, Shared};
use super::error::ConsoleError;
use super::index;
use super::rollup;
use super::web;
use crate::history::query::{self, Filter, QueryError};

/// Serves the pages and the API until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Shared,
    stop: CancellationToken,
) -> Result<(), ConsoleError> {
    let addr = listener.local_addr().ok();
    let api = Router::new()
        .route("/api/notifications/{id}/attempts", get(attempts_of))
        .route("/api/attempts", get(attempts))
        .route("/api/endpoints", get(endpoints))
        .route("/api/endpoints/{action}", post(change))
        .route("/api/dead-letters", get(actions::dead_letters))
        .route("/api/dead-letters/replay", post(actions::start_replay))
        .route("/api/dead-letters/replays", get(actions::replays))
        .route("/api/dead-letters/purge", post(actions::purge))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            app::api_guard,
        ));
    let app = Router::new()
        .route("/readyz", get(readyz))
        .merge(api)
        .merge(web::routes(state.clone()))
        .layer(middleware::from_fn(web::harden))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|source| ConsoleError::Listen {
            addr: addr.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
            source,
        })
}

/// 200 once the index has caught up with the stream as of the start.
async fn readyz(State(s): State<Shared>) -> Response {
    match s.ready.load(Ordering::Relaxed) {
        true => (StatusCode::OK, "ready\n").into_response(),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            "catching up with the history stream\n",
        )
            .into_response(),
    }
}

/// `POST /api/endpoints/{pause|resume|disable|enable}`.
async fn change(State(s): State<Shared>, Path(action): Path<String>, b: Bytes) -> Response {
    match action.as_str() {
        "pause" | "resume" | "disable" | "enable" => actions::change(s, &action, b).await,
        other => app::error(
            StatusCode::NOT_FOUND,
            &format!("no action {other:?}: pause, resume, disable or enable"),
        ),
    }
}

/// `GET /api/endpoints`: every row `endpoint list` shows, with the last
/// hour's attempts, outcomes and latency percentiles from the history.
async fn endpoints(State(s): State<Shared>) -> Response {
    let pulse = s.live.pulse().await;
    let since = crate::clock::now_ms() - 3_600_000;
    let db = s.db.clone();
    let stats = tokio::task::spawn_blocking(move || {
        let c = db
            .lock()
            .map_err(|_| "the index's lock was poisoned".to_string())?;
        rollup::endpoints(&c, since, None).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let stats = match stats {
        Ok(s) => s,
        Err(e) => return app::error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let rows: Vec<serde_json::Value> = pulse
        .endpoints
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            let st = stats.get(&r.endpoint).cloned().unwrap_or_default();
            v["last_hour"] = serde_json::json!({
                "attempts": st.attempts(), "delivered": st.delivered, "retry": st.retry,
                "dead": st.dead, "p50_ms": st.percentile_ms(50.0), "p99_ms": st.percentile_ms(99.0),
            });
            v
        })
        .collect();
    Json(rows).into_response()
}

async fn attempts_of(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    read(s, move |c| index::show(c, &id)).await
}

/// The query string of `/api/attempts`, as text: checked by [`query`].
#[derive(Deserialize, Default)]
struct ListParams {
    endpoint: Option<String>,
    outcome: Option<String>,
    status: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
}

async fn attempts(State(s): State<Shared>, Query(p): Query<ListParams>) -> Response {
    match filter(&p, SystemTime::now()) {
        Ok(f) => read(s, move |c| index::list(c, &f)).await,
        Err(e) => app::error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

fn filter(p: &ListParams, now: SystemTime) -> Result<Filter, QueryError> {
    let time = |t: &Option<String>| t.as_deref().map(|t| query::parse_time(t, now)).transpose();
    Filter {
        endpoint: p
            .endpoint
            .as_deref()
            .filter(|e| !e.is_empty())
            .map(query::parse_endpoint)
            .transpose()?,
        outcome: p.outcome.as_deref().map(query::parse_outcome).transpose()?,
        status: p.status.as_deref().map(query::Status::parse).transpose()?,
        since: time(&p.since)?,
        until: time(&p.until)?,
        limit: p
            .limit
            .as_deref()
            .map(query::parse_limit)
            .transpose()?
            .unwrap_or(query::DEFAULT_LIMIT),
    }
    .checked()
}

/// Runs `q` on a blocking thread; its records (JSON texts) as one array.
async fn read<F>(s: Shared, q: F) -> Response
where
    F: FnOnce(&rusqlite::Connection) -> Result<Vec<String>, index::IndexError> + Send + 'static,
{
    match app::query(&s, q).await {
        Ok(records) => {
            let body = format!("[{}]", records.join(","));
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(r) => r,
    }
}
