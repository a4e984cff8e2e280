//! Dead-letter operations through the CLI, against the real broker.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::dead_letters::{assert_unchanged, dead, fixture, now_ms, rabbitmqctl_counts};
use common::harness::*;
use common::process::Proc;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use lapin::types::FieldTable;
use redeliver::delay::DelayBackend;

async fn list_leaves_the_queue_identical(backend: DelayBackend) {
    let app = TestApp::new("list", backend);
    let items = fixture("http://127.0.0.1:9");
    app.publish_to_queue("dead", &items).await;
    let table = stdout(&app.cli(&["dlq", "list"]));
    assert_eq!(table.lines().count(), 5, "{table}");
    assert!(table.lines().nth(1).unwrap().starts_with("a "));
    assert!(table.contains("permanent-status"));
    let json = stdout(&app.cli(&["dlq", "list", "--json", "--limit", "2"]));
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["dead_letter"]["reason"], "max-attempts");
    assert_eq!(rows[1]["dead_letter"]["headers"]["x-custom"], "b");
    let shown = stdout(&app.cli(&["dlq", "show", "b"]));
    let doc: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(doc["id"], "b");
    assert_eq!(doc["notification"]["body"]["n"], "b", "the body, as JSON");
    assert!(
        shown.contains("\n  \"notification\": {\n"),
        "pretty-printed: {shown}"
    );
    assert_eq!(doc["dead_letter"]["reason"], "permanent-status");
    assert_eq!(doc["dead_letter"]["last_status"], 500);
    assert_eq!(doc["dead_letter"]["headers"]["x-custom"], "b");
    assert_eq!(doc["dead_letter"]["history"][0]["status"], 500);
    let missing = app.cli(&["dlq", "show", "nope"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no dead letter with id \"nope\""));
    let after = app.drain_dead().await;
    // The quorum dead-letter queue counts each return of a walk.
    for got in &after {
        let counted = got.headers.inner().contains_key("x-delivery-count");
        assert!(counted, "a quorum queue");
    }
    assert_unchanged(&after, &items);
}

