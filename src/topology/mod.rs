//! Exchanges, queues and bindings under one prefix, declared idempotently
//! by every command that needs them. The work queue is N lanes
//! (`lanes.rs` says which lane a notification takes, `lay.rs` declares
//! them and moves a prefix from one lane count, or the single work queue
//! of earlier builds, to another).

mod declare;
mod error;
pub mod lanes;
mod lay;
mod park;

use declare::declare_exchange;
pub(crate) use error::classify;
pub use error::TopologyError;

pub use lay::Leftover;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};

pub use crate::config::QueueType;

/// The names derived from `--prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub prefix: String,
    /// Fanout exchange producers publish new notifications to.
    pub intake: String,
    /// Delayed exchange failed notifications are republished to.
    pub retry: String,
    /// The single work queue of builds before lanes: no longer bound to
    /// anything, consumed until it is empty, then deleted (`lay.rs`).
    pub work: String,
    /// Lanes, quorum queues `<prefix>.work.<k>`, that the workers consume.
    pub lanes: u16,
    /// Direct exchange routing `bucket.<b>` keys to the lanes, with
    /// [`Topology::lanes_default`] as its alternate exchange.
    pub lanes_exchange: String,
    /// Dead letters with their history.
    pub dead: String,
    /// The stream of endpoint controls and failing clocks every worker
    /// folds (`crate::control`).
    pub endpoint_state: String,
    /// Workers' reports of the endpoints they see, for `endpoint list`.
    pub endpoint_reports: String,
    /// Topic exchange of operational events, routed by their type
    /// (`crate::events`); users bind their own queues.
    pub events: String,
}

impl Topology {
    pub fn new(prefix: &str) -> Self {
        Topology {
            prefix: prefix.to_string(),
            intake: format!("{prefix}.notifications"),
            retry: format!("{prefix}.retry"),
            work: format!("{prefix}.work"),
            lanes: lanes::DEFAULT_LANES,
            lanes_exchange: format!("{prefix}.lanes"),
            dead: format!("{prefix}.dead"),
            endpoint_state: format!("{prefix}.endpoint-state"),
            endpoint_reports: format!("{prefix}.endpoint-reports"),
            events: format!("{prefix}.events"),
        }
    }

    /// The same names with `n` lanes.
    pub fn with_lanes(mut self, n: u16) -> Self {
        self.lanes = n.clamp(1, lanes::BUCKETS);
        self
    }

    /// Lane `k`'s queue.
    pub fn lane(&self, k: u16) -> String {
        format!("{}.work.{k}", self.prefix)
    }

    /// Every lane's queue, lane 0 first.
    pub fn lane_names(&self) -> Vec<String> {
        (0..self.lanes).map(|k| self.lane(k)).collect()
    }

    /// The lanes exchange's alternate: a fanout to lane 0, for routing keys
    /// that are no bucket's (a raw producer's, an old build's).
    pub fn lanes_default(&self) -> String {
        format!("{}.lanes.default", self.prefix)
    }

    /// The `--events-url` relay's queue (`crate::events::relay`).
    pub fn events_relay(&self) -> String {
        format!("{}.events-url", self.prefix)
    }

    /// The queue whose one message says a stall of `backend` was reported
    /// (`crate::events::lease`), so one event goes out per stall.
    pub fn stall_lease(&self, backend: &str) -> String {
        format!("{}.events-stall-{backend}", self.prefix)
    }

    /// Declares the intake, lanes and dead objects, on channels of its own
    /// (a broker-side refusal closes the channel it happened on). `lay`:
    /// lay the lanes' bindings for this topology's lane count even on a
    /// prefix that has lanes (see [`Topology::declare_lanes`]). Returns
    /// whether it laid them.
    pub async fn declare(
        &self,
        conn: &Connection,
        queue_type: QueueType,
        lay: bool,
    ) -> Result<Option<bool>, TopologyError> {
        let ch = &channel(conn, &self.prefix).await?;
        let none = FieldTable::default();
        declare_exchange(ch, &self.intake, ExchangeKind::Fanout, none).await?;
        self.declare_events(ch).await?;
        // An existing dead-letter queue keeps its type and arguments:
        // `--queue-type` only matters the first time, so later commands
        // need not repeat it, and one declared classic by an earlier build
        // is still used (see `dead_args`). Lanes do the same.
        if !exists(conn, &self.dead).await? {
            let q = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(self.dead.as_str().into(), q, dead_args(queue_type))
                .await
                .map_err(|e| classify("queue", &self.dead, e))?;
        }
        let laid = self.declare_lanes(conn, ch, queue_type, lay).await?;
        let _ = ch.close(200, "topology declared".into()).await;
        Ok(laid)
    }

    /// Declares the events exchange (`crate::events`): a topic exchange,
    /// routed by the event's type (`notification.exhausted`, ...), so a
    /// consumer binds only the keys it wants; durable like the intake.
    pub async fn declare_events(&self, ch: &Channel) -> Result<(), TopologyError> {
        declare_exchange(ch, &self.events, ExchangeKind::Topic, FieldTable::default()).await
    }

