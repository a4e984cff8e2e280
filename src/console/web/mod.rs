//! The console's web pages: thin handlers that fetch (the index, the
//! live pulse, the dead-letter walk), build a view model (`views`) and lay
//! it out (`pages`, `dead_page`). Pages only read; every change goes
//! through the JSON API, from the small script in `assets/`.

mod dead_page;
mod layout;
mod pages;
pub mod views;

use std::time::Instant;

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Extension, Router};
use maud::Markup;
use serde::Deserialize;

use super::app::{self, behind_https, Shared};
use super::auth::{self, Role};
use super::index;
use super::rollup;
use crate::control::view::Row;
use crate::history::query::Filter;
use crate::history::record::Attempt;
use crate::message::target::Target;

/// A wrong token at sign-in is answered after this long.
const WRONG_TOKEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The pages (behind the page guard), the sign-in form and the assets.
pub fn routes(app: Shared) -> Router<Shared> {
    let pages = Router::new()
        .route("/", get(overview))
        .route("/endpoints", get(endpoints))
        .route("/endpoints/{*origin}", get(endpoint))
        .route("/notifications/{id}", get(notification))
        .route("/dead-letters", get(dead_letters))
        .route("/search", get(search))
        .route_layer(middleware::from_fn_with_state(app, app::page_guard));
    Router::new()
        .merge(pages)
        .route("/login", get(login_form).post(login))
        .route("/logout", axum::routing::post(logout))
        .route("/assets/console.css", get(|| asset(CSS, "text/css")))
        .route("/assets/console.js", get(|| asset(JS, "text/javascript")))
}

/// Every response: no framing, no sniffing, no script or style but ours.
/// Its `Server-Timing` says how long the console took (browsers show it;
/// the bench reads it).
pub async fn harden(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut res = next.run(req).await;
    let took = started.elapsed().as_secs_f64() * 1_000.0;
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={took:.2}")) {
        h.insert("server-timing", v);
    }
    let csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
               frame-ancestors 'none'; form-action 'self'; base-uri 'none'";
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

fn html(m: Markup) -> Response {
    Html(m.into_string()).into_response()
}

fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}

async fn overview(State(app): State<Shared>, Extension(role): Extension<Role>) -> Response {
    let pulse = app.live.pulse().await;
    let since = now_ms() as i64 - views::CHART_MINUTES * 60_000;
    let read = move |c: &rusqlite::Connection| {
        Ok((
            rollup::per_minute(c, since)?,
            rollup::endpoints(c, since, None)?,
        ))
    };
    let (counts, stats) = match app::query(&app, read).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let chart = views::Chart::build(&counts, now_ms() as i64);
    let o = views::Overview::build(&pulse, chart, &stats, now_ms());
    html(pages::overview(&o, role))
}

async fn endpoints(State(app): State<Shared>, Extension(role): Extension<Role>) -> Response {
    let pulse = app.live.pulse().await;
    let since = now_ms() as i64 - 3_600_000;
    let stats = match app::query(&app, move |c| Ok(rollup::endpoints(c, since, None)?)).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    html(pages::endpoints(
        &views::endpoint_rows(&pulse.endpoints, &stats, now_ms()),
        role,
    ))
}

async fn endpoint(
    State(app): State<Shared>,
    Extension(role): Extension<Role>,
    Path(origin): Path<String>,
) -> Response {
    let Ok(target) = Target::parse(&origin) else {
        let what =
            format!("{origin:?} is not an endpoint (an origin such as https://shop.example)");
        return (
            StatusCode::NOT_FOUND,
            html(layout::not_found(&what, Some(role))),
        )
            .into_response();
    };
    let name = target.to_string();
    let pulse = app.live.pulse().await;
    let row = pulse.endpoints.iter().find(|r| r.endpoint == name).cloned();
    let key = target.origin_key();
    let since = now_ms() as i64 - 3_600_000;
    let (k, f) = (
        key.clone(),
        Filter {
            endpoint: Some(key.clone()),
            limit: 100,
            ..Filter::default()
        },
    );
    let got = app::query(&app, move |c| {
        Ok((rollup::endpoints(c, since, Some(&k))?, index::list(c, &f)?))
    })
    .await;
    let (stats, recent) = match got {
        Ok(v) => v,
        Err(r) => return r,
    };
    let row = row.unwrap_or(Row {
        endpoint: name,
        state: "active",
        ..Row::default()
    });
    let line = views::EndpointRow::build(&row, stats.get(&key), now_ms());
    html(pages::endpoint(&line, &parsed(&recent), role))
}

