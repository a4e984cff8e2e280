//! `redeliver endpoint ...`, the library side: read the shared endpoint
//! state with the live workers' reports ([`overview`]), and pause, resume,
//! disable or enable a target ([`change`]). Both read the stream up to a
//! marker of their own, as a worker does, so they see every change made
//! before them.

pub mod render;

use std::time::Duration;

use lapin::Connection;

use crate::config::BrokerSettings;
use crate::control::book::{Book, KeyState, Mode};
use crate::control::record::{self, Change, Record};
use crate::control::reports::{self, Report};
use crate::control::stream::{self, Reader, Writer};
use crate::control::view::{self, Row};
use crate::control::ControlError;
use crate::message::target::Target;
use crate::topology::Topology;

/// How long a command may take to read the stream.
const READ_WITHIN: Duration = Duration::from_secs(30);
/// A read-only command has read the stream once nothing came for this long.
const QUIET: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot connect to the broker at {url}: {source}")]
    Connect { url: String, source: lapin::Error },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("{target} is not paused ({state}); nothing changed")]
    NotPaused { target: String, state: String },
    #[error("{target} is not disabled ({state}); nothing changed")]
    NotDisabled { target: String, state: String },
    #[error("{0} is disabled; a pause would change nothing (enable it first)")]
    Disabled(String),
    #[error("{0} is already disabled; nothing changed")]
    AlreadyDisabled(String),
    #[error("{0} changed meanwhile (another command or a worker came first; it is {1} now); nothing changed")]
    Conflict(String, String),
    #[error("no live worker has seen {0} in the last 10 minutes, and it is not paused or disabled (`redeliver endpoint list` shows what they see)")]
    Unknown(String),
}

impl EndpointError {
    /// Bad input, not a failure: the command exits 2.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            EndpointError::NotPaused { .. }
                | EndpointError::NotDisabled { .. }
                | EndpointError::Disabled(_)
                | EndpointError::AlreadyDisabled(_)
                | EndpointError::Conflict(..)
                | EndpointError::Unknown(_)
        )
    }
}

/// The shared state and what the live workers see.
pub struct Overview {
    pub rows: Vec<Row>,
    pub book: Book,
    pub reports: Vec<Report>,
    pub now_ms: u64,
}

impl Overview {
    /// The row for exactly `target`, if any.
    pub fn row(&self, target: &Target) -> Option<&Row> {
        let name = target.to_string();
        self.rows.iter().find(|r| r.endpoint == name)
    }
}

/// What an operator can do to a target.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Pause {
        reason: Option<String>,
        until_ms: Option<u64>,
    },
    Resume,
    Disable {
        reason: Option<String>,
    },
    Enable,
}

/// What a change did.
pub struct Changed {
    pub record: Record,
    /// The target's state after it.
    pub after: Option<KeyState>,
    /// Whether a live worker saw an endpoint under or over the target.
    pub seen: bool,
    /// A shorter target's pause or disable that still applies to it.
    pub still_under: Option<(Target, Mode)>,
}

/// Reads the stream and the live workers' reports, writing nothing (and
/// creating nothing: no stream yet is an empty state).
pub async fn overview(broker: &BrokerSettings) -> Result<Overview, EndpointError> {
    let (conn, t) = connect(broker).await?;
    let mut book = Book::default();
    if stream::exists(&conn, &t.endpoint_state).await? {
        let mut reader = Reader::open(&conn, &t.endpoint_state).await?;
        stream::read_quietly(&mut reader, &mut book, QUIET, READ_WITHIN).await?;
        reader.close().await;
    }
    let reports = reports::read(&conn, &t).await;
    let _ = conn.close(200, "read".into()).await;
    let now_ms = now_ms();
    Ok(Overview {
        rows: view::rows(&reports, &book, now_ms),
        book,
        reports,
        now_ms,
    })
}

/// Appends the change for `target`, once checked against the state, and
/// reads it back: every worker applies it within 2 s.
pub async fn change(
    broker: &BrokerSettings,
    target: &Target,
    op: Op,
) -> Result<Changed, EndpointError> {
    change_by(broker, target, op, &by()).await
}

/// [`change`], recorded as made by `who` (the console names itself).
pub async fn change_by(
    broker: &BrokerSettings,
    target: &Target,
    op: Op,
    who: &str,
) -> Result<Changed, EndpointError> {
    let (conn, t) = connect(broker).await?;
    stream::declare(&conn, &t.endpoint_state).await?;
    let (mut book, writer, mut reader) = read(&conn, &t).await?;
    let now = now_ms();
    check(&book, target, &op, now)?;
    let snapshot_due = book.snapshot_due(now, 0);
    let record = Record::new(now, who, change_of(target, op));
    writer.append(&record).await?;
    stream::read_through(&mut reader, &mut book, &record.id, READ_WITHIN).await?;
    // Another change landed first and made this one a no-op.
    let took = book
        .get(target)
        .and_then(|k| k.history.last())
        .is_some_and(|e| e.id == record.id);
    if !took {
        let state = book.get(target).map_or("active", |k| k.control.name(now));
        return Err(EndpointError::Conflict(target.to_string(), state.into()));
    }
    announce(&conn, &t, broker, &book, &record).await;
    // Writers keep the stream's snapshots, workers or not; a snapshot
    // that cannot be written (too large?) must not stop a change.
    if snapshot_due {
        let keys = book.snapshot_keys(now);
        let through = book.through().unwrap_or(0);
        let snapshot = Record::new(now, &by(), Change::Snapshot { through, keys });
        if let Err(e) = writer.append(&snapshot).await {
            tracing::warn!(error = %e, "the endpoint-state snapshot was not written");
        }
    }
    let reports = reports::read(&conn, &t).await;
    writer.close().await;
    reader.close().await;
    let _ = conn.close(200, "changed".into()).await;
    let table = crate::control::table::Table::build(&book, now);
    let still_under = table
        .covering(target, now)
        .filter(|(by, _)| *by != target)
        .map(|(by, c)| (by.clone(), c.clone()));
    Ok(Changed {
        after: book.get(target).cloned(),
        seen: seen(&reports, target),
        still_under,
        record,
    })
}

