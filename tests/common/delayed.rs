//! Helpers for the contract tests of the `x-delayed-message` exchange type
//! of the test broker (tests/broker/plugin), driven through lapin with
//! publisher confirms.
//!
//! Timing-sensitive tests share `LOAD`; load-heavy phases (the 10k test,
//! starting, restarting or stopping a private node) take it exclusively so
//! they do not skew measured lateness on a small machine.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind, PublisherConfirm};
use tokio::sync::{mpsc, RwLock};
use tokio::time::timeout;

pub static LOAD: RwLock<()> = RwLock::const_new(());

pub const DELAYED: &str = "x-delayed-message";

#[derive(Clone, Copy)]
pub enum QueueKind {
    Quorum,
    Classic,
}

pub fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(k.into(), v);
    }
    t
}

pub fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

pub fn delayed_type(t: &str) -> FieldTable {
    table(vec![("x-delayed-type", long_str(t))])
}

pub fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Persistent message properties with `id` as message_id and an optional x-delay.
pub fn props(id: &str, delay: Option<AMQPValue>) -> BasicProperties {
    let p = BasicProperties::default().with_message_id(id.into());
    let p = p.with_delivery_mode(2);
    match delay {
        Some(d) => p.with_headers(table(vec![("x-delay", d)])),
        None => p,
    }
}

/// `props` with an integer x-delay of `delay`.
pub fn delayed(id: &str, delay: Duration) -> BasicProperties {
    props(id, Some(AMQPValue::LongInt(delay.as_millis() as i32)))
}

pub fn id_of(d: &Delivery) -> String {
    let id = d.properties.message_id().as_ref();
    id.map(ToString::to_string).unwrap_or_default()
}

/// A channel with publisher confirms enabled.
pub async fn open_channel(conn: &Connection) -> Channel {
    let ch = conn.create_channel().await.expect("create_channel");
    let opts = ConfirmSelectOptions::default();
    ch.confirm_select(opts).await.expect("confirm_select");
    ch
}

pub async fn declare_delayed(ch: &Channel, name: &str, args: FieldTable) -> lapin::Result<()> {
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let kind = ExchangeKind::Custom(DELAYED.into());
    ch.exchange_declare(name.into(), kind, opts, args).await
}

/// Declares a durable queue of `kind` bound to `exchange` with `key`.
pub async fn bound_queue(ch: &Channel, name: &str, kind: QueueKind, exchange: &str, key: &str) {
    let args = match kind {
        QueueKind::Quorum => table(vec![("x-queue-type", long_str("quorum"))]),
        QueueKind::Classic => FieldTable::default(),
    };
    let opts = QueueDeclareOptions::durable();
    let declared = ch.queue_declare(name.into(), opts, args).await;
    declared.expect("queue_declare");
    let (opts, args) = (QueueBindOptions::default(), FieldTable::default());
    let bound = ch.queue_bind(name.into(), exchange.into(), key.into(), opts, args);
    bound.await.expect("queue_bind");
}

pub async fn teardown(ch: &Channel, exchanges: &[&str], queues: &[&str]) {
    for q in queues {
        let deleted = ch.queue_delete((*q).into(), QueueDeleteOptions::default());
        deleted.await.expect("queue_delete");
    }
    for x in exchanges {
        let deleted = ch.exchange_delete((*x).into(), ExchangeDeleteOptions::default());
        deleted.await.expect("exchange_delete");
    }
}

pub async fn acked(confirm: PublisherConfirm) {
    let confirmation = confirm.await.expect("publisher confirm");
    assert!(confirmation.is_ack(), "not acked: {confirmation:?}");
}

/// Where messages are published: an exchange and a routing key on a confirm channel.
#[derive(Clone)]
pub struct Target {
    pub ch: Channel,
    pub exchange: String,
    pub key: String,
}

impl Target {
    /// Publishes (never mandatory) and returns the pending publisher confirm.
    pub async fn send(&self, body: &[u8], p: BasicProperties) -> PublisherConfirm {
        let (x, key) = (self.exchange.as_str(), self.key.as_str());
        let opts = BasicPublishOptions::default();
        let sent = self.ch.basic_publish(x.into(), key.into(), opts, body, p);
        sent.await.expect("basic_publish")
    }

    /// Publishes with body = message id, waits for the ack, and returns the
    /// instant taken just before the publish.
    pub async fn publish(&self, p: BasicProperties) -> Instant {
        let body = p.message_id().clone().unwrap_or_default();
        let at = Instant::now();
        acked(self.send(body.as_str().as_bytes(), p).await).await;
        at
    }
}

/// Deliveries of one consumer, each stamped with its arrival instant (and acked).
pub struct Inbox(pub mpsc::UnboundedReceiver<(Delivery, Instant)>);

/// Consumes `queue` with a prefetch of 1000, acking each delivery.
pub async fn consume(ch: &Channel, queue: &str) -> Inbox {
    let qos = ch.basic_qos(1000, BasicQosOptions::default()).await;
    qos.expect("basic_qos");
    let (opts, args) = (BasicConsumeOptions::default(), FieldTable::default());
    let consumer = ch.basic_consume(queue.into(), "".into(), opts, args).await;
    let mut consumer = consumer.expect("basic_consume");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let at = Instant::now();
            let acked = delivery.ack(BasicAckOptions::default()).await.is_ok();
            if !acked || tx.send((delivery, at)).is_err() {
                break;
            }
        }
    });
    Inbox(rx)
}

