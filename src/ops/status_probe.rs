//! `status`'s reads of many queues: passive declares sharing a channel
//! ([`Probe`]), the cascade's queues and the parking queues.

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::amqp::bounded;
use serde::Serialize;

use crate::ops::management::Placement;
use crate::topology::Topology;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QueueStatus {
    pub name: String,
    /// `false` when the queue has not been declared yet.
    pub exists: bool,
    pub ready: u32,
    /// From the management API; `None` when it was not asked or not reachable.
    pub unacked: Option<u64>,
    pub consumers: u32,
    /// Type, leader and members (from the management API).
    pub placement: Option<Placement>,
}

/// One queue of the cascade: stage `stage`, digit `digit`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CascadeQueueStatus {
    pub queue: String,
    pub stage: u32,
    pub digit: u32,
    /// How long each message waits in this queue: digit × 16^stage ms.
    pub ttl_ms: u64,
    pub messages: u32,
}

/// Passive declares that share one channel while the queues exist: a
/// missing queue closes the channel (a soft error), and only then is a new
/// one opened. `status` reads up to 123 queues, mostly existing ones.
pub(super) struct Probe<'a> {
    conn: &'a lapin::Connection,
    channel: Option<lapin::Channel>,
}

impl<'a> Probe<'a> {
    pub(super) fn new(conn: &'a lapin::Connection) -> Self {
        Probe {
            conn,
            channel: None,
        }
    }

    pub(super) async fn queue(&mut self, name: &str) -> Result<QueueStatus, lapin::Error> {
        let ch = match self.channel.take() {
            Some(ch) => ch,
            None => bounded(self.conn.create_channel()).await?,
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = bounded(ch.queue_declare(name.into(), passive, FieldTable::default())).await;
        let (exists, ready, consumers) = match declared {
            Ok(q) => {
                self.channel = Some(ch);
                (true, q.message_count(), q.consumer_count())
            }
            Err(e) if e.is_amqp_soft_error() => (false, 0, 0),
            Err(e) => return Err(e),
        };
        Ok(QueueStatus {
            name: name.into(),
            exists,
            ready,
            unacked: None,
            consumers,
            placement: None,
        })
    }

    pub(super) async fn close(mut self) {
        if let Some(ch) = self.channel.take() {
            let _ = bounded(ch.close(200, "".into())).await;
        }
    }
}

/// The cascade's queues that exist, with their messages. The hold queue
/// (`held`) is declared before the stages: without it there is no cascade
/// to show, and 120 passive declares of missing queues (each closing its
/// channel) are skipped.
pub(super) async fn read_cascade(
    probe: &mut Probe<'_>,
    t: &Topology,
    held: bool,
) -> Result<Vec<CascadeQueueStatus>, lapin::Error> {
    let mut cascade = vec![];
    let stages = crate::delay::cascade::queues(t).filter(|_| held);
    for (stage, digit, name) in stages {
        let q = probe.queue(&name).await?;
        if q.exists {
            cascade.push(CascadeQueueStatus {
                queue: name,
                stage,
                digit,
                ttl_ms: crate::delay::cascade::ttl_ms(stage, digit),
                messages: q.ready,
            });
        }
    }
    Ok(cascade)
}

/// Ready messages in every parking queue; 0 when none can be read.
pub(super) async fn read_parked(conn: &lapin::Connection, t: &Topology) -> u32 {
    match t.parks_found(conn).await {
        Ok(parks) => crate::topology::ready_total(conn, parks).await,
        Err(_) => 0,
    }
}
