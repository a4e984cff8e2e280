//! `redeliver publish` as a user runs it: the built binary, real broker.

mod common;

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::harness::*;
use common::receiver::{Receiver, Reply};
use common::TestApp;
use redeliver::delay::DelayBackend;

/// Runs the app's binary with `args`, feeding it `stdin`.
fn redeliver(app: &TestApp, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = app
        .command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redeliver");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_published_and_its_ids_printed() {
    let app = TestApp::new("file", DelayBackend::Plugin);
    let lines = "{\"url\":\"http://127.0.0.1:9/a\",\"id\":\"one\"}\n\n{\"url\":\"http://127.0.0.1:9/b\",\"body\":[1]}\n{\"url\":\"http://127.0.0.1:9/c\"}\n";
    let out = redeliver(&app, &["publish", "--file", "-"], Some(lines));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], "one");
    assert_eq!(app.queue_len("work").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_is_named_and_nothing_is_published() {
    let app = TestApp::new("badline", DelayBackend::Plugin);
    // Declare the topology so the queue can be counted afterwards.
    app.publish(&[] as &[String]).await;
    let lines = "{\"url\":\"http://127.0.0.1:9/a\"}\n{\"url\":\"ftp://nope/\"}\n";
    let out = redeliver(&app, &["publish", "--file", "-"], Some(lines));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("only http and https"), "{stderr}");
    assert_eq!(app.queue_len("work").await, 0);
    let out = redeliver(
        &app,
        &["publish", "--url", "http://x/", "--body", "{not json"],
        None,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid JSON"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_publish_with_flags_and_delay_is_delivered_late() {
    let app = TestApp::new("delay", DelayBackend::Plugin);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let w = app.spawn_worker(schedule_settings("1s", 3, 4));
    assert!(app.wait_consumers("work").await, "the worker consumes");
    let started = Instant::now();
    let target = rx.url("/cb");
    let args = [
        "publish",
        "--url",
        &target,
        "--body",
        r#"{"a": 1}"#,
        "--id",
        "fixed-id",
        "--header",
        "X-One: 1",
        "--method",
        "PUT",
        "--delay",
        "1500ms",
    ];
    let out = redeliver(&app, &args, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "fixed-id");
    assert!(wait_until(Duration::from_secs(10), || rx.count() == 1).await);
    let r = &rx.requests()[0];
    let late = r.at.duration_since(started);
    assert!(
        late >= Duration::from_millis(1500),
        "delivered after {late:?}"
    );
    assert_eq!(r.method, "PUT");
    assert_eq!(r.header("x-one").as_deref(), Some("1"));
    assert_eq!(r.id(), "fixed-id");
    assert_eq!(
        &r.body[..],
        br#"{"a": 1}"#,
        "the --body text is sent as typed"
    );
    w.stop().await;
}

/// A quorum work queue gets a delivery limit it never reaches, instead of
/// RabbitMQ 4.0+'s default of 20, past which a message would be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_queue_has_no_reachable_delivery_limit() {
    let app = TestApp::new("dlimit", DelayBackend::Plugin);
    let o = redeliver(&app, &["publish", "--url", "http://127.0.0.1:9/"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let port = common::default_port();
    let args = ["rabbitmqctl", "-q", "list_queues", "name", "arguments"];
    let queues = common::ctl_output(port, &args);
    // Lane 0, the one a producer declares (the workers declare the
    // others alike), spreads its leader over a cluster's nodes.
    let work = app.name("work.0");
    let line = queues
        .lines()
        .find(|l| l.split_whitespace().next() == Some(work.as_str()));
    let line = line.unwrap_or_else(|| panic!("{work} not listed:\n{queues}"));
    assert!(line.contains("x-delivery-limit"), "{line}");
    assert!(line.contains("1000000"), "{line}");
    assert!(line.contains("least-leaders"), "{line}");
}

/// `--queue-type` matters only when the work queue is first declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_type_is_needed_only_once() {
    let app = TestApp::new("qtype", DelayBackend::Plugin);
    let first = redeliver(
        &app,
        &[
            "--queue-type",
            "classic",
            "publish",
            "--url",
            "http://127.0.0.1:9/",
        ],
        None,
    );
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let later = redeliver(&app, &["publish", "--url", "http://127.0.0.1:9/"], None);
    assert!(
        later.status.success(),
        "{}",
        String::from_utf8_lossy(&later.stderr)
    );
    assert_eq!(app.queue_len("work").await, 2);
}

/// A URL list whose other entries refuse still reaches the broker: every
/// publish lands, whichever entry a run starts at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_list_skips_the_urls_that_refuse() {
    let app = TestApp::new("urllist", DelayBackend::Plugin);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refusing = format!(
        "amqp://u:s3cret@127.0.0.1:{}/%2f",
        dead.local_addr().unwrap().port()
    );
    drop(dead);
    let list = format!("{refusing},{}", app.url);
    for _ in 0..4 {
        let out = app
            .command_via(&list)
            .args(["publish", "--url", "http://127.0.0.1:9/"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        assert!(!all.contains("s3cret"), "{all}");
    }
    assert_eq!(app.queue_len("work").await, 4);
    // Nothing answers at all: the error names every URL, no password.
    let out = app
        .command_via(&format!("{refusing},{refusing}"))
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("s3cret"), "{err}");
    assert!(err.contains("u:***@127.0.0.1"), "{err}");
}

/// A dead-letter queue declared classic by an earlier build is kept:
/// commands go on using it, and `dlq list` reads it, more than one of its
/// windows long, in order, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_dead_letter_queue_from_an_earlier_build_is_kept() {
    let app = TestApp::new("olddlq", DelayBackend::Plugin);
    let conn = common::connect(&app.url).await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = lapin::types::FieldTable::default();
    let s = |v: &str| lapin::types::AMQPValue::LongString(v.into());
    args.insert("x-queue-type".into(), s("classic"));
    args.insert("x-queue-mode".into(), s("lazy"));
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(app.name("dead").as_str().into(), durable, args)
        .await
        .unwrap();
    let out = redeliver(&app, &["publish", "--url", "http://127.0.0.1:9/"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now = common::dead_letters::now_ms();
    let ids: Vec<String> = (0..2_500).map(|i| format!("old-{i:04}")).collect();
    let items: Vec<_> = ids
        .iter()
        .map(|id| common::dead_letters::dead(id, "http://127.0.0.1:9/", "max-attempts", now))
        .collect();
    app.publish_to_queue("dead", &items).await;
    for walk in 0..2 {
        let list = app.cli(&["dlq", "list", "--json"]);
        assert!(
            list.status.success(),
            "{}",
            String::from_utf8_lossy(&list.stderr)
        );
        let listed = common::dead_letters::ids_of(&stdout(&list));
        assert_eq!(listed, ids, "walk {walk}: every dead letter, in order");
    }
    let _ = conn.close(200, "".into()).await;
}
