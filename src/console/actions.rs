//! The JSON API behind the pages' buttons, so a script can do what a
//! click does: pause, resume, disable and enable a target (through the
//! same shared state as `redeliver endpoint`), and replay or purge dead
//! letters (through the same walks as `redeliver dlq`). Bodies are read by
//! hand so a bad one is a 400 that says what is wrong.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::app::{error, Shared};
use super::web::views::DeadFilter;
use crate::message::dead_letter::Filter;
use crate::message::target::Target;
use crate::ops::dlq::{replay, walk, Op, ReplayOptions};
use crate::ops::endpoints::{self, Op as EndpointOp};
use crate::policy::Rate;
use crate::publish::Publisher;
use crate::topology::Topology;

/// How long one replayed dead letter's republish may wait for its confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest pause with a duration (longer: pause until resumed).
const MAX_PAUSE: Duration = Duration::from_secs(366 * 24 * 3600);
/// Republishes in flight per batch (as `dlq replay`'s default).
const REPLAY_BATCH: usize = 100;

/// `{"target": ORIGIN_OR_PREFIX, "reason": "...", "for": "1h"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    target: String,
    reason: Option<String>,
    #[serde(rename = "for")]
    for_: Option<String>,
}

fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| format!("the body is not what this call takes: {e}"))
}

