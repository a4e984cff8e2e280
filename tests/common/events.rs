//! Operational events from outside: a queue of the test's own bound to
//! `<prefix>.events`, as a user would bind one, and the documented
//! schema's checks (docs/operations.md, "Operational events").

use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::Value;

use super::app::TestApp;

/// A queue `<prefix>.<suffix>` bound to the events exchange, and what it
/// has given so far.
pub struct Sink {
    queue: String,
    pub seen: Vec<Value>,
}

impl Sink {
    /// Declares the exchange (as a worker would), the queue, and binds it
    /// with `keys`; the queue goes when the app is dropped.
    pub async fn bind(app: &TestApp, suffix: &str, keys: &[&str]) -> Sink {
        let queue = app.name(suffix);
        app.delete_on_drop(&[&queue], &[]);
        let conn = app.broker().url.connect("test events").await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let exchange = app.name("events");
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(queue.as_str().into(), q, FieldTable::default())
            .await
            .unwrap();
        for k in keys {
            ch.queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                (*k).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        }
        let _ = conn.close(200, "".into()).await;
        Sink {
            queue,
            seen: vec![],
        }
    }

    /// Takes what has come since.
    pub async fn take(&mut self, app: &TestApp) {
        let got = super::harness::drain_url(&app.url, &self.queue).await;
        for body in got {
            let v: Value = serde_json::from_slice(&body).expect("an event is JSON");
            self.seen.push(v);
        }
    }

    /// Waits up to `within` until `done` holds for what has come.
    pub async fn wait(
        &mut self,
        app: &TestApp,
        within: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + within;
        loop {
            self.take(app).await;
            if done(&self.seen) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The events of `kind`.
    pub fn of(&self, kind: &str) -> Vec<&Value> {
        self.seen.iter().filter(|e| e["type"] == kind).collect()
    }

    /// The events of `kind` about notification `id`.
    pub fn about(&self, kind: &str, id: &str) -> Vec<&Value> {
        self.of(kind)
            .into_iter()
            .filter(|e| e["data"]["notification_id"] == id)
            .collect()
    }
}

/// How many events of `kind` there are.
pub fn count(seen: &[Value], kind: &str) -> usize {
    seen.iter().filter(|e| e["type"] == kind).count()
}

/// Checks an event against the documented schema.
pub fn assert_schema(e: &Value, prefix: &str) {
    assert_eq!(e["v"], 1, "{e:#}");
    assert!(
        e["id"].as_str().is_some_and(|i| i.starts_with("evt_")),
        "{e:#}"
    );
    assert_eq!(e["prefix"], prefix, "{e:#}");
    let time = e["time"].as_str().expect("time");
    assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
    let kind = e["type"].as_str().expect("type");
    let d = &e["data"];
    let fields: &[&str] = match kind.split('.').next() {
        Some("notification") => &[
            "notification_id",
            "webhook_id",
            "endpoint",
            "attempt",
            "status",
            "error",
            "reason",
        ],
        Some("endpoint") => &["endpoint", "by", "automatic", "reason", "until"],
        Some("delay-backend") => &["backend", "since", "lasted_seconds"],
        _ => panic!("unknown type {kind}"),
    };
    for f in fields {
        assert!(d.get(f).is_some(), "{kind}: data.{f} missing: {e:#}");
    }
}
