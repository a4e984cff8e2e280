//! `dlq replay`: republishes dead letters to the work queue at a bounded
//! pace, a batch of confirms at a time, and stops cleanly when asked.
//!
//! A replayed dead letter is removed (acked) only after the broker
//! confirmed its republish, and a stop waits for the batch in flight, so a
//! stopped replay leaves every dead letter it did not finish in the queue,
//! in order: running it again continues there and replays nothing twice.
//! Only a hard kill between a confirm and its ack can replay one twice
//! (at-least-once; receivers dedupe by the id).

use std::time::{Duration, Instant};

use lapin::message::Delivery;
use lapin::{Connection, PublisherConfirm};
use tokio_util::sync::CancellationToken;

use super::reader::Reader;
use super::{dead_letters_now, fresh, selected, DlqError, Summary};
use crate::message::dead_letter::Filter;
use crate::policy::{Pacer, Rate};
use crate::publish::Publisher;
use crate::topology::Topology;

/// A batch is settled at the latest this long after its first republish,
/// so a slow `--rate` does not keep confirmed dead letters unacked for long.
const SETTLE_AFTER: Duration = Duration::from_secs(1);

/// How a replay goes.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Most republishes per interval (`None`: as fast as the broker confirms).
    pub rate: Option<Rate>,
    /// Republishes in flight before their confirms are awaited and the
    /// dead letters removed (at least 1).
    pub batch: usize,
    /// Cancelled: no new republish starts; the batch in flight is settled.
    pub stop: CancellationToken,
}

/// How far a replay has got, reported after every dead letter looked at.
#[derive(Clone, Copy, Debug)]
pub struct ReplayProgress {
    /// Dead letters in the queue when the replay started.
    pub total: usize,
    /// Of those, looked at so far.
    pub seen: usize,
    /// Replayed (confirmed and removed) so far.
    pub replayed: usize,
    pub elapsed: Duration,
}

/// Republished, not yet confirmed: the dead letter, its window and its
/// id (for the error).
struct InFlight {
    window: usize,
    delivery: Delivery,
    id: String,
    confirm: PublisherConfirm,
}

/// Replays the dead letters that match `filter` (at most `limit`), in
/// order, paced by `opts`; `progress` hears of each step.
pub async fn replay(
    conn: &Connection,
    topology: &Topology,
    filter: &Filter,
    limit: Option<usize>,
    publisher: &Publisher,
    opts: &ReplayOptions,
    mut progress: impl FnMut(&ReplayProgress),
) -> Result<Summary, DlqError> {
    let total = dead_letters_now(conn, topology).await?;
    let mut reader = Reader::new(conn, &topology.dead);
    let mut run = Run {
        reader: &mut reader,
        publisher,
        opts,
        started: Instant::now(),
        total,
        s: Summary {
            total,
            ..Summary::default()
        },
        batch: Vec::with_capacity(opts.batch),
    };
    let result = run.go(filter, limit, &mut progress).await;
    // Settle what is in flight also after an error: confirmed ones go.
    let settled = run.settle().await;
    let s = run.s;
    // The kept dead letters go back in order.
    reader.finish().await;
    result.and(settled).map(|()| s)
}

struct Run<'a, 'r> {
    reader: &'a mut Reader<'r>,
    publisher: &'a Publisher,
    opts: &'a ReplayOptions,
    started: Instant,
    total: usize,
    s: Summary,
    batch: Vec<InFlight>,
}

impl Run<'_, '_> {
    async fn go(
        &mut self,
        filter: &Filter,
        limit: Option<usize>,
        progress: &mut impl FnMut(&ReplayProgress),
    ) -> Result<(), DlqError> {
        let now_ms = crate::clock::now_ms();
        let mut pacer = Pacer::default();
        let stop = self.opts.stop.clone();
        // `stop` is checked between messages, not raced with `next`, which
        // may be opening a window (a consumer must never go untracked);
        // `next` returns within two idle looks anyway.
        while self.s.seen < self.total && !stop.is_cancelled() {
            if self.reader.window_full() {
                // Before the walk moves to a new window: acking the batch
                // later would free room on a consumer no longer read, and
                // the broker would push it messages nobody takes.
                self.settle().await?;
            }
            let Some(m) = self.reader.next().await? else {
                break;
            };
            let window = self.reader.window();
            self.s.seen += 1;
            if let Some(d) = selected(&m, filter, limit, now_ms, &mut self.s) {
                if !self.wait_turn(&mut pacer).await? {
                    break; // stopped while waiting: this one stays
                }
                self.start(window, m, d.id).await?;
            }
            progress(&self.progress());
        }
        Ok(())
    }

    /// Waits for the pace's next turn, settling the batch first when the
    /// wait is long; `false` when stopped meanwhile.
    async fn wait_turn(&mut self, pacer: &mut Pacer) -> Result<bool, DlqError> {
        let Some(rate) = self.opts.rate else {
            return Ok(true);
        };
        let wait = pacer.reserve(Instant::now(), rate);
        if wait >= SETTLE_AFTER / 4 {
            self.settle().await?;
        }
        tokio::select! {
            biased;
            () = self.opts.stop.cancelled() => Ok(false),
            () = tokio::time::sleep(wait) => Ok(true),
        }
    }

    async fn start(&mut self, window: usize, m: Delivery, id: String) -> Result<(), DlqError> {
        let republish = self
            .publisher
            .start_to_work_queue(&m.data, fresh(&m.properties))
            .await;
        let confirm = republish.map_err(|source| DlqError::Republish {
            id: id.clone(),
            source,
        })?;
        self.batch.push(InFlight {
            window,
            delivery: m,
            id,
            confirm,
        });
        let full = self.batch.len() >= self.opts.batch.max(1);
        if full || self.started_at_least(SETTLE_AFTER) {
            self.settle().await?;
        }
        Ok(())
    }

    /// Whether the oldest republish in flight is `age` old (approximately:
    /// a batch is settled within a pace's turn of it).
    fn started_at_least(&self, age: Duration) -> bool {
        let Some(rate) = self.opts.rate else {
            return false;
        };
        rate.interval().saturating_mul(self.batch.len() as u32) >= age
    }

    /// Waits for every confirm in flight, in order, and removes each
    /// confirmed dead letter; the first failure stops there (the rest stay
    /// dead letters, and may also be in the work queue).
    async fn settle(&mut self) -> Result<(), DlqError> {
        for f in std::mem::take(&mut self.batch) {
            if let Err(source) = self.publisher.settle(f.confirm).await {
                return Err(DlqError::Republish { id: f.id, source });
            }
            self.reader.ack(f.window, &f.delivery).await?;
            self.s.done += 1;
        }
        Ok(())
    }

    fn progress(&self) -> ReplayProgress {
        ReplayProgress {
            total: self.total,
            seen: self.s.seen,
            replayed: self.s.done,
            elapsed: self.started.elapsed(),
        }
    }
}
