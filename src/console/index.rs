//! The console's index of the history stream: SQLite (rusqlite, bundled),
//! one row per record, and the stream offset to resume from, written in
//! the same transaction as the rows it covers, so a restart neither skips
//! nor repeats a record. The index can always be rebuilt from the stream,
//! so it trades durability for speed (WAL, `synchronous=NORMAL`).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use super::rollup;
use crate::history::query::{Filter, Status};
use crate::history::record::{Attempt, Outcome};

/// The index's file in `--data`.
pub const FILE: &str = "history.sqlite3";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS attempts (
    -- The stream offset of the message, and the record's line in it.
    offset INTEGER NOT NULL,
    line INTEGER NOT NULL,
    notification_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    started_ms INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    -- The record as the stream carried it (JSON).
    record TEXT NOT NULL,
    PRIMARY KEY (offset, line)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS by_id ON attempts (notification_id, started_ms);
CREATE INDEX IF NOT EXISTS by_time ON attempts (started_ms);
CREATE INDEX IF NOT EXISTS by_endpoint ON attempts (endpoint, started_ms);
CREATE INDEX IF NOT EXISTS by_outcome ON attempts (outcome, started_ms);
CREATE INDEX IF NOT EXISTS by_status ON attempts (status, started_ms);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
";

/// What went wrong with the index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("the history index: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("the history index's directory {dir}: {source}")]
    Dir { dir: String, source: std::io::Error },
}

/// One record as read off the stream, with where it was.
pub struct Row {
    pub offset: u64,
    pub line: u32,
    pub attempt: Attempt,
    pub json: String,
}

/// Opens (creating) the index in `dir`.
pub fn open(dir: &Path) -> Result<Connection, IndexError> {
    std::fs::create_dir_all(dir).map_err(|source| IndexError::Dir {
        dir: dir.display().to_string(),
        source,
    })?;
    let c = Connection::open(dir.join(FILE))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    init(c)
}

/// Pages SQLite keeps in memory, in KiB (negative: a size, not a count).
/// The id index takes its inserts at random places (ids are the
/// producers'); with SQLite's default 2 MiB, most of them read and evict a
/// page, and ingest slows to a crawl past a few million records.
const CACHE_KIB: i64 = 256 * 1024;
/// Reads through a memory map instead of a system call per page.
const MMAP_BYTES: i64 = 1 << 30;
/// WAL pages between checkpoints (4 KiB each: 200 MiB). A batch's id
/// index inserts dirty a page each, so SQLite's default of 1,000 pages
/// checkpointed (and synced) after nearly every batch; with room, a page
/// changed by many batches reaches the database file once.
const CHECKPOINT_PAGES: i64 = 50_000;

/// Sets a connection up and creates the schema where it is missing.
pub fn init(c: Connection) -> Result<Connection, IndexError> {
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.pragma_update(None, "cache_size", -CACHE_KIB)?;
    c.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    c.pragma_update(None, "temp_store", "MEMORY")?;
    c.pragma_update(None, "wal_autocheckpoint", CHECKPOINT_PAGES)?;
    c.busy_timeout(Duration::from_secs(10))?;
    c.execute_batch(SCHEMA)?;
    c.execute_batch(rollup::SCHEMA)?;
    // An index made before the counts per minute: the last two hours'.
    rollup::backfill(&c, millis(SystemTime::now()) - 2 * 3_600_000)?;
    Ok(c)
}

