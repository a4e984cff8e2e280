//! The cascade's holder: the worker side of short delays.
//!
//! With `--delay-backend cascade`, a delay of at most
//! [`cascade::HOLD_MAX_MS`] is published to `<prefix>.cascade.hold` with its
//! due time ([`cascade::DUE_HEADER`]) instead of waiting in the stages'
//! queues, whose expiry path costs ~1.5 ms per hop. Every `run` worker of
//! the prefix consumes that queue here: it keeps each message unacked until
//! it is due, publishes it to `<prefix>.cascade.out` (the work queue) with a
//! publisher confirm, and only then acks it. So a message is always in the
//! hold queue, in the work queue, or both:
//! - a worker that crashes while holding leaves its messages unacked, and
//!   the broker hands them to another holder, which releases them at their
//!   due time, or at once when that has passed;
//! - a release whose ack is lost is delivered twice (at-least-once), never
//!   not at all.
//!
//! The due time is the publisher's clock, compared with this host's:
//! hosts must agree (NTP), or a holder whose clock runs ahead releases
//! that much early. A message is never held longer than its own delay
//! after it arrives, whatever the clocks say.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::amqp::requeue;
use crate::config::{BrokerSettings, DEFAULT_HOLD_PREFETCH as PREFETCH};
use crate::delay::cascade;
use crate::delay::DelayBackend;
use crate::message::state::{self, H_DELAY};
use crate::publish::{PublishError, Publisher};
use crate::telemetry::{self, GaugeGuard};
use crate::topology::{Topology, TopologyError};

#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("the broker cancelled the hold queue's consumer (was it deleted?)")]
    ConsumerCancelled,
    #[error("releasing a held message failed (unroutable or unconfirmed)")]
    ReleaseFailing,
}

/// Confirm channels [`run`]'s releases are spread over.
const CHANNELS: usize = 2;

/// How long to hold a message that arrives at `now_us` (this host's clock,
/// µs since the Unix epoch): until `due_us`, but not longer than its
/// delay from now (a publisher's clock ahead of ours) and not at all when
/// that has passed (a redelivery after a holder crashed). Without a due
/// time, the whole delay from now: late rather than early. The delay
/// (`x-delay`) is capped at [`cascade::HOLD_MAX_MS`], all the hold queue
/// is for, and taken as that when missing or malformed, so bad headers
/// make a message late, never early, and never pin a slot for longer.
pub fn hold_for(due_us: Option<i64>, delay_ms: Option<i64>, now_us: u64) -> Duration {
    let max = i64::from(cascade::HOLD_MAX_MS);
    let delay_us = delay_ms.unwrap_or(max).clamp(0, max) as u64 * 1000;
    let latest = now_us.saturating_add(delay_us);
    let due_us = match due_us {
        Some(us) => u64::try_from(us).unwrap_or(0),
        None => latest,
    };
    Duration::from_micros(due_us.clamp(now_us, latest) - now_us)
}

/// [`hold_for`] with the message's own headers.
fn wait_of(headers: Option<&FieldTable>) -> Duration {
    let int = |name| state::get(headers, name).and_then(state::int);
    hold_for(
        int(cascade::DUE_HEADER),
        int(H_DELAY),
        crate::clock::now_us(),
    )
}

/// A consumer of the hold queue, ready to [`serve`](Holder::serve).
pub struct Holder {
    channel: Channel,
    consumer: lapin::Consumer,
    publisher: Publisher,
    /// The cascade's exit, where a message goes once its wait is over.
    out: String,
}

impl Holder {
    /// Opens the holder's channel on `conn` and starts consuming the
    /// prefix's hold queue (declared with the cascade's topology), holding
    /// at most `prefetch` messages. Releases go out through `publisher`
    /// (a worker's own, whose channels it shares).
    pub async fn start(
        conn: &Connection,
        topology: &Topology,
        publisher: Publisher,
        prefetch: u16,
    ) -> Result<Self, HoldError> {
        let channel = conn.create_channel().await?;
        // prefetch: at most this many held (unacked) messages at once.
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let queue = cascade::hold(topology);
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        info!(%queue, max_ms = cascade::HOLD_MAX_MS, "holding short delays");
        // Present from the start, so dashboards see 0, not "no data".
        metrics::gauge!(telemetry::HELD).increment(0.0);
        Ok(Holder {
            channel,
            consumer,
            publisher,
            out: cascade::out(topology),
        })
    }

