//! The web console's security and its JSON API over plain HTTP (issue
//! 50): 401 without credentials, 403 for a change from another origin or
//! by a read-only token, the session cookie's flags, 400 for a bad body,
//! and the changes themselves as `redeliver endpoint` and the dead-letter
//! queue see them.

mod common;

use std::time::Duration;

use common::console::TestConsole;
use common::dead_letters::{dead, now_ms};
use common::endpoints::show;
use common::harness::*;
use common::TestApp;
use redeliver::delay::DelayBackend;
use reqwest::header::{COOKIE, ORIGIN, SET_COOKIE};
use reqwest::redirect::Policy;
use serde_json::{json, Value};

const TARGET: &str = "http://127.0.0.1:9";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

/// Signs in with `token`; the cookie to send back.
async fn sign_in(c: &TestConsole, token: &str, https: bool) -> (String, String) {
    let mut req = client()
        .post(format!("{}/login", c.url))
        .header(ORIGIN, &c.url)
        .form(&[("token", token)]);
    if https {
        req = req.header("x-forwarded-proto", "https");
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 303, "signed in: redirected to the overview");
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    let pair = set.split(';').next().unwrap().to_string();
    (pair, set)
}

async fn post(c: &TestConsole, path: &str, body: &str, auth: Auth<'_>) -> (u16, Value) {
    let mut req = client()
        .post(format!("{}{path}", c.url))
        .header("content-type", "application/json")
        .body(body.to_string());
    req = match auth {
        Auth::None => req,
        Auth::Bearer(t) => req.bearer_auth(t),
        Auth::Cookie(cookie, origin) => req.header(COOKIE, cookie).header(ORIGIN, origin),
    };
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[derive(Clone, Copy)]
enum Auth<'a> {
    None,
    Bearer(&'a str),
    Cookie(&'a str, &'a str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_origins_and_roles_are_enforced() {
    let app = TestApp::new("console-web", DelayBackend::Plugin);
    let c = TestConsole::start_with(&app.broker(), true).await;
    assert!(c.ready(Duration::from_secs(20)).await, "ready");
    let read = c.read_token.clone().unwrap();
    let pause = json!({"target": TARGET, "reason": "test"}).to_string();

    // No credentials: 401 on the API, the sign-in form for a page.
    let r = client()
        .get(format!("{}/api/endpoints", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        post(&c, "/api/endpoints/pause", &pause, Auth::None).await.0,
        401
    );
    assert_eq!(
        post(&c, "/api/endpoints/pause", &pause, Auth::Bearer("wrong"))
            .await
            .0,
        401
    );
    let r = client()
        .get(format!("{}/dead-letters", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/login");

    // A session cookie: HttpOnly, SameSite=Strict, Secure behind https.
    let (cookie, set) = sign_in(&c, &c.token, false).await;
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "{set}");
    let (_, secure) = sign_in(&c, &c.token, true).await;
    assert!(secure.ends_with("; Secure"), "{secure}");

    // The cookie with another Origin (or none) is 403; with its own, done.
    for origin in ["http://evil.example", "null"] {
        let (status, v) = post(
            &c,
            "/api/endpoints/pause",
            &pause,
            Auth::Cookie(&cookie, origin),
        )
        .await;
        assert_eq!(status, 403, "{origin}: {v}");
    }
    let (status, v) = post(
        &c,
        "/api/endpoints/pause",
        &pause,
        Auth::Cookie(&cookie, &c.url),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "paused");
    assert_eq!(
        show(&app, TARGET).expect("endpoint show")["state"],
        "paused"
    );

    // The read-only token, as bearer or session: reads, never changes.
    let resume = json!({"target": TARGET}).to_string();
    assert_eq!(
        post(&c, "/api/endpoints/resume", &resume, Auth::Bearer(&read))
            .await
            .0,
        403
    );
    let (viewer, _) = sign_in(&c, &read, false).await;
    assert_eq!(
        post(
            &c,
            "/api/endpoints/resume",
            &resume,
            Auth::Cookie(&viewer, &c.url)
        )
        .await
        .0,
        403
    );
    let page = client()
        .get(format!("{}/endpoints", c.url))
        .header(COOKIE, &viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("read-only") && !html.contains("data-api=\"/api/endpoints/resume\""),
        "no buttons for a viewer"
    );
    assert!(
        !html.contains(&c.token) && !html.contains(&read),
        "no token in a page"
    );
    let r = client()
        .get(format!("{}/api/endpoints", c.url))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(show(&app, TARGET).unwrap()["state"], "paused", "unchanged");

    // Another site cannot sign the operator out either.
    let out = client()
        .post(format!("{}/logout", c.url))
        .header(COOKIE, &cookie)
        .header(ORIGIN, "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 403);

    // The operator's bearer token needs no Origin.
    let (status, v) = post(&c, "/api/endpoints/resume", &resume, Auth::Bearer(&c.token)).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("active")), "{v}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_body_is_a_400_that_says_why() {
    let app = TestApp::new("console-bad", DelayBackend::Plugin);
    let c = TestConsole::start(&app.broker()).await;
    assert!(c.ready(Duration::from_secs(20)).await, "ready");
    let t = c.token.clone();
    let cases = [
        ("/api/endpoints/pause", "not json", "the body is not"),
        ("/api/endpoints/pause", r#"{"target": "ftp://x"}"#, "target"),
        (
            "/api/endpoints/pause",
            r#"{"target": "http://x", "for": "soon"}"#,
            "for",
        ),
        (
            "/api/endpoints/pause",
            r#"{"target": "http://x", "reasn": "typo"}"#,
            "unknown field",
        ),
        (
            "/api/endpoints/resume",
            r#"{"target": "http://x", "for": "1h"}"#,
            "only a pause",
        ),
        ("/api/dead-letters/replay", r#"{}"#, "nothing selected"),
        (
            "/api/dead-letters/replay",
            r#"{"all": true, "rate": "fast"}"#,
            "rate",
        ),
        (
            "/api/dead-letters/purge",
            r#"{"ids": ["a"], "all": true}"#,
            "not both",
        ),
        (
            "/api/dead-letters/purge",
            r#"{"all": true, "since": "lately"}"#,
            "since",
        ),
    ];
    for (path, body, says) in cases {
        let (status, v) = post(&c, path, body, Auth::Bearer(&t)).await;
        assert_eq!(status, 400, "{path} {body}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(
            msg.contains(says),
            "{path} {body}: {msg:?} should say {says:?}"
        );
    }
    let (status, _) = post(&c, "/api/endpoints/explode", "{}", Auth::Bearer(&t)).await;
    assert_eq!(status, 404);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_replayed_by_id_and_purged_by_filter() {
    let app = TestApp::new("console-dlq", DelayBackend::Plugin);
    // The queues, and no worker: a replayed one waits in the work queue.
    app.publish(&Vec::<String>::new()).await;
    let at = now_ms() - 60_000;
    let items = vec![
        dead("d-1", "http://127.0.0.1:9/a", "max-attempts", at),
        dead("d-2", "http://127.0.0.1:9/b", "permanent-status", at),
        dead("d-3", "http://127.0.0.1:8/c", "max-attempts", at),
    ];
    app.publish_to_queue("dead", &items).await;
    let c = TestConsole::start(&app.broker()).await;
    assert!(c.ready(Duration::from_secs(20)).await, "ready");
    let (status, v) = c.get("/api/dead-letters?reason=max-attempts").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["total"].as_u64(), v["matching"].as_u64()),
        (Some(3), Some(2)),
        "{v}"
    );
    assert_eq!(c.get("/api/dead-letters?since=lately").await.0, 400);

    // Purge what died for one endpoint: only d-3 goes.
    let purge = json!({"all": true, "endpoint": "http://127.0.0.1:8"}).to_string();
    let (status, v) = post(
        &c,
        "/api/dead-letters/purge",
        &purge,
        Auth::Bearer(&c.token),
    )
    .await;
    assert_eq!((status, v["purged"].as_u64()), (200, Some(1)), "{v}");
    // Replay d-1 by id: it leaves the queue for the work queue.
    let replay = json!({"ids": ["d-1"], "rate": "5/s"}).to_string();
    let (status, v) = post(
        &c,
        "/api/dead-letters/replay",
        &replay,
        Auth::Bearer(&c.token),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let done = wait_until_async(Duration::from_secs(20), async || {
        let (_, jobs) = c.get("/api/dead-letters/replays").await;
        jobs[0]["state"] == "done" && jobs[0]["replayed"] == 1
    })
    .await;
    assert!(done, "{}", c.get("/api/dead-letters/replays").await.1);
    // Stopped first: its background walk of the dead letters (after the
    // change) holds them unacked while it reads.
    c.stop().await;
    let left: Vec<String> = app
        .drain_dead()
        .await
        .iter()
        .filter_map(|d| d.str("x-custom"))
        .collect();
    assert_eq!(left, ["d-2"], "d-1 replayed, d-3 purged");
    let work = app.drain_queue("work").await;
    assert_eq!(work.len(), 1);
    assert!(String::from_utf8_lossy(&work[0].body).contains("\"d-1\""));
}
