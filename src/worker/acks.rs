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
//! - any other ack on its own, at once: it is never held back for a slower
//!   delivery below it (a 30 s attempt, a 2 s settle), which would take
//!   prefetch room and delay nothing but the ack.
//!
//! `multiple` is only sent when every tag up to it is settled (acked,
//! about to be, or requeued before), so it never acks a delivery still
//! being attempted or held: the ack still comes after its copy's confirm.
//! Nothing waits for a batch to fill; under light load each ack goes out
//! alone, as soon as it is asked for.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lapin::options::BasicAckOptions;
use lapin::Channel;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tracing::warn;

/// At most this many settles are planned in one turn.
const TURN: usize = 512;

/// How long a retired consumer's channel stays open after its last ack
/// was sent: lapin treats a frame that reaches a closing channel as a
/// connection error, and a delivery the broker sent right after the
/// cancel-ok may still be on its way.
const CLOSE_AFTER: Duration = Duration::from_secs(1);

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
}

impl Book {
    /// The frames for `batch`, in the order to send them.
    pub(super) fn plan(&mut self, batch: &[Settle]) -> Vec<Frame> {
        let mut frames = vec![];
        let mut acks = BTreeSet::new();
        for s in batch {
            match *s {
                Settle::Requeue(tag) => {
                    frames.push(Frame::Requeue(tag));
                    self.above.insert(tag);
                }
                Settle::Ack(tag) => {
                    acks.insert(tag);
                }
            }
        }
        // The run continuing the settled prefix: one ack, `multiple`.
        let (mut run, mut last) = (0, None);
        loop {
            let next = self.floor + 1;
            if acks.remove(&next) {
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
        // The rest on their own, now.
        for tag in acks {
            frames.push(Frame::Ack {
                tag,
                multiple: false,
            });
            self.above.insert(tag);
        }
        frames
    }
}

/// The sending side: cheap to call from a delivery's task.
#[derive(Debug)]
pub(super) struct Acks(mpsc::UnboundedSender<Settle>);

impl Acks {
    /// Starts the channel's ack task on `tracker`. Once this handle is
    /// dropped (its consumer retired and every delivery settled), the task
    /// sends everything asked for, then closes the channel, which returns
    /// anything still unacked there; unless `ending` is set: the session's
    /// end closes the connection, and every channel with it.
    pub(super) fn start(channel: Channel, tracker: &TaskTracker, ending: Arc<AtomicBool>) -> Acks {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(async move {
            run(&channel, rx).await;
            if ending.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(CLOSE_AFTER).await;
            if !ending.load(Ordering::Relaxed) {
                let _ = channel.close(200, "consumer retired".into()).await;
            }
        });
        Acks(tx)
    }

    pub(super) fn settle(&self, s: Settle) {
        // A send fails only once the task ended with its channel: the
        // broker requeues what was unacked there.
        let _ = self.0.send(s);
    }
}

async fn run(channel: &Channel, mut rx: mpsc::UnboundedReceiver<Settle>) {
    let mut book = Book::default();
    let mut batch = Vec::with_capacity(TURN);
    while rx.recv_many(&mut batch, TURN).await > 0 {
        let frames = book.plan(&batch);
        batch.clear();
        // Polled in order, so the frames leave in this order.
        let sent = join_all(frames.iter().map(|f| send(channel, *f))).await;
        if let Some(e) = sent.into_iter().find_map(Result::err) {
            warn!(error = %e, "ack/nack failed; the broker will redeliver");
        }
    }
}

async fn send(channel: &Channel, f: Frame) -> Result<(), lapin::Error> {
    match f {
        // multiple: every unacked tag up to `tag`, all settled (see `plan`).
        Frame::Ack { tag, multiple } => channel.basic_ack(tag, BasicAckOptions { multiple }).await,
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
        let f = b.plan(&[Settle::Ack(2), Settle::Ack(1), Settle::Ack(3)]);
        assert_eq!(f, vec![ack(3, true)]);
        assert_eq!(b.plan(&[Settle::Ack(4)]), vec![ack(4, false)]);
    }

    #[test]
    fn an_ack_above_an_unsettled_tag_goes_alone_and_at_once() {
        let mut b = Book::default();
        // 1 is still being attempted (or held for the settle).
        let f = b.plan(&[Settle::Ack(2), Settle::Ack(3)]);
        assert_eq!(f, vec![ack(2, false), ack(3, false)]);
        // 1 settles: the prefix moves past 2 and 3 without acking them again.
        assert_eq!(b.plan(&[Settle::Ack(1)]), vec![ack(1, false)]);
        assert_eq!(
            b.plan(&[Settle::Ack(4), Settle::Ack(5)]),
            vec![ack(5, true)]
        );
    }

    #[test]
    fn multiple_never_covers_an_unsettled_tag() {
        let mut b = Book::default();
        let f = b.plan(&[
            Settle::Ack(1),
            Settle::Ack(2),
            Settle::Ack(4),
            Settle::Ack(5),
        ]);
        assert_eq!(f, vec![ack(2, true), ack(4, false), ack(5, false)]);
        // 3 is requeued: it is never covered by an ack.
        let f = b.plan(&[Settle::Requeue(3), Settle::Ack(6), Settle::Ack(7)]);
        assert_eq!(f, vec![Requeue(3), ack(7, true)]);
    }

    #[test]
    fn a_requeue_goes_before_acks_of_its_batch() {
        let mut b = Book::default();
        let f = b.plan(&[Settle::Ack(2), Settle::Requeue(1)]);
        assert_eq!(f, vec![Requeue(1), ack(2, false)]);
    }
}