    /// Holds and releases messages until `stop` (then `Ok`) or a failure.
    /// Each held message is a task on `tracker`; on `hard_stop` the ones
    /// still waiting are nacked back to the queue.
    pub async fn serve(
        mut self,
        stop: CancellationToken,
        hard_stop: CancellationToken,
        tracker: TaskTracker,
    ) -> Result<(), HoldError> {
        let shared = Arc::new(Shared {
            publisher: self.publisher,
            out: self.out,
            channel: self.channel,
            hard_stop,
            failed: CancellationToken::new(),
        });
        let result = loop {
            let next = tokio::select! {
                _ = stop.cancelled() => break Ok(()),
                _ = shared.failed.cancelled() => break Err(HoldError::ReleaseFailing),
                d = self.consumer.next() => d,
            };
            match next {
                Some(Ok(d)) => {
                    tracker.spawn(hold_one(shared.clone(), d));
                }
                Some(Err(e)) => break Err(e.into()),
                None => break Err(HoldError::ConsumerCancelled),
            }
        };
        // Deliveries the broker sent but this loop did not take return to
        // the queue when the channel closes: after the last held task.
        let tag = self.consumer.tag();
        let _ = shared
            .channel
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await;
        result
    }

    /// [`serve`](Holder::serve) as a task on `tracker`. Returns a token
    /// that is cancelled if the holder fails, for the caller to end its
    /// session on.
    pub fn spawn(
        self,
        tracker: &TaskTracker,
        stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> CancellationToken {
        let failed = CancellationToken::new();
        let f = failed.clone();
        let served = self.serve(stop.clone(), hard_stop.clone(), tracker.clone());
        tracker.spawn(async move {
            if let Err(e) = served.await {
                warn!(error = %e, "the short-delay holder stopped");
                f.cancel();
            }
        });
        failed
    }
}

/// What the held messages' tasks share. The channel lives here, not only
/// in the holder: a lapin channel closes when its last handle is dropped,
/// and the broker would then requeue messages that their tasks are still
/// going to release, so each would be delivered twice.
struct Shared {
    publisher: Publisher,
    out: String,
    channel: Channel,
    hard_stop: CancellationToken,
    /// Cancelled by a release that failed for a reason a new session may
    /// cure (unroutable: the topology is re-declared; no confirm; a closed
    /// channel).
    failed: CancellationToken,
}

/// After a broker nack (say a full work queue), a held message goes back
/// to the hold queue this much later, so that it neither spins nor ends
/// the session.
const NACKED_PAUSE: Duration = Duration::from_secs(1);

/// Holds one message until due, releases it with a confirm, then acks it.
/// A message whose release failed stays unacked or is requeued: it goes
/// out later, from this holder or another.
async fn hold_one(s: Arc<Shared>, d: Delivery) {
    let _held = GaugeGuard::new(telemetry::HELD);
    let wait = wait_of(d.properties.headers().as_ref());
    let key = cascade::held_key(d.properties.headers().as_ref());
    tokio::select! {
        _ = s.hard_stop.cancelled() => {
            let _ = d.acker.nack(requeue()).await;
            return;
        }
        _ = tokio::time::sleep(wait) => {}
    }
    // Back in the queue already (the channel failed): another holder has it.
    if !d.acker.usable() {
        return;
    }
    match s
        .publisher
        .confirmed(&s.out, &key, true, &d.data, d.properties.clone())
        .await
    {
        Ok(()) => match d.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {}
            // Released but still in the hold queue: it is released again
            // when redelivered, a duplicate, not a loss.
            Ok(false) => warn!("a released message could not be acked; it may be delivered twice"),
            Err(e) => {
                warn!(error = %e, "acking a released message failed; it may be delivered twice")
            }
        },
        Err(PublishError::Nacked) => {
            warn!(retry_in = ?NACKED_PAUSE, "the broker refused a released message; it returns to the hold queue");
            tokio::select! {
                _ = s.hard_stop.cancelled() => {}
                _ = tokio::time::sleep(NACKED_PAUSE) => {}
            }
            let _ = d.acker.nack(requeue()).await;
        }
        Err(e) => {
            warn!(error = %e, "releasing a held message failed; it stays in the hold queue");
            s.failed.cancel();
        }
    }
}

