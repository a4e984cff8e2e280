//! Reads the dead-letter queue in its order and gives back what was kept
//! in that order, on a quorum queue as on a classic one.
//!
//! Kept messages stay unacked and return to the queue when their channel
//! closes. How they return is what this file is about:
//! - A quorum queue returns a consumer's messages sorted by the order it
//!   received them, and serves returned messages before the others. It
//!   does not keep the order across consumers: each `basic.get` is a
//!   consumer of its own, and the consumers of a closed channel are
//!   returned in no particular order (measured on 3.10: a walk of 40 came
//!   back shuffled). So each channel has one `basic.consume` consumer.
//! - Its prefetch (the window) bounds how many messages the broker pushes
//!   ahead, and so the memory; a window full of kept messages moves the
//!   walk on to a new channel with a consumer of its own.
//! - The channels are closed in the order they were opened, each once the
//!   one before has visibly returned its messages (the queue's ready count
//!   has grown by them), so the blocks come back in order too; and the walk
//!   ends only once the last block is back, so the next walk sees them.
//! - A classic queue puts returned messages back at their old positions,
//!   whatever the order of returns.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use tracing::warn;

/// Unacked messages per channel: what the broker may push ahead of the
/// walk, and so the most message bodies held in memory at once.
const WINDOW: u16 = 2_000;

/// How long to wait for the next message before asking whether any is
/// left (another walk may hold the rest). The walk ends after two such
/// waits in a row find nothing ready: a message already on its way to this
/// consumer counts as unacked, not ready, so one empty look is not proof.
const IDLE: Duration = Duration::from_secs(1);

/// How long to wait for a closed channel's messages to be back before
/// closing the next one anyway (nothing is lost then; only the order of
/// the two blocks may differ).
const RETURN_WAIT: Duration = Duration::from_secs(10);

/// One channel of the walk: its consumer and how many of its deliveries
/// are still unacked.
struct Window {
    ch: Channel,
    consumer: Consumer,
    unacked: usize,
}

