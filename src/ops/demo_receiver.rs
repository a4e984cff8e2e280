//! The demo's HTTP receiver on 127.0.0.1: it fails in realistic ways.
//!
//! | path | behaviour |
//! |---|---|
//! | `/ok/..` | 200 at once |
//! | `/flaky/..` | 500 twice per notification, then 200 |
//! | `/slow/..` | the first request hangs past the timeout, then 200 |
//! | `/gone` | 410 Gone (a permanent status) |
//! | `/down/..` | 503 every time |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, u32>>>);

/// Starts the receiver; `hang` is how long a slow request hangs. The server
/// stops when the returned handle is aborted (or the runtime ends).
pub async fn start(hang: Duration) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .fallback(move |state, uri, headers| answer(state, uri, headers, hang))
        .with_state(Seen::default());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}

async fn answer(
    State(seen): State<Seen>,
    uri: Uri,
    headers: HeaderMap,
    hang: Duration,
) -> StatusCode {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let nth = {
        let mut m = seen.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(id).or_insert(0);
        *n += 1;
        *n
    };
    let kind = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    match (kind, nth) {
        ("ok", _) => StatusCode::OK,
        ("flaky", n) if n <= 2 => StatusCode::INTERNAL_SERVER_ERROR,
        ("flaky", _) => StatusCode::OK,
        ("slow", 1) => {
            tokio::time::sleep(hang).await;
            StatusCode::OK
        }
        ("slow", _) => StatusCode::OK,
        ("gone", _) => StatusCode::GONE,
        ("down", _) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::NOT_FOUND,
    }
}