/// `POST /api/endpoints/{pause|resume|disable|enable}`.
pub async fn change(app: Shared, what: &str, b: Bytes) -> Response {
    let c: Change = match body(&b) {
        Ok(c) => c,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    let target = match Target::parse(&c.target) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("target: {e}")),
    };
    let op = match op(what, &c) {
        Ok(op) => op,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    let who = format!("console {}", crate::telemetry::hostname());
    match endpoints::change_by(app.live.broker(), &target, op, &who).await {
        Ok(done) => {
            app.live.changed();
            let now = crate::clock::now_ms().max(0) as u64;
            let state = done
                .after
                .as_ref()
                .map_or("active", |k| k.control.name(now));
            let body = serde_json::json!({"target": target.to_string(), "state": state, "record": done.record.id});
            Json(body).into_response()
        }
        Err(e) if e.is_usage() => error(StatusCode::CONFLICT, &e.to_string()),
        Err(e) => error(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

fn op(what: &str, c: &Change) -> Result<EndpointOp, String> {
    let reason = c.reason.clone().filter(|r| !r.trim().is_empty());
    let until_ms = match c.for_.as_deref().map(str::trim).filter(|f| !f.is_empty()) {
        None => None,
        Some(f) => {
            let d = humantime::parse_duration(f)
                .map_err(|e| format!("for: {f:?} is not a duration such as 30m or 2h: {e}"))?;
            if d > MAX_PAUSE {
                return Err(format!("for: {f:?} is longer than a year; pause without a duration instead (until resumed)"));
            }
            Some(crate::clock::now_ms().max(0) as u64 + d.as_millis() as u64)
        }
    };
    if c.for_.is_some() && what != "pause" {
        return Err(format!("for: only a pause takes a duration, not {what}"));
    }
    Ok(match what {
        "pause" => EndpointOp::Pause { reason, until_ms },
        "resume" => EndpointOp::Resume,
        "disable" => EndpointOp::Disable { reason },
        _ => EndpointOp::Enable,
    })
}

/// Which dead letters: ids, or every one matching a filter (`all`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    endpoint: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    since: String,
    /// Replays only: `50/s`, `1000/m`; none is as fast as confirms come.
    rate: Option<String>,
}

impl Selection {
    /// The walk's filter, and the selection as a person reads it.
    fn filter(&self) -> Result<(Filter, String), String> {
        if self.ids.is_empty() && !self.all {
            return Err("nothing selected: give ids, or all: true with an optional filter".into());
        }
        if !self.ids.is_empty() && self.all {
            return Err("give ids or all: true, not both".into());
        }
        let endpoint = match self.endpoint.trim() {
            "" => None,
            e => Some(Target::parse(e).map_err(|e| format!("endpoint: {e}"))?),
        };
        let since = match self.since.trim() {
            "" => None,
            s => Some(humantime::parse_duration(s).map_err(|e| format!("since: {s:?}: {e}"))?),
        };
        let said = match self.ids.len() {
            0 => format!("all matching{}", self.described()),
            n => format!("{n} selected"),
        };
        let f = Filter {
            ids: self.ids.clone(),
            reason: Some(self.reason.clone()).filter(|r| !r.is_empty()),
            url_contains: None,
            endpoint,
            since,
        };
        Ok((f, said))
    }

    fn described(&self) -> String {
        let parts: Vec<String> = [
            ("endpoint", &self.endpoint),
            ("reason", &self.reason),
            ("since", &self.since),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!(" {k}={v}"))
        .collect();
        parts.concat()
    }
}

/// A replay's or purge's body: the selection, its filter, and its words.
fn selected(b: &Bytes) -> Result<(Selection, Filter, String), String> {
    let sel: Selection = body(b)?;
    let (filter, said) = sel.filter()?;
    Ok((sel, filter, said))
}

/// `POST /api/dead-letters/replay`: starts a replay; 202 with its id.
pub async fn start_replay(State(app): State<Shared>, b: Bytes) -> Response {
    let (sel, filter, said) = match selected(&b) {
        Ok(s) => s,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    if let Some(busy) = running(&app) {
        return busy;
    }
    let rate = match sel.rate.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => match r.parse::<Rate>() {
            Ok(rate) => Some(rate),
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("rate: {e}")),
        },
    };
    let id = app.jobs.start(said, rate.map(|r| r.to_string()));
    let job = id.clone();
    let task = app.clone();
    app.tasks
        .spawn(async move { run_replay(task, job, filter, rate).await });
    (StatusCode::ACCEPTED, Json(serde_json::json!({ "job": id }))).into_response()
}

/// A 409 while a replay runs: one walk of the dead letters at a time,
/// and none waits behind a replay that may take hours.
fn running(app: &Shared) -> Option<Response> {
    let job = app.jobs.list().into_iter().find(|j| j.state == "running")?;
    let msg = format!(
        "replay {} is still running (GET /api/dead-letters/replays); wait for it to end",
        job.id
    );
    Some(error(StatusCode::CONFLICT, &msg))
}

/// One replay, the only walk of the dead letters while it runs.
async fn run_replay(app: Shared, job: String, f: Filter, rate: Option<Rate>) {
    let _held = app.live.dlq.lock().await;
    let broker = app.live.broker();
    let stop = app.stop.child_token();
    let result = async {
        let conn = broker.url.connect("redeliver console replay").await?;
        let t = Topology::new(&broker.prefix);
        let publisher = Publisher::new(&conn, t.clone(), broker.delay, CONFIRM_TIMEOUT).await?;
        let opts = ReplayOptions {
            rate,
            batch: REPLAY_BATCH,
            stop: stop.clone(),
        };
        let r = replay(&conn, &t, &f, None, &publisher, &opts, |p| {
            app.jobs.progress(&job, p)
        })
        .await;
        let _ = conn.close(200, "replayed".into()).await;
        r.map_err(anyhow::Error::from)
    }
    .await;
    match result {
        Ok(s) => app.jobs.finish(&job, s.done, stop.is_cancelled(), None),
        Err(e) => app.jobs.fail(&job, format!("{e:#}")),
    }
    drop(_held);
    app.live.changed();
}

/// `GET /api/dead-letters/replays`: every replay remembered, newest first.
pub async fn replays(State(app): State<Shared>) -> Response {
    Json(app.jobs.list()).into_response()
}

/// `POST /api/dead-letters/purge`: removes the selected dead letters now.
pub async fn purge(State(app): State<Shared>, b: Bytes) -> Response {
    let (_, filter, _) = match selected(&b) {
        Ok(s) => s,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    if let Some(busy) = running(&app) {
        return busy;
    }
    let held = app.live.dlq.lock().await;
    let broker = app.live.broker();
    let purged = async {
        let conn = broker.url.connect("redeliver console purge").await?;
        let t = Topology::new(&broker.prefix);
        let s = walk(&conn, &t, &filter, None, Op::Purge, |_| {}).await;
        let _ = conn.close(200, "purged".into()).await;
        s.map_err(anyhow::Error::from)
    }
    .await;
    drop(held);
    app.live.changed();
    match purged {
        Ok(s) => Json(serde_json::json!({ "purged": s.done })).into_response(),
        Err(e) => error(StatusCode::BAD_GATEWAY, &format!("{e:#}")),
    }
}

/// `GET /api/dead-letters?endpoint=&reason=&since=`: what the latest walk
/// found (at most every 10 s), filtered.
pub async fn dead_letters(State(app): State<Shared>, Query(f): Query<DeadFilter>) -> Response {
    let list = app.live.dead().await;
    let now = crate::clock::now_ms().max(0) as u64;
    let rows = match super::web::views::select(&list, &f, now) {
        Ok(rows) => rows,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    Json(serde_json::json!({
        "total": list.total, "matching": rows.len(), "as_of_ms": list.at_ms,
        "dead_letters": rows,
    }))
    .into_response()
}