/// A holder on its own connection, until `shutdown`: for embedders and
/// tests that consume the work queue themselves. `run` workers hold
/// already (see [`crate::worker::run`]). It declares the prefix's cascade
/// whatever `broker.delay` says. Returns an error when the
/// connection or a release fails; held messages then return to the queue.
pub async fn run(broker: &BrokerSettings, shutdown: CancellationToken) -> Result<(), HoldError> {
    let conn = broker.url.connect("redeliver holder").await?;
    // The cascade's topology, whichever backend `broker` names: holding
    // is the cascade's.
    let cascade = DelayBackend::Cascade;
    let b = BrokerSettings {
        delay: cascade,
        ..broker.clone()
    };
    let topology = crate::delay::declare_topology(&b, &conn).await?;
    let publisher = Publisher::with_channels(
        &conn,
        CHANNELS,
        topology.clone(),
        cascade,
        Duration::from_secs(30),
    )
    .await?;
    let holder = Holder::start(&conn, &topology, publisher, PREFETCH).await?;
    let (tracker, hard_stop) = (TaskTracker::new(), CancellationToken::new());
    let result = holder
        .serve(shutdown, hard_stop.clone(), tracker.clone())
        .await;
    tracker.close();
    // Held messages are due within HOLD_MAX_MS: let them go out first.
    let grace = Duration::from_millis(u64::from(cascade::HOLD_MAX_MS) + 5_000);
    if result.is_err() || tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        hard_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
    }
    let _ = conn.close(200, "holder stopping".into()).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000_000; // µs

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn held_until_due_by_the_publishers_clock() {
        let now = NOW as i64;
        assert_eq!(ms(hold_for(Some(now + 300_000), Some(500), NOW)), 300);
        let wait = hold_for(Some(now + 1_234), Some(500), NOW);
        assert_eq!(wait, Duration::from_micros(1_234));
        // Due already (a redelivery after a holder crashed): at once.
        assert_eq!(hold_for(Some(now - 50), Some(500), NOW), Duration::ZERO);
    }

    #[test]
    fn never_longer_than_the_delay_from_arrival() {
        // A publisher clock an hour ahead: the delay from now, no more.
        let hour_ahead = NOW as i64 + 3_600_000_000;
        assert_eq!(ms(hold_for(Some(hour_ahead), Some(500), NOW)), 500);
        // No due time: the whole delay from now.
        assert_eq!(ms(hold_for(None, Some(40), NOW)), 40);
        // No delay: the longest a held delay can be, from now, whatever
        // the due time says.
        assert_eq!(ms(hold_for(None, None, NOW)), 1000);
        let due = Some(NOW as i64 + 300_000);
        assert_eq!(ms(hold_for(due, None, NOW)), 300);
        // A forged delay is capped at what the hold queue is for.
        assert_eq!(ms(hold_for(None, Some(i64::MAX), NOW)), 1000);
        assert_eq!(hold_for(Some(-5), Some(-5), NOW), Duration::ZERO);
    }

    #[test]
    fn the_due_time_set_at_publish_is_read_back() {
        // Published at NOW + 0.4 ms with 10 ms, arriving 0.7 ms later.
        let mut h = FieldTable::default();
        cascade::hold_entry(10, NOW + 400, &mut h);
        let due = h.inner().get(cascade::DUE_HEADER).and_then(state::int);
        let wait = hold_for(due, Some(10), NOW + 1_100);
        assert_eq!(wait, Duration::from_micros(9_300));
    }
}
