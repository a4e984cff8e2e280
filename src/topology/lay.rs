//! Declares the lanes and lays the bucket bindings (see `lanes.rs`), and
//! finds the queues a change left behind: lanes past a smaller `--lanes`,
//! or the single work queue of builds before lanes.
//!
//! Laying is costly (a binding or unbinding per bucket and lane, each a
//! cluster-wide metadata write), so it is done once per lane count: the
//! exchange `<exchange>.laid-<N>` says the bindings of `<exchange>` are
//! laid for N lanes. A worker with another N lays them again: it binds
//! each bucket to its lane and unbinds it from every other lane that
//! exists. Nothing is lost on the way: a bucket is bound to its new lane
//! before it leaves the old one (a message routed in between reaches both,
//! a duplicate), and a queue left behind is drained by the workers. It is
//! not deleted: a quorum queue refuses `if-empty` and `if-unused` deletes,
//! and without them a worker's delivery still in flight from it (during
//! its shutdown grace, say) could be lost. `status` shows it, empty, for
//! the operator to delete.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};

use super::declare::declare_exchange;
use super::lanes::{bucket_key, relay_plan, BUCKETS, DEFAULT_LANES};
use super::{channel, classify, exists, work_args, QueueType, Topology, TopologyError};

/// A queue no route feeds any more that may still hold notifications.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    pub queue: String,
    /// Ready messages when it was found.
    pub messages: u32,
}

impl Topology {
    /// Declares the lanes exchange, its alternate and lane 0, which takes
    /// every key no binding matches. `lay` (a worker): also the other lanes,
    /// the bucket bindings for this topology's lane count, and the move of
    /// the intake from the single work queue of an earlier build to the
    /// lanes. A producer (`!lay`) lays no bucket: until a worker has, every
    /// notification goes to lane 0 through the alternate, so a producer
    /// never undoes the workers' `--lanes`, whichever declares first. On a
    /// prefix with the old queue it leaves the intake on it, for the old
    /// workers until new ones take over. Returns, when it laid, whether the
    /// lanes exchange was new (see [`Topology::lay_buckets`]).
    pub(super) async fn declare_lanes(
        &self,
        conn: &Connection,
        ch: &Channel,
        queue_type: QueueType,
        lay: bool,
    ) -> Result<Option<bool>, TopologyError> {
        let fresh = !exchange_exists(conn, &self.lanes_exchange).await?;
        let default = self.lanes_default();
        declare_exchange(ch, &default, ExchangeKind::Fanout, FieldTable::default()).await?;
        let mut args = FieldTable::default();
        // alternate-exchange: a routing key that is no bucket's (a raw
        // producer's, an older build's) goes to lane 0 instead of nowhere.
        args.insert(
            "alternate-exchange".into(),
            AMQPValue::LongString(default.as_str().into()),
        );
        declare_exchange(ch, &self.lanes_exchange, ExchangeKind::Direct, args).await?;
        let count = if lay { self.lanes } else { 1 };
        for k in 0..count {
            let lane = self.lane(k);
            if !exists(conn, &lane).await? {
                ch.queue_declare(lane.as_str().into(), durable_queue(), lane_args(queue_type))
                    .await
                    .map_err(|e| classify("queue", &lane, e))?;
            }
        }
        bind_queue(ch, &self.lane(0), &default, "").await?;
        let old = exists(conn, &self.work).await?;
        if lay || !old {
            // The intake fans out to the lanes exchange, which routes by key.
            ch.exchange_bind(
                self.lanes_exchange.as_str().into(),
                self.intake.as_str().into(),
                "".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify("binding to", &self.intake, e))?;
        }
        if !lay {
            return Ok(None);
        }
        self.lay_buckets(conn, ch, (&self.lanes_exchange, fresh))
            .await?;
        self.declare_parks(conn, ch).await?;
        if old {
            // The single work queue of an earlier build: nothing new goes
            // there; the workers drain it (see [`Topology::leftovers`]).
            unbind_queue(ch, &self.work, &self.intake, "").await?;
        }
        Ok(Some(fresh))
    }

