//! A webhook receiver for what redeliver sends: it checks the Standard
//! Webhooks signature, drops duplicates by `webhook-id`, logs one line per
//! request and answers 2xx so that the worker acks.
//!
//! Run it next to a worker that signs with the same secret:
//!
//! ```sh
//! export WEBHOOK_SECRET="whsec_$(head -c 32 /dev/urandom | base64)"
//! cargo run --example receiver                    # listens on 127.0.0.1:3000
//!
//! export REDELIVER_AMQP_URL='amqp://guest:guest@127.0.0.1:5674/%2f'
//! cargo run --release -- run --signing-secret "$WEBHOOK_SECRET" &
//! cargo run --release -- publish --url http://127.0.0.1:3000/hook --body '{"order":"A-1001"}'
//! ```
//!
//! Environment:
//! - `RECEIVER_ADDR`: the address to listen on (default `127.0.0.1:3000`).
//! - `WEBHOOK_SECRET`: a `whsec_...` secret. When set, every request must
//!   carry a valid `webhook-id`, `webhook-timestamp` and `webhook-signature`
//!   (otherwise 401). When unset, signatures are not checked, which is only
//!   for trying things out.
//!
//! Every method and path is accepted (`/hook`, `/notify/wechat`, ...): a
//! notification chooses its URL and its method (`POST` by default).
//!
//! Answers:
//! - 200 `ok`: a new, valid notification, processed once;
//! - 200 `duplicate`: an id seen before. A redelivery is normal under
//!   at-least-once delivery, and it must still be answered 2xx, or the
//!   worker retries it again;
//! - 401: a missing or bad signature, or a timestamp outside the 5-minute
//!   tolerance. redeliver retries a 401 (only `--permanent-status` ends a
//!   notification at once), which gives you time to fix a wrong secret;
//! - 400: no `webhook-id` while no secret is set (nothing to deduplicate on).

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::Router;
use standardwebhooks::Webhook;

/// How many recent ids are remembered. Retries can come hours apart (a
/// schedule may end with 6h waits), so a real receiver keeps ids in its
/// database, ideally under a unique constraint in the same transaction as
/// the work the notification triggers. A bounded in-memory window is enough
/// to show the idea and catches the common case: a redelivery shortly after
/// a worker or broker restart.
const SEEN_CAPACITY: usize = 10_000;

/// The last `cap` ids, oldest first in `order`, all of them in `set`.
struct Seen {
    order: VecDeque<String>,
    set: HashSet<String>,
    cap: usize,
}

impl Seen {
    fn new(cap: usize) -> Self {
        Seen {
            order: VecDeque::with_capacity(cap),
            set: HashSet::with_capacity(cap),
            cap,
        }
    }

    /// Records `id`; `false` when it was already there. Checking and
    /// inserting under one lock means two copies of one notification that
    /// arrive at the same moment cannot both count as new.
    fn insert(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() == self.cap {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        self.order.push_back(id.to_owned());
        self.set.insert(id.to_owned());
        true
    }
}

struct App {
    /// `None`: no `WEBHOOK_SECRET`, signatures are not checked.
    webhook: Option<Webhook>,
    seen: Mutex<Seen>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::var("RECEIVER_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
        .context("RECEIVER_ADDR must be host:port, e.g. 127.0.0.1:3000")?;
    // A bad secret is a configuration error: refuse to start rather than
    // answer 401 to every request.
    let webhook = match std::env::var("WEBHOOK_SECRET") {
        Ok(s) if !s.is_empty() => Some(
            Webhook::new(&s)
                .context("WEBHOOK_SECRET must be whsec_ followed by base64 (Standard Webhooks)")?,
        ),
        _ => None,
    };
    let signed = webhook.is_some();
    let app = Arc::new(App {
        webhook,
        seen: Mutex::new(Seen::new(SEEN_CAPACITY)),
    });
    // One handler for every method and path.
    let router = Router::new().fallback(receive).with_state(app);

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    eprintln!(
        "receiver listening on http://{} ({})",
        listener.local_addr()?,
        if signed {
            "verifying signatures"
        } else {
            "WEBHOOK_SECRET unset: signatures NOT verified"
        }
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// `body` is the exact bytes received: the signature covers those, so the
/// body must not be parsed and re-serialized before it is verified.
async fn receive(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let id = header("webhook-id");
    let attempt = header("redeliver-attempt");
    let path = uri.path();

    // 1. Authenticity first: an unsigned request must not be able to mark
    //    an id as seen (and so suppress the genuine notification).
    if let Some(webhook) = &app.webhook {
        if let Err(e) = webhook.verify(&body, &headers) {
            eprintln!("{method} {path} id={id} attempt={attempt} rejected: {e}");
            return (StatusCode::UNAUTHORIZED, "bad signature");
        }
    } else if !headers.contains_key("webhook-id") {
        eprintln!("{method} {path} attempt={attempt} rejected: no webhook-id");
        return (StatusCode::BAD_REQUEST, "missing webhook-id");
    }

    // 2. Deduplicate on the id, which is the same on every attempt and every
    //    redelivery of one notification.
    let new = app
        .seen
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(&id);
    if !new {
        println!("{method} {path} id={id} attempt={attempt} duplicate");
        return (StatusCode::OK, "duplicate");
    }

    // 3. Process. Here: log it. If real processing can fail, answer 5xx so
    //    that redeliver retries, and forget the id first (or record it only
    //    once the work is committed), or the retry would be taken for a
    //    duplicate.
    println!(
        "{method} {path} id={id} attempt={attempt} new {}",
        String::from_utf8_lossy(&body)
    );
    (StatusCode::OK, "ok")
}