pub(super) struct Reader<'a> {
    conn: &'a Connection,
    queue: String,
    /// Every channel opened, in order; the last is the one being read.
    windows: Vec<Window>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(conn: &'a Connection, queue: &str) -> Self {
        Reader {
            conn,
            queue: queue.to_string(),
            windows: vec![],
        }
    }

    /// The next message, or `None` when the queue has nothing more to give.
    /// The message counts as kept until [`Reader::ack`] removes it.
    pub(super) async fn next(&mut self) -> Result<Option<Delivery>, lapin::Error> {
        if self.window_full() {
            self.open().await?;
        }
        let mut empty_looks = 0;
        loop {
            let Some(w) = self.windows.last_mut() else {
                return Ok(None);
            };
            match tokio::time::timeout(IDLE, w.consumer.next()).await {
                Ok(Some(delivery)) => {
                    w.unacked += 1;
                    return delivery.map(Some);
                }
                // The broker cancelled the consumer (the queue was deleted).
                Ok(None) => return Ok(None),
                Err(_) => {
                    empty_looks = if self.ready().await? == 0 {
                        empty_looks + 1
                    } else {
                        0
                    };
                    if empty_looks >= 2 {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Removes `d`, a message [`Reader::next`] gave, from the queue (it was
    /// replayed or purged).
    /// `window` is what [`Reader::window`] said when `d` was taken: a
    /// replay acks a batch after its confirms, maybe from an earlier window.
    pub(super) async fn ack(&mut self, window: usize, d: &Delivery) -> Result<(), lapin::Error> {
        d.acker.ack(BasicAckOptions::default()).await?;
        if let Some(w) = self.windows.get_mut(window) {
            w.unacked -= 1;
        }
        Ok(())
    }

    /// Whether the next [`Reader::next`] opens a new window: the current
    /// one holds [`WINDOW`] unacked messages (or there is none yet).
    pub(super) fn window_full(&self) -> bool {
        self.windows
            .last()
            .is_none_or(|w| w.unacked >= usize::from(WINDOW))
    }

    /// The window the message [`Reader::next`] gave last belongs to.
    pub(super) fn window(&self) -> usize {
        self.windows.len().saturating_sub(1)
    }

    /// Gives every kept message back, window by window, in order. Best
    /// effort: a step that fails is logged and the rest go on, since every
    /// kept message returns to the queue anyway when the connection closes
    /// (only their order is at stake).
    pub(super) async fn finish(self) {
        // First stop every consumer, so that a block returned by one
        // channel is not pushed to a consumer of a later one (which would
        // return it behind its own).
        for w in &self.windows {
            let tag = w.consumer.tag();
            let cancel = BasicCancelOptions::default();
            if let Err(e) = w.ch.basic_cancel(tag.as_str().into(), cancel).await {
                warn!(error = %e, "dead-letter walk: cancelling a consumer failed");
            }
        }
        // Even a single block is waited for: a command that ends before
        // its kept messages are back leaves the next one (a `dlq list` run
        // right after) a queue that looks empty for seconds. Seen on a
        // busy three-node cluster: a second list found none of ten.
        let probe = match self.windows.iter().any(|w| w.unacked > 0) {
            false => None,
            true => self.conn.create_channel().await.ok(),
        };
        let baseline = match &probe {
            Some(p) => ready_on(p, &self.queue).await.ok(),
            None => None,
        };
        let mut back = 0u64;
        for w in &self.windows {
            let _ = w.ch.close(200, "dead-letter walk done".into()).await;
            back += w.unacked as u64;
            if let (Some(p), Some(base)) = (&probe, baseline) {
                wait_ready(p, &self.queue, base + back).await;
            }
        }
        if let Some(p) = probe {
            let _ = p.close(200, "dead-letter walk done".into()).await;
        }
    }

    /// A new channel whose one consumer may hold [`WINDOW`] messages.
    async fn open(&mut self) -> Result<(), lapin::Error> {
        // Two channels are kept for counting: beyond the broker's channel
        // limit the walk could not give its windows back in order.
        let max = usize::from(self.conn.configuration().channel_max());
        if max > 0 && self.windows.len() + 3 > max {
            let what = format!(
                "the dead-letter queue holds more than {} messages, more than one walk \
                 can read in order on this broker (channel_max {max})",
                self.windows.len() * usize::from(WINDOW)
            );
            return Err(std::io::Error::other(what).into());
        }
        let ch = self.conn.create_channel().await?;
        // basic.qos before basic.consume: a per-consumer prefetch applies
        // to the consumers started after it.
        ch.basic_qos(WINDOW, BasicQosOptions { global: false })
            .await?;
        let tag = format!("redeliver-dlq-{}", self.windows.len());
        let consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        self.windows.push(Window {
            ch,
            consumer,
            unacked: 0,
        });
        Ok(())
    }

    async fn ready(&self) -> Result<u64, lapin::Error> {
        match self.windows.last() {
            Some(w) => ready_on(&w.ch, &self.queue).await,
            None => Ok(0),
        }
    }
}

/// Waits until `queue` has `want` messages ready: the block a closed
/// channel returned is back. A message that arrives meanwhile counts too,
/// and can end the wait early; then, or after [`RETURN_WAIT`], the next
/// block may come back before this one (nothing is lost).
async fn wait_ready(probe: &Channel, queue: &str, want: u64) {
    let deadline = tokio::time::Instant::now() + RETURN_WAIT;
    loop {
        match ready_on(probe, queue).await {
            Ok(n) if n >= want => return,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(n) => {
                warn!(ready = n, want, "dead-letter walk: a block was not back in time; the order of two blocks may differ");
                return;
            }
            Err(e) => {
                warn!(error = %e, "dead-letter walk: cannot count the queue; the order of two blocks may differ");
                return;
            }
        }
    }
}

/// Messages ready in `queue` (not counting unacked ones).
async fn ready_on(ch: &Channel, queue: &str) -> Result<u64, lapin::Error> {
    crate::topology::ready_count(ch, queue).await.map(u64::from)
}
