//! The harness itself: a test that fails leaves nothing on the broker
//! (dropping its `TestApp` stops its workers and deletes its prefix, the
//! cascade's 120 queues included).

#[macro_use]
mod common;

use common::harness::schedule_settings;
use common::TestApp;
use redeliver::delay::DelayBackend;

async fn a_failing_test_leaves_nothing_behind(backend: DelayBackend) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let failed = tokio::spawn(async move {
        let app = TestApp::new("fails", backend);
        app.delete_on_drop(&[&app.name("extra-q")], &[]);
        let _w = app.spawn_worker(schedule_settings("1s", 3, 4));
        let _h = app.spawn_holder();
        assert!(app.wait_consumers("work").await, "the worker consumes");
        // Every async method is usable in a spawned task (`Send`).
        app.publish(&["{\"url\": \"http://127.0.0.1:9/\"}"]).await;
        app.publish_raw(b"x", None).await;
        app.publish_to_queue("dead", &[]).await;
        let _ = app.wait_dead(0).await;
        assert_eq!(app.drain_queue("nothing").await.len(), 0);
        let _ = app.queue_len("dead").await;
        declare_extra_queue(&app).await;
        let _ = tx.send((app.broker(), app.url.clone()));
        panic!("a failing assertion (expected: this test checks the clean-up after it)");
    })
    .await;
    assert!(failed.is_err_and(|e| e.is_panic()), "the inner test failed");
    let (b, url) = rx.await.expect("the inner test got as far as its topology");
    let left = redeliver::ops::status::status(&b, None).await.unwrap();
    assert!(
        !left.work.exists && !left.dead.exists && left.cascade.is_empty(),
        "queues left behind: {left:?}"
    );
    let conn = common::connect(&url).await;
    let ch = conn.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let extra = format!("{}.extra-q", b.prefix);
    let q = ch.queue_declare(extra.as_str().into(), passive, Default::default());
    assert!(q.await.is_err(), "{extra} was deleted too");
    let _ = conn.close(200, "".into()).await;
}

async fn declare_extra_queue(app: &TestApp) {
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.unwrap();
    let name = app.name("extra-q");
    let declared = ch.queue_declare(name.as_str().into(), Default::default(), Default::default());
    declared.await.unwrap();
    let _ = conn.close(200, "".into()).await;
}

both_backends!(a_failing_test_leaves_nothing_behind);
