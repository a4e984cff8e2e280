//! What each page shows, computed from what the handlers fetched, with
//! the time passed in: pure, and tested without a browser. The templates
//! (`pages.rs`) only lay these out.

use std::collections::BTreeMap;

use crate::console::live::{Dead, DeadList, Pulse};
use crate::console::rollup::EndpointStats;
use crate::control::book::Mode;
use crate::control::view::Row;
use crate::history::record::{Attempt, Outcome};
use crate::message::target::Target;
use crate::ops::endpoints::render::{ago, when};

/// Minutes the overview's chart covers.
pub const CHART_MINUTES: i64 = 60;

/// One minute's bar: counts, and heights in the chart's units (0..=100).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bar {
    pub minute: i64,
    pub delivered: i64,
    pub retry: i64,
    pub dead: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub bars: Vec<Bar>,
    /// The tallest bar's total (at least 1).
    pub max: i64,
}

impl Chart {
    /// The last [`CHART_MINUTES`] minutes up to `now_ms`, every minute one
    /// bar (an empty minute is a bar of zero, not a gap).
    pub fn build(counts: &[(i64, String, i64)], now_ms: i64) -> Chart {
        let last = now_ms / 60_000;
        let first = last - CHART_MINUTES + 1;
        let mut bars: Vec<Bar> = (first..=last)
            .map(|minute| Bar {
                minute,
                ..Bar::default()
            })
            .collect();
        for (minute, outcome, n) in counts {
            let Some(b) = usize::try_from(minute - first)
                .ok()
                .and_then(|i| bars.get_mut(i))
            else {
                continue;
            };
            match outcome.as_str() {
                "delivered" => b.delivered += n,
                "retry" => b.retry += n,
                _ => b.dead += n,
            }
        }
        let max = bars
            .iter()
            .map(|b| b.delivered + b.retry + b.dead)
            .max()
            .unwrap_or(0)
            .max(1);
        Chart { bars, max }
    }

    pub fn totals(&self) -> (i64, i64, i64) {
        self.bars.iter().fold((0, 0, 0), |(d, r, x), b| {
            (d + b.delivered, r + b.retry, x + b.dead)
        })
    }
}

/// The overview's figures.
pub struct Overview {
    pub chart: Chart,
    pub backlog: String,
    pub dead: String,
    pub workers: usize,
    pub consumers: String,
    /// Each delay backend the workers report: name, state, and whether stalled.
    pub backends: Vec<(String, String, bool)>,
    /// Active, paused, disabled, breaker open.
    pub by_state: [usize; 4],
    /// The endpoints with most failures in the last 5 minutes.
    pub failing: Vec<EndpointRow>,
    pub error: Option<String>,
}

impl Overview {
    pub fn build(
        p: &Pulse,
        chart: Chart,
        stats: &BTreeMap<String, EndpointStats>,
        now_ms: u64,
    ) -> Overview {
        let count = |n: Option<u32>| n.map_or("-".to_string(), |n| n.to_string());
        let mut failing: Vec<&Row> = p
            .endpoints
            .iter()
            .filter(|r| r.last_5m.failures > 0)
            .collect();
        failing.sort_by_key(|r| std::cmp::Reverse(r.last_5m.failures));
        Overview {
            chart,
            backlog: count(p.work.map(|(ready, _)| ready)),
            dead: count(p.dead),
            workers: p.workers,
            consumers: count(p.work.map(|(_, c)| c)),
            backends: p
                .probes
                .iter()
                .map(|s| {
                    let state = format!("{:?}", s.state).to_lowercase();
                    (
                        s.backend.as_str().to_string(),
                        state.clone(),
                        state == "stalled",
                    )
                })
                .collect(),
            by_state: crate::control::view::tally(&p.endpoints),
            failing: failing
                .into_iter()
                .take(10)
                .map(|r| EndpointRow::build(r, stats.get(&r.endpoint), now_ms))
                .collect(),
            error: p.error.clone(),
        }
    }
}

/// One endpoint's line.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointRow {
    pub endpoint: String,
    pub state: &'static str,
    /// Delivered ÷ attempted over the last hour, e.g. `99.5%`.
    pub success: String,
    pub attempts: i64,
    pub p50: String,
    pub p99: String,
    pub last_error: String,
    pub paused_until: String,
    pub reason: String,
    pub failures_5m: u64,
    pub waiting: u64,
}

impl EndpointRow {
    pub fn build(r: &Row, s: Option<&EndpointStats>, now_ms: u64) -> EndpointRow {
        let attempts = s.map_or(0, |s| s.attempts());
        let success = match (s, attempts) {
            (Some(s), n) if n > 0 => percent(s.delivered, n),
            _ => "-".into(),
        };
        let latency = |p| {
            s.and_then(|s| s.percentile_ms(p))
                .map_or("-".into(), at_most)
        };
        let (paused_until, reason) = match &r.control {
            Some(Mode::Paused {
                until_ms, reason, ..
            }) => (
                until_ms.map_or("until resumed".into(), |u| when(now_ms, Some(u))),
                reason.clone().unwrap_or_default(),
            ),
            Some(Mode::Disabled { reason, .. }) => ("-".into(), reason.clone().unwrap_or_default()),
            _ => ("-".into(), String::new()),
        };
        let last_error = r.last_failure.as_ref().map_or(String::new(), |f| {
            let what = f
                .status
                .map(|s| format!("HTTP {s}"))
                .or(f.error.clone())
                .unwrap_or_default();
            format!("{what} ({})", ago(now_ms, Some(f.at_ms)))
        });
        EndpointRow {
            endpoint: r.endpoint.clone(),
            state: r.state,
            success,
            attempts,
            p50: latency(50.0),
            p99: latency(99.0),
            last_error,
            paused_until,
            reason,
            failures_5m: r.last_5m.failures,
            waiting: r.waiting + r.parked,
        }
    }
}

