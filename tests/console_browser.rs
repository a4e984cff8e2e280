//! The web console (issue 50) clicked through in a real browser: headless
//! Chromium over WebDriver, against a console, a worker on default flags
//! (but a short schedule), a real broker and a real receiver. Every page
//! is photographed under `target/console-screenshots/` and its browser
//! console checked for errors.

mod common;

#[path = "console_parts/browser.rs"]
mod browser;

use std::time::Duration;

use browser::Browser;
use common::console::TestConsole;
use common::endpoints::{origin, show};
use common::harness::*;
use common::receiver::{Receiver, Recorded, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;
use serde_json::json;

/// What a receiver may answer that a page must show as text.
const HOSTILE: &str = "<script>window.pwned = 1</script><b>not bold</b>";

fn answer(r: &Recorded) -> Reply {
    match r.id().starts_with("ok-") {
        true => Reply::status(200).body(HOSTILE),
        false => Reply::status(500).body("down for maintenance"),
    }
}

async fn wait_page(b: &Browser, path: &str, css: &str, within: Duration) -> bool {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        b.goto(path).await;
        if b.wait_for(css, Duration::from_millis(300)).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_signs_in_searches_pauses_and_replays_by_clicking() {
    let app = TestApp::new("console-browser", DelayBackend::Plugin);
    let rx = Receiver::start(answer).await;
    let _w = app.spawn_worker(schedule_settings("1s", 2, 8));
    let mut n: Vec<_> = (0..3)
        .map(|i| json!({"url": rx.url("/hook"), "id": format!("ok-{i}"), "body": {"i": i}}))
        .collect();
    n.extend(
        (0..3).map(|i| json!({"url": rx.url("/hook"), "id": format!("bad-{i}"), "body": {"i": i}})),
    );
    app.publish(&n).await;
    assert!(wait_until(Duration::from_secs(30), || rx.count() == 3 + 3 * 2).await);
    let console = TestConsole::start_with(&app.broker(), true).await;
    assert!(console.ready(Duration::from_secs(20)).await, "ready");
    console.wait_records(9, Duration::from_secs(20)).await;
    let b = Browser::start(&console.url).await;

    sign_in(&b, &console.token).await;
    search_shows_attempts_as_text(&b).await;
    pause_and_resume(&b, &app, &origin(&rx)).await;
    replay_and_purge(&b, &app, &rx).await;
    b.click("header form[action='/logout'] button").await;
    assert_eq!(b.wait_path("/login").await, "/login", "signed out");
    b.goto("/endpoints").await;
    assert_eq!(b.path().await, "/login", "a page needs a session again");
    b.close().await;
    console.stop().await;
}

/// The sign-in form; the overview after it.
async fn sign_in(b: &Browser, token: &str) {
    b.goto("/").await;
    assert_eq!(b.path().await, "/login", "no session: the sign-in form");
    b.fill("#token", "not-the-token").await;
    b.click("form.login button").await;
    assert!(b
        .text("p.error")
        .await
        .contains("not one this console takes"));
    b.fill("#token", token).await;
    b.click("form.login button").await;
    assert_eq!(b.wait_path("/").await, "/");
    assert!(b.wait_for("#chart", Duration::from_secs(5)).await);
    let cookie = b.eval("return document.cookie").await;
    assert_eq!(cookie, json!(""), "the session cookie is HttpOnly");
    b.screenshot("overview").await;
    b.assert_no_severe("overview").await;
}

/// An id typed into the search opens its page: each attempt's status and
/// body, the receiver's markup shown as text and never run.
async fn search_shows_attempts_as_text(b: &Browser) {
    b.fill("input[name=q]", "ok-1").await;
    b.click("header form[role=search] button").await;
    assert_eq!(
        b.wait_path("/notifications/ok%2D1").await,
        "/notifications/ok%2D1"
    );
    assert_eq!(b.text("#notification-id").await, "ok-1");
    assert_eq!(b.texts("tr.attempt td.status").await, ["200"]);
    assert_eq!(
        b.text("tr.attempt td.response pre").await,
        HOSTILE,
        "shown as text"
    );
    assert_eq!(
        b.eval("return window.pwned === undefined").await,
        json!(true)
    );
    assert_eq!(
        b.eval("return document.querySelectorAll('main b').length")
            .await,
        json!(0)
    );
    b.screenshot("notification").await;
    b.assert_no_severe("notification").await;
    b.goto("/notifications/bad-0").await;
    assert_eq!(b.texts("tr.attempt td.status").await, ["500", "500"]);
    assert!(
        b.wait_for("form#replay", Duration::from_secs(1)).await,
        "a dead one offers a replay"
    );
    b.screenshot("notification-dead").await;
    b.assert_no_severe("notification-dead").await;
}

/// Pause and resume on the endpoints page; both as `redeliver endpoint show` sees them.
async fn pause_and_resume(b: &Browser, app: &TestApp, origin: &str) {
    let row = format!("tr[data-endpoint='{origin}']");
    assert!(
        wait_page(b, "/endpoints", &row, Duration::from_secs(30)).await,
        "the receiver's row"
    );
    b.screenshot("endpoints").await;
    b.fill(&format!("{row} input[name=reason]"), "maintenance <window>")
        .await;
    b.fill(&format!("{row} input[name=for]"), "1h").await;
    b.click(&format!("{row} form[data-api$=pause] button"))
        .await;
    assert!(
        b.wait_for(
            &format!("{row} form[data-api$=resume]"),
            Duration::from_secs(10)
        )
        .await,
        "the page shows it paused"
    );
    let v = show(app, origin).expect("endpoint show");
    assert_eq!(v["state"], "paused", "{v}");
    assert_eq!(v["control"]["reason"], "maintenance <window>");
    assert!(b
        .text(&format!("{row} td.endpoint-state"))
        .await
        .contains("paused"));
    b.screenshot("endpoints-paused").await;
    b.goto(&format!("/endpoints/{}", urlencode(origin))).await;
    b.screenshot("endpoint").await;
    b.assert_no_severe("endpoint").await;
    b.goto("/endpoints").await;
    b.click(&format!("{row} form[data-api$=resume] button"))
        .await;
    assert!(
        b.wait_for(
            &format!("{row} form[data-api$=pause]"),
            Duration::from_secs(10)
        )
        .await,
        "the page shows it active"
    );
    assert_eq!(show(app, origin).expect("endpoint show")["state"], "active");
    b.assert_no_severe("endpoints").await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|c| match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (c as char).to_string(),
            _ => format!("%{c:02X}"),
        })
        .collect()
}

