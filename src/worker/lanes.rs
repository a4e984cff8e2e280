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
    let explicit = settings.prefetch.is_some();
    let share = lane_room(prefetch, settings.concurrency, queues.len(), explicit);
    let feed = Feed::open(conn, &queues, share, settings.concurrency).await?;
    let c = settings.concurrency;
    info!(lanes = topology.lanes, queues = ?queues, concurrency = c, broker = %node, "consuming");
    Ok(feed)
}

/// The least room past the concurrency a lane's consumer gets by default.
/// One receiver alone uses one lane: with the default room (1,024) split
/// eight ways (128), its acks lingering a few milliseconds and its copies
/// waiting for confirms filled the window, and it ran at 0.71 of one queue
/// (bench phase 3, `--baseline-exe` a build with one lane). With 512 it
/// runs as fast as one queue did.
pub const MIN_LANE_ROOM: usize = 512;

/// Each lane's room past the concurrency: the worker's room (`prefetch`
/// less `concurrency`) shared out between `queues`, but by default at
/// least [`MIN_LANE_ROOM`] (or the whole room, if smaller). An `explicit`
/// `--prefetch` is a bound the operator chose: shared out exactly. So by
/// default a worker holds at most `queues × (concurrency + 512)` unacked,
/// and one lane never has less than one queue had with half the room.
pub(super) fn lane_room(
    prefetch: usize,
    concurrency: usize,
    queues: usize,
    explicit: bool,
) -> usize {
    let room = prefetch.saturating_sub(concurrency);
    let share = room / queues.max(1);
    match explicit {
        true => share,
        false => share.max(room.min(MIN_LANE_ROOM)),
    }
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
    fn a_lane_keeps_half_the_default_room_and_an_explicit_prefetch_is_shared_exactly() {
        // The defaults: concurrency 32, room 1,024, eight lanes.
        assert_eq!(lane_room(32 + 1_024, 32, 8, false), 512);
        assert_eq!(lane_room(32 + 1_024, 32, 1, false), 1_024);
        assert_eq!(lane_room(32 + 4_096, 32, 2, false), 2_048);
        // A small room is not raised past itself.
        assert_eq!(lane_room(32 + 100, 32, 8, false), 100);
        // --prefetch 1056 with eight lanes: 128 each, as asked.
        assert_eq!(lane_room(32 + 1_024, 32, 8, true), 128);
    }
}
