//! Acks and requeues of one consumer channel, batched where that is safe.
//!
//! Each delivery's task used to ack through its own `Acker`: one frame,
//! one promise and three cross-thread hand-offs (the task, lapin's RPC
//! task, its I/O loop) per delivery. Here every settle of a channel goes,
//! in order, to one task, which sends what piled up since its last turn:
//!
//! - a requeue at once, on its own (`basic.nack`, requeue);
//! - the run of acks that continues the channel's settled prefix as **one**
//!   `basic.ack` with `multiple`, which acks every unacked tag up to it;
//! - any other ack (above a tag not settled yet) waits up to [`COALESCE`]
//!   (5 ms) for the tags below it, since deliveries finish out of order by
//!   about that much and one `multiple` ack then covers them all; past
//!   that it goes on its own. It is never held longer for a slower
//!   delivery below it (a 30 s attempt, a 3 s settle, a wait in the
//!   worker), which would take prefetch room and delay nothing but the ack.
//!
//! `multiple` is only sent when every tag up to it is settled (acked,
//! about to be, or requeued before), so it never acks a delivery still
//! being attempted or held: the ack still comes after its copy's confirm.
//! Nothing waits for a batch to fill; under light load each ack goes out
//! alone, as soon as it is asked for. Each ack sent on its own is a
//! command of its own for a quorum queue (10–30 µs of broker CPU here).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::join_all;
use lapin::options::BasicAckOptions;
use lapin::Channel;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::telemetry;

/// At most this many settles are planned in one turn.
const TURN: usize = 512;

/// How long an ack above an unsettled tag waits for the tags below it:
/// deliveries finish out of order by about an HTTP answer's or a
/// confirm's spread, and each ack sent on its own is a command of its own
/// for a quorum queue. Past it the ack goes alone (a 2 s settle or a
/// delivery waiting in the worker below it is not waited for).
const COALESCE: Duration = Duration::from_millis(5);

/// How long a retired consumer's channel stays open after its last ack
/// was sent: lapin treats a frame that reaches a closing channel as a
/// connection error, and a delivery the broker sent right after the
/// cancel-ok may still be on its way.
const CLOSE_AFTER: Duration = Duration::from_secs(1);

/// How long the channel's close-ok is waited for: a broker that does not
/// answer must not hold a stop.
const CLOSE_OK_BOUND: Duration = Duration::from_secs(2);

/// How a delivery is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settle {
    Ack(u64),
    /// Back to the queue (`basic.nack`, requeue).
    Requeue(u64),
}

/// A frame to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Ack { tag: u64, multiple: bool },
    Requeue(u64),
}

/// The channel's settled tags (pure: the planning, unit-tested).
#[derive(Debug, Default)]
pub(super) struct Book {
    /// Every tag up to this one is settled.
    floor: u64,
    /// Settled tags above the floor (acked or requeued on their own).
    above: BTreeSet<u64>,
    /// Acks above the floor not sent yet: a slower delivery below them
    /// may settle within [`COALESCE`], and one `multiple` ack then covers
    /// them all.
    pending: BTreeSet<u64>,
}

impl Book {
    /// The frames for `batch`, in the order to send them; with `flush`,
    /// the acks still pending above the floor go too, each on its own.
    pub(super) fn plan(&mut self, batch: &[Settle], flush: bool) -> Vec<Frame> {
        let mut frames = vec![];
        for s in batch {
            match *s {
                Settle::Requeue(tag) => {
                    frames.push(Frame::Requeue(tag));
                    self.above.insert(tag);
                }
                Settle::Ack(tag) => {
                    self.pending.insert(tag);
                }
            }
        }
        // The run continuing the settled prefix: one ack, `multiple`.
        let (mut run, mut last) = (0, None);
        loop {
            let next = self.floor + 1;
            if self.pending.remove(&next) {
                run += 1;
                last = Some(next);
            } else if !self.above.remove(&next) {
                break;
            }
            self.floor = next;
        }
        if let Some(tag) = last {
            frames.push(Frame::Ack {
                tag,
                multiple: run > 1,
            });
        }
        if flush {
            for tag in std::mem::take(&mut self.pending) {
                frames.push(Frame::Ack {
                    tag,
                    multiple: false,
                });
                self.above.insert(tag);
            }
        }
        frames
    }

    /// Acks wait to be sent.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// The sending side: cheap to call from a delivery's task.
#[derive(Debug)]
pub(super) struct Acks(mpsc::UnboundedSender<Settle>);

impl Acks {
    /// Starts the channel's ack task on `tracker`. Once this handle is
    /// dropped (its consumer retired and every delivery settled), the task
    /// sends everything asked for, then closes the channel, which returns
    /// anything still unacked there. It waits for the close-ok, also when
    /// `ending` (the session's end) is set: the broker handles a channel's
    /// frames in order, so the close-ok says every ack before it was taken.
    /// Leaving the acks to the connection's close lost them (seen in CI on
    /// 4.3.6, here about once in 25 stops): a channel lapin auto-closes on
    /// drop raced the connection's close ("invalid channel state:
    /// Closing"), lapin raised a connection error and dropped the socket,
    /// and the broker requeued deliveries whose acks it had not taken:
    /// redelivered, not lost, but each one a duplicate. `queue` labels its
    /// frames in `redeliver_ack_frames_total`: per lane, an operator sees
    /// which lane's acks go alone.
    pub(super) fn start(
        channel: Channel,
        tracker: &TaskTracker,
        ending: Arc<AtomicBool>,
        queue: String,
    ) -> Acks {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(async move {
            run(&channel, rx, &queue).await;
            // A retired consumer's late deliveries: see `CLOSE_AFTER`. At
            // the session's end the consumers' cancel-ok came first.
            if !ending.load(Ordering::Relaxed) {
                tokio::time::sleep(CLOSE_AFTER).await;
            }
            let close = channel.close(200, "consumer done".into());
            let _ = tokio::time::timeout(CLOSE_OK_BOUND, close).await;
        });
        Acks(tx)
    }

