//! The endpoint-state stream on the broker: a RabbitMQ stream, declared
//! by every worker and every `endpoint` command, appended to with
//! publisher confirms, and read from its first record by each reader.
//!
//! A stream, because many readers each read all of it (a queue hands each
//! message to one), it is replicated and fsync'd like a quorum queue, and
//! it survives broker restarts. AMQP 0.9.1 reads it with a prefetch and
//! `x-stream-offset`; acks only move the credit window.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use super::book::Book;
use super::error::ControlError;
use super::record::{Change, Record};

/// Records older than this go once their segment is full; snapshots
/// (`book.rs`) keep what they held.
pub const MAX_AGE: &str = "7D";
/// Small segments, so that retention can act on a stream this quiet.
pub const SEGMENT_BYTES: i64 = 1_000_000;
/// Records in flight to a reader at once.
const PREFETCH: u16 = 1_000;
/// A bound on declaring, opening a channel or a consumer, and each confirm.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a worker may take to read the stream up to its marker before
/// it gives up (and its session reconnects).
pub const CATCH_UP: Duration = Duration::from_secs(60);

/// Declares the stream on a channel of its own (a refusal closes the
/// channel it happens on).
pub async fn declare(conn: &Connection, name: &str) -> Result<(), ControlError> {
    let ch = bounded(conn.create_channel(), "a channel").await?;
    let mut args = FieldTable::default();
    // x-queue-type: stream, an append-only replicated log every reader reads whole.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    // x-max-age: retention by age; snapshots carry older state forward.
    args.insert("x-max-age".into(), AMQPValue::LongString(MAX_AGE.into()));
    // x-stream-max-segment-size-bytes: retention drops whole segments only.
    args.insert(
        "x-stream-max-segment-size-bytes".into(),
        AMQPValue::LongLongInt(SEGMENT_BYTES),
    );
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let declared = ch.queue_declare(name.into(), opts, args);
    let result = match tokio::time::timeout(OP_TIMEOUT, declared).await {
        Ok(r) => r.map(drop).map_err(|e| ControlError::declare(name, e)),
        Err(_) => Err(ControlError::Timeout("declaring the endpoint-state stream")),
    };
    let _ = ch.close(200, "declared".into()).await;
    result
}

/// Whether the stream exists (a passive declare on a channel of its own).
pub async fn exists(conn: &Connection, name: &str) -> Result<bool, ControlError> {
    let ch = bounded(conn.create_channel(), "a channel").await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = ch.queue_declare(name.into(), passive, FieldTable::default());
    match tokio::time::timeout(OP_TIMEOUT, declared)
        .await
        .map_err(|_| ControlError::Timeout("the endpoint-state stream"))?
    {
        Ok(_) => {
            let _ = ch.close(200, "".into()).await;
            Ok(true)
        }
        Err(e) if e.is_amqp_soft_error() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An AMQP operation bounded by [`OP_TIMEOUT`]: a broker that does not
/// answer (a stream without a leader) must not hold a worker or `status`.
async fn bounded<T>(
    op: impl std::future::Future<Output = Result<T, lapin::Error>>,
    what: &'static str,
) -> Result<T, ControlError> {
    match tokio::time::timeout(OP_TIMEOUT, op).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ControlError::Timeout(what)),
    }
}

/// Appends records, each confirmed by the broker before it returns.
pub struct Writer {
    ch: Channel,
    name: String,
}

impl Writer {
    pub async fn open(conn: &Connection, name: &str) -> Result<Writer, ControlError> {
        let ch = bounded(conn.create_channel(), "a channel").await?;
        bounded(
            ch.confirm_select(ConfirmSelectOptions::default()),
            "confirms",
        )
        .await?;
        Ok(Writer {
            ch,
            name: name.to_string(),
        })
    }

    pub async fn append(&self, r: &Record) -> Result<(), ControlError> {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(r.id.as_str().into());
        // mandatory: a stream that is gone is an error, not a silent drop.
        let opts = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let body = r.to_json();
        let publish = async {
            let confirm = self
                .ch
                .basic_publish("".into(), self.name.as_str().into(), opts, &body, props)
                .await?
                .await?;
            Ok::<_, lapin::Error>(confirm)
        };
        match tokio::time::timeout(OP_TIMEOUT, publish).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(_)) => Err(ControlError::Refused(self.name.clone())),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ControlError::Timeout(
                "a confirm from the endpoint-state stream",
            )),
        }
    }

    pub fn is_connected(&self) -> bool {
        self.ch.status().connected()
    }

    pub async fn close(self) {
        let _ = self.ch.close(200, "done".into()).await;
    }
}

/// The stream read from its first record, then live.
pub struct Reader {
    ch: Channel,
    consumer: lapin::Consumer,
}

