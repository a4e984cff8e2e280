//! Publishing a batch of notifications with failover: what `redeliver
//! publish` does, for Rust producers too.
//!
//! Under a network partition a node can accept a connection and then never
//! confirm: a quorum queue's leader on the minority side cannot commit, and
//! the node learns it is cut off only after `net_ticktime` (45–75 s by
//! default). So every broker round trip here is bounded by the confirm
//! timeout, and a batch that times out moves on to the next node of the URL
//! list and publishes again from its first unconfirmed notification, with
//! the same ids: a notification confirmed twice is a duplicate the receiver
//! deduplicates by id, one never confirmed is lost.

use std::future::Future;
use std::time::Duration;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use lapin::Connection;

use crate::config::BrokerSettings;
use crate::publish::{Prepared, PublishError, Publisher};
use crate::topology::TopologyError;

/// Confirms awaited at once.
pub const WINDOW: usize = 256;

/// How a batch is published.
#[derive(Clone, Debug)]
pub struct ProduceOptions {
    /// A delay before the first attempt (through the delay backend).
    pub delay: Option<Duration>,
    /// How long one broker round trip (a confirm, a declare) may take
    /// before the connection is given up and the next node is tried.
    pub confirm_timeout: Duration,
    /// Tries while no node of the URL list accepts a connection (a broker
    /// that is down), with a backoff of 0.5 s, 1 s, 2 s, 4 s, then 8 s.
    pub tries: u32,
    /// How long to go on, since the last confirm, while nodes accept
    /// connections but do not confirm (or nack, or drop the connection). A cut node is noticed
    /// only after `net_ticktime` (up to 75 s by default), and until then
    /// no node may confirm what goes to a queue the cut node led; so this
    /// outlasts that.
    pub patience: Duration,
}

/// The longest pause between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);

impl Default for ProduceOptions {
    fn default() -> Self {
        ProduceOptions {
            delay: None,
            confirm_timeout: Duration::from_secs(10),
            tries: 6,
            patience: Duration::from_secs(120),
        }
    }
}

/// Why a batch was not published whole.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The broker answered, but not in a way another try can change (a
    /// refused login, a bad certificate, a topology of another type).
    #[error("{0}")]
    Permanent(#[source] anyhow::Error),
    /// Every try failed; `confirmed` of them were confirmed (in order).
    #[error("publishing failed after {tries}; {left} notification(s) not confirmed: {last:#}", tries = tries_text(*.tries))]
    GaveUp {
        tries: u32,
        confirmed: usize,
        left: usize,
        last: anyhow::Error,
    },
    /// `on_confirmed` failed (stdout closed, for one).
    #[error("reporting a confirmed notification: {0}")]
    Report(#[source] std::io::Error),
}

fn tries_text(n: u32) -> String {
    match n {
        1 => "1 try".into(),
        n => format!("{n} tries"),
    }
}

/// Publishes `all` in order and calls `on_confirmed` with each id once its
/// notification is confirmed (in order, so what was reported is a prefix).
/// Returns how many were confirmed.
pub async fn publish_all(
    broker: &BrokerSettings,
    all: &[Prepared],
    opts: &ProduceOptions,
    mut on_confirmed: impl FnMut(&str) -> std::io::Result<()>,
) -> Result<usize, ProduceError> {
    let bad_url = |e: crate::config::BadUrl| ProduceError::Permanent(e.into());
    broker.url.validate().map_err(bad_url)?;
    let (mut done, mut tries, mut unreachable, mut declare) = (0, 0, 0, false);
    let mut started = tokio::time::Instant::now();
    loop {
        tries += 1;
        let before = done;
        let step = publish_from(broker, all, opts, declare, &mut done, &mut on_confirmed).await;
        if done > before {
            // Progress: the budgets count from here.
            (started, unreachable) = (tokio::time::Instant::now(), 0);
        }
        let err = match step {
            Ok(()) => return Ok(done),
            Err(Step::Report(e)) => return Err(ProduceError::Report(e)),
            Err(Step::Unreachable(e)) => {
                unreachable += 1;
                e
            }
            Err(Step::Broker(e)) => e,
        };
        // Unroutable after a lookup only: something of the topology was
        // deleted since; declare it all, once, and go on.
        if !declare && is_unroutable(&err) {
            declare = true;
            continue;
        }
        if !transient(&err) {
            return Err(ProduceError::Permanent(err));
        }
        if unreachable >= opts.tries.max(1) || started.elapsed() >= opts.patience {
            let left = all.len() - done;
            return Err(ProduceError::GaveUp {
                tries,
                confirmed: done,
                left,
                last: err,
            });
        }
        let wait = Duration::from_millis(250 << tries.min(6)).min(MAX_BACKOFF);
        tracing::warn!(error = %format!("{err:#}"), retry_in = ?wait, confirmed = done,
            "publishing interrupted; trying the next node of the URL list");
        tokio::time::sleep(wait).await;
    }
}

enum Step {
    /// No node of the list accepted a connection.
    Unreachable(anyhow::Error),
    Broker(anyhow::Error),
    Report(std::io::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Step {
    fn from(e: E) -> Self {
        Step::Broker(e.into())
    }
}

fn is_unroutable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<PublishError>(),
            Some(PublishError::Unroutable)
        )
    })
}

