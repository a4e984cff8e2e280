//! One connection's life: a [`Session`] opens its channels and helpers,
//! pumps deliveries into tasks under the concurrency bound, and drains
//! them when it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::Connection;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use super::admit::Slot;
use super::context::Context;
use super::context::Parking;
use super::error::WorkerError;
use super::feed::Feed;
use super::lanes::open_feed;
use super::process::process;
use super::wait::WaitRoom;
use crate::config::{BrokerSettings, DelayBackend, WorkerSettings};
use crate::control::Control;
use crate::delay::declare_topology_with;
use crate::delay::failover::Router;
use crate::delay::hold::Holder;
use crate::delay::probe::{Prober, Watch};
use crate::deliver::DeliveryHandler;
use crate::events::{relay, Emitter};
use crate::history::Recorder;
use crate::isolation::Endpoints;
use crate::publish::Publisher;
use crate::telemetry;
use crate::topology::Topology;

/// Deliveries past their HTTP attempt (waiting for a republish confirm, or
/// held by `--retry-settle`) are unacked but hold no concurrency slot, so
/// the prefetch has room for them: `--prefetch`, or by default
/// concurrency + max(1024, 4 × concurrency), at most 65535.
pub fn prefetch(settings: &WorkerSettings) -> usize {
    let room = (4 * settings.concurrency).max(DEFAULT_PREFETCH_ROOM);
    settings
        .prefetch
        .unwrap_or(settings.concurrency + room)
        .min(usize::from(u16::MAX))
}

/// What every session of one worker shares.
pub(super) struct Shared {
    /// The `--concurrency` slots: HTTP attempts in flight.
    pub(super) slots: Arc<Semaphore>,
    pub(super) endpoints: Arc<Endpoints>,
    /// Parked deliveries ask the pump for its idle slot through it.
    pub(super) slot_wanted: Arc<Notify>,
    /// The delay backends' probe state and the failover switch.
    pub(super) watch: Watch,
    /// The shared endpoint state: pauses, disables, the failing clock.
    pub(super) control: Control,
    /// Seats for deliveries waiting in the worker.
    pub(super) waiting: Arc<WaitRoom>,
    /// Parks against releases (`park.rs`).
    pub(super) parking: Parking,
}

/// Channels a worker republishes on (see [`Publisher`]).
pub const PUBLISH_CHANNELS: usize = 8;

/// See [`prefetch`].
pub const DEFAULT_PREFETCH_ROOM: usize = 1024;

/// One connection's consumer and the tasks of its deliveries.
pub(super) struct Session<H> {
    ctx: Arc<Context<H>>,
    feed: Feed,
    /// The deliveries' (and held short delays') tasks.
    tracker: TaskTracker,
    /// Stops this session's helpers: the holder's consumer, the
    /// dead-letter gauge and the connection watch.
    helpers: CancellationToken,
    /// Cancelled by the connection watch when the connection drops.
    lost: CancellationToken,
    /// Cancelled when the short-delay holder fails.
    hold_failed: CancellationToken,
    /// Cancelled when the delay probe ends before the session.
    probe_failed: CancellationToken,
    /// Cancelled when the `--events-url` relay ends before the session.
    relay_failed: CancellationToken,
}

/// What the session's deliveries share.
fn context<H>(
    handler: &Arc<H>,
    (publisher, events, history): (Publisher, Emitter, Option<Recorder>),
    settings: &WorkerSettings,
    (hard_stop, stopping): (CancellationToken, CancellationToken),
    shared: &Shared,
    tracker: &TaskTracker,
) -> Arc<Context<H>> {
    Arc::new(Context {
        handler: handler.clone(),
        publisher,
        events,
        history,
        worker: telemetry::worker_id(),
        settings: settings.clone(),
        hard_stop,
        broken: CancellationToken::new(),
        slots: shared.slots.clone(),
        endpoints: shared.endpoints.clone(),
        control: shared.control.clone(),
        slot_wanted: shared.slot_wanted.clone(),
        tracker: tracker.clone(),
        waiting: shared.waiting.clone(),
        parking: shared.parking.clone(),
        stopping,
    })
}