    pub(super) fn settle(&self, s: Settle) {
        // A send fails only once the task ended with its channel: the
        // broker requeues what was unacked there.
        let _ = self.0.send(s);
    }
}

async fn run(channel: &Channel, mut rx: mpsc::UnboundedReceiver<Settle>, queue: &str) {
    let mut book = Book::default();
    let mut batch = Vec::with_capacity(TURN);
    // Since when acks above the floor wait (see `Book::pending`).
    let mut waiting_since: Option<Instant> = None;
    loop {
        let got = match waiting_since {
            None => rx.recv_many(&mut batch, TURN).await,
            Some(since) => {
                let until = since + COALESCE;
                let next = tokio::time::timeout_at(until, rx.recv_many(&mut batch, TURN));
                next.await.unwrap_or(usize::MAX)
            }
        };
        // The channel's end (0) sends what is left; so does a wait over.
        let over = got == 0 || waiting_since.is_some_and(|t| t.elapsed() >= COALESCE);
        let frames = book.plan(&batch, over);
        batch.clear();
        waiting_since = match book.has_pending() {
            true => waiting_since.or(Some(Instant::now())),
            false => None,
        };
        // Polled in order, so the frames leave in this order.
        let sent = join_all(frames.iter().map(|f| send(channel, *f, queue))).await;
        if let Some(e) = sent.into_iter().find_map(Result::err) {
            warn!(error = %e, "ack/nack failed; the broker will redeliver");
        }
        if got == 0 {
            return;
        }
    }
}

async fn send(channel: &Channel, f: Frame, queue: &str) -> Result<(), lapin::Error> {
    match f {
        // multiple: every unacked tag up to `tag`, all settled (see `plan`).
        Frame::Ack { tag, multiple } => {
            let kind = if multiple { "multiple" } else { "single" };
            let queue = queue.to_string();
            metrics::counter!(telemetry::ACK_FRAMES, "kind" => kind, "queue" => queue).increment(1);
            channel.basic_ack(tag, BasicAckOptions { multiple }).await
        }
        Frame::Requeue(tag) => channel.basic_nack(tag, crate::amqp::requeue()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Frame::{Ack, Requeue};

    fn ack(tag: u64, multiple: bool) -> Frame {
        Ack { tag, multiple }
    }

    #[test]
    fn a_contiguous_run_is_one_multiple_ack() {
        let mut b = Book::default();
        let f = b.plan(&[Settle::Ack(2), Settle::Ack(1), Settle::Ack(3)], false);
        assert_eq!(f, vec![ack(3, true)]);
        assert_eq!(b.plan(&[Settle::Ack(4)], false), vec![ack(4, false)]);
    }

    #[test]
    fn an_ack_above_an_unsettled_tag_waits_for_it() {
        let mut b = Book::default();
        // 1 is still being attempted: 2 and 3 wait.
        assert!(b.plan(&[Settle::Ack(2), Settle::Ack(3)], false).is_empty());
        assert!(b.has_pending());
        // 1 settles within the wait: one ack covers all three.
        assert_eq!(b.plan(&[Settle::Ack(1)], false), vec![ack(3, true)]);
        assert!(!b.has_pending());
    }

    #[test]
    fn past_the_wait_an_ack_above_an_unsettled_tag_goes_alone() {
        let mut b = Book::default();
        // 1 is held for the settle, longer than the wait.
        assert!(b.plan(&[Settle::Ack(2), Settle::Ack(3)], false).is_empty());
        assert_eq!(b.plan(&[], true), vec![ack(2, false), ack(3, false)]);
        // 1 settles: the prefix moves past 2 and 3 without acking them again.
        assert_eq!(b.plan(&[Settle::Ack(1)], false), vec![ack(1, false)]);
        assert_eq!(
            b.plan(&[Settle::Ack(4), Settle::Ack(5)], false),
            vec![ack(5, true)]
        );
    }

    #[test]
    fn multiple_never_covers_an_unsettled_tag() {
        let mut b = Book::default();
        let all = [
            Settle::Ack(1),
            Settle::Ack(2),
            Settle::Ack(4),
            Settle::Ack(5),
        ];
        let f = b.plan(&all, true);
        assert_eq!(f, vec![ack(2, true), ack(4, false), ack(5, false)]);
        // 3 is requeued: it is never covered by an ack.
        let f = b.plan(&[Settle::Requeue(3), Settle::Ack(6), Settle::Ack(7)], false);
        assert_eq!(f, vec![Requeue(3), ack(7, true)]);
    }

    #[test]
    fn a_requeue_goes_at_once_and_before_acks_of_its_batch() {
        let mut b = Book::default();
        let f = b.plan(&[Settle::Ack(2), Settle::Requeue(1)], false);
        assert_eq!(f, vec![Requeue(1), ack(2, false)]);
        let f = b.plan(&[Settle::Ack(4), Settle::Requeue(5)], false);
        assert_eq!(f, vec![Requeue(5)], "4 waits for 3; 5 goes at once");
    }
}
