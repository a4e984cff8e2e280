//! The delay seam: how a message is made to wait before it reaches the
//! work queue again. Everything else in redeliver only asks this module for
//! "publish here, with these headers"; a plugin-free backend slots in here.

pub mod cascade;
pub mod failover;
pub mod hold;
pub mod probe;
pub mod report;

use std::time::Duration;

use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};

pub use crate::config::DelayBackend;
pub use crate::publish::{DelayRouter, DelayedRoute};

use crate::config::BrokerSettings;
use crate::message::state::H_DELAY;
use crate::topology::{classify, Topology, TopologyError};

/// Declares the prefix's whole topology: the intake, work and dead objects
/// ([`Topology::declare`]), then those of the backend `broker.delay` names.
/// Every command that touches a prefix calls it; it is idempotent, so a
/// declare the broker refused as "not there yet" (see
/// [`TopologyError::is_transient`]) is simply made again, a few times.
pub async fn declare_topology(
    broker: &BrokerSettings,
    conn: &Connection,
) -> Result<Topology, TopologyError> {
    declare_topology_with(broker, conn, None).await
}

/// [`declare_topology`] for a worker with `lanes` lanes: it lays the lanes'
/// bindings for that count, where any other command only lays them on a
/// prefix that has none (see `crate::topology::lanes`).
pub async fn declare_topology_with(
    broker: &BrokerSettings,
    conn: &Connection,
    lanes: Option<u16>,
) -> Result<Topology, TopologyError> {
    let mut pause = Duration::from_millis(100);
    for _ in 1..DECLARE_TRIES {
        match declare_once(broker, conn, lanes).await {
            Err(e) if e.is_transient() => {
                tracing::info!(error = %e, retry_in = ?pause, "the broker asked to declare again later");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            done => return done,
        }
    }
    declare_once(broker, conn, lanes).await
}

/// Tries of [`declare_topology`]: 100 ms doubling, 1.5 s of waits in all.
const DECLARE_TRIES: u32 = 5;

async fn declare_once(
    broker: &BrokerSettings,
    conn: &Connection,
    lanes: Option<u16>,
) -> Result<Topology, TopologyError> {
    let topology = match lanes {
        Some(n) => Topology::new(&broker.prefix).with_lanes(n),
        None => Topology::new(&broker.prefix),
    };
    let laid = topology
        .declare(conn, broker.queue_type, lanes.is_some())
        .await?;
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| classify("a channel for", &broker.prefix, e))?;
    broker.delay.declare(conn, &ch, &topology, laid).await?;
    // Last: its existence says a declare of everything above completed.
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        marker(&topology).as_str().into(),
        ExchangeKind::Fanout,
        durable,
        FieldTable::default(),
    )
    .await
    .map_err(|e| classify("exchange", &marker(&topology), e))?;
    let _ = ch.close(200, "topology declared".into()).await;
    Ok(topology)
}

/// An exchange that routes nothing, declared after everything else of a
/// prefix ([`ensure_topology`] looks for it).
pub fn marker(t: &Topology) -> String {
    format!("{}.declared", t.prefix)
}

/// The topology for a producer, without a declare when it is already
/// there: the intake and the backend's exchanges are looked up with passive
/// declares (a lookup on the node the connection reaches), and only when
/// one is missing is everything declared. A declare is a cluster-wide
/// transaction: while a node is cut off and not yet noticed
/// (`net_ticktime`, 45-75 s by default), it blocks on every node, while
/// publishing to the replicated queues goes on. The [`marker`] is declared
/// after everything else, so when it exists a whole declare completed (one
/// cut short by a timeout leaves it missing, and the next call declares).
pub async fn ensure_topology(
    broker: &BrokerSettings,
    conn: &Connection,
) -> Result<Topology, TopologyError> {
    let topology = Topology::new(&broker.prefix);
    let mut names = vec![topology.intake.clone(), marker(&topology)];
    match broker.delay {
        DelayBackend::Plugin => names.push(topology.retry.clone()),
        DelayBackend::Cascade => names.extend(cascade::names(&topology).1),
    }
    if exchanges_exist(conn, &names).await {
        return Ok(topology);
    }
    declare_topology(broker, conn).await
}

