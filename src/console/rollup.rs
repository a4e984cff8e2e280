//! Counts per minute beside the attempts, so the pages' charts and the
//! endpoints' success rates and latencies over the last hour read a few
//! thousand rows, not every attempt of that hour (a million, at the rate
//! of a busy prefix). Written in the ingest's transaction, only for rows
//! the ingest really added, so a record read twice is counted once.
//! Latencies are kept as counts per bucket: a percentile is the upper
//! bound of the bucket it falls in (at most 2× off, enough to tell a
//! 40 ms receiver from a 4 s one).

use std::collections::BTreeMap;

use rusqlite::{params, Connection, Transaction};

use crate::history::record::Attempt;

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS endpoint_minutes (
    minute INTEGER NOT NULL,
    endpoint TEXT NOT NULL,
    outcome TEXT NOT NULL,
    -- The latency bucket (BOUNDS_MS), -1 for a record without an attempt.
    bucket INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (minute, endpoint, outcome, bucket)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS endpoint_minutes_by_endpoint ON endpoint_minutes (endpoint, minute);
";

/// Each latency bucket's upper bound (the last one holds the rest).
pub const BOUNDS_MS: [u64; 16] = [
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    u64::MAX,
];

/// The bucket of a duration.
pub fn bucket(ms: u64) -> usize {
    BOUNDS_MS
        .iter()
        .position(|&b| ms <= b)
        .unwrap_or(BOUNDS_MS.len() - 1)
}

/// Rows added in one ingest, summed per (minute, endpoint, outcome, bucket).
#[derive(Default)]
pub struct Tally(BTreeMap<(i64, String, &'static str, i64), i64>);

impl Tally {
    pub fn add(&mut self, a: &Attempt, started_ms: i64, outcome: &'static str) {
        let bucket = match a.attempt {
            0 => -1,
            _ => bucket(a.duration_ms) as i64,
        };
        let key = (started_ms / 60_000, a.endpoint.clone(), outcome, bucket);
        *self.0.entry(key).or_default() += 1;
    }

    /// Adds the counts (in the ingest's transaction).
    pub fn write(self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        let mut up = tx.prepare_cached(
            "INSERT INTO endpoint_minutes (minute, endpoint, outcome, bucket, n) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        for ((minute, endpoint, outcome, bucket), n) in self.0 {
            up.execute(params![minute, endpoint, outcome, bucket, n])?;
        }
        Ok(())
    }
}

/// Removes the minutes before `before_ms`.
pub fn prune(c: &Connection, before_ms: i64) -> rusqlite::Result<usize> {
    c.execute(
        "DELETE FROM endpoint_minutes WHERE minute < ?1",
        params![before_ms / 60_000],
    )
}

/// Outcomes per minute since `since_ms`: (minute, outcome, count).
pub fn per_minute(c: &Connection, since_ms: i64) -> rusqlite::Result<Vec<(i64, String, i64)>> {
    let mut q = c.prepare_cached(
        "SELECT minute, outcome, SUM(n) FROM endpoint_minutes WHERE minute >= ?1 \
         GROUP BY minute, outcome",
    )?;
    let rows = q.query_map(params![since_ms / 60_000], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    rows.collect()
}

/// One endpoint's counts since a time: per outcome, and its attempts per
/// latency bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointStats {
    pub delivered: i64,
    pub retry: i64,
    pub dead: i64,
    pub buckets: [i64; BOUNDS_MS.len()],
}

impl EndpointStats {
    /// Attempts made (records without an attempt left out).
    pub fn attempts(&self) -> i64 {
        self.buckets.iter().sum()
    }

    /// The upper bound of the bucket the `p`-th percentile falls in.
    pub fn percentile_ms(&self, p: f64) -> Option<u64> {
        let total = self.attempts();
        if total == 0 {
            return None;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as i64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(BOUNDS_MS[i]);
            }
        }
        None
    }
}

/// Every endpoint's stats since `since_ms` (one endpoint's with `only`).
pub fn endpoints(
    c: &Connection,
    since_ms: i64,
    only: Option<&str>,
) -> rusqlite::Result<BTreeMap<String, EndpointStats>> {
    let mut q = c.prepare_cached(
        "SELECT endpoint, outcome, bucket, SUM(n) FROM endpoint_minutes \
         WHERE minute >= ?1 AND (?2 IS NULL OR endpoint = ?2) \
         GROUP BY endpoint, outcome, bucket",
    )?;
    let rows = q.query_map(params![since_ms / 60_000, only], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    let mut out: BTreeMap<String, EndpointStats> = BTreeMap::new();
    for row in rows {
        let (endpoint, outcome, bucket, n) = row?;
        let s = out.entry(endpoint).or_default();
        match outcome.as_str() {
            "delivered" => s.delivered += n,
            "retry" => s.retry += n,
            _ => s.dead += n,
        }
        if let Some(b) = usize::try_from(bucket)
            .ok()
            .filter(|b| *b < BOUNDS_MS.len())
        {
            s.buckets[b] += n;
        }
    }
    Ok(out)
}

/// Fills the counts from the attempts of the last `since_ms` when the
/// table is new on an index that already holds attempts (one made before
/// the counts existed).
pub fn backfill(c: &Connection, since_ms: i64) -> rusqlite::Result<()> {
    let empty: bool = c.query_row(
        "SELECT NOT EXISTS (SELECT 1 FROM endpoint_minutes)",
        [],
        |r| r.get(0),
    )?;
    if !empty {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO endpoint_minutes (minute, endpoint, outcome, bucket, n) \
         SELECT started_ms / 60000, endpoint, outcome, \
                CASE WHEN attempt = 0 THEN -1 ELSE {} END, COUNT(*) \
         FROM attempts WHERE started_ms >= ?1 GROUP BY 1, 2, 3, 4",
        bucket_sql("json_extract(record, '$.duration_ms')")
    );
    c.execute(&sql, params![since_ms])?;
    Ok(())
}

/// [`bucket`] in SQL, of the expression `ms`.
fn bucket_sql(ms: &str) -> String {
    let last = BOUNDS_MS.len() - 1;
    let whens: String = BOUNDS_MS[..last]
        .iter()
        .enumerate()
        .map(|(i, b)| format!(" WHEN {ms} <= {b} THEN {i}"))
        .collect();
    format!("(CASE{whens} ELSE {last} END)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_falls_in_the_first_bucket_that_holds_it() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(5), 0);
        assert_eq!(bucket(6), 1);
        assert_eq!(bucket(999), 7);
        assert_eq!(bucket(u64::MAX), BOUNDS_MS.len() - 1);
    }

    #[test]
    fn percentiles_are_the_bounds_of_their_buckets() {
        let mut s = EndpointStats::default();
        s.buckets[bucket(40)] = 98; // ≤ 50 ms
        s.buckets[bucket(3_000)] = 2; // ≤ 5 s
        assert_eq!(s.percentile_ms(50.0), Some(50));
        assert_eq!(s.percentile_ms(98.0), Some(50));
        assert_eq!(s.percentile_ms(99.0), Some(5_000));
        assert_eq!(EndpointStats::default().percentile_ms(50.0), None);
    }
}
