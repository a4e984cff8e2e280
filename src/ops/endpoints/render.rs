//! `endpoint list` and `endpoint show` as text for people; their JSON is
//! the rows' own `Serialize`.

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Overview;
use crate::control::book::{KeyState, Mode};
use crate::control::view::Row;
use crate::isolation::Failure;

/// The table: one line per endpoint.
pub fn list(o: &Overview, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    writeln!(
        out,
        "{:<40} {:<12} {:>9} {:>16} {:>12} {:<28} {:>13} {:>7}",
        "ENDPOINT",
        "STATE",
        "IN FLIGHT",
        "5 MIN OK/FAIL",
        "LAST OK",
        "LAST FAILURE",
        "FAILING SINCE",
        "WAITING"
    )?;
    for r in &o.rows {
        let five = format!("{}/{}", r.last_5m.successes, r.last_5m.failures);
        writeln!(
            out,
            "{:<40} {:<12} {:>9} {:>16} {:>12} {:<28} {:>13} {:>7}",
            r.endpoint,
            r.state,
            format!("{}/{}", r.in_flight, r.limit),
            five,
            ago(o.now_ms, r.last_success_ms),
            failure(o.now_ms, r.last_failure.as_ref(), 28),
            ago(o.now_ms, r.failing_since_ms),
            r.waiting + r.parked
        )?;
    }
    if o.rows.is_empty() {
        writeln!(out, "(no endpoint seen by a live worker in the last 10 minutes, and none paused or disabled)")?;
    }
    writeln!(out, "{} live worker(s) reporting", o.reports.len())
}

/// One target in full.
pub fn show(
    o: &Overview,
    row: &Row,
    key: Option<&KeyState>,
    out: &mut (impl Write + ?Sized),
) -> io::Result<()> {
    let now = o.now_ms;
    writeln!(out, "endpoint       {}", row.endpoint)?;
    writeln!(out, "state          {}", state_line(row, now))?;
    writeln!(
        out,
        "in flight      {} of {} ({} worker(s))",
        row.in_flight, row.limit, row.workers
    )?;
    let c = row.last_5m;
    writeln!(
        out,
        "last 5 min     {} attempts, {} ok, {} failed",
        c.attempts, c.successes, c.failures
    )?;
    writeln!(out, "last success   {}", when(now, row.last_success_ms))?;
    writeln!(
        out,
        "last failure   {}",
        failure(now, row.last_failure.as_ref(), 200)
    )?;
    match row.failing_since_ms {
        Some(s) => writeln!(
            out,
            "failing since  {} ({} failed attempts)",
            when(now, Some(s)),
            row.failures_since
        )?,
        None => writeln!(out, "failing since  -")?,
    }
    writeln!(out, "waiting        {}", row.waiting)?;
    writeln!(out, "parked         {}", row.parked)?;
    if row.dead_lettered > 0 {
        writeln!(
            out,
            "dead-lettered  {} as endpoint-disabled",
            row.dead_lettered
        )?;
    }
    show_history(now, key, out)?;
    workers(o, row, out)
}

fn state_line(row: &Row, now: u64) -> String {
    let under = row
        .by_target
        .as_ref()
        .map(|t| format!(" (by {t})"))
        .unwrap_or_default();
    match &row.control {
        Some(Mode::Paused {
            since_ms,
            until_ms,
            reason,
            by,
            ..
        }) => format!(
            "paused{under} since {} by {by}{}{}",
            when(now, Some(*since_ms)),
            reason_text(reason),
            until_ms
                .map(|u| format!(", until {}", when(now, Some(u))))
                .unwrap_or_default()
        ),
        Some(Mode::Disabled {
            since_ms,
            reason,
            by,
        }) => format!(
            "disabled{under} since {} by {by}{}",
            when(now, Some(*since_ms)),
            reason_text(reason)
        ),
        _ => row.state.to_string(),
    }
}

fn reason_text(r: &Option<String>) -> String {
    r.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
}

/// A target's history of changes, newest first.
fn show_history(
    now: u64,
    key: Option<&KeyState>,
    out: &mut (impl Write + ?Sized),
) -> io::Result<()> {
    let entries = key.map(|k| k.history.as_slice()).unwrap_or_default();
    if entries.is_empty() {
        return writeln!(out, "history        -");
    }
    for (i, e) in entries.iter().rev().enumerate() {
        let label = if i == 0 { "history" } else { "" };
        writeln!(
            out,
            "{label:<14} {} {} by {}{}",
            when(now, Some(e.at_ms)),
            e.what,
            e.by,
            reason_text(&e.reason)
        )?;
    }
    Ok(())
}

/// Each live worker's view of the endpoint.
fn workers(o: &Overview, row: &Row, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    for r in &o.reports {
        let mine = r
            .endpoints
            .iter()
            .find(|e| e.target.as_ref().map_or(e.key.clone(), |t| t.to_string()) == row.endpoint);
        if let Some(e) = mine {
            writeln!(
                out,
                "worker         {}: in flight {}/{}, {} attempts in 5 min, waiting {}{}",
                r.worker,
                e.in_flight,
                e.limit,
                e.counts.attempts,
                e.waiting,
                if e.breaker_open { ", breaker open" } else { "" }
            )?;
        }
    }
    Ok(())
}

fn failure(now: u64, f: Option<&Failure>, width: usize) -> String {
    let Some(f) = f else {
        return "-".into();
    };
    let what = match (&f.error, f.status) {
        (Some(e), _) => e.clone(),
        (None, Some(s)) => format!("HTTP {s}"),
        (None, None) => "failed".into(),
    };
    let text = format!("{} {what}", ago(now, Some(f.at_ms)));
    text.chars().take(width).collect()
}

/// `12s ago`, `3h ago`, or `-`.
pub fn ago(now: u64, at: Option<u64>) -> String {
    let Some(at) = at else {
        return "-".into();
    };
    let secs = now.saturating_sub(at) / 1_000;
    let (n, unit) = match secs {
        0..=119 => (secs, "s"),
        120..=7_199 => (secs / 60, "m"),
        7_200..=172_799 => (secs / 3_600, "h"),
        _ => (secs / 86_400, "d"),
    };
    format!("{n}{unit} ago")
}

/// A time as RFC 3339, with how long ago (or from now).
pub fn when(now: u64, at: Option<u64>) -> String {
    let Some(at) = at else {
        return "-".into();
    };
    // humantime formats years up to 9999 only (and panics past them).
    const YEAR_9999_MS: u64 = 253_402_300_799_000;
    let t = UNIX_EPOCH + Duration::from_millis(at.min(YEAR_9999_MS));
    let stamp = humantime::format_rfc3339_seconds(t.max(SystemTime::UNIX_EPOCH));
    if at > now {
        let left = Duration::from_secs((at - now) / 1_000);
        return format!("{stamp} (in {})", humantime::format_duration(left));
    }
    format!("{stamp} ({})", ago(now, Some(at)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_say_them() {
        assert_eq!(ago(10_000, Some(4_000)), "6s ago");
        assert_eq!(ago(10_000_000, Some(0)), "2h ago");
        assert_eq!(ago(1, None), "-");
        assert!(when(0, Some(5_000)).ends_with("(in 5s)"));
        assert!(when(5_000, Some(0)).starts_with("1970-01-01T00:00:00Z"));
    }
}
