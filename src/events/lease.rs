//! One `delay-backend.stalled` and one `delay-backend.recovered` per stall
//! for the prefix, however many workers see it. Every worker's probe sees
//! a stall by itself, so they agree through a queue that holds at most
//! one message (`<prefix>.events-stall-<backend>`, a durable classic
//! queue: `x-max-length` 1, `x-overflow` `reject-publish`): the worker whose token the broker
//! confirms reported the stall and sends the event; the others' tokens
//! are refused (nacked). When the backend routes again, the first worker
//! to see it takes the token (its stall's start inside), sends the
//! recovery with it, and acks it only after its confirm, so the next
//! stall can be reported again.
//!
//! A worker that dies between its token's confirm and its event leaves
//! that stall without a `stalled` event; its `recovered` still comes.
//! When the lease cannot be read at all (its node is down), the event is
//! sent anyway: a duplicate rather than a loss.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use tracing::warn;

use super::Emitter;
use crate::message::event::{self, Kind};

/// A broker that does not answer within this is given up on; the stall's
/// event is then not sent (the log and metrics still say it).
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error(transparent)]
    Publish(#[from] crate::publish::PublishError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What a worker's probe saw of a backend.
#[derive(Clone, Copy, Debug)]
pub enum News {
    /// It stalled: the probe sent at this time did not come back.
    Stalled(SystemTime),
    /// Its probes come back (after a stall, or the first one).
    Routing,
}

/// Tries to send a recovery this often before the next news.
const RECOVERY_TRIES: u32 = 5;

/// One worker's announcer: [`stalled`] and [`recovered`] in the order the
/// probe saw them, one at a time (a short stall's recovery must not take
/// the lease before its stall's token is in).
#[derive(Clone)]
pub struct Announcer(tokio::sync::mpsc::UnboundedSender<(&'static str, News)>);

impl Announcer {
    pub fn send(&self, backend: &'static str, news: News) {
        let _ = self.0.send((backend, news));
    }
}

/// Starts an announcer; it ends when its last [`Announcer`] is dropped.
pub fn announcer(conn: std::sync::Arc<Connection>, events: Emitter) -> Announcer {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some((backend, news)) = rx.recv().await {
            match news {
                News::Stalled(since) => {
                    if let Err(e) = stalled(&conn, &events, backend, since).await {
                        warn!(error = %e, backend, "the delay-backend.stalled event was not sent");
                    }
                }
                News::Routing => announce_recovery(&conn, &events, backend).await,
            }
        }
    });
    Announcer(tx)
}

/// [`recovered`], tried again a few times: a token left behind would keep
/// the next stall from being reported.
async fn announce_recovery(conn: &Connection, events: &Emitter, backend: &str) {
    for i in 1..=RECOVERY_TRIES {
        match recovered(conn, events, backend).await {
            Ok(_) => return,
            Err(e) if i == RECOVERY_TRIES => {
                warn!(error = %e, backend, "the delay-backend.recovered event was not sent")
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

/// Reports the stall of `backend` that began at `since`, unless another
/// worker did. Returns whether this one did.
pub async fn stalled(
    conn: &Connection,
    events: &Emitter,
    backend: &str,
    since: SystemTime,
) -> Result<bool, LeaseError> {
    let queue = events.topology().stall_lease(backend);
    let since_ms = since
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis()) as u64;
    match lease(conn, &queue, since_ms).await {
        Ok(false) => return Ok(false),
        Ok(true) => {}
        // Better twice than never: without the lease (its node down), the
        // event goes out all the same.
        Err(e) => {
            warn!(error = %e, backend, "the stall lease could not be taken; sending the event anyway")
        }
    }
    let e = event::delay(Kind::DelayStalled, events.prefix(), backend, since, None);
    events.emit(&e).await?;
    Ok(true)
}

async fn lease(conn: &Connection, queue: &str, since_ms: u64) -> Result<bool, LeaseError> {
    let ch = open(conn, queue).await?;
    let won = bounded(take_lease(&ch, queue, since_ms)).await;
    let _ = ch.close(200, "stall lease".into()).await;
    won
}

/// Reports that `backend` routes again after the stall in the lease, if
/// one is there (another worker may have reported it already).
pub async fn recovered(
    conn: &Connection,
    events: &Emitter,
    backend: &str,
) -> Result<bool, LeaseError> {
    let queue = events.topology().stall_lease(backend);
    let ch = open(conn, &queue).await?;
    let got = bounded(async {
        let opts = BasicGetOptions { no_ack: false };
        Ok(ch.basic_get(queue.as_str().into(), opts).await?)
    })
    .await;
    let Some(msg) = got? else {
        let _ = ch.close(200, "no stall".into()).await;
        return Ok(false);
    };
    let since_ms: u64 = std::str::from_utf8(&msg.data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let since = UNIX_EPOCH + Duration::from_millis(since_ms);
    let lasted = SystemTime::now().duration_since(since).ok();
    let e = event::delay(
        Kind::DelayRecovered,
        events.prefix(),
        backend,
        since,
        lasted,
    );
    // Unacked until the event is confirmed: a failure here closes the
    // channel, and the token goes back for the next worker that sees it.
    let sent = events.emit(&e).await;
    if sent.is_ok() {
        msg.ack(BasicAckOptions::default()).await?;
        // A second worker's token, let in while this one was unacked
        // (the length limit counts ready messages): the same stall.
        let opts = BasicGetOptions { no_ack: true };
        while let Ok(Ok(Some(_))) =
            tokio::time::timeout(TIMEOUT, ch.basic_get(queue.as_str().into(), opts)).await
        {}
    }
    let _ = ch.close(200, "stall over".into()).await;
    sent?;
    Ok(true)
}

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, LeaseError>>,
) -> Result<T, LeaseError> {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .unwrap_or(Err(LeaseError::Timeout(TIMEOUT)))
}

/// A confirm channel with the lease queue declared.
async fn open(conn: &Connection, queue: &str) -> Result<Channel, LeaseError> {
    bounded(async {
        let ch = conn.create_channel().await?;
        let mut args = FieldTable::default();
        // Classic (durable): its length limit is checked as each publish
        // arrives, so exactly one token gets in; a quorum queue applies it
        // after the fact and let two in at once (RabbitMQ 3.10, tried).
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("classic".into()),
        );
        // One token at most; a second publish is refused (nacked), not
        // taken and not dropped from the head.
        args.insert("x-max-length".into(), AMQPValue::LongInt(1));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(queue.into(), durable, args).await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(ch)
    })
    .await
}

/// Publishes the token; `true` when the broker took it.
async fn take_lease(ch: &Channel, queue: &str, since_ms: u64) -> Result<bool, LeaseError> {
    let body = since_ms.to_string();
    let confirm = ch
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            // delivery_mode 2: persistent.
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await?;
    Ok(matches!(confirm, Confirmation::Ack(_)))
}