/// The three dead letters replayed by clicking (the receiver gets them
/// again), and, once dead again, purged after the confirmation.
async fn replay_and_purge(b: &Browser, app: &TestApp, rx: &Receiver) {
    assert!(
        wait_page(
            b,
            "/dead-letters",
            "tr[data-id='bad-2']",
            Duration::from_secs(30)
        )
        .await
    );
    assert_eq!(b.texts("#dead-letters tbody tr").await.len(), 3);
    b.screenshot("dead-letters").await;
    let before = rx.count();
    b.click("#select-page").await;
    b.click("form#replay button").await;
    assert!(
        b.wait_for("#replays .replay[data-state=done]", Duration::from_secs(20))
            .await,
        "progress shown"
    );
    assert!(
        wait_until(Duration::from_secs(30), || rx.count() >= before + 3 * 2).await,
        "the receiver got them again: {} new requests",
        rx.count() - before
    );
    b.goto("/dead-letters").await;
    assert!(
        b.text("#replays").await.contains("replayed 3"),
        "progress survives a reload"
    );
    b.assert_no_severe("dead-letters").await;
    // Dead again (two more 500s each): purge them all.
    assert!(
        wait_until_async(Duration::from_secs(30), async || app
            .queue_len("dead")
            .await
            == 3)
        .await,
        "dead again"
    );
    assert!(
        wait_page(
            b,
            "/dead-letters",
            "tr[data-id='bad-2']",
            Duration::from_secs(30)
        )
        .await
    );
    b.click("#purge-open").await;
    b.click("#purge input[name=all]").await;
    b.screenshot("dead-letters-purge").await;
    b.click("#purge-now").await;
    assert!(
        wait_until_async(Duration::from_secs(15), async || app
            .queue_len("dead")
            .await
            == 0)
        .await,
        "purged"
    );
    b.assert_no_severe("dead-letters purge").await;
}
