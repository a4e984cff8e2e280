//! The `<prefix>.history` stream: a RabbitMQ stream, so that many readers
//! (every console, a columnar store) each read all of it, it is replicated
//! on a cluster like a quorum queue, and retention is the broker's.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};

use super::HistorySettings;

/// A bound on declaring, opening a channel, and each confirm.
pub const OP_TIMEOUT: Duration = Duration::from_secs(15);
/// Retention drops whole segments only: 100 MB segments let it act in
/// steps of at most 1% of the default 10 GB.
pub const SEGMENT_BYTES: i64 = 100_000_000;

/// What recording could not do. The worker treats each as "not
/// confirmed": the delivery is requeued, never acked without its record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HistoryError {
    #[error("AMQP error on the history stream: {0}")]
    Amqp(String),
    #[error("the broker refused a history record (nack)")]
    Nacked,
    #[error("the history stream {0} is gone (a record was unroutable)")]
    Unroutable(String),
    #[error("no confirm for a history record within {0:?}")]
    Timeout(Duration),
    #[error("the history writer has stopped")]
    Closed,
    #[error(
        "the history stream {name} exists with other settings than this worker's \
         --history-max-age/--history-max-bytes ({reason}); run every worker with the \
         same values, or delete the stream (`rabbitmqctl delete_queue {name}`; its \
         history goes with it)"
    )]
    Inequivalent { name: String, reason: String },
    #[error(
        "the broker refused the history stream {name} ({reason}): does it support \
         streams (RabbitMQ 3.9 or later)? Or run with --history off"
    )]
    Refused { name: String, reason: String },
}

impl HistoryError {
    /// Whether a new connection may cure it (the stream redeclared, the
    /// writer's channel opened again). An AMQP error is one: the broker
    /// closes a channel on the errors it raises, and every later record
    /// on it would fail, each failure an attempt repeated for nothing.
    pub fn wants_new_connection(&self) -> bool {
        matches!(
            self,
            HistoryError::Amqp(_)
                | HistoryError::Unroutable(_)
                | HistoryError::Timeout(_)
                | HistoryError::Closed
        )
    }

    /// Whether the worker cannot start with it, whatever it retries.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            HistoryError::Inequivalent { .. } | HistoryError::Refused { .. }
        )
    }
}

impl From<lapin::Error> for HistoryError {
    fn from(e: lapin::Error) -> Self {
        HistoryError::Amqp(e.to_string())
    }
}

/// `<prefix>.history`.
pub fn stream_name(prefix: &str) -> String {
    format!("{prefix}.history")
}

/// `x-max-age` as RabbitMQ reads it: a whole number and one unit (`7D`,
/// `36h`, `90m`, `45s`), the largest that divides the age exactly; at
/// least `1s`.
pub fn max_age_arg(age: Duration) -> String {
    let s = age.as_secs().max(1);
    match s {
        s if s % 86_400 == 0 => format!("{}D", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The stream's arguments, each commented.
pub fn arguments(s: &HistorySettings) -> FieldTable {
    let mut args = FieldTable::default();
    // x-queue-type: stream, an append-only replicated log every reader reads whole.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    // x-max-age: records older than --history-max-age go, a segment at a time.
    args.insert(
        "x-max-age".into(),
        AMQPValue::LongString(max_age_arg(s.max_age).into()),
    );
    // x-max-length-bytes: --history-max-bytes, the stream's disk bound per node.
    args.insert(
        "x-max-length-bytes".into(),
        AMQPValue::LongLongInt(i64::try_from(s.max_bytes).unwrap_or(i64::MAX)),
    );
    // x-stream-max-segment-size-bytes: the step in which retention acts.
    args.insert(
        "x-stream-max-segment-size-bytes".into(),
        AMQPValue::LongLongInt(SEGMENT_BYTES),
    );
    args
}

/// Declares the stream and the fanout exchange of the same name that
/// records are published to, bound to it: another consumer (a columnar
/// store's queue) binds to the exchange and gets every record too. On a
/// channel of its own (a refusal closes the channel it happens on).
/// Arguments unlike an existing stream's, or a broker without streams, are
/// a clear error.
pub async fn declare(
    conn: &Connection,
    name: &str,
    s: &HistorySettings,
) -> Result<(), HistoryError> {
    let ch = bounded(conn.create_channel()).await?;
    let declared = declare_on(&ch, name, s).await;
    let _ = ch.close(200, "declared".into()).await;
    match declared {
        Ok(()) => Ok(()),
        Err(HistoryError::Amqp(reason)) if reason.contains("PRECONDITION_FAILED") => {
            Err(HistoryError::Inequivalent {
                name: name.to_string(),
                reason,
            })
        }
        Err(HistoryError::Amqp(reason))
            if reason.contains("COMMAND_INVALID") || reason.contains("NOT_ALLOWED") =>
        {
            Err(HistoryError::Refused {
                name: name.to_string(),
                reason,
            })
        }
        Err(e) => Err(e),
    }
}

async fn declare_on(ch: &Channel, name: &str, s: &HistorySettings) -> Result<(), HistoryError> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    bounded(ch.queue_declare(name.into(), durable, arguments(s))).await?;
    // Durable fanout: every queue bound to it gets every record.
    let x = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let fanout = ExchangeKind::Fanout;
    bounded(ch.exchange_declare(name.into(), fanout, x, FieldTable::default())).await?;
    let bind = ch.queue_bind(
        name.into(),
        name.into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    );
    bounded(bind).await
}

/// An AMQP round trip bounded by [`OP_TIMEOUT`].
pub(super) async fn bounded<T>(
    op: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, HistoryError> {
    match tokio::time::timeout(OP_TIMEOUT, op).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(HistoryError::Timeout(OP_TIMEOUT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_written_in_the_largest_exact_unit() {
        let d = |s| max_age_arg(Duration::from_secs(s));
        assert_eq!(d(7 * 86_400), "7D");
        assert_eq!(d(36 * 3_600), "36h");
        assert_eq!(d(90 * 60), "90m");
        assert_eq!(d(45), "45s");
        assert_eq!(d(0), "1s");
    }

    #[test]
    fn only_errors_a_new_connection_can_cure_ask_for_one() {
        let cured = |e: HistoryError| e.wants_new_connection();
        assert!(cured(HistoryError::Amqp("channel closed".into())));
        assert!(cured(HistoryError::Timeout(OP_TIMEOUT)));
        assert!(cured(HistoryError::Closed));
        assert!(!cured(HistoryError::Nacked));
        let refused = HistoryError::Refused {
            name: "x".into(),
            reason: "y".into(),
        };
        assert!(!cured(refused));
    }
}
