//! `status`'s line on operational events: the `<prefix>.events` exchange,
//! whether anything is bound to it (from the management API: AMQP cannot
//! list bindings), and the `--events-url` relay's queue.

use crate::amqp::bounded;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde::Serialize;

use crate::ops::management::Api;
use crate::topology::Topology;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EventsStatus {
    pub exchange: String,
    /// `false` until a worker (or an endpoint command) declared it.
    pub exists: bool,
    /// Bindings from the exchange (the relay's included), from the
    /// management API; `None` when not asked or not reachable.
    pub bindings: Option<u64>,
    /// The `--events-url` relay's queue; `None` when no worker was given
    /// one.
    pub relay: Option<RelayStatus>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RelayStatus {
    pub queue: String,
    /// Events waiting to be relayed.
    pub ready: u32,
    pub consumers: u32,
}

pub(crate) async fn read(
    conn: &lapin::Connection,
    t: &Topology,
) -> Result<EventsStatus, lapin::Error> {
    let ch = bounded(conn.create_channel()).await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let kind = lapin::ExchangeKind::Topic;
    let declare = ch.exchange_declare(
        t.events.as_str().into(),
        kind,
        passive,
        FieldTable::default(),
    );
    let exists = match bounded(declare).await {
        Ok(()) => {
            let _ = bounded(ch.close(200, "".into())).await;
            true
        }
        // A missing exchange closes the channel (a soft error).
        Err(e) if e.is_amqp_soft_error() => false,
        Err(e) => return Err(e),
    };
    Ok(EventsStatus {
        exchange: t.events.clone(),
        exists,
        bindings: None,
        relay: relay(conn, t).await?,
    })
}

/// The relay queue, by a passive declare on a channel of its own.
async fn relay(
    conn: &lapin::Connection,
    t: &Topology,
) -> Result<Option<RelayStatus>, lapin::Error> {
    let ch = bounded(conn.create_channel()).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let name = crate::events::relay::queue(t);
    match bounded(ch.queue_declare(name.as_str().into(), passive, FieldTable::default())).await {
        Ok(q) => {
            let _ = bounded(ch.close(200, "".into())).await;
            Ok(Some(RelayStatus {
                queue: name,
                ready: q.message_count(),
                consumers: q.consumer_count(),
            }))
        }
        Err(e) if e.is_amqp_soft_error() => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) async fn add_management(e: &mut EventsStatus, api: &Api) {
    if e.exists {
        e.bindings = api.bindings_from(&e.exchange).await;
    }
}

/// `status`'s text line.
pub fn line(e: &EventsStatus) -> String {
    if !e.exists {
        return format!("{} not declared yet", e.exchange);
    }
    let bound = match e.bindings {
        None => "bindings ? (needs --management-url)".to_string(),
        Some(0) => "nothing bound: events are dropped".to_string(),
        Some(n) => format!("{n} binding(s)"),
    };
    let relay = match &e.relay {
        Some(r) => format!(
            "; --events-url relay {} waiting, {} consumer(s)",
            r.ready, r.consumers
        ),
        None => String::new(),
    };
    format!("{}  {bound}{relay}", e.exchange)
}