/// The endpoints page: every row, with its hour's figures.
pub fn endpoint_rows(
    rows: &[Row],
    stats: &BTreeMap<String, EndpointStats>,
    now_ms: u64,
) -> Vec<EndpointRow> {
    rows.iter()
        .map(|r| EndpointRow::build(r, stats.get(&r.endpoint), now_ms))
        .collect()
}

fn percent(part: i64, whole: i64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// A bucket's bound as people read it: `≤ 50 ms`, `≤ 2.5 s`, `> 120 s`.
pub fn at_most(ms: u64) -> String {
    match ms {
        u64::MAX => "> 120 s".into(),
        0..1_000 => format!("≤ {ms} ms"),
        _ => format!("≤ {} s", ms as f64 / 1_000.0),
    }
}

/// One attempt's line on a notification's page.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptRow {
    pub attempt: u32,
    pub started_at: String,
    pub outcome: &'static str,
    pub status: String,
    pub duration: String,
    pub error: String,
    pub response: String,
    pub next_retry: String,
    pub dead_reason: String,
    pub trace_id: String,
    pub endpoint: String,
}

/// A notification's page.
pub struct Notification {
    pub id: String,
    pub url: String,
    pub attempts: Vec<AttemptRow>,
    /// The first request body recorded.
    pub request_body: Option<String>,
    /// Its last record says dead: a replay is offered.
    pub dead: bool,
}

impl Notification {
    pub fn build(id: &str, records: &[Attempt]) -> Notification {
        let attempts = records.iter().map(attempt_row).collect();
        Notification {
            id: id.to_string(),
            url: records.last().map_or(String::new(), |a| a.url.clone()),
            attempts,
            request_body: records.iter().find_map(|a| a.request_body.clone()),
            dead: records.last().is_some_and(|a| a.outcome == Outcome::Dead),
        }
    }
}

fn attempt_row(a: &Attempt) -> AttemptRow {
    let opt = |s: &Option<String>| s.clone().unwrap_or_default();
    AttemptRow {
        attempt: a.attempt,
        started_at: a.started_at.clone(),
        outcome: match a.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Retry => "retry",
            Outcome::Dead => "dead",
        },
        status: a.status.map_or("-".into(), |s| s.to_string()),
        duration: match a.attempt {
            0 => "-".into(),
            _ => format!("{} ms", a.duration_ms),
        },
        error: opt(&a.error),
        response: opt(&a.response_body),
        next_retry: opt(&a.next_attempt_at),
        dead_reason: opt(&a.dead_reason),
        trace_id: opt(&a.trace_id),
        endpoint: a.endpoint.clone(),
    }
}

/// The dead letters page's filter, as given in its query string.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct DeadFilter {
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub reason: String,
    /// Died within this long (`1h`, `7d`).
    #[serde(default)]
    pub since: String,
}

/// Rows shown at most; the rest are counted ("all matching" takes them).
pub const DEAD_SHOWN: usize = 200;

pub struct DeadLetters {
    pub rows: Vec<Dead>,
    pub matching: usize,
    pub total: usize,
    pub reasons: Vec<String>,
    pub as_of: String,
    pub error: Option<String>,
}

/// The dead letters of `list` that match `f`, as a replay or purge of
/// the same filter takes them (`dead_letter::Filter`): an endpoint is an
/// origin or URL prefix. A bad filter is an error.
pub fn select<'a>(
    list: &'a DeadList,
    f: &DeadFilter,
    now_ms: u64,
) -> Result<Vec<&'a Dead>, String> {
    let since = match f.since.trim() {
        "" => None,
        s => {
            let d = humantime::parse_duration(s)
                .map_err(|e| format!("since: {s:?} is not a duration such as 1h: {e}"))?;
            let back = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            Some((now_ms as i64).saturating_sub(back))
        }
    };
    let target = match f.endpoint.trim() {
        "" => None,
        e => Some(Target::parse(e).map_err(|err| format!("endpoint: {err}"))?),
    };
    let keep = |d: &&Dead| {
        target.as_ref().is_none_or(|t| {
            d.url
                .as_deref()
                .and_then(|u| url::Url::parse(u).ok())
                .is_some_and(|u| t.matches(&u))
        }) && (f.reason.is_empty() || d.reason.as_deref() == Some(f.reason.as_str()))
            && since.is_none_or(|s| d.dead_at_ms.is_some_and(|at| at >= s))
    };
    Ok(list.rows.iter().filter(keep).collect())
}

impl DeadLetters {
    /// The dead letters that match `f` (a bad `since` matches nothing and
    /// says so).
    pub fn build(list: &DeadList, f: &DeadFilter, now_ms: u64) -> DeadLetters {
        let (matching, error) = match select(list, f, now_ms) {
            Ok(m) => (m, list.error.clone()),
            Err(e) => (vec![], Some(e)),
        };
        let mut reasons: Vec<String> = list.rows.iter().filter_map(|d| d.reason.clone()).collect();
        reasons.sort();
        reasons.dedup();
        DeadLetters {
            matching: matching.len(),
            rows: matching.into_iter().take(DEAD_SHOWN).cloned().collect(),
            total: list.total,
            reasons,
            as_of: ago(now_ms, Some(list.at_ms)),
            error,
        }
    }
}

#[cfg(test)]
#[path = "views_tests.rs"]
mod tests;