impl<H: DeliveryHandler> Session<H> {
    /// Declares the topology (through `conn`, which reached the URL `node`,
    /// redacted), opens the publisher and the consumer (prefetch
    /// set first, so it applies to it) and starts the helpers.
    pub(super) async fn open(
        conn: &Arc<Connection>,
        node: &str,
        broker: &BrokerSettings,
        settings: &WorkerSettings,
        handler: &Arc<H>,
        shared: &Shared,
    ) -> Result<Self, WorkerError> {
        let topology = declare_topology_with(broker, conn, Some(settings.lanes)).await?;
        // Before the publisher: while failing over, the probe declares the
        // cascade that the first retry is routed to.
        let prober = Prober::start(conn, broker, &topology, &shared.watch).await?;
        let publisher = open_publisher(conn, broker, &topology, settings, shared).await?;
        let events = Emitter::new(&publisher, &topology, &settings.ops_events);
        let history = super::record::open(conn, &broker.prefix, settings).await?;
        let (tracker, helpers) = (TaskTracker::new(), CancellationToken::new());
        // Should a later step fail, the helpers started so far stop.
        let stop_helpers = helpers.clone().drop_guard();
        // The endpoint state is read whole before the consumer starts: a
        // pause or a disable applies from this session's first delivery.
        shared
            .control
            .attach(conn, &topology, shared.endpoints.clone(), &events, &helpers)
            .await?;
        // The consumer comes after the publisher: nothing is pulled
        // before its copies could be made.
        let feed = open_feed(conn, &topology, (settings, prefetch(settings)), node).await?;
        let parking = (shared.control.clone(), shared.parking.clone());
        super::unpark::start(conn, &publisher, parking, &helpers).await?;
        let hard_stop = CancellationToken::new();
        let stops = (&tracker, &helpers, &hard_stop);
        let hold_failed =
            start_holder(conn, broker, settings, &topology, &publisher, stops).await?;
        let lost = start_watches(conn, &topology, settings, &helpers).await?;
        let relay_failed = relay::start(conn, &events, helpers.clone()).await?;
        let probe_failed = match prober {
            Some(p) => p.spawn(helpers.clone(), events.clone()),
            None => CancellationToken::new(),
        };
        let ctx = context(
            handler,
            (publisher, events, history),
            settings,
            // The helpers stop when the session begins to stop.
            (hard_stop, helpers.clone()),
            shared,
            &tracker,
        );
        stop_helpers.disarm();
        Ok(Session {
            ctx,
            feed,
            tracker,
            helpers,
            lost,
            hold_failed,
            probe_failed,
            relay_failed,
        })
    }

    /// Pulls deliveries into tasks until `shutdown` (`Ok`) or until the
    /// session breaks (`Err`). A parking place and a concurrency permit
    /// are taken *before* the next delivery is pulled, so a delivery never
    /// waits for a slot, and one whose endpoint is busy can give its slot
    /// back and wait in its place.
    pub(super) async fn pump(&mut self, shutdown: &CancellationToken) -> Result<(), WorkerError> {
        let slots = self.ctx.slots.clone();
        let rotation_wanted = self.feed.rotation_wanted();
        loop {
            let (place, permit) = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.lost.cancelled() => return Err(WorkerError::ConnectionLost),
                _ = self.hold_failed.cancelled() => return Err(WorkerError::HolderStopped),
                _ = self.probe_failed.cancelled() => return Err(WorkerError::ProbeStopped),
                _ = self.relay_failed.cancelled() => return Err(WorkerError::RelayStopped),
                p = async {
                    let place = self.ctx.endpoints.place().await;
                    (place, slots.clone().acquire_owned().await)
                } => match p {
                    (place, Ok(p)) => (place, p),
                    (_, Err(_)) => return Ok(()),
                },
            };
            if !self.ctx.publisher.is_connected() {
                return Err(WorkerError::PublisherClosed);
            }
            let delivery = tokio::select! {
                // In this order: a parked delivery's request for the slot
                // comes before the next delivery, always ready in a backlog.
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.ctx.broken.cancelled() => return Err(WorkerError::RepublishFailing),
                _ = self.hold_failed.cancelled() => return Err(WorkerError::HolderStopped),
                _ = self.probe_failed.cancelled() => return Err(WorkerError::ProbeStopped),
                _ = self.relay_failed.cancelled() => return Err(WorkerError::RelayStopped),
                // A parked delivery needs a slot and all are taken: give
                // this idle one back (it is first in line) and take another.
                _ = self.ctx.slot_wanted.notified() => continue,
                // Settling originals fill the consumer's prefetch: replace it.
                _ = rotation_wanted.notified() => {
                    self.feed.rotate().await?;
                    continue;
                }
                d = self.feed.next() => d,
            };
            match delivery {
                Some(Ok((d, lease))) => {
                    let (ctx, pulled) = (self.ctx.clone(), Instant::now());
                    let slot = Slot::new(permit, place);
                    self.tracker
                        .spawn(async move { process(ctx, d, lease, pulled, slot).await });
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Err(WorkerError::ConsumerCancelled),
            }
        }
    }