impl Inbox {
    pub async fn next(&mut self, within: Duration, what: &str) -> (Delivery, Instant) {
        let Ok(Some(d)) = timeout(within, self.0.recv()).await else {
            panic!("{what} did not arrive within {within:?}");
        };
        d
    }

    /// Receives until `n` distinct message ids have arrived; returns every
    /// arrival (duplicates included) as (message id, instant) in arrival order.
    pub async fn collect(&mut self, n: usize, within: Duration) -> Vec<(String, Instant)> {
        match self.try_collect(n, within).await {
            Ok(all) => all,
            Err(seen) => panic!("only {seen} of {n} arrived within {within:?}"),
        }
    }

    /// [`Inbox::collect`], or how many distinct ids arrived in time.
    pub async fn try_collect(
        &mut self,
        n: usize,
        within: Duration,
    ) -> Result<Vec<(String, Instant)>, usize> {
        let deadline = Instant::now() + within;
        let (mut all, mut seen) = (Vec::new(), HashSet::new());
        while seen.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some((d, at))) = timeout(left, self.0.recv()).await else {
                return Err(seen.len());
            };
            seen.insert(id_of(&d));
            all.push((id_of(&d), at));
        }
        Ok(all)
    }
}

/// A test's connection, a delayed exchange over `direct` and a durable queue
/// bound to it with routing key = queue name, with a consumer on the queue.
pub struct Route {
    pub conn: Connection,
    pub to: Target,
    pub inbox: Inbox,
}

impl Route {
    /// Declares (or re-declares, after a restart) the route named `name`.
    pub async fn open(url: &str, name: &str, kind: QueueKind) -> Self {
        let conn = super::connect(url).await;
        let ch = open_channel(&conn).await;
        let (exchange, key) = (name.to_string(), format!("{name}-q"));
        let declared = declare_delayed(&ch, &exchange, delayed_type("direct")).await;
        declared.expect("declare exchange");
        bound_queue(&ch, &key, kind, &exchange, &key).await;
        let inbox = consume(&ch, &key).await;
        let to = Target { ch, exchange, key };
        Route { conn, to, inbox }
    }

    /// The route `<prefix>.route` of `app`, on its broker; dropping the
    /// app deletes it too.
    pub async fn of(app: &super::TestApp, kind: QueueKind) -> Self {
        let name = app.name("route");
        app.delete_on_drop(&[&format!("{name}-q")], &[&name]);
        Route::open(&app.url, &name, kind).await
    }

    /// Deletes the exchange and queue and closes the connection.
    pub async fn close(self) {
        let Target { ch, exchange, key } = &self.to;
        teardown(ch, &[exchange], &[key]).await;
        let closed = self.conn.close(200, "done".into()).await;
        closed.expect("close connection");
    }
}

/// Sorted lateness (`arrival - due`, zero when early) and the ids that came early.
pub fn lateness(
    arrivals: &[(String, Instant)],
    dues: &HashMap<String, Instant>,
) -> (Vec<Duration>, Vec<String>) {
    let early = arrivals.iter().filter(|(id, at)| *at < dues[id]);
    let early = early.map(|(id, _)| id.clone()).collect();
    let late = arrivals
        .iter()
        .map(|(id, at)| at.saturating_duration_since(dues[id]));
    let mut late: Vec<Duration> = late.collect();
    late.sort();
    (late, early)
}

/// "p50=..ms p99=..ms max=..ms" of sorted durations.
pub fn summary(sorted: &[Duration]) -> String {
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_millis();
    format!("p50={}ms p99={}ms max={}ms", at(0.5), at(0.99), at(1.0))
}

/// A private broker node; stopped when dropped, also when the test fails.
pub struct OwnNode(pub u16);

impl OwnNode {
    /// Starts the node; a node boot loads the machine, so it runs exclusively.
    pub async fn up(port: u16) -> (Self, String) {
        let _exclusive = LOAD.write().await;
        let node = OwnNode(port);
        let url = node.ctl(&["up"]).await;
        (node, url)
    }

    /// `tests/broker/ctl ARGS` for this node, off the async workers. Callers
    /// hold `LOAD` exclusively around the heavy commands.
    pub async fn ctl(&self, args: &[&'static str]) -> String {
        let (port, args) = (self.0, args.to_vec());
        let ran = tokio::task::spawn_blocking(move || super::ctl(port, &args));
        ran.await.expect("ctl task")
    }

    pub async fn down(self) {
        let _exclusive = LOAD.write().await;
        self.ctl(&["down"]).await;
    }
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        // Not super::ctl: a panic while unwinding would abort.
        let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/ctl"))
            .arg("down")
            .env(
                "REDELIVER_TEST_BROKER_PORT",
                super::node_port(self.0).to_string(),
            )
            .output();
    }
}
