//! Phase 17: the console's index on its own, without a broker: how fast it
//! ingests records (batches of 1,000, as the follower writes them), how
//! long `show` and a filtered `list` take once it holds many (10 million;
//! 20,000 with `--quick`), and the bytes per record as JSON (what the
//! stream carries) and on disk.

use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::options::Phase;
use super::phases::Bench;
use crate::console::index::{self, Row};
use crate::history::query::{Filter, Status};
use crate::history::record::{Attempt, Outcome};

/// Records ingested per transaction, as the follower's batches.
const BATCH: usize = 1_000;

struct Figures {
    records: usize,
    ingest_per_s: f64,
    show_p99_ms: f64,
    list_p99_ms: f64,
    json_bytes: f64,
    disk_bytes: f64,
}

impl Bench {
    pub(super) async fn history_index(&mut self) -> anyhow::Result<()> {
        let n = if self.opts.quick { 20_000 } else { 10_000_000 };
        let dir = std::env::temp_dir().join(format!(
            "redeliver-bench-index-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let at = dir.clone();
        let measured = tokio::task::spawn_blocking(move || measure(&at, n)).await;
        let _ = std::fs::remove_dir_all(&dir);
        let f = measured??;
        let p = Phase::HistoryIndex;
        self.push(p, "records indexed", Some(f.records as f64), "rec");
        let name = "index ingest (batches of 1,000)";
        self.push_target(p, name, Some(f.ingest_per_s), "rec/s", "≥ 50,000", |r| {
            r >= 50_000.0
        });
        let name = "history show, p99 (1,000 random ids)";
        self.push_target(p, name, Some(f.show_p99_ms), "ms", "≤ 50", |m| m <= 50.0);
        let name = "history list filtered, p99 (200 queries)";
        self.push_target(p, name, Some(f.list_p99_ms), "ms", "≤ 200", |m| {
            m <= 200.0
        });
        let name = "bytes per record as JSON (the stream's payload)";
        self.push(p, name, Some(f.json_bytes), "B");
        self.push(
            p,
            "bytes per record on disk (index)",
            Some(f.disk_bytes),
            "B",
        );
        Ok(())
    }
}

fn measure(dir: &Path, n: usize) -> anyhow::Result<Figures> {
    let mut c = index::open(dir)?;
    let (mut spent, mut json) = (Duration::ZERO, 0usize);
    for start in (0..n).step_by(BATCH) {
        let rows: Vec<Row> = (start..(start + BATCH).min(n)).map(row).collect();
        json += rows.iter().map(|r| r.json.len() + 1).sum::<usize>();
        let t = Instant::now();
        index::ingest(&mut c, &rows, (start + BATCH) as u64)?;
        spent += t.elapsed();
    }
    let notifications = n.div_ceil(3);
    let show = p99(1_000, |i| {
        let id = format!("n-{}", (i * 7_919) % notifications);
        index::show(&c, &id).map(drop)
    })?;
    let last = started_ms(n.saturating_sub(1)) as u64;
    let list = p99(200, |i| index::list(&c, &filter(i, last)).map(drop))?;
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    Ok(Figures {
        records: n,
        ingest_per_s: n as f64 / spent.as_secs_f64(),
        show_p99_ms: show,
        list_p99_ms: list,
        json_bytes: json as f64 / n as f64,
        disk_bytes: dir_bytes(dir) as f64 / n as f64,
    })
}

/// The queries `list` gets, in turn: by status class within the last
/// hour, by endpoint, by outcome, by exact status.
fn filter(i: usize, last_ms: u64) -> Filter {
    let hour_before = UNIX_EPOCH + Duration::from_millis(last_ms.saturating_sub(3_600_000));
    let mut f = Filter::default();
    match i % 4 {
        0 => (f.status, f.since) = (Some(Status::Class(5)), Some(hour_before)),
        1 => f.endpoint = Some(endpoint(i * 31)),
        2 => f.outcome = Some(Outcome::Dead),
        _ => f.status = Some(Status::Exact(404)),
    }
    f
}

/// The 99th percentile of `k` timed calls, in ms.
fn p99(
    k: usize,
    mut call: impl FnMut(usize) -> Result<(), index::IndexError>,
) -> anyhow::Result<f64> {
    let mut ms = Vec::with_capacity(k);
    for i in 0..k {
        let t = Instant::now();
        call(i)?;
        ms.push(t.elapsed().as_secs_f64() * 1_000.0);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[(k * 99 / 100).min(k - 1)])
}

fn endpoint(i: usize) -> String {
    format!("https://merchant-{}.example:443", i % 1_000)
}

/// 10 ms apart: 10 million records span about 28 hours.
fn started_ms(i: usize) -> i64 {
    1_795_000_000_000 + i as i64 * 10
}

/// Record `i`: attempt `i % 3 + 1` of notification `n-{i / 3}`, with a
/// status, outcome and a short response body of the kinds seen in use.
fn row(i: usize) -> Row {
    row_at(i, started_ms(i))
}

/// Record `i`, started at `at_ms`.
pub(super) fn row_at(i: usize, at_ms: i64) -> Row {
    let (status, outcome) = match i % 10 {
        0 => (Some(503), Outcome::Retry),
        1 => (Some(500), Outcome::Retry),
        2 => (Some(404), Outcome::Dead),
        3 => (None, Outcome::Retry),
        _ => (Some(200), Outcome::Delivered),
    };
    let at = UNIX_EPOCH + Duration::from_millis(at_ms as u64);
    let a = Attempt {
        notification_id: format!("n-{}", i / 3),
        webhook_id: format!("n-{}", i / 3),
        run: Some(format!("run_{:032x}", i / 3)),
        attempt: (i % 3) as u32 + 1,
        endpoint: endpoint(i),
        url: format!(
            "{}/webhooks/pay?token=***",
            endpoint(i).trim_end_matches(":443")
        ),
        started_at: humantime::format_rfc3339_millis(at).to_string(),
        duration_ms: (i % 250) as u64,
        status,
        error: status.is_none().then(|| "timeout after 15s".to_string()),
        outcome,
        next_attempt_at: None,
        dead_reason: (outcome == Outcome::Dead).then(|| "permanent-status".to_string()),
        response_body: status.map(|s| format!("{{\"code\":{s},\"message\":\"see docs\"}}")),
        response_content_type: status.map(|_| "application/json".to_string()),
        request_body: None,
        request_headers: vec![("X-Order".into(), format!("o-{}", i / 3))],
        worker: "bench-host/4242".into(),
        trace_id: None,
    };
    let json = serde_json::to_string(&a).unwrap_or_default();
    Row {
        offset: (i / BATCH * BATCH) as u64,
        line: (i % BATCH) as u32,
        attempt: a,
        json,
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    files
        .map(|f| f.path())
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}
