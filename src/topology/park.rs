//! Parking queues: where a paused endpoint's notifications wait, unread,
//! until a resume releases them (`crate::worker`'s park and unpark).
//!
//! One per lane, `<prefix>.park.K`, shared by every endpoint of the lane,
//! not one per endpoint: a thousand paused endpoints must not mean a
//! thousand quorum queues, and a queue per endpoint would have to be
//! deleted when it empties, which races a worker still parking into it
//! (quorum queues refuse `if-empty` deletes). A release reads only its
//! endpoint's lane, once, and parks again what is still paused.
//!
//! A parked notification carries its `--max-age` as a per-message TTL. On
//! expiry the queue dead-letters it to the lanes exchange, with its lane's
//! bucket key, and the worker that takes it dead-letters it as `expired`
//! with its history, like any notification past its age.

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};

use super::lanes::{bucket_key, BUCKETS};
use super::lay::lane_args;
use super::{classify, exists, QueueType, Topology, TopologyError};

impl Topology {
    /// Lane `k`'s parking queue.
    pub fn park(&self, k: u16) -> String {
        format!("{}.park.{k}", self.prefix)
    }

    /// Every lane's parking queue, lane 0 first.
    pub fn park_names(&self) -> Vec<String> {
        (0..self.lanes).map(|k| self.park(k)).collect()
    }

    /// Declares the parking queues of this topology's lanes that do not
    /// exist yet (an existing one keeps its arguments).
    pub(super) async fn declare_parks(
        &self,
        conn: &Connection,
        ch: &Channel,
    ) -> Result<(), TopologyError> {
        for k in 0..self.lanes {
            let name = self.park(k);
            if exists(conn, &name).await? {
                continue;
            }
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(name.as_str().into(), durable, self.park_args(k))
                .await
                .map_err(|e| classify("queue", &name, e))?;
        }
        Ok(())
    }

    /// Parking queues that exist, found by passive declares from lane 0
    /// until the first missing one: this topology's, and those of a larger
    /// lane count laid before.
    pub async fn parks_found(&self, conn: &Connection) -> Result<Vec<String>, TopologyError> {
        let mut found = Vec::new();
        for k in 0..BUCKETS {
            let name = self.park(k);
            if !exists(conn, &name).await? {
                break;
            }
            found.push(name);
        }
        Ok(found)
    }

    /// A parking queue's arguments: a quorum lane's, and a dead-lettering
    /// that sends what expires back to the lanes.
    fn park_args(&self, k: u16) -> FieldTable {
        let mut a = lane_args(QueueType::Quorum);
        let s = |v: &str| AMQPValue::LongString(v.into());
        // x-dead-letter-exchange: an expired notification (its --max-age
        // as the message's TTL) goes back to the lanes, where the worker
        // dead-letters it as `expired` with its reason and history.
        a.insert("x-dead-letter-exchange".into(), s(&self.lanes_exchange));
        // x-dead-letter-routing-key: bucket k, which lane k takes for any
        // lane count above k (bucket b goes to lane b mod N).
        a.insert("x-dead-letter-routing-key".into(), s(&bucket_key(k)));
        // x-dead-letter-strategy: at-least-once: an expired notification
        // leaves only once the lanes confirmed it; a crash mid-hop loses
        // nothing.
        a.insert("x-dead-letter-strategy".into(), s("at-least-once"));
        // x-overflow: reject-publish, which at-least-once needs (no
        // length limit is set, so nothing is refused for it).
        a.insert("x-overflow".into(), s("reject-publish"));
        a
    }
}
