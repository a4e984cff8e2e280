//! Follows the history stream into the index: from the stored offset (the
//! whole retained stream for a fresh index), in batches, each batch's rows
//! and its resume offset in one transaction. Ready once it has read past
//! a marker it appended at its start: every record confirmed before the
//! console started is then indexed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};

use super::error::{ConsoleError, Db};
use super::index::{self, Row};
use crate::history::wire;

/// Deliveries the broker may send ahead: the stream reader's credit.
const PREFETCH: u16 = 2_000;
/// A batch closes after this many messages or this long without one.
const BATCH: usize = 1_000;
const GATHER: Duration = Duration::from_millis(20);
/// The header that marks a console's readiness marker (empty body).
pub const MARKER: &str = "redeliver-marker";

/// What the follower owns between batches.
pub struct Follower {
    ch: Channel,
    consumer: lapin::Consumer,
    /// The marker to read past before the console is ready.
    marker: String,
}

impl Follower {
    /// Appends a marker, then starts consuming at `from` (or the first
    /// retained record).
    pub async fn open(
        conn: &Connection,
        name: &str,
        from: Option<u64>,
    ) -> Result<Self, ConsoleError> {
        let ch = conn.create_channel().await?;
        let marker = append_marker(&ch, name).await?;
        // A stream consumer must set a prefetch: it is its credit window.
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let mut args = FieldTable::default();
        // x-stream-offset: where the index stopped, or the whole retained log.
        let start = match from {
            Some(o) => AMQPValue::LongLongInt(o as i64),
            None => AMQPValue::LongString("first".into()),
        };
        args.insert("x-stream-offset".into(), start);
        let opts = BasicConsumeOptions::default();
        let consumer = ch
            .basic_consume(name.into(), "redeliver-console".into(), opts, args)
            .await?;
        Ok(Follower {
            ch,
            consumer,
            marker,
        })
    }

    /// Indexes batches until the consumer ends (`Err`) or `stop` fires.
    pub async fn run(
        mut self,
        db: &Db,
        ready: &AtomicBool,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<(), ConsoleError> {
        loop {
            let batch = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                b = self.gather() => b?,
            };
            let Some(last) = batch.last() else {
                return Err(ConsoleError::StreamEnded);
            };
            let (tag, next) = (last.delivery_tag, offset(last).map_or(0, |o| o + 1));
            let (rows, saw_marker) = rows(&batch, &self.marker);
            let db = db.clone();
            tokio::task::spawn_blocking(move || {
                let mut c = db.lock().map_err(|_| ConsoleError::Poisoned)?;
                index::ingest(&mut c, &rows, next).map_err(ConsoleError::from)
            })
            .await??;
            self.ch
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await?;
            if saw_marker {
                ready.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The next deliveries: one awaited, then whatever follows within
    /// [`GATHER`] of the last, up to [`BATCH`].
    async fn gather(&mut self) -> Result<Vec<Delivery>, ConsoleError> {
        let mut batch = vec![];
        let Some(first) = self.consumer.next().await else {
            return Ok(batch);
        };
        batch.push(first?);
        while batch.len() < BATCH {
            match tokio::time::timeout(GATHER, self.consumer.next()).await {
                Ok(Some(d)) => batch.push(d?),
                Ok(None) | Err(_) => break,
            }
        }
        Ok(batch)
    }
}

/// The records of `batch`; a line that is no record is skipped with a
/// warning (another writer's message), and whether the marker was read.
fn rows(batch: &[Delivery], marker: &str) -> (Vec<Row>, bool) {
    let (mut out, mut saw) = (vec![], false);
    for d in batch {
        if d.properties.message_id().as_ref().map(|m| m.as_str()) == Some(marker) {
            saw = true;
        }
        let Some(offset) = offset(d) else { continue };
        for (line, bytes) in wire::lines(&d.data).enumerate() {
            match serde_json::from_slice(bytes) {
                Ok(attempt) => out.push(Row {
                    offset,
                    line: line as u32,
                    json: String::from_utf8_lossy(bytes).into_owned(),
                    attempt,
                }),
                Err(e) => {
                    tracing::warn!(offset, line, error = %e, "skipped a line of the history stream that is not a record")
                }
            }
        }
    }
    (out, saw)
}

fn offset(d: &Delivery) -> Option<u64> {
    match d
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-stream-offset"))
    {
        Some(AMQPValue::LongLongInt(o)) => Some((*o).max(0) as u64),
        _ => None,
    }
}

/// Appends an empty message marked [`MARKER`], confirmed; its id.
async fn append_marker(ch: &Channel, name: &str) -> Result<String, ConsoleError> {
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let id = format!("marker_{}", uuid::Uuid::new_v4().simple());
    let mut h = FieldTable::default();
    h.insert(MARKER.into(), AMQPValue::Boolean(true));
    let props = BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_content_type(wire::CONTENT_TYPE.into())
        .with_headers(h);
    // mandatory: no stream, no marker: an error, not a wait forever.
    let opts = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirm = ch
        .basic_publish("".into(), name.into(), opts, b"", props)
        .await?
        .await?;
    match confirm {
        lapin::Confirmation::Ack(None) => Ok(id),
        _ => Err(ConsoleError::NoStream(name.to_string())),
    }
}