/// One connection's worth: publishes `all[*done..]`, advancing `done`;
/// the topology is looked up, or with `declare` declared in full.
async fn publish_from(
    broker: &BrokerSettings,
    all: &[Prepared],
    opts: &ProduceOptions,
    declare: bool,
    done: &mut usize,
    on_confirmed: &mut impl FnMut(&str) -> std::io::Result<()>,
) -> Result<(), Step> {
    use anyhow::Context as _;
    let (conn, node) = broker
        .url
        .connect_to("redeliver publish")
        .await
        .with_context(|| format!("cannot connect to the broker at {}", broker.url))
        .map_err(Step::Unreachable)?;
    let limit = opts.confirm_timeout;
    let result = async {
        let topology = bounded(limit, "looking up the topology", async {
            let t = match declare {
                true => crate::delay::declare_topology(broker, &conn).await,
                false => crate::delay::ensure_topology(broker, &conn).await,
            };
            t.map_err(anyhow::Error::from)
        })
        .await?;
        let publisher = bounded(limit, "opening a confirm channel", async {
            Publisher::new(&conn, topology, broker.delay, limit)
                .await
                .map_err(anyhow::Error::from)
        })
        .await?;
        let mut confirmed = stream::iter(all[*done..].iter().map(|n| {
            let publisher = &publisher;
            async move { publisher.publish_new(n, opts.delay).await.map(|_| n) }
        }))
        .buffered(WINDOW);
        while let Some(n) = confirmed.try_next().await? {
            on_confirmed(&n.id).map_err(Step::Report)?;
            *done += 1;
        }
        Ok(())
    }
    .await
    .map_err(|e| match e {
        Step::Broker(e) => Step::Broker(e.context(format!("node {node}"))),
        other => other,
    });
    close(conn).await;
    result
}

/// A broker round trip that got no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the broker within {0:?}")]
pub struct NoAnswer(pub Duration);

/// `fut`, or [`NoAnswer`] after `limit`.
async fn bounded<T>(
    limit: Duration,
    what: &'static str,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> Result<T, Step> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => Ok(r.map_err(|e| e.context(what))?),
        Err(_) => Err(anyhow::Error::from(NoAnswer(limit)).context(what).into()),
    }
}

/// Closes without waiting long: a node cut off by a partition never
/// answers the close handshake.
async fn close(conn: Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.close(200, "done".into())).await;
}

/// Connection trouble, silence and a nack are worth another node; a
/// refused login or a bad broker certificate is not.
fn transient(e: &anyhow::Error) -> bool {
    if crate::config::is_permanent_connect_error(&format!("{e:#}")) {
        return false;
    }
    e.chain().any(|c| {
        c.downcast_ref::<lapin::Error>().is_some()
            || c.downcast_ref::<NoAnswer>().is_some()
            || matches!(
                c.downcast_ref::<PublishError>(),
                Some(
                    PublishError::Amqp(_)
                        | PublishError::ConfirmTimeout(_)
                        // A nack is the broker saying it could not take the
                        // message (a quorum queue without a leader, for
                        // one): publishing again is what it asks for.
                        | PublishError::Nacked
                )
            )
            || matches!(
                c.downcast_ref::<TopologyError>(),
                Some(TopologyError::Amqp { .. })
            )
    })
}
