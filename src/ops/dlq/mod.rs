//! Dead-letter operations: list, show, replay, purge, export.
//!
//! The dead-letter queue is read without acking (`reader.rs`). A message
//! that is kept stays unacked until the walk ends, and then the broker
//! returns it, in its old order. At most a window of messages is held in
//! memory, so a long queue can be walked (up to about 2,000 times the
//! broker's `channel_max`: some 4 million dead letters with its default).
//!
//! Every walk takes every message that was there when it started, also
//! past its `--limit` or the one `show` looked for: a quorum queue (the
//! replicated dead-letter queue) serves returned messages first, behind
//! those returned before them, so a walk that stopped halfway would move
//! the messages it took behind the ones it did not. Returned all together,
//! in the order taken, they keep their order. A walk cut short (Ctrl-C,
//! `kill -9`) loses nothing, but may leave them in another order.
//! A replayed message is acked only after its republish to the work queue
//! was confirmed. An interruption at any point therefore leaves every
//! message in the dead-letter queue, the work queue, or (rarely) both.

use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use tracing::warn;

use crate::message::dead_letter::{DeadLetter, Filter};
use crate::message::run;
use crate::message::state::{
    get, int, long_string, string, H_ATTEMPT, H_DEAD_AT, H_DEAD_REASON, H_DEFERRALS, H_DELAY,
    H_FIRST_AT, H_FIRST_SEEN, H_ID, H_LAST_ERROR, H_LAST_STATUS,
};
use crate::publish::PublishError;
use crate::topology::Topology;
use lapin::message::Delivery;
use reader::Reader;

mod reader;
mod replay;

pub use replay::{replay, ReplayOptions, ReplayProgress};

/// What to do with each selected dead letter (replaying is [`replay`]'s).
#[derive(Clone, Copy)]
pub enum Op {
    /// Leave it where it is (list, show, export, dry runs).
    Keep,
    /// Remove it.
    Purge,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Dead letters in the queue when the walk started.
    pub total: usize,
    /// Dead letters looked at.
    pub seen: usize,
    /// Dead letters that matched the filter (and the limit).
    pub selected: usize,
    /// Dead letters replayed or purged.
    pub done: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("there is no dead-letter queue {0} (nothing was dead-lettered on this --prefix yet, or the prefix is wrong)")]
    NoQueue(String),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("republishing {id} failed: {source}")]
    Republish { id: String, source: PublishError },
}

/// Walks the dead-letter queue once, in order, applying `op` to each dead
/// letter that matches `filter` (at most `limit` of them) after `visit` saw it.
pub async fn walk(
    conn: &Connection,
    topology: &Topology,
    filter: &Filter,
    limit: Option<usize>,
    op: Op,
    mut visit: impl FnMut(&DeadLetter),
) -> Result<Summary, DlqError> {
    let total = dead_letters_now(conn, topology).await?;
    let mut reader = Reader::new(conn, &topology.dead);
    let result = take(&mut reader, total, filter, limit, op, &mut visit).await;
    // Also after an error: the kept messages go back in order.
    reader.finish().await;
    let s = result?;
    warn_if_short(&s);
    Ok(s)
}

/// A walk that ended before it looked at every dead letter counted at its
/// start, other than by a stop: said in the log.
fn warn_if_short(s: &Summary) {
    let total = s.total;
    if s.seen < total {
        warn!(
            read = s.seen,
            counted = total,
            "the dead-letter walk read fewer messages than the queue held when it started \
             (another consumer, or another dlq command, holds the rest)"
        );
    }
}

/// Only what is there now: dead letters that arrive during the walk are
/// left for the next one.
pub(super) async fn dead_letters_now(
    conn: &Connection,
    topology: &Topology,
) -> Result<usize, DlqError> {
    let ch = conn.create_channel().await?;
    let total = match topology.dead_count(&ch).await {
        Ok(n) => n,
        Err(e) if e.is_amqp_soft_error() => return Err(DlqError::NoQueue(topology.dead.clone())),
        Err(e) => return Err(e.into()),
    };
    let _ = ch.close(200, "counted".into()).await;
    Ok(total as usize)
}