    /// Stops taking deliveries and gives in-flight ones `grace` to finish;
    /// then tells the rest to stop, which nacks them back to the queue.
    pub(super) async fn drain(self, grace: Duration) {
        // Draining or reconnecting: not ready for traffic.
        self.ctx.settings.health.set_consuming(false);
        self.helpers.cancel();
        // Bounded: a broker that does not answer must not hold the stop.
        let cancel = self.feed.cancel_current();
        let _ = tokio::time::timeout(Duration::from_secs(5), cancel).await;
        let tracker = &self.tracker;
        tracker.close();
        if grace.is_zero() && !tracker.is_empty() {
            // The session broke: their acks could no longer reach the
            // broker, which requeues them itself.
            warn!(
                in_flight = tracker.len(),
                "session lost; in-flight deliveries return to the queue"
            );
        } else if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            warn!(
                in_flight = tracker.len(),
                "shutdown grace over; requeueing unfinished deliveries"
            );
        }
        self.ctx.hard_stop.cancel();
        // Nacks are quick; a dead connection makes them fail at once.
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
        // The acks and nacks asked for are sent by each channel's ack
        // task, which ends once the feed (and every delivery) is gone and
        // its channel's close-ok came (so the broker took them).
        let acks = self.feed.ack_tasks();
        drop(self);
        acks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), acks.wait()).await;
    }
}

/// With the cascade, every worker also holds its prefix's short delays;
/// held messages are tasks on the session's tracker, drained like
/// deliveries. Returns the token cancelled if the holder fails.
async fn start_holder(
    conn: &Connection,
    broker: &BrokerSettings,
    settings: &WorkerSettings,
    topology: &Topology,
    publisher: &Publisher,
    (tracker, helpers, hard_stop): (&TaskTracker, &CancellationToken, &CancellationToken),
) -> Result<CancellationToken, WorkerError> {
    Ok(match broker.delay {
        DelayBackend::Cascade => {
            Holder::start(conn, topology, publisher.clone(), settings.hold_prefetch)
                .await?
                .spawn(tracker, helpers, hard_stop)
        }
        DelayBackend::Plugin => CancellationToken::new(),
    })
}

/// The session's confirm channels, routing delays through the worker's
/// backend, or the cascade while the failover switch is on.
async fn open_publisher(
    conn: &Connection,
    broker: &BrokerSettings,
    topology: &Topology,
    settings: &WorkerSettings,
    shared: &Shared,
) -> Result<Publisher, lapin::Error> {
    let router = Router {
        primary: broker.delay,
        switch: shared.watch.switch(),
    };
    let (n, timeout) = (PUBLISH_CHANNELS, settings.confirm_timeout);
    Publisher::with_channels(conn, n, topology.clone(), router, timeout).await
}

/// Starts the dead-letter gauge and the connection watch (until
/// `helpers` is cancelled) and marks the worker ready. Returns the token
/// the watch cancels when the connection is lost.
async fn start_watches(
    conn: &Connection,
    topology: &Topology,
    settings: &WorkerSettings,
    helpers: &CancellationToken,
) -> Result<CancellationToken, lapin::Error> {
    let dead_channel = conn.create_channel().await?;
    tokio::spawn(watch_queues(
        dead_channel,
        topology.clone(),
        helpers.clone(),
    ));
    // Ready only now that every channel is open; not ready the moment the
    // connection drops, even while every slot is busy and the pump is not
    // reading the consumer.
    settings.health.set_consuming(true);
    let lost = CancellationToken::new();
    tokio::spawn(watch_connection(
        conn.status().clone(),
        settings.health.clone(),
        lost.clone(),
        helpers.clone(),
    ));
    Ok(lost)
}

/// How often the queue counts are read for the metrics.
const QUEUE_CHECK: Duration = Duration::from_secs(15);

/// Sets the dead-letter and backlog gauges from passive declares of the
/// dead and work queues, now and every [`QUEUE_CHECK`], until `stop`. A
/// failed read keeps the last value: the gauges are "at the last check".
async fn watch_queues(channel: lapin::Channel, topology: Topology, stop: CancellationToken) {
    loop {
        let counts = async {
            let dead = topology.dead_count(&channel).await?;
            Ok::<_, lapin::Error>((dead, topology.work_count(&channel).await?))
        };
        match counts.await {
            Ok((dead, work)) => {
                metrics::gauge!(telemetry::DEAD_LETTERS).set(f64::from(dead));
                metrics::gauge!(telemetry::BACKLOG).set(f64::from(work));
            }
            // A failed passive declare closes the channel; stop until the
            // next session.
            Err(_) => return,
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(QUEUE_CHECK) => {}
        }
    }
    let _ = channel.close(200, "done".into()).await;
}

/// Marks the worker not ready, and the session lost, as soon as the
/// connection is no longer up (checked every 250 ms), until `stop`.
async fn watch_connection(
    status: lapin::ConnectionStatus,
    health: crate::telemetry::Health,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if !status.connected() {
            health.set_consuming(false);
            lost.cancel();
            return;
        }
    }
}
