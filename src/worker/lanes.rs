//! Which queues a session consumes: its lanes, and what a lane change left
//! behind until it is drained (`crate::topology::Topology::leftovers`).

use std::sync::Arc;

use lapin::Connection;
use tracing::info;

use super::error::WorkerError;
use super::feed::Feed;
use crate::config::WorkerSettings;
use crate::topology::{Topology, TopologyError};

/// The session's feed: a consumer on each queue of [`consumed`], sharing
/// the worker's `prefetch` room.
pub(super) async fn open_feed(
    conn: &Arc<Connection>,
    topology: &Topology,
    (settings, prefetch): (&WorkerSettings, usize),
    node: &str,
) -> Result<Feed, WorkerError> {
    let prefetch = u16::try_from(prefetch).unwrap_or(u16::MAX);
    let queues = consumed(conn, topology).await?;
    let feed = Feed::open(conn, &queues, prefetch, settings.concurrency).await?;
    let c = settings.concurrency;
    info!(lanes = topology.lanes, queues = ?queues, concurrency = c, broker = %node, "consuming");
    Ok(feed)
}

/// The lanes of `topology`, then the leftovers that still hold ready
/// messages. An empty leftover is not consumed: nothing routes to it any
/// more, and what another worker holds of it comes back ready only if that
/// worker's session ends, and so starts again and looks again. `status`
/// shows an empty one for the operator to delete.
pub(super) async fn consumed(
    conn: &Connection,
    topology: &Topology,
) -> Result<Vec<String>, TopologyError> {
    let mut queues = topology.lane_names();
    for left in topology.leftovers(conn).await? {
        if left.messages == 0 {
            continue;
        }
        info!(
            queue = %left.queue,
            messages = left.messages,
            "draining a queue no longer routed to (a lane change or the single work queue of an earlier build)"
        );
        queues.push(left.queue);
    }
    Ok(queues)
}
