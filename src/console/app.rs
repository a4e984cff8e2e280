//! What every handler of the console shares, and the guard in front of
//! them: it reads a request's credentials, asks [`auth::decide`], and
//! either passes the role on (as a request extension) or answers 401/403.
//! A page asked without credentials goes to the sign-in form instead.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::{self, Access, Ask, Sessions, Tokens, Verdict};
use super::error::Db;
use super::jobs::Jobs;
use super::live::Live;

/// The console's shared parts.
pub struct App {
    /// The index's reading connection.
    pub db: Db,
    pub tokens: Tokens,
    pub sessions: Sessions,
    pub ready: Arc<AtomicBool>,
    pub live: Arc<Live>,
    pub jobs: Jobs,
    /// Replays started from the API; the console waits for them to settle.
    pub tasks: TaskTracker,
    pub stop: CancellationToken,
}

pub type Shared = Arc<App>;

impl App {
    /// What `h` carries, checked against the tokens and sessions.
    pub fn verdict(&self, h: &HeaderMap, access: Access) -> Verdict {
        let text = |name| h.get(name).and_then(|v| v.to_str().ok());
        let session = text(header::COOKIE)
            .and_then(auth::session_id)
            .and_then(|id| self.sessions.role(id, Instant::now()));
        let ask = Ask {
            bearer: text(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer ")),
            session,
            origin: text(header::ORIGIN),
            host: text(header::HOST),
        };
        auth::decide(&self.tokens, &ask, access)
    }
}

/// Behind `https` (as a proxy in front says): the cookie is `Secure`.
pub fn behind_https(h: &HeaderMap) -> bool {
    h.get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// The API's guard: a GET reads, anything else changes.
pub async fn api_guard(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
    let access = match *req.method() {
        Method::GET | Method::HEAD => Access::Read,
        _ => Access::Change,
    };
    match app.verdict(req.headers(), access) {
        Verdict::Allow(role) => {
            req.extensions_mut().insert(role);
            next.run(req).await
        }
        Verdict::Unauthorized => unauthorized(),
        Verdict::Forbidden(why) => error(StatusCode::FORBIDDEN, why),
    }
}

/// The pages' guard: without credentials, the sign-in form.
pub async fn page_guard(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
    match app.verdict(req.headers(), Access::Read) {
        Verdict::Allow(role) => {
            req.extensions_mut().insert(role);
            next.run(req).await
        }
        _ => Redirect::to("/login").into_response(),
    }
}

pub fn unauthorized() -> Response {
    let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
    let body = error(
        StatusCode::UNAUTHORIZED,
        "a bearer token or a session is required",
    );
    (challenge, body).into_response()
}

/// `{"error": "..."}` with `status`.
pub fn error(status: StatusCode, msg: &str) -> Response {
    let body = serde_json::json!({ "error": msg }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Runs an index query on a blocking thread (the reading connection); a
/// failure is a 500 that says what failed.
pub async fn query<T: Send + 'static>(
    app: &Shared,
    q: impl FnOnce(&rusqlite::Connection) -> Result<T, super::index::IndexError> + Send + 'static,
) -> Result<T, Response> {
    let db = app.db.clone();
    let got = tokio::task::spawn_blocking(move || {
        let c = db
            .lock()
            .map_err(|_| "the index's lock was poisoned".to_string())?;
        q(&c).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    got.map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e))
}