fn parsed(records: &[String]) -> Vec<Attempt> {
    records
        .iter()
        .filter_map(|r| serde_json::from_str(r).ok())
        .collect()
}

async fn notification(
    State(app): State<Shared>,
    Extension(role): Extension<Role>,
    Path(id): Path<String>,
) -> Response {
    let q = id.clone();
    let records = match app::query(&app, move |c| index::show(c, &q)).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if records.is_empty() {
        let what = format!("No attempt of {id:?} is in the history (yet, or any more).");
        return (
            StatusCode::NOT_FOUND,
            html(layout::not_found(&what, Some(role))),
        )
            .into_response();
    }
    let n = views::Notification::build(&id, &parsed(&records));
    let running = app.jobs.list().iter().any(|j| j.state == "running");
    html(pages::notification(&n, running, role))
}

async fn dead_letters(
    State(app): State<Shared>,
    Extension(role): Extension<Role>,
    Query(f): Query<views::DeadFilter>,
) -> Response {
    let list = app.live.dead().await;
    let v = views::DeadLetters::build(&list, &f, now_ms());
    html(dead_page::dead_letters(&v, &f, &app.jobs.list(), role))
}

#[derive(Deserialize)]
struct Search {
    #[serde(default)]
    q: String,
}

/// An id (or webhook-id, the same) opens its notification; an origin or
/// URL opens its endpoint.
async fn search(
    State(app): State<Shared>,
    Extension(role): Extension<Role>,
    Query(s): Query<Search>,
) -> Response {
    let q = s.q.trim().to_string();
    if q.is_empty() {
        return Redirect::to("/").into_response();
    }
    let id = q.clone();
    let found = match app::query(&app, move |c| Ok(!index::show(c, &id)?.is_empty())).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if found {
        return Redirect::to(&format!("/notifications/{}", layout::seg(&q))).into_response();
    }
    if let Some(t) = url::Url::parse(&q)
        .ok()
        .as_ref()
        .and_then(Target::origin_of)
    {
        return Redirect::to(&format!("/endpoints/{}", layout::seg(&t.to_string())))
            .into_response();
    }
    let what = format!("Nothing is known as {q:?}: no notification of that id in the history, and it is not an endpoint's URL.");
    (
        StatusCode::NOT_FOUND,
        html(layout::not_found(&what, Some(role))),
    )
        .into_response()
}

async fn login_form() -> Response {
    html(layout::login(false))
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
}

/// Checks the token; a session cookie for its role.
async fn login(State(app): State<Shared>, h: HeaderMap, Form(f): Form<SignIn>) -> Response {
    let text = |n| h.get(n).and_then(|v: &HeaderValue| v.to_str().ok());
    if text(header::ORIGIN).is_some_and(|o| !auth::own_origin(Some(o), text(header::HOST))) {
        return app::error(StatusCode::FORBIDDEN, "sign in from the console's own page");
    }
    let Some(role) = app.tokens.role_of(&f.token) else {
        // The form again, said plainly (a 401 would be a console error in
        // the browser for a typo); a guesser waits a little each time.
        tokio::time::sleep(WRONG_TOKEN_PAUSE).await;
        return html(layout::login(true));
    };
    let id = app.sessions.open(role, Instant::now());
    let cookie = auth::cookie(&id, behind_https(&h));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

async fn logout(State(app): State<Shared>, h: HeaderMap) -> Response {
    let text = |n| h.get(n).and_then(|v: &HeaderValue| v.to_str().ok());
    if !auth::own_origin(text(header::ORIGIN), text(header::HOST)) {
        return app::error(
            StatusCode::FORBIDDEN,
            "sign out from the console's own page",
        );
    }
    if let Some(id) = h
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::session_id)
    {
        app.sessions.close(id);
    }
    (
        [(header::SET_COOKIE, auth::expired_cookie())],
        Redirect::to("/login"),
    )
        .into_response()
}
