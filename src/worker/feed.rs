//! The lanes' consumers: each lane (`crate::topology::lanes`) has its own
//! channel and consumer, so an open tag on one lane (a delivery to a hung
//! endpoint, a settling original) never holds the acks of another: AMQP
//! acks a run of tags with no hole in it, per channel.
//!
//! A retried original is kept unacked for
//! `--retry-settle` after its copy was confirmed (see `process.rs`), and
//! an unacked delivery counts against its consumer's prefetch. Held
//! originals would therefore crowd out the deliveries waiting to be
//! attempted, and cap the retry rate near prefetch room ÷ settle.
//!
//! So the feed *rotates*: once the current consumer holds half its room in
//! settling originals, it opens a fresh channel and consumer (a fresh
//! prefetch) and cancels the old consumer. It rotates too when a delivery
//! begins to wait in the worker (`wait.rs`), at most once a second per
//! lane (`rotation.rs`): the old channel keeps the waiting tag open, and
//! the fresh one's acks go in runs again. The old channel stays open, so
//! its held originals are still acked on the channel they arrived on, and
//! is closed once its last delivery is settled. Closing it also returns to
//! the queue anything the broker sent after the cancel-ok, which lapin
//! drops for an unknown consumer tag: nothing is stranded.
//!
//! Memory stays bounded: a held original keeps only its acker, a retired
//! consumer receives nothing after its cancel-ok, the feed rotates again
//! only once the last retired consumer handed out everything it received
//! (so at most two prefetches of bodies are in memory), and at most
//! [`MAX_LIVE`] consumers are alive at once. Past that the feed stops
//! rotating, and the settle takes prefetch room as before.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{self, SelectAll, Stream, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::acks::{Acks, Settle};
use super::rotation::{pick, Why};

use crate::telemetry::{self, GaugeGuard};

/// Consumers alive at once per lane, the current one included. Each
/// retired one lives about `--retry-settle` (plus its slowest delivery),
/// so 64 allows a rotation every ~30 ms with the 2 s default.
const MAX_LIVE: usize = 64;

/// One consumer, on a channel of its own, and its settling originals.
pub(super) struct Generation {
    channel: Channel,
    tag: String,
    /// Its deliveries' acks and requeues, in order (see `acks.rs`).
    acks: Acks,
    /// Originals of this consumer held for the settle right now.
    held: AtomicUsize,
    /// Set when a newer consumer took over.
    retired: AtomicBool,
    /// Held originals at which the feed rotates.
    threshold: usize,
    /// A delivery began to wait in the worker here ([`Lease::hold_waiting`]).
    waited: AtomicBool,
    /// Wakes the pump to rotate.
    rotate: Arc<Notify>,
    /// Alive generations of the session (this one included).
    live: Arc<AtomicUsize>,
}