/// Whether every exchange exists. A missing one closes the channel (404),
/// so one channel answers for all of them.
async fn exchanges_exist(conn: &Connection, names: &[String]) -> bool {
    let Ok(ch) = conn.create_channel().await else {
        return false;
    };
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for name in names {
        let found = ch
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Fanout,
                passive,
                FieldTable::default(),
            )
            .await;
        if found.is_err() {
            return false;
        }
    }
    let _ = ch.close(200, "looked up".into()).await;
    true
}

/// Deletes the prefix's queues and exchanges, both backends' included,
/// messages and all (for throwaway prefixes: the demo's, the benchmark's,
/// tests').
pub async fn delete(topology: &Topology, conn: &Connection) -> Result<(), lapin::Error> {
    // Deleting what does not exist is a no-op.
    let (queues, exchanges) = cascade::names(topology);
    let ch = conn.create_channel().await?;
    for q in queues.iter().chain([&report::queue(topology)]) {
        ch.queue_delete(q.as_str().into(), Default::default())
            .await?;
    }
    for x in exchanges.iter().chain([&topology.retry, &marker(topology)]) {
        ch.exchange_delete(x.as_str().into(), Default::default())
            .await?;
    }
    let _ = ch.close(200, "deleted".into()).await;
    topology.delete(conn).await
}

impl DelayBackend {
    pub(crate) async fn declare(
        self,
        conn: &Connection,
        ch: &Channel,
        t: &Topology,
        laid: Option<bool>,
    ) -> Result<(), TopologyError> {
        match self {
            DelayBackend::Plugin => {
                let mut args = FieldTable::default();
                // x-delayed-type: direct; the exchange routes like a direct
                // exchange once the delay is over (key = work queue name).
                args.insert(
                    "x-delayed-type".into(),
                    AMQPValue::LongString("direct".into()),
                );
                let opts = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                ch.exchange_declare(
                    t.retry.as_str().into(),
                    ExchangeKind::Custom("x-delayed-message".into()),
                    opts,
                    args,
                )
                .await
                .map_err(|e| classify("exchange", &t.retry, e))?;
                // Due messages route to the lanes by their bucket key,
                // bound by the workers (see `Topology::declare_lanes`).
                t.lay_plugin_exit(conn, ch, laid).await
            }
            DelayBackend::Cascade => {
                crate::delay::cascade::declare(ch, t).await?;
                let out = crate::delay::cascade::out(t);
                match laid {
                    Some(_) => t.release_work_queue(conn, ch, &out, "").await,
                    None => Ok(()),
                }
            }
        }
    }

    /// Sets the delay on `headers` and says where to publish, and whether
    /// `mandatory` may be set (the plugin returns every delayed message as
    /// unroutable at publish time, so not there). The route reaches the
    /// work queue only, never other queues bound to the intake.
    pub fn route(
        self,
        t: &Topology,
        delay_ms: u32,
        key: &str,
        headers: &mut FieldTable,
    ) -> DelayedRoute {
        // x-delay: milliseconds to hold the message, as an integer. The
        // cascade reads its digit headers instead, but sets it too, so a
        // copy reads the same whichever backend carried it.
        headers.insert(H_DELAY.into(), AMQPValue::LongLongInt(delay_ms.into()));
        match self {
            // The bucket key, bound on the plugin's exchange like on the
            // lanes exchange.
            DelayBackend::Plugin => DelayedRoute {
                exchange: t.retry.clone(),
                routing_key: key.to_string(),
                mandatory: false,
            },
            // Short delays go to the hold queue (default exchange, its
            // name as the key), where the workers time them.
            DelayBackend::Cascade if crate::delay::cascade::is_held(delay_ms) => {
                crate::delay::cascade::hold_entry(delay_ms, crate::clock::now_us(), headers);
                crate::delay::cascade::hold_key(key, headers);
                DelayedRoute {
                    exchange: String::new(),
                    routing_key: crate::delay::cascade::hold(t),
                    mandatory: true,
                }
            }
            // Dead-lettering keeps the key: the exit routes it to its lane.
            DelayBackend::Cascade => DelayedRoute {
                exchange: crate::delay::cascade::entry(t, delay_ms, headers),
                routing_key: key.to_string(),
                mandatory: true,
            },
        }
    }
}

impl DelayRouter for DelayBackend {
    fn route(
        &self,
        t: &Topology,
        delay_ms: u32,
        key: &str,
        headers: &mut FieldTable,
    ) -> DelayedRoute {
        DelayBackend::route(*self, t, delay_ms, key, headers)
    }
}