/// Reads `total` dead letters and applies `op` to the selected ones.
async fn take(
    reader: &mut Reader<'_>,
    total: usize,
    filter: &Filter,
    limit: Option<usize>,
    op: Op,
    visit: &mut impl FnMut(&DeadLetter),
) -> Result<Summary, DlqError> {
    let now = crate::clock::now_ms();
    let mut s = Summary {
        total,
        ..Summary::default()
    };
    while s.seen < total {
        let Some(m) = reader.next().await? else {
            break;
        };
        s.seen += 1;
        let Some(d) = selected(&m, filter, limit, now, &mut s) else {
            continue;
        };
        visit(&d);
        if let Op::Purge = op {
            reader.ack(reader.window(), &m).await?;
            s.done += 1;
        }
    }
    Ok(s)
}

/// The dead letter in `m` if the filter selects it and the limit has room
/// (counted in `s.selected`). One past the limit is still taken, only to
/// keep the order (see above).
fn selected(
    m: &Delivery,
    filter: &Filter,
    limit: Option<usize>,
    now_ms: i64,
    s: &mut Summary,
) -> Option<DeadLetter> {
    if limit.is_some_and(|l| s.selected >= l) {
        return None;
    }
    let props = &m.properties;
    let message_id = props.message_id().as_ref().map(|m| m.to_string());
    let d = DeadLetter::from_message(&m.data, props.headers().as_ref(), message_id.as_deref());
    if !filter.matches(&d, now_ms) {
        return None;
    }
    s.selected += 1;
    Some(d)
}

/// The properties for a replay: the attempt counter, the deferral count,
/// when its age started and the death record are dropped (so a replayed
/// `expired` notification gets a new max age); the id and the attempt
/// history stay. The replay is a run of its own ([`run::replayed`]).
pub(super) fn fresh(props: &BasicProperties) -> BasicProperties {
    let old = props.headers().as_ref();
    let text = |k: &str| get(old, k).and_then(string);
    let id = text(H_ID).or_else(|| props.message_id().as_ref().map(|m| m.to_string()));
    let dead_at = get(old, H_DEAD_AT).and_then(int);
    let run = run::replayed(
        &id.unwrap_or_default(),
        text(run::H_RUN).as_deref(),
        dead_at,
    );
    let stale = [
        H_ATTEMPT,
        H_DEAD_AT,
        H_DEAD_REASON,
        H_FIRST_AT,
        H_FIRST_SEEN,
        H_DEFERRALS,
        H_LAST_ERROR,
        H_LAST_STATUS,
        H_DELAY,
    ];
    let mut headers: FieldTable = old
        .map(|h| {
            h.inner()
                .iter()
                .filter(|(k, _)| !stale.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into()
        })
        .unwrap_or_default();
    headers.insert(run::H_RUN.into(), long_string(&run));
    crate::publish::republish_properties(props, headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::AMQPValue;

    /// A replayed notification starts afresh: no attempts, no deferrals and
    /// no age (an `expired` one would otherwise expire again on arrival).
    #[test]
    fn a_replay_forgets_attempts_deferrals_and_age() {
        let mut h = FieldTable::default();
        for k in [H_ATTEMPT, H_FIRST_AT, H_FIRST_SEEN, H_DEFERRALS, H_DEAD_AT] {
            h.insert(k.into(), AMQPValue::LongLongInt(7));
        }
        h.insert("redeliver-id".into(), AMQPValue::LongLongInt(1));
        let props = fresh(&BasicProperties::default().with_headers(h));
        let kept = props.headers().clone().unwrap_or_default();
        let names: Vec<&str> = kept.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["redeliver-id", "redeliver-run"]);
        let run = crate::message::state::string(&kept.inner()["redeliver-run"]);
        assert_eq!(
            run,
            Some(run::replayed("", None, Some(7))),
            "a replay's own run"
        );
    }
}