impl Drop for Generation {
    /// Every delivery of this consumer is settled and its cancel-ok came.
    /// Dropping its `Acks` ends the channel's ack task, which sends what
    /// is left and then closes the channel (see `acks.rs`).
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A delivery's hold on its consumer's channel (which stays open while any
/// delivery that arrived on it is unsettled), and the duty to settle it:
/// a lease dropped unsettled (its task panicked, say) requeues its
/// delivery, so no tag is left unsettled below the channel's later acks.
pub struct Lease {
    generation: Arc<Generation>,
    tag: u64,
    settled: bool,
}

impl Lease {
    /// Acks the delivery (sent by the channel's ack task, maybe with others
    /// in one frame).
    pub fn ack(mut self) {
        self.settle(Settle::Ack(self.tag));
    }

    /// Returns the delivery to the queue.
    pub fn requeue(mut self) {
        self.settle(Settle::Requeue(self.tag));
    }

    fn settle(&mut self, s: Settle) {
        self.settled = true;
        self.generation.acks.settle(s);
    }

    /// Counts a retried original as held for the settle until the returned
    /// guard drops, and asks for a rotation when the current consumer holds
    /// too many.
    pub fn hold(&self) -> Held {
        self.hold_as(telemetry::SETTLING, false)
    }

    /// [`Lease::hold`] for a delivery waiting in the worker (`wait.rs`),
    /// unacked on its consumer like a settling one. It asks for a rotation
    /// at once: in a flowing lane every ack above its tag would go alone
    /// for as long as it waits (a second at 29,000 deliveries a second:
    /// a whole bench run, 19,918 single frames where 700 is usual), and a
    /// fresh consumer's acks stay batched. [`Feed::rotate`] spaces these
    /// rotations (`rotation.rs`).
    pub fn hold_waiting(&self) -> Held {
        self.generation.waited.store(true, Ordering::Relaxed);
        self.hold_as(telemetry::WAITING, true)
    }

    fn hold_as(&self, gauge: &'static str, waiting: bool) -> Held {
        let g = &self.generation;
        let held = g.held.fetch_add(1, Ordering::Relaxed) + 1;
        if (held >= g.threshold || waiting) && !g.retired.load(Ordering::Relaxed) {
            g.rotate.notify_one();
        }
        Held(g.clone(), GaugeGuard::new(gauge))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.settled {
            warn!(
                tag = self.tag,
                "a delivery was left unsettled; requeueing it"
            );
            self.settle(Settle::Requeue(self.tag));
        }
    }
}

/// See [`Lease::hold`].
pub struct Held(Arc<Generation>, #[allow(dead_code)] GaugeGuard);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

type Tagged = (Arc<Generation>, Option<Result<Delivery, lapin::Error>>);

/// One consumer's deliveries, then its end. `Sync` too: the pump holds the
/// feed across awaits in a task that may move between threads.
type Deliveries = Pin<Box<dyn Stream<Item = Tagged> + Send + Sync>>;

/// What a new consumer is made of.
struct Subscriber {
    conn: Arc<Connection>,
    /// The lanes, by index.
    queues: Vec<String>,
    prefetch: u16,
    threshold: usize,
    rotate: Arc<Notify>,
    live: Arc<AtomicUsize>,
    ending: Arc<AtomicBool>,
    /// The channels' ack tasks.
    ack_tasks: TaskTracker,
}

/// Each lane's current consumer and the retired ones still delivering
/// what they received before their cancel.
pub(super) struct Feed {
    subscriber: Subscriber,
    /// By lane index.
    current: Vec<Arc<Generation>>,
    streams: SelectAll<Deliveries>,
    /// Set when a rotation could not open a consumer: no more tries in
    /// this session.
    stuck: bool,
    /// By lane index: its last rotation for a wait ([`Lease::hold_waiting`]).
    wait_rotated: Vec<Option<Instant>>,
}

impl Feed {
    /// A consumer on each of `queues`, each with `concurrency` plus `share`
    /// of room (see `lanes.rs`'s `lane_room`); it rotates past half its
    /// share.
    pub(super) async fn open(
        conn: &Arc<Connection>,
        queues: &[String],
        share: usize,
        concurrency: usize,
    ) -> Result<Feed, lapin::Error> {
        let subscriber = Subscriber {
            conn: conn.clone(),
            queues: queues.to_vec(),
            prefetch: u16::try_from(concurrency + share).unwrap_or(u16::MAX),
            threshold: (share / 2).max(1),
            rotate: Arc::new(Notify::new()),
            live: Arc::new(AtomicUsize::new(0)),
            ending: Arc::new(AtomicBool::new(false)),
            ack_tasks: TaskTracker::new(),
        };
        let (mut current, mut streams) = (Vec::new(), SelectAll::new());
        for lane in 0..queues.len() {
            let (generation, deliveries) = subscriber.subscribe(lane).await?;
            current.push(generation);
            streams.push(deliveries);
        }
        Ok(Feed {
            wait_rotated: vec![None; current.len()],
            subscriber,
            current,
            streams,
            stuck: false,
        })
    }

    /// The next delivery of any live consumer, with its lease; `None` when
    /// the broker cancelled the current consumer (its queue is gone).
    pub(super) async fn next(&mut self) -> Option<Result<(Delivery, Lease), lapin::Error>> {
        while let Some((generation, item)) = self.streams.next().await {
            match item {
                Some(Ok(d)) => {
                    let lease = Lease {
                        tag: d.delivery_tag,
                        generation,
                        settled: false,
                    };
                    return Some(Ok((d, lease)));
                }
                Some(Err(e)) => return Some(Err(e)),
                // A retired consumer's cancel-ok: its stream is over.
                None if generation.retired.load(Ordering::Relaxed) => continue,
                None => return None,
            }
        }
        None
    }

    /// The lane to rotate now and why, if any ([`pick`]).
    fn wanted(&self, now: Instant) -> Option<(usize, Why)> {
        let seen: Vec<(usize, bool)> = self
            .current
            .iter()
            .map(|g| {
                (
                    g.held.load(Ordering::Relaxed),
                    g.waited.load(Ordering::Relaxed),
                )
            })
            .collect();
        pick(&seen, &self.wait_rotated, self.subscriber.threshold, now)
    }

    /// Notified when the current consumer holds enough settling originals
    /// to be worth replacing: then call [`Feed::rotate`].
    pub(super) fn rotation_wanted(&self) -> Arc<Notify> {
        self.subscriber.rotate.clone()
    }

    /// Replaces a lane's current consumer with a fresh one (a fresh
    /// prefetch), then cancels the old one. Does nothing when no lane wants
    /// it (`rotation.rs`), when too many consumers are alive, or while a retired
    /// consumer still has deliveries to hand out: so at most two
    /// prefetches' worth of bodies are ever in memory.
    pub(super) async fn rotate(&mut self) -> Result<(), lapin::Error> {
        let live = self.subscriber.live.load(Ordering::Relaxed);
        let draining = self.streams.len() > self.current.len();
        let now = Instant::now();
        let Some((lane, why)) = self.wanted(now) else {
            return Ok(());
        };
        if live >= MAX_LIVE * self.current.len() || draining || self.stuck {
            return Ok(());
        }
        if why == Why::Wait {
            self.wait_rotated[lane] = Some(now);
        }
        let held = self.current[lane].held.load(Ordering::Relaxed);
        let (fresh, deliveries) = match self.subscriber.subscribe(lane).await {
            Ok(fresh) => fresh,
            // Say, the broker's channel_max: keep the current consumer
            // (held originals take its room again) rather than break the
            // session, which would redeliver every one of them.
            Err(e) => {
                warn!(error = %e, "cannot open another consumer; settling originals keep taking prefetch room");
                self.stuck = true;
                return Ok(());
            }
        };
        self.streams.push(deliveries);
        let old = std::mem::replace(&mut self.current[lane], fresh);
        old.retired.store(true, Ordering::Relaxed);
        debug!(held, tag = %old.tag, "consumer rotated: its settling originals no longer take prefetch room");
        metrics::counter!(telemetry::ROTATIONS).increment(1);
        cancel(&old).await
    }

    /// The channels' ack tasks: each ends once its consumer's deliveries
    /// are all settled and the feed is dropped; wait for them before the
    /// connection closes, or the last acks never leave.
    pub(super) fn ack_tasks(&self) -> TaskTracker {
        self.subscriber.ack_tasks.clone()
    }

    /// Cancels the current consumers (shutdown): deliveries they already
    /// sent still come out of [`Feed::next`].
    pub(super) async fn cancel_current(&self) -> Result<(), lapin::Error> {
        self.subscriber.ending.store(true, Ordering::Relaxed);
        for g in &self.current {
            g.retired.store(true, Ordering::Relaxed);
        }
        for g in &self.current {
            cancel(g).await?;
        }
        Ok(())
    }
}

impl Subscriber {
    /// A new channel, its prefetch, and a consumer on lane `lane`, with
    /// its deliveries as a stream that also reports its end.
    async fn subscribe(&self, lane: usize) -> Result<(Arc<Generation>, Deliveries), lapin::Error> {
        let channel = self.conn.create_channel().await?;
        // basic.qos before basic.consume: a per-consumer prefetch
        // (global=false) applies to consumers started after it.
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                self.queues[lane].as_str().into(),
                // An empty tag: the broker names the consumer.
                "".into(),
                // Manual acks (no_ack: false), not exclusive: workers compete.
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        self.live.fetch_add(1, Ordering::Relaxed);
        let generation = Arc::new(Generation {
            acks: Acks::start(
                channel.clone(),
                &self.ack_tasks,
                self.ending.clone(),
                self.queues[lane].clone(),
            ),
            channel,
            tag: consumer.tag().to_string(),
            held: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
            threshold: self.threshold,
            waited: AtomicBool::new(false),
            rotate: self.rotate.clone(),
            live: self.live.clone(),
        });
        let g = generation.clone();
        let deliveries = consumer.map(move |d| (g.clone(), Some(d)));
        // The end is reported too, so that the broker cancelling the
        // current consumer is told apart from our own cancel.
        let g = generation.clone();
        let end = stream::once(async move { (g, None) });
        Ok((generation, Box::pin(deliveries.chain(end))))
    }
}

async fn cancel(g: &Generation) -> Result<(), lapin::Error> {
    g.channel
        .basic_cancel(g.tag.as_str().into(), BasicCancelOptions::default())
        .await
}
