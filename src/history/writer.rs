//! The worker's side of the seam: [`Recorder::record`] returns once the
//! record is confirmed by the broker, so the worker acks a delivery only
//! after its record is safe.
//!
//! Records are batched without waiting for a batch to fill: one task takes
//! whatever piled up since its last turn, sends it as one message (JSON
//! lines, `wire`), and keeps up to [`IN_FLIGHT`] messages awaiting their
//! confirms while the next batch gathers. Under light load each record
//! goes alone, at once; under heavy load a confirm's round trip gathers
//! the next batch, and the broker sees one message per batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::{mpsc, oneshot};

use super::record::Attempt;
use super::stream::{bounded, HistoryError, OP_TIMEOUT};
use super::wire;

/// Records taken in one turn.
const TURN: usize = 4096;
/// Turns awaiting their confirms at once. One: the broker's cost is per
/// message far more than per byte, and the records of a busy worker that
/// pile up during one round trip then go as one message.
const IN_FLIGHT: usize = 1;
/// The shortest time between two turns. A busy worker's records then go
/// in a few hundred messages a second, whatever the round trip: each
/// message costs the broker and the worker far more than its bytes. The
/// ack waits that much longer; the concurrency slot does not (it is freed
/// when the attempt ends).
const LINGER: Duration = Duration::from_millis(5);

type Reply = oneshot::Sender<Result<(), HistoryError>>;

/// One record on its way: its JSON line and who waits for its confirm.
struct Job {
    line: Vec<u8>,
    done: Reply,
}

/// Cheap to clone; the writer's task ends with the last clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<Job>,
}

impl Recorder {
    /// Opens a confirm-mode channel on `conn` and starts the writer's task
    /// for the stream `name` (declared before: [`super::declare`]).
    pub async fn open(conn: &Connection, name: &str) -> Result<Recorder, HistoryError> {
        let ch = bounded(conn.create_channel()).await?;
        bounded(ch.confirm_select(ConfirmSelectOptions::default())).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(Arc::new(ch), Arc::from(name), rx));
        Ok(Recorder { tx })
    }

    /// Appends `a` to the stream; `Ok` once the broker confirmed it.
    pub async fn record(&self, a: &Attempt) -> Result<(), HistoryError> {
        let line = serde_json::to_vec(a).map_err(|e| HistoryError::Amqp(e.to_string()))?;
        let (done, confirmed) = oneshot::channel();
        self.tx
            .send(Job { line, done })
            .map_err(|_| HistoryError::Closed)?;
        confirmed.await.map_err(|_| HistoryError::Closed)?
    }
}

/// Turns until every [`Recorder`] is dropped and every confirm is in.
async fn run(ch: Arc<Channel>, name: Arc<str>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut flying = FuturesUnordered::new();
    let mut jobs = Vec::with_capacity(TURN);
    let mut last_turn = Instant::now();
    loop {
        tokio::select! {
            n = rx.recv_many(&mut jobs, TURN), if flying.len() < IN_FLIGHT => {
                if n == 0 {
                    break;
                }
                gather(&mut rx, &mut jobs, last_turn).await;
                last_turn = Instant::now();
                let (lines, replies): (Vec<_>, Vec<_>) =
                    jobs.drain(..).map(|j| (j.line, j.done)).unzip();
                let mut replies = replies.into_iter();
                for r in wire::runs(&lines, wire::MESSAGE_BYTES) {
                    let waiting: Vec<Reply> = replies.by_ref().take(r.len()).collect();
                    let body = wire::body(&lines[r]);
                    flying.push(send(ch.clone(), name.clone(), body, waiting));
                }
            }
            Some(()) = flying.next(), if !flying.is_empty() => {}
        }
    }
    while flying.next().await.is_some() {}
    let _ = ch.close(200, "history writer done".into()).await;
}

/// Turns come at most every [`LINGER`]: a turn sooner than that waits out
/// the rest, taking what arrives meanwhile. After a quiet spell a record
/// goes at once.
async fn gather(rx: &mut mpsc::UnboundedReceiver<Job>, jobs: &mut Vec<Job>, last_turn: Instant) {
    let rest = LINGER.saturating_sub(last_turn.elapsed());
    if rest.is_zero() || jobs.len() >= TURN {
        return;
    }
    tokio::time::sleep(rest).await;
    while jobs.len() < TURN {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// Publishes one message and tells each of its records' waiters.
async fn send(ch: Arc<Channel>, name: Arc<str>, body: Vec<u8>, waiting: Vec<Reply>) {
    let result = publish(&ch, &name, &body).await;
    if let Err(e) = &result {
        tracing::warn!(error = %e, records = waiting.len(), "history records not confirmed");
    }
    for w in waiting {
        let _ = w.send(result.clone());
    }
}

async fn publish(ch: &Channel, name: &str, body: &[u8]) -> Result<(), HistoryError> {
    // delivery_mode 2: persistent, as for every message redeliver keeps.
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(wire::CONTENT_TYPE.into());
    // mandatory: a stream that is gone is an error, not a silent drop.
    let opts = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirm = async {
        // To the fanout of the stream's name: the stream, and any queue bound.
        ch.basic_publish(name.into(), "".into(), opts, body, props)
            .await?
            .await
    };
    match tokio::time::timeout(OP_TIMEOUT, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(_)))) => Err(HistoryError::Unroutable(name.to_string())),
        Ok(Ok(Confirmation::Nack(_))) => Err(HistoryError::Nacked),
        Ok(Ok(Confirmation::NotRequested)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(HistoryError::Timeout(OP_TIMEOUT)),
    }
}
