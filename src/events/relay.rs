//! `--events-url`: events become notifications. A worker given an events
//! URL binds a queue of the prefix's, `<prefix>.events-url`, to
//! `<prefix>.events` for the types asked for (`--events-types`), consumes
//! it and publishes each event to the intake as a notification to the
//! URL, whose id is the event's (its `webhook-id`), marked with
//! [`super::H_EVENT`]. It acks an event only once that publish is
//! confirmed, so an event is never lost between the two.
//!
//! Every event (a command's included) thus reaches the URL through one
//! path, once per prefix however many workers relay. Give every worker of
//! a prefix the same `--events-url` and `--events-types`: they share the
//! queue, and each relays only the types it was given (the others are
//! acked and dropped).

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use url::Url;

use super::{properties, H_EVENT};
use crate::config::EventSettings;
use crate::message::target::Target;
use crate::publish::Publisher;
use crate::topology::Topology;

/// Events relayed at once: each waits for its publish's confirm.
const PREFETCH: u16 = 64;
/// A relay queue nobody consumed for this long is deleted by the broker:
/// a prefix whose workers lost `--events-url` does not pile events up.
const UNUSED_FOR: Duration = Duration::from_secs(7 * 86_400);
/// After a failed publish, it is tried again after this, doubling up to
/// 30 s.
const BACKOFF: Duration = Duration::from_secs(1);

/// The queue's name.
pub fn queue(t: &Topology) -> String {
    t.events_relay()
}

/// The topic binding keys for `--events-types` (all: `#`).
pub fn binding_keys(types: &[String]) -> Vec<String> {
    if types.is_empty() || types.iter().any(|t| t == "*") {
        return vec!["#".into()];
    }
    types.to_vec()
}

/// Declares and binds the queue and starts relaying until `stop`. The
/// token returned is cancelled if the relay ends before that (its channel
/// closed): the session then reconnects. Nothing without an events URL.
pub async fn start(
    conn: &Connection,
    events: &super::Emitter,
    stop: CancellationToken,
) -> Result<CancellationToken, lapin::Error> {
    let failed = CancellationToken::new();
    let (t, settings) = (&events.topology, &*events.settings);
    let Some(url) = settings.url.clone() else {
        return Ok(failed);
    };
    let ch = conn.create_channel().await?;
    declare(&ch, t, &settings.types).await?;
    // Prefetch: events relayed at once, each waiting for its confirm.
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    let consumer = ch
        .basic_consume(
            queue(t).as_str().into(),
            // An empty tag: the broker names the consumer.
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let relay = Relay {
        url,
        settings: settings.clone(),
        intake: t.intake.clone(),
        publisher: events.publisher.clone(),
    };
    let f = failed.clone();
    tokio::spawn(async move {
        relay.run(ch, consumer, stop.clone()).await;
        if !stop.is_cancelled() {
            f.cancel();
        }
    });
    Ok(failed)
}

async fn declare(ch: &Channel, t: &Topology, types: &[String]) -> Result<(), lapin::Error> {
    let mut args = FieldTable::default();
    // Quorum: replicated, and confirmed only once on disk.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    // x-expires: deleted once unused (no consumer) this long.
    args.insert(
        "x-expires".into(),
        AMQPValue::LongLongInt(UNUSED_FOR.as_millis() as i64),
    );
    // x-delivery-limit: RabbitMQ 4.x drops a quorum queue's message
    // returned 20 times by default; an event must not be lost for being
    // returned (a worker's crash, a relay that stops) too often.
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(1_000_000));
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let q = queue(t);
    ch.queue_declare(q.as_str().into(), durable, args).await?;
    for key in binding_keys(types) {
        let (x, opts) = (t.events.as_str(), QueueBindOptions::default());
        ch.queue_bind(
            q.as_str().into(),
            x.into(),
            key.as_str().into(),
            opts,
            FieldTable::default(),
        )
        .await?;
    }
    Ok(())
}

struct Relay {
    url: Url,
    settings: EventSettings,
    intake: String,
    publisher: Publisher,
}

/// What the relay reads of an event.
#[derive(Deserialize)]
struct Head {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: Option<HeadData>,
}

#[derive(Deserialize)]
struct HeadData {
    endpoint: Option<String>,
}

impl Relay {
    async fn run(self, ch: Channel, mut consumer: lapin::Consumer, stop: CancellationToken) {
        let tasks = tokio_util::task::TaskTracker::new();
        let relay = std::sync::Arc::new(self);
        loop {
            let d = tokio::select! {
                _ = stop.cancelled() => break,
                d = consumer.next() => d,
            };
            let Some(Ok(d)) = d else {
                if !stop.is_cancelled() {
                    warn!("the events-url relay stopped (its channel closed)");
                }
                break;
            };
            let (r, stop) = (relay.clone(), stop.clone());
            tasks.spawn(async move { r.one(d, stop).await });
        }
        tasks.close();
        tasks.wait().await;
        let _ = ch.close(200, "relay done".into()).await;
    }

    /// Relays one event (or drops what is not one, or not for the URL),
    /// then acks it. A publish that fails is tried again, here, until it
    /// works or the session stops (the event then goes back to the queue
    /// with the channel): never nacked, so never counted as returned.
    async fn one(&self, d: Delivery, stop: CancellationToken) {
        if let Some((n, id, kind)) = self.notification(&d.data) {
            let mut h = FieldTable::default();
            h.insert(H_EVENT.into(), AMQPValue::LongString(kind.as_str().into()));
            let props = properties(&id, &kind, h);
            let mut wait = BACKOFF;
            // The bucket key of its URL picks its lane.
            let key = crate::topology::lanes::key_of_payload(&n);
            // Mandatory: an intake routed nowhere is an error.
            let publish = || {
                self.publisher
                    .confirmed(&self.intake, &key, true, &n, props.clone())
            };
            while let Err(e) = publish().await {
                warn!(error = %e, retry_in = ?wait, "an event was not relayed to the events URL; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return,
                }
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
        let _ = d.ack(BasicAckOptions::default()).await;
    }

    /// The notification for an event, with its id and type; `None` for
    /// what is not an event, a type not asked for, or an event about the
    /// events URL's own endpoint.
    fn notification(&self, payload: &[u8]) -> Option<(Vec<u8>, String, String)> {
        let head: Head = serde_json::from_slice(payload).ok()?;
        // By name, not by this build's types: a newer build's event is
        // relayed as well.
        if !self.settings.name_to_url(&head.kind) {
            return None;
        }
        let endpoint = head.data.and_then(|d| d.endpoint);
        if head.kind.starts_with("endpoint.")
            && endpoint.is_some_and(|e| Target::parse(&e).is_ok_and(|t| t.matches(&self.url)))
        {
            return None;
        }
        let body = RawValue::from_string(String::from_utf8(payload.to_vec()).ok()?).ok()?;
        let n =
            serde_json::json!({ "v": 1, "id": head.id, "url": self.url.as_str(), "body": body });
        Some((serde_json::to_vec(&n).ok()?, head.id, head.kind))
    }
}