/// Publishes the change's operational event (`endpoint.paused`, ...),
/// confirmed; tried three times, then the change stands without it (said
/// on stderr: the change itself is made and read back).
async fn announce(
    conn: &Connection,
    t: &Topology,
    broker: &BrokerSettings,
    book: &Book,
    r: &Record,
) {
    let Some(e) = crate::control::Control::announce(&t.prefix, book, r) else {
        return;
    };
    let mut last = None;
    for _ in 0..3 {
        match emit(conn, t, broker, &e).await {
            Ok(()) => return,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(err) = last {
        tracing::warn!(error = %err, event = e.kind.as_str(), "the change is made, but its event was not published");
    }
}

async fn emit(
    conn: &Connection,
    t: &Topology,
    broker: &BrokerSettings,
    e: &crate::message::event::Event,
) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    let declared = t.declare_events(&ch).await;
    let _ = ch.close(200, "declared".into()).await;
    declared?;
    let timeout = Duration::from_secs(30);
    let publisher = crate::publish::Publisher::new(conn, t.clone(), broker.delay, timeout).await?;
    let events = crate::events::Emitter::new(&publisher, t, &Default::default());
    Ok(events.emit(e).await?)
}

async fn connect(broker: &BrokerSettings) -> Result<(Connection, Topology), EndpointError> {
    let conn = broker
        .url
        .connect("redeliver endpoint")
        .await
        .map_err(|source| EndpointError::Connect {
            url: broker.url.redacted(),
            source,
        })?;
    Ok((conn, Topology::new(&broker.prefix)))
}

/// The whole state, read up to a marker of this command's own.
async fn read(conn: &Connection, t: &Topology) -> Result<(Book, Writer, Reader), EndpointError> {
    let writer = Writer::open(conn, &t.endpoint_state).await?;
    let mut reader = Reader::open(conn, &t.endpoint_state).await?;
    let mut book = Book::default();
    stream::catch_up(&writer, &mut reader, &mut book, &by(), READ_WITHIN).await?;
    Ok((book, writer, reader))
}

/// A resume needs a pause, an enable a disable, on that very target; a
/// disabled target is enabled before it is paused.
fn check(book: &Book, target: &Target, op: &Op, now: u64) -> Result<(), EndpointError> {
    let control = book
        .get(target)
        .map(|k| k.control.clone())
        .unwrap_or_default();
    let state = || control.name(now).to_string();
    match op {
        Op::Pause { .. } if matches!(control, Mode::Disabled { .. }) => {
            Err(EndpointError::Disabled(target.to_string()))
        }
        Op::Disable { .. } if matches!(control, Mode::Disabled { .. }) => {
            Err(EndpointError::AlreadyDisabled(target.to_string()))
        }
        Op::Resume if !matches!(control, Mode::Paused { .. }) => Err(EndpointError::NotPaused {
            target: target.to_string(),
            state: state(),
        }),
        Op::Enable if !matches!(control, Mode::Disabled { .. }) => {
            Err(EndpointError::NotDisabled {
                target: target.to_string(),
                state: state(),
            })
        }
        _ => Ok(()),
    }
}

fn change_of(target: &Target, op: Op) -> Change {
    let target = target.clone();
    match op {
        Op::Pause { reason, until_ms } => Change::Pause {
            target,
            reason: record::reason(reason.as_deref()),
            until_ms,
        },
        Op::Resume => Change::Resume { target },
        Op::Disable { reason } => Change::Disable {
            target,
            reason: record::reason(reason.as_deref()),
            failing_since_ms: None,
        },
        Op::Enable => Change::Enable { target },
    }
}

/// Whether a live worker saw an endpoint under `target`, or one that
/// `target` is under (a prefix of an origin it delivers to).
pub fn seen(reports: &[Report], target: &Target) -> bool {
    let related = |t: &Target| t.covers(target) || target.covers(t);
    reports.iter().any(|r| {
        r.endpoints
            .iter()
            .any(|e| e.target.as_ref().is_some_and(related))
            || r.held.iter().any(|h| related(&h.target))
    })
}

/// `command <user>@<host>`: who made a change, for the history.
fn by() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "?".into());
    format!("command {user}@{}", crate::telemetry::hostname())
}

fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}