impl Reader {
    pub async fn open(conn: &Connection, name: &str) -> Result<Reader, ControlError> {
        let ch = bounded(conn.create_channel(), "a channel").await?;
        // A stream consumer must set a prefetch: it is its credit window.
        bounded(
            ch.basic_qos(PREFETCH, BasicQosOptions::default()),
            "a prefetch",
        )
        .await?;
        let mut args = FieldTable::default();
        // x-stream-offset: first, the whole retained log.
        args.insert(
            "x-stream-offset".into(),
            AMQPValue::LongString("first".into()),
        );
        let tag = format!(
            "redeliver-state-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let opts = BasicConsumeOptions::default();
        let consume = ch.basic_consume(name.into(), tag.as_str().into(), opts, args);
        let consumer = bounded(consume, "a consumer on the endpoint-state stream").await?;
        Ok(Reader { ch, consumer })
    }

    /// The next message's offset and record (`None` for a body that is
    /// not one: someone else's message, skipped with a warning, whose
    /// offset still counts); `Ok(None)` when the consumer ended (the
    /// channel closed, the stream was deleted).
    pub async fn next(&mut self) -> Result<Option<(u64, Option<Record>)>, ControlError> {
        loop {
            let Some(d) = self.consumer.next().await else {
                return Ok(None);
            };
            let d = d?;
            d.ack(BasicAckOptions::default()).await?;
            let offset = match d
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("x-stream-offset").cloned())
            {
                Some(AMQPValue::LongLongInt(o)) => o.max(0) as u64,
                _ => continue,
            };
            let r = serde_json::from_slice::<Record>(&d.data);
            if let Err(e) = &r {
                tracing::warn!(offset, error = %e, "skipped a message on the endpoint-state stream that is not a record");
            }
            return Ok(Some((offset, r.ok())));
        }
    }

    pub async fn close(self) {
        let _ = self.ch.close(200, "done".into()).await;
    }
}

/// Declares the stream and reads it whole, up to a marker of `me`'s own:
/// the state, the reader (to follow it on), and a writer.
pub async fn open_and_read(
    conn: &Connection,
    name: &str,
    me: &str,
    within: Duration,
) -> Result<(Book, Reader, Writer), ControlError> {
    declare(conn, name).await?;
    let writer = Writer::open(conn, name).await?;
    let mut reader = Reader::open(conn, name).await?;
    let mut book = Book::default();
    catch_up(&writer, &mut reader, &mut book, me, within).await?;
    Ok((book, reader, writer))
}

/// Appends a marker and folds everything before it into `book`: once the
/// marker comes back, every record written before it has been read.
pub async fn catch_up(
    writer: &Writer,
    reader: &mut Reader,
    book: &mut Book,
    me: &str,
    within: Duration,
) -> Result<(), ControlError> {
    let marker = Record::new(crate::clock::now_ms().max(0) as u64, me, Change::Sync);
    writer.append(&marker).await?;
    read_through(reader, book, &marker.id, within).await?;
    if book.settle() {
        tracing::warn!("the endpoint-state stream's start was cut off by its retention and no snapshot covers it; pauses and disables older than its first record may be missing");
    }
    Ok(())
}

/// Folds records into `book` up to and including the one with `id`.
pub async fn read_through(
    reader: &mut Reader,
    book: &mut Book,
    id: &str,
    within: Duration,
) -> Result<(), ControlError> {
    let read = async {
        while let Some((offset, r)) = reader.next().await? {
            let Some(r) = r else {
                book.skip(offset);
                continue;
            };
            let done = r.id == id;
            book.apply(offset, r);
            if done {
                return Ok(());
            }
        }
        Err(ControlError::Ended)
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| ControlError::Timeout("reading the endpoint-state stream"))?
}

/// Folds the stream into `book` without writing to it (for read-only
/// commands: `endpoint list`, `show`, `status`): reads until no record
/// came for `quiet` (the first may take up to a second), within `within`.
/// A change made in the same moment may be missed; one made before the
/// command started is read.
pub async fn read_quietly(
    reader: &mut Reader,
    book: &mut Book,
    quiet: Duration,
    within: Duration,
) -> Result<(), ControlError> {
    let read = async {
        let mut wait = quiet.max(Duration::from_secs(1));
        loop {
            match tokio::time::timeout(wait, reader.next()).await {
                Err(_) | Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Some((offset, Some(r))))) => {
                    book.apply(offset, r);
                }
                Ok(Ok(Some((offset, None)))) => book.skip(offset),
            }
            wait = quiet;
        }
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| ControlError::Timeout("reading the endpoint-state stream"))??;
    book.settle();
    Ok(())
}