    /// Binds each bucket key on `exchange` to its lane for this lane count
    /// and unbinds the buckets that moved from their lane of the count laid
    /// before ([`relay_plan`]), unless already laid for this count. `fresh`:
    /// the lanes exchange was just created, so nothing was laid before.
    pub(crate) async fn lay_buckets(
        &self,
        conn: &Connection,
        ch: &Channel,
        (exchange, fresh): (&str, bool),
    ) -> Result<(), TopologyError> {
        let marker = laid_marker(exchange, self.lanes);
        if exchange_exists(conn, &marker).await? {
            return Ok(());
        }
        let before = match fresh {
            true => None,
            false => laid_before(conn, exchange).await?,
        };
        let (bind, unbind) = relay_plan(before, self.lanes);
        for (b, lane) in bind {
            bind_queue(ch, &self.lane(lane), exchange, &bucket_key(b)).await?;
        }
        for (b, lane) in unbind {
            unbind_queue(ch, &self.lane(lane), exchange, &bucket_key(b)).await?;
        }
        if let Some(old) = before {
            let name = laid_marker(exchange, old);
            let gone = ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default());
            gone.await.map_err(|e| classify("exchange", &name, e))?;
        }
        declare_exchange(ch, &marker, ExchangeKind::Fanout, FieldTable::default()).await
    }

    /// The plugin's exchange routes a due copy by its bucket key, like the
    /// lanes exchange, so a worker (`lay`) gives it the same bindings. Lane
    /// 0 takes the single work queue's name as a key, the one copies delayed
    /// by an earlier build carry, and producers use ([`Topology::work`]),
    /// before the old queue lets go of it; and the empty key, a copy's
    /// whose URL has no origin (the exchange has no alternate).
    pub(crate) async fn lay_plugin_exit(
        &self,
        conn: &Connection,
        ch: &Channel,
        laid: Option<bool>,
    ) -> Result<(), TopologyError> {
        if laid.is_none() && exists(conn, &self.work).await? {
            // The old queue still has the key, until a worker moves it.
            return Ok(());
        }
        bind_queue(ch, &self.lane(0), &self.retry, &self.work).await?;
        bind_queue(ch, &self.lane(0), &self.retry, "").await?;
        let Some(fresh) = laid else { return Ok(()) };
        self.lay_buckets(conn, ch, (&self.retry, fresh)).await?;
        self.release_work_queue(conn, ch, &self.retry, &self.work)
            .await
    }

    /// Unbinds the single work queue of an earlier build from `exchange`,
    /// if it is still there.
    pub(crate) async fn release_work_queue(
        &self,
        conn: &Connection,
        ch: &Channel,
        exchange: &str,
        key: &str,
    ) -> Result<(), TopologyError> {
        if exists(conn, &self.work).await? {
            unbind_queue(ch, &self.work, exchange, key).await?;
        }
        Ok(())
    }

    /// Lanes at and past this topology's lane count that exist, found by
    /// passive declares until the first missing one.
    async fn leftover_lanes(&self, conn: &Connection) -> Result<Vec<String>, TopologyError> {
        let mut found = Vec::new();
        for k in self.lanes..BUCKETS {
            let lane = self.lane(k);
            if !exists(conn, &lane).await? {
                break;
            }
            found.push(lane);
        }
        Ok(found)
    }

    /// The queues the workers may still have to drain: the single work
    /// queue of an earlier build and lanes past `--lanes`, with their ready
    /// messages.
    pub async fn leftovers(&self, conn: &Connection) -> Result<Vec<Leftover>, TopologyError> {
        let mut names = self.leftover_lanes(conn).await?;
        if exists(conn, &self.work).await? {
            names.push(self.work.clone());
        }
        let mut left = Vec::new();
        for queue in names {
            let ch = channel(conn, &queue).await?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let q = ch.queue_declare(queue.as_str().into(), passive, FieldTable::default());
            let Ok(q) = q.await else { continue };
            let _ = ch.close(200, "".into()).await;
            left.push(Leftover {
                messages: q.message_count(),
                queue,
            });
        }
        Ok(left)
    }
}

impl Topology {
    /// Every marker [`Topology::lay_buckets`] may have declared.
    pub(super) fn laid_markers(&self) -> Vec<String> {
        let mut all = Vec::new();
        for x in [&self.lanes_exchange, &self.retry] {
            all.extend((1..=BUCKETS).map(|n| laid_marker(x, n)));
        }
        all
    }
}

/// The lane count `exchange`'s buckets were laid for, if any: its marker,
/// looked for at the default count first.
async fn laid_before(conn: &Connection, exchange: &str) -> Result<Option<u16>, TopologyError> {
    let others = (1..=BUCKETS).filter(|&n| n != DEFAULT_LANES);
    for n in std::iter::once(DEFAULT_LANES).chain(others) {
        if exchange_exists(conn, &laid_marker(exchange, n)).await? {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// The marker saying `exchange`'s bucket bindings are laid for `lanes`.
pub fn laid_marker(exchange: &str, lanes: u16) -> String {
    format!("{exchange}.laid-{lanes}")
}

/// A lane's arguments: the work queue's, with its leader spread over the
/// cluster's nodes.
pub(crate) fn lane_args(queue_type: QueueType) -> FieldTable {
    let mut a = work_args(queue_type);
    if queue_type == QueueType::Quorum {
        // x-queue-leader-locator: least-leaders puts each new lane's leader
        // on the node leading fewest queues (RabbitMQ 3.10 knows
        // client-local, random and least-leaders; 3.12+ reads it as
        // `balanced`), so N lanes spread over a cluster's nodes instead of
        // all living where the first worker connected.
        a.insert(
            "x-queue-leader-locator".into(),
            AMQPValue::LongString("least-leaders".into()),
        );
    }
    a
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

pub(crate) async fn bind_queue(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), TopologyError> {
    let (opts, args) = (QueueBindOptions::default(), FieldTable::default());
    ch.queue_bind(queue.into(), exchange.into(), key.into(), opts, args)
        .await
        .map_err(|e| classify("binding to", exchange, e))
}

pub(crate) async fn unbind_queue(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), TopologyError> {
    ch.queue_unbind(
        queue.into(),
        exchange.into(),
        key.into(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| classify("unbinding from", exchange, e))
}

/// A passive declare of an exchange on a channel of its own.
async fn exchange_exists(conn: &Connection, name: &str) -> Result<bool, TopologyError> {
    let probe = channel(conn, name).await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let found = probe.exchange_declare(
        name.into(),
        ExchangeKind::Direct,
        passive,
        FieldTable::default(),
    );
    match found.await {
        Ok(_) => {
            let _ = probe.close(200, "".into()).await;
            Ok(true)
        }
        Err(e) if e.is_amqp_soft_error() => Ok(false),
        Err(e) => Err(classify("exchange", name, e)),
    }
}