    /// Deletes the intake, work and dead objects, messages included. Only
    /// through `crate::delay::delete`, which deletes the delay backends'
    /// objects first, so no caller leaves half a prefix behind.
    pub(crate) async fn delete(&self, conn: &Connection) -> Result<(), lapin::Error> {
        let ch = conn.create_channel().await?;
        // The delay backends' objects are `crate::delay::delete`'s.
        // Lanes are numbered from 0 without gaps: delete up to the first
        // missing one.
        for k in 0..lanes::BUCKETS {
            let lane = self.lane(k);
            if !matches!(exists(conn, &lane).await, Ok(true)) {
                break;
            }
            ch.queue_delete(lane.as_str().into(), Default::default())
                .await?;
        }
        // Every lane count's parking queues; deleting a missing queue is
        // no error (and no probe closes a channel).
        for k in 0..lanes::BUCKETS {
            ch.queue_delete(self.park(k).as_str().into(), Default::default())
                .await?;
        }
        for marker in self.laid_markers() {
            ch.exchange_delete(marker.as_str().into(), Default::default())
                .await?;
        }
        for q in [
            &self.work,
            &self.dead,
            &self.endpoint_state,
            &self.endpoint_reports,
            &self.events_relay(),
            &self.stall_lease("plugin"),
            &self.stall_lease("cascade"),
            &crate::history::stream_name(&self.prefix),
        ] {
            ch.queue_delete(q.as_str().into(), Default::default())
                .await?;
        }
        for x in [
            &self.intake,
            &self.lanes_exchange,
            &self.lanes_default(),
            &self.events,
            &crate::history::stream_name(&self.prefix),
        ] {
            ch.exchange_delete(x.as_str().into(), Default::default())
                .await?;
        }
        let _ = ch.close(200, "deleted".into()).await;
        Ok(())
    }

    /// Ready messages in the dead-letter queue (passive declare).
    pub async fn dead_count(&self, ch: &Channel) -> Result<u32, lapin::Error> {
        ready_count(ch, &self.dead).await
    }

    /// Ready messages in the lanes, the backlog (passive declares).
    pub async fn work_count(&self, ch: &Channel) -> Result<u32, lapin::Error> {
        let mut n = 0;
        for lane in self.lane_names() {
            n += ready_count(ch, &lane).await?;
        }
        Ok(n)
    }
}

async fn channel(conn: &Connection, prefix: &str) -> Result<Channel, TopologyError> {
    conn.create_channel()
        .await
        .map_err(|source| TopologyError::Amqp {
            what: "a channel for",
            name: prefix.to_string(),
            source,
        })
}

/// A passive declare on a channel of its own (a missing queue closes it).
async fn exists(conn: &Connection, queue: &str) -> Result<bool, TopologyError> {
    let amqp = |source| TopologyError::Amqp {
        what: "queue",
        name: queue.to_string(),
        source,
    };
    // Bounded: a reply that never comes (a lost channel close, seen with
    // many channels on one connection) must not hang `status` or a start.
    let probe = crate::amqp::bounded(conn.create_channel())
        .await
        .map_err(amqp)?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let found =
        crate::amqp::bounded(probe.queue_declare(queue.into(), passive, FieldTable::default()))
            .await;
    match found {
        Ok(_) => {
            let _ = probe.close(200, "".into()).await;
            Ok(true)
        }
        Err(e) if e.is_amqp_soft_error() => Ok(false),
        Err(e) => Err(amqp(e)),
    }
}

pub(crate) fn work_args(queue_type: QueueType) -> FieldTable {
    let mut a = FieldTable::default();
    // x-queue-type: quorum replicates and fsyncs every enqueue before confirming.
    a.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.as_str().into()),
    );
    if queue_type == QueueType::Quorum {
        // x-delivery-limit: effectively none. RabbitMQ 4.0+ gives quorum
        // queues a default of 20 and drops a message returned more often
        // than that; every worker crash or shutdown returns what it held.
        a.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(WORK_DELIVERY_LIMIT),
        );
    }
    a
}

/// See [`work_args`]: high enough never to be reached.
pub const WORK_DELIVERY_LIMIT: i64 = 1_000_000;

/// The dead-letter queue has the work queue's type. A quorum queue is
/// replicated to the cluster's nodes (every node, on RabbitMQ 3.x), so
/// losing one node, or its disk, loses no dead letter and dead-lettering
/// goes on while it is down. `dlq` walks it without acking and gives
/// every message back in order (`ops::dlq`; `tests/cluster.rs` checks the
/// order on a cluster); quorum queues add an `x-delivery-count` header on
/// the way, which the walk ignores.
pub(crate) fn dead_args(queue_type: QueueType) -> FieldTable {
    match queue_type {
        // Every walk returns each message once, and RabbitMQ 4.0-4.2 counts
        // that as a delivery: without the limit set this high, the 20th
        // `dlq list` would drop every dead letter.
        QueueType::Quorum => work_args(QueueType::Quorum),
        QueueType::Classic => {
            let mut a = work_args(QueueType::Classic);
            // x-queue-mode: lazy keeps a large backlog of dead letters on
            // disk, not in RAM (a quorum queue keeps bodies on disk anyway).
            a.insert("x-queue-mode".into(), AMQPValue::LongString("lazy".into()));
            a
        }
    }
}

/// Ready messages in `queues`, on a channel of its own, counting 0 for one
/// that cannot be read (for reports: `status`, the bench).
pub(crate) async fn ready_total(conn: &Connection, queues: Vec<String>) -> u32 {
    let Ok(ch) = crate::amqp::bounded(conn.create_channel()).await else {
        return 0;
    };
    let mut n = 0;
    for q in queues {
        n += ready_count(&ch, &q).await.unwrap_or(0);
    }
    let _ = ch.close(200, "".into()).await;
    n
}

/// Ready messages of a queue that exists: a passive declare, which
/// closes the channel when it does not.
pub(crate) async fn ready_count(ch: &Channel, queue: &str) -> Result<u32, lapin::Error> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declare = ch.queue_declare(queue.into(), passive, FieldTable::default());
    Ok(crate::amqp::bounded(declare).await?.message_count())
}