/// The offset to resume from: one past the last message indexed.
pub fn next_offset(c: &Connection) -> Result<Option<u64>, IndexError> {
    let v: Option<i64> = c
        .query_row(
            "SELECT value FROM meta WHERE key = 'next_offset'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.map(|v| v as u64))
}

/// Adds `rows` and moves the resume offset to `next`, in one transaction.
/// A row already there (the same offset and line) is left as it was.
pub fn ingest(c: &mut Connection, rows: &[Row], next: u64) -> Result<(), IndexError> {
    let tx = c.transaction()?;
    let mut tally = rollup::Tally::default();
    {
        let mut ins = tx.prepare_cached(
            "INSERT OR IGNORE INTO attempts \
             (offset, line, notification_id, endpoint, outcome, status, started_ms, attempt, record) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for r in rows {
            let a = &r.attempt;
            let (started, outcome) = (started_ms(&a.started_at), outcome_text(a.outcome));
            let added = ins.execute(params![
                r.offset as i64,
                r.line,
                a.notification_id,
                a.endpoint,
                outcome,
                a.status,
                started,
                a.attempt,
                r.json,
            ])?;
            // A row read twice is counted once.
            if added == 1 {
                tally.add(a, started, outcome);
            }
        }
        tally.write(&tx)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('next_offset', ?1) \
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![next as i64],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Removes records that started before `before`; how many went.
pub fn prune(c: &Connection, before: SystemTime) -> Result<usize, IndexError> {
    rollup::prune(c, millis(before))?;
    Ok(c.execute(
        "DELETE FROM attempts WHERE started_ms < ?1",
        params![millis(before)],
    )?)
}

/// One notification's attempts, oldest first.
pub fn show(c: &Connection, id: &str) -> Result<Vec<String>, IndexError> {
    let mut q = c.prepare_cached(
        "SELECT record FROM attempts WHERE notification_id = ?1 \
         ORDER BY started_ms, attempt, offset, line",
    )?;
    let rows = q.query_map(params![id], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Attempts that match `f`, newest first, at most `f.limit`: the meaning
/// of [`Filter::matches`]. The order (time, then stream position) is one
/// every index of a table `WITHOUT ROWID` already holds (its key is
/// appended to each), so with a filter on an indexed column SQLite walks
/// that index newest first and stops at the limit: no sort.
pub fn list(c: &Connection, f: &Filter) -> Result<Vec<String>, IndexError> {
    let (mut clauses, mut args) = (vec![], Vec::<rusqlite::types::Value>::new());
    if let Some(e) = &f.endpoint {
        clauses.push("endpoint = ?");
        args.push(e.clone().into());
    }
    if let Some(o) = f.outcome {
        clauses.push("outcome = ?");
        args.push(outcome_text(o).to_string().into());
    }
    match f.status.map(|s| (s, s.range())) {
        Some((Status::Exact(_), (lo, _))) => {
            clauses.push("status = ?");
            args.push(i64::from(lo).into());
        }
        // `+status`: no index on it, so the newest-first walk of another
        // index (time, endpoint, outcome) stops after `limit` matches
        // instead of sorting every status of the class.
        Some((Status::Class(_), (lo, hi))) => {
            clauses.push("+status BETWEEN ? AND ?");
            args.extend([i64::from(lo).into(), i64::from(hi).into()]);
        }
        None => {}
    }
    if let Some(t) = f.since {
        clauses.push("started_ms >= ?");
        args.push(millis(t).into());
    }
    if let Some(t) = f.until {
        clauses.push("started_ms < ?");
        args.push(millis(t).into());
    }
    let filter = match clauses.is_empty() {
        true => String::new(),
        false => format!("WHERE {}", clauses.join(" AND ")),
    };
    let sql = format!(
        "SELECT record FROM attempts {filter} \
         ORDER BY started_ms DESC, offset DESC, line DESC LIMIT {}",
        f.limit
    );
    let mut q = c.prepare_cached(&sql)?;
    let rows = q.query_map(params_from_iter(args), |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// How many records the index holds.
pub fn count(c: &Connection) -> Result<u64, IndexError> {
    Ok(c.query_row("SELECT COUNT(*) FROM attempts", [], |r| r.get::<_, i64>(0))? as u64)
}

pub fn outcome_text(o: Outcome) -> &'static str {
    match o {
        Outcome::Delivered => "delivered",
        Outcome::Retry => "retry",
        Outcome::Dead => "dead",
    }
}

/// A record's start in ms since the epoch; 0 when unreadable, so it is
/// pruned first rather than kept forever.
pub fn started_ms(rfc3339: &str) -> i64 {
    humantime::parse_rfc3339_weak(rfc3339)
        .map(millis)
        .unwrap_or(0)
}

pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
