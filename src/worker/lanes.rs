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

/// Each lane's room past the concurrency: the even share of the worker's
/// room (`prefetch` less `concurrency`) between `queues`, and at least a
/// quarter of it, so a worker holds at most `queues × concurrency` plus
/// the larger of `room` and `queues × room / 4` unacked (twice the room
/// with the default eight lanes, when every lane has a backlog).
///
/// Why a quarter: one receiver's notifications all go to one lane, and
/// the even share (32 + 128 with the defaults) made the lone receiver's
/// end to end 0.71 of one lane's (bench phase 3): a quorum queue's
/// consumer needs the room to keep deliveries coming while acks make
/// their way. With 32 + 256 it read 0.99. A larger room per lane first
/// broke phase 9 (0.18 to 0.38 of alone): a bad endpoint's lane held more
/// deliveries than the worker's parking places, parked them all, and the
/// pump, which takes a place before each pull, stopped for the healthy
/// lanes. An endpoint now parks no more than its fair share of the
/// places once they run short (`crate::isolation`, `fair_places`).
pub(super) fn lane_room(prefetch: usize, concurrency: usize, queues: usize) -> usize {
    let room = prefetch.saturating_sub(concurrency);
    (room / queues.max(1)).max(room / 4)
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
    fn a_lane_has_its_even_share_of_the_room_and_at_least_a_quarter() {
        // The defaults: concurrency 32, room 1,024, eight lanes.
        assert_eq!(lane_room(32 + 1_024, 32, 8), 256);
        assert_eq!(lane_room(32 + 1_024, 32, 2), 512);
        assert_eq!(lane_room(32 + 1_024, 32, 1), 1_024);
        assert_eq!(lane_room(20, 32, 8), 0);
    }
}
