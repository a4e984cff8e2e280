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
    let queues = consumed(conn, topology).await?;
    let share = lane_room(prefetch, settings.concurrency, queues.len());
    let feed = Feed::open(conn, &queues, share, settings.concurrency).await?;
    let c = settings.concurrency;
    info!(lanes = topology.lanes, queues = ?queues, concurrency = c, broker = %node, "consuming");
    Ok(feed)
}

/// Each lane's room past the concurrency: the worker's room (`prefetch`
/// less `concurrency`) shared out evenly between `queues`, so a worker holds
/// at most `queues × concurrency + room` unacked.
///
/// Not more: a lane's room bounds what a bad endpoint's lane can hold, and
/// past the worker's parking places (`--max-parked`, 256) its parked
/// deliveries took every place, and the pump, which takes a place before
/// each pull, stopped for the healthy lanes too. Bench phase 9 measured it
/// (healthy beside a hanging endpoint, and beside one answering in
/// 500 ms): 1.00 and 0.98 of alone with 32 + 128 per lane, 0.38 and 0.18
/// with 32 + 256, 0.36 and 0.19 with 32 + 512. The even share costs a lone
/// receiver end to end (phase 3: 0.71 of one lane; 0.99 with 32 + 256,
/// 1.05 with 32 + 512): a per-endpoint bound on parking places would let
/// a lane have more room; it is not built (issue 51 stays open).
pub(super) fn lane_room(prefetch: usize, concurrency: usize, queues: usize) -> usize {
    prefetch.saturating_sub(concurrency) / queues.max(1)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_is_shared_out_evenly() {
        // The defaults: concurrency 32, room 1,024, eight lanes.
        assert_eq!(lane_room(32 + 1_024, 32, 8), 128);
        assert_eq!(lane_room(32 + 1_024, 32, 1), 1_024);
        assert_eq!(lane_room(20, 32, 8), 0);
    }
}
