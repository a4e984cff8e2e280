//! The console's HTTP API: `/readyz`, and the history as JSON arrays of
//! records, behind `Authorization: Bearer TOKEN` when a token is set.
//! Reads run on blocking threads against the index's reading connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Path, Query, Request, State as Shared};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::error::ConsoleError;
use super::index;
use crate::history::query::{self, Filter, QueryError};

/// What the handlers share.
#[derive(Clone)]
pub struct State {
    db: Arc<Mutex<rusqlite::Connection>>,
    token: Option<Arc<SecretString>>,
    ready: Arc<AtomicBool>,
}

impl State {
    pub fn new(
        db: Arc<Mutex<rusqlite::Connection>>,
        token: Option<SecretString>,
        ready: Arc<AtomicBool>,
    ) -> Self {
        State {
            db,
            token: token.map(Arc::new),
            ready,
        }
    }
}

/// Serves until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: State,
    stop: CancellationToken,
) -> Result<(), ConsoleError> {
    let addr = listener.local_addr().ok();
    let api = Router::new()
        .route("/api/notifications/{id}/attempts", get(attempts_of))
        .route("/api/attempts", get(attempts))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorized));
    let app = Router::new()
        .route("/readyz", get(readyz))
        .merge(api)
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
async fn readyz(Shared(s): Shared<State>) -> Response {
    match s.ready.load(Ordering::Relaxed) {
        true => (StatusCode::OK, "ready\n").into_response(),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            "catching up with the history stream\n",
        )
            .into_response(),
    }
}

/// 401 without the bearer token (compared in constant time).
async fn authorized(Shared(s): Shared<State>, h: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        let given = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same(given.as_bytes(), token.expose_secret().as_bytes()) {
            let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
            return (
                StatusCode::UNAUTHORIZED,
                challenge,
                error_body("a bearer token is required"),
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Equal bytes, in time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn attempts_of(Shared(s): Shared<State>, Path(id): Path<String>) -> Response {
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

async fn attempts(Shared(s): Shared<State>, Query(p): Query<ListParams>) -> Response {
    match filter(&p, SystemTime::now()) {
        Ok(f) => read(s, move |c| index::list(c, &f)).await,
        Err(e) => (StatusCode::BAD_REQUEST, error_body(&e.to_string())).into_response(),
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
async fn read<F>(s: State, q: F) -> Response
where
    F: FnOnce(&rusqlite::Connection) -> Result<Vec<String>, index::IndexError> + Send + 'static,
{
    let db = s.db.clone();
    let got = tokio::task::spawn_blocking(move || {
        let c = db
            .lock()
            .map_err(|_| "the index's lock was poisoned".to_string())?;
        q(&c).map_err(|e| e.to_string())
    })
    .await;
    match got {
        Ok(Ok(records)) => {
            let body = format!("[{}]", records.join(","));
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, error_body(&e)).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            error_body(&e.to_string()),
        )
            .into_response(),
    }
}

fn error_body(msg: &str) -> Response {
    let body = serde_json::json!({ "error": msg }).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
