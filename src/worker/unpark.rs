//! Releasing parked notifications (`park.rs`) when their pause ends: every
//! worker session reads the parking queues once when it starts (a resume
//! read while no worker ran, or a worker killed while parking), then, each
//! time a pause ends, the parking queue of that endpoint's lane.
//!
//! A read takes what was parked before it began: each notification goes
//! to its lane if its pause is over (on the attempt it had: parking spends
//! none), or is parked again at the queue's tail if it is still paused.
//! Every move is confirmed before the parked copy is acked, so a crash
//! mid-read duplicates at worst. Several workers read a queue at once as
//! competing consumers, each taking a share; each release's queues are
//! read again a few seconds later, for what those reads left behind
//! (`reread.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Connection;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::context::Parking;
use super::park::{parked_at, plan, with_expiry, Move, PARKED_AT};
use super::reread::Rereads;
use crate::clock::now_ms;
use crate::control::{Control, Gate};
use crate::message::target::Target;
use crate::publish::{republish_properties, retain_headers, PublishError, Publisher};
use crate::telemetry;
use crate::topology::lanes::{bucket_of, key_of_payload, lane_of, url_of_payload};
use crate::topology::TopologyError;

/// Moves in flight at once during a read (and the read's prefetch).
const MOVES: u16 = 128;

/// A read ends when its queue gives nothing for this long: what is left
/// is held by another worker reading it too (or comes slowly from a loaded
/// broker: `reread.rs` reads it again).
const IDLE: Duration = Duration::from_secs(2);

/// Finds the parking queues that exist, while the session opens (a
/// passive declare of a missing one closes its channel, best not beside
/// the session's other channels), then starts the releases of the session
/// until `stop`: first a read of those found.
pub(super) async fn start(
    conn: &Arc<Connection>,
    publisher: &Publisher,
    (control, parking): (Control, Parking),
    stop: &CancellationToken,
) -> Result<(), TopologyError> {
    let found = publisher.topology().parks_found(conn).await?;
    let (conn, publisher, stop) = (conn.clone(), publisher.clone(), stop.clone());
    let found: BTreeSet<String> = found.into_iter().collect();
    spawn(conn, found, publisher, (control, parking), stop);
    Ok(())
}

fn spawn(
    conn: Arc<Connection>,
    found: BTreeSet<String>,
    publisher: Publisher,
    (control, parking): (Control, Parking),
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let mut since = now_ms().max(0) as u64;
        let (mut queues, mut again) = (found, Rereads::default());
        loop {
            if !queues.is_empty() {
                drop(parking.write().await);
                read_all(&conn, &publisher, &control, &queues).await;
            }
            let due = again.next();
            let lifted = tokio::select! {
                lifted = control.released(&mut since, &stop) => match lifted {
                    Some(lifted) => Some(lifted),
                    None => return,
                },
                _ = sleep_until(due), if due.is_some() => None,
            };
            queues = match lifted {
                Some(lifted) => {
                    let queues = lanes_of(&publisher, &lifted);
                    again.released(Instant::now(), &queues);
                    queues
                }
                None => again.take_due(Instant::now()),
            };
        }
    });
}

/// Sleeps until `at` (`None`: never; the caller guards that branch).
async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// The parking queues of the lanes `targets` send to.
fn lanes_of(publisher: &Publisher, targets: &[Target]) -> BTreeSet<String> {
    let t = publisher.topology();
    let lane = |target: &Target| lane_of(bucket_of(&target.origin_key()), t.lanes);
    targets.iter().map(|x| t.park(lane(x))).collect()
}

/// Reads each of `queues` at once; a failure is logged (the session's own
/// watches see a lost connection; what was not moved stays parked).
async fn read_all(
    conn: &Connection,
    publisher: &Publisher,
    control: &Control,
    queues: &BTreeSet<String>,
) {
    let reads = queues.iter().map(|q| async move {
        match read(conn, publisher, control, q).await {
            Ok(0) => {}
            Ok(moved) => info!(queue = %q, moved, "parked notifications read"),
            Err(e) => warn!(queue = %q, error = %e, "reading a parking queue failed; what it holds stays parked"),
        }
    });
    futures_util::future::join_all(reads).await;
}

/// Reads `queue` from its head until it meets a notification parked after
/// the read began (a re-park: the rest was read), has taken as many as it
/// held when it began, or finds nothing for [`IDLE`]. Returns how many it
/// moved.
async fn read(
    conn: &Connection,
    publisher: &Publisher,
    control: &Control,
    queue: &str,
) -> Result<usize, PublishError> {
    let ch = conn.create_channel().await?;
    let held = crate::topology::ready_count(&ch, queue).await?;
    if held == 0 {
        let _ = ch.close(200, "".into()).await;
        return Ok(0);
    }
    let began = now_ms();
    // basic.qos before basic.consume, so it applies to this consumer.
    ch.basic_qos(MOVES, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            // An empty tag: the broker names the consumer.
            "".into(),
            // Manual acks (no_ack: false), not exclusive: workers compete.
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (mut taken, mut moves, mut result) = (0u32, FuturesUnordered::new(), Ok(()));
    while taken < held {
        let next = tokio::time::timeout(IDLE, consumer.next());
        let d = match next.await {
            Ok(Some(Ok(d))) => d,
            Ok(Some(Err(e))) => {
                result = Err(e.into());
                break;
            }
            Ok(None) | Err(_) => break,
        };
        taken += 1;
        let newer = parked_at(d.properties.headers().as_ref()).is_some_and(|at| at >= began);
        moves.push(relocate(publisher, control, queue, d));
        while moves.len() >= usize::from(MOVES) {
            if let Some(Err(e)) = moves.next().await {
                result = Err(e);
            }
        }
        if newer || result.is_err() {
            break;
        }
    }
    while let Some(r) = moves.next().await {
        result = result.and(r);
    }
    // Closing the channel gives back what was delivered and not moved.
    let _ = ch.close(200, "read".into()).await;
    result.map(|()| taken as usize)
}

/// Moves one parked notification to its lane or parks it again, confirmed,
/// then acks it.
async fn relocate(
    publisher: &Publisher,
    control: &Control,
    queue: &str,
    d: Delivery,
) -> Result<(), PublishError> {
    let url = url_of_payload(&d.data);
    let paused = url.is_some_and(|u| matches!(control.gate(&u), Gate::Paused { .. }));
    let expiration = d.properties.expiration().as_ref();
    let ttl = expiration.and_then(|e| e.as_str().parse::<u64>().ok());
    let headers = d.properties.headers().as_ref();
    let now = now_ms();
    let mut kept = headers.cloned().unwrap_or_default();
    let (exchange, key, props, op) = match plan(paused, ttl, parked_at(headers), now) {
        Move::Lane => {
            retain_headers(&mut kept, |k| k != PARKED_AT);
            let props = republish_properties(&d.properties, kept);
            let t = publisher.topology();
            (
                t.lanes_exchange.clone(),
                key_of_payload(&d.data),
                props,
                "released",
            )
        }
        Move::Park { left_ms } => {
            kept.insert(PARKED_AT.into(), AMQPValue::LongLongInt(now));
            let props = with_expiry(republish_properties(&d.properties, kept), left_ms);
            (String::new(), queue.to_string(), props, "reparked")
        }
    };
    publisher
        .confirmed(&exchange, &key, true, &d.data, props)
        .await?;
    d.acker.ack(BasicAckOptions::default()).await?;
    debug!(queue, op, "parked notification moved");
    metrics::counter!(telemetry::PARKING, "op" => op).increment(1);
    Ok(())
}