async fn filters_select_correctly(backend: DelayBackend) {
    let app = TestApp::new("filter", backend);
    app.publish_to_queue("dead", &fixture("http://127.0.0.1:9"))
        .await;
    let ids = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["dlq", "list", "--json"];
        a.extend_from_slice(args);
        stdout(&app.cli(&a))
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(ids(&["--reason", "max-attempts"]), ["a", "c"]);
    assert_eq!(ids(&["--url-contains", "/shop/"]), ["a", "c", "d"]);
    assert_eq!(ids(&["--since", "1h"]), ["a", "b", "d"]);
    assert_eq!(
        ids(&[
            "--since",
            "1h",
            "--url-contains",
            "shop",
            "--reason",
            "invalid"
        ]),
        ["d"]
    );
    assert_eq!(ids(&["--limit", "3"]), ["a", "b", "c"]);
    // Without --yes: counts, changes nothing, and fails (exit 1), so
    // `dlq purge && ...` in a script does not go on as if it purged.
    let refused = app.cli(&["dlq", "purge", "--reason", "max-attempts"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let out = String::from_utf8_lossy(&refused.stdout);
    assert!(out.contains("2 dead letter(s) would be purged"), "{out}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(
        app.queue_len("dead").await,
        4,
        "purge without --yes changes nothing"
    );
    let out = stdout(&app.cli(&["dlq", "purge", "--yes", "--reason", "max-attempts"]));
    assert!(out.contains("purged 2"), "{out}");
    assert_eq!(ids(&[]), ["b", "d"]);
}

async fn replay_one_then_all_delivers_and_removes(backend: DelayBackend) {
    let app = TestApp::new("replay", backend);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    app.publish_to_queue("dead", &fixture(&rx.base)).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    let dry = stdout(&app.cli(&["dlq", "replay", "--all", "--dry-run"]));
    assert!(dry.contains("4 would be replayed"), "{dry}");
    assert!(
        app.cli(&["dlq", "replay"]).status.code() == Some(1),
        "nothing selected is an error"
    );

    let out = stdout(&app.cli(&["dlq", "replay", "b"]));
    assert!(out.contains("replayed 1"), "{out}");
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    let r = &rx.requests()[0];
    assert_eq!(r.id(), "b");
    assert_eq!(
        r.header("redeliver-attempt").as_deref(),
        Some("1"),
        "a fresh attempt counter"
    );
    assert_eq!(app.queue_len("dead").await, 3, "only that one removed");

    let out = stdout(&app.cli(&["dlq", "replay", "--all"]));
    assert!(out.contains("replayed 3"), "{out}");
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 4).await);
    assert_quiet_for(Duration::from_millis(300), "requests", || rx.count()).await;
    w.stop().await;
    let ids: HashSet<String> = rx.requests().iter().map(|r| r.id()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"].map(String::from).into());
    assert_eq!(app.queue_len("dead").await, 0);
}

async fn export_then_publish_file_round_trips(backend: DelayBackend) {
    let app = TestApp::new("export", backend);
    let items = fixture("http://127.0.0.1:9");
    app.publish_to_queue("dead", &items).await;
    let file = std::env::temp_dir().join(format!("{}.jsonl", app.prefix));
    let path = file.to_str().unwrap();
    let o = app.cli(&["dlq", "export", "--json", "--out", path]);
    assert!(o.status.success());
    assert_eq!(app.queue_len("dead").await, 4, "export is non-destructive");
    let ids = stdout(&app.cli(&["publish", "--file", path]));
    assert_eq!(ids.lines().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    // The re-imported notifications are the originals, field for field.
    let work = app.drain_queue("work").await;
    assert_eq!(work.len(), items.len(), "every one re-imported");
    for (m, (body, _)) in work.iter().zip(&items) {
        let want: serde_json::Value = serde_json::from_slice(body).unwrap();
        let mut got: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        got.as_object_mut().unwrap().remove("dead_letter");
        assert_eq!(got, want);
    }
    let _ = std::fs::remove_file(&file);
}

/// On the test node, whose rabbitmqctl and management API it compares with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_match_the_broker() {
    let app = TestApp::new("status", DelayBackend::Plugin);
    app.publish_to_queue("dead", &fixture("http://127.0.0.1:9"))
        .await;
    let work: Vec<_> = (0..3)
        .map(|i| {
            (
                format!(r#"{{"url":"http://127.0.0.1:9/{i}"}}"#).into_bytes(),
                FieldTable::default(),
            )
        })
        .collect();
    app.publish_to_queue("work", &work).await;
    // Hold one work message unacked with a consumer of our own.
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(1, Default::default()).await.unwrap();
    let _consumer = ch
        .basic_consume(
            app.name("work.0").as_str().into(),
            "".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // The broker's own view (rabbitmqctl); its statistics lag by up to the
    // collection interval, so poll until it shows the state we built.
    let mut broker = vec![];
    let queues = [app.name("work.0"), app.name("dead")];
    poll_every(
        Duration::from_millis(500),
        Duration::from_secs(60),
        async || {
            broker = rabbitmqctl_counts(&queues);
            broker == [[2, 1, 1], [4, 0, 0]]
        },
    )
    .await;
    assert_eq!(
        broker[0],
        [2, 1, 1],
        "rabbitmqctl: work ready, unacked, consumers"
    );
    assert_eq!(
        broker[1],
        [4, 0, 0],
        "rabbitmqctl: dead ready, unacked, consumers"
    );
    // The management API samples on its own interval too.
    let mgmt = common::ctl(common::default_port(), &["management-url"]);
    let mut s = serde_json::Value::Null;
    poll_every(
        Duration::from_millis(500),
        Duration::from_secs(30),
        async || {
            let out = stdout(&app.cli(&["status", "--json", "--management-url", &mgmt]));
            s = serde_json::from_str(&out).unwrap();
            s["work"]["unacked"] == 1
        },
    )
    .await;
    assert_eq!(s["work"]["ready"], 2);
    assert_eq!(s["work"]["unacked"], 1);
    // A producer declares lane 0 alone (the workers the others), where our
    // consumer is: the lanes' sum counts the consumers of every lane.
    assert_eq!(s["lanes"]["lanes"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(s["lanes"]["lanes"][0]["consumers"], 1);
    assert_eq!(s["work"]["consumers"], 1);
    assert_eq!(s["dead"]["ready"], 4);
    assert_eq!(s["dead"]["consumers"], 0);
    assert_eq!(s["retry_exchange_type_available"], true);
    let text = stdout(&app.cli(&["status"]));
    assert!(
        text.contains("ready 2") && text.contains("consumers 1") && text.contains("unacked ?"),
        "{text}"
    );
    let _ = conn.close(200, "".into()).await;
    let on_plain = app
        .command_via(&common::plain_broker_url())
        .arg("status")
        .output();
    let plain = stdout(&on_plain.expect("run redeliver"));
    assert!(plain.contains("MISSING"), "{plain}");
}

async fn killing_replay_midway_loses_nothing(backend: DelayBackend) {
    let app = TestApp::new("killreplay", backend);
    let items: Vec<_> = (0..3000)
        .map(|i| {
            dead(
                &format!("k{i}"),
                "http://127.0.0.1:9/",
                "max-attempts",
                now_ms(),
            )
        })
        .collect();
    app.publish_to_queue("dead", &items).await;
    let mut replay = app.command();
    replay.args(["dlq", "replay", "--all"]);
    let mut child = Proc::spawn(replay);
    // Kill it once it has replayed some but not all. With no worker to
    // lay the lanes, the replays wait in lane 0: poll that one queue (the
    // sum over every lane took long enough for the replay to finish).
    let some = async || app.queue_len("work.0").await >= 200;
    poll_every(Duration::from_millis(5), Duration::from_secs(10), some).await;
    child.kill();
    let in_work = app.queue_len("work").await;
    // What the killed replay had taken but not acked goes back to the
    // dead-letter queue once the broker sees its connection gone: drain
    // both queues until every id has turned up (or is missing for good).
    let (mut seen, mut dead_left) = (HashSet::new(), 0);
    wait_until_async(Duration::from_secs(10), async || {
        let dead = app.drain_dead().await;
        dead_left += dead.len();
        seen.extend(dead.iter().map(|d| d.str("x-custom").unwrap()));
        for m in app.drain_queue("work").await {
            let v: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
            seen.insert(v["id"].as_str().unwrap().to_string());
        }
        seen.len() == 3000
    })
    .await;
    println!(
        "killed replay: {in_work} in the work queue, {dead_left} still dead, {} distinct of 3000",
        seen.len()
    );
    assert!(in_work > 0 && dead_left > 0, "the kill landed mid-way");
    assert_eq!(seen.len(), 3000, "none missing");
}

async fn demo_runs_to_completion_and_cleans_up(backend: DelayBackend) {
    let app = TestApp::new("demo", backend);
    let started = std::time::Instant::now();
    let o = app.cli(&["demo"]);
    let out = stdout(&o);
    println!("{out}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "demo took {:?}",
        started.elapsed()
    );
    assert!(out.contains("published 20 notifications"));
    assert!(
        out.contains("retry in 1s")
            && out.contains("DEAD (permanent-status)")
            && out.contains("DEAD (max-attempts)")
    );
    assert!(out.contains("timed out after 1s"), "some requests time out");
    assert!(out.contains("What happened: 20 notifications"));
    let waited = match backend {
        DelayBackend::Plugin => "with an x-delay from the schedule",
        DelayBackend::Cascade => "into the delay cascade",
    };
    assert!(out.contains(waited), "the summary names how retries waited");
    let table: Vec<_> = out
        .lines()
        .skip_while(|l| !l.starts_with("ID "))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(table.len(), 4, "two 410s and two exhausted: {table:?}");
    let demo_prefix = out
        .split("prefix ")
        .nth(1)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_string();
    assert!(demo_prefix.starts_with(&app.prefix), "{demo_prefix}");
    // Every queue of the demo's prefix is gone, the cascade's included.
    let demo = redeliver::BrokerSettings {
        prefix: demo_prefix,
        ..app.broker()
    };
    let left = redeliver::ops::status::status(&demo, None).await.unwrap();
    assert!(
        !left.work.exists && !left.dead.exists && left.cascade.is_empty(),
        "demo queues deleted: {left:?}"
    );
}

/// An id-less producer's notification keeps a stable id through export and
/// re-import; an invalid dead letter is skipped on re-import, not fatal.
async fn export_keeps_ids_of_idless_producers_and_skips_invalid_ones(backend: DelayBackend) {
    let app = TestApp::new("idless", backend);
    let body = br#"{"url":"http://127.0.0.1:9/x"}"#.to_vec();
    let derived = redeliver::message::derived_id(&body);
    let items = vec![
        (body, FieldTable::default()),
        (b"not json".to_vec(), FieldTable::default()),
    ];
    app.publish_to_queue("dead", &items).await;
    let listed = stdout(&app.cli(&["dlq", "list", "--json"]));
    assert!(listed.contains(&derived), "{listed}");
    let file = std::env::temp_dir().join(format!("{}.jsonl", app.prefix));
    let path = file.to_str().unwrap();
    assert!(app.cli(&["dlq", "export", "--out", path]).status.success());
    let out = app.cli(&["publish", "--file", path]);
    assert_eq!(
        stdout(&out).trim(),
        derived,
        "the same id, so receivers still deduplicate"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped"));
    let _ = std::fs::remove_file(&file);
}

both_backends!(
    demo_runs_to_completion_and_cleans_up,
    list_leaves_the_queue_identical,
    filters_select_correctly,
    replay_one_then_all_delivers_and_removes,
    export_then_publish_file_round_trips,
    killing_replay_midway_loses_nothing,
    export_keeps_ids_of_idless_producers_and_skips_invalid_ones,
);
