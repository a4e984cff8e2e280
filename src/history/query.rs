//! What `history list` and `GET /api/attempts` accept, checked before any
//! database is asked: an endpoint, an outcome, a status (`500` or `5xx`),
//! a time window (RFC 3339, or a duration back from now such as `1h`) and
//! a limit. Pure: the time "now" is passed in. [`Filter::matches`] is the
//! meaning every index must give the same answers to.

use std::time::SystemTime;

use super::record::{Attempt, Outcome};

/// A filter value that cannot be meant; the CLI exits 2 with it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QueryError {
    #[error("--status takes a status such as 503 or a class such as 5xx, not {0:?}")]
    Status(String),
    #[error("--outcome takes delivered, retry or dead, not {0:?}")]
    Outcome(String),
    #[error("a time is RFC 3339 (2026-11-28T08:00:00Z) or a duration back from now (90m, 1h, 7d), not {0:?}")]
    Time(String),
    #[error("--since {since} is after --until {until}")]
    Window { since: String, until: String },
    #[error("--limit takes 1 to {max}, not {0:?}", max = MAX_LIMIT)]
    Limit(String),
    #[error("--endpoint takes an origin such as https://shop.example or http://10.0.0.5:8080, not {0:?}")]
    Endpoint(String),
}

/// The most attempts one answer holds.
pub const MAX_LIMIT: u32 = 10_000;
/// Attempts one answer holds when no limit is given.
pub const DEFAULT_LIMIT: u32 = 50;

/// An exact status, or a class (`5xx` is 500 to 599).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exact(u16),
    Class(u8),
}

impl Status {
    pub fn parse(s: &str) -> Result<Status, QueryError> {
        let bad = || QueryError::Status(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        match t.strip_suffix("xx") {
            Some(c) if c.len() == 1 => match c.parse::<u8>() {
                Ok(d @ 1..=5) => Ok(Status::Class(d)),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
            None => match t.parse::<u16>() {
                Ok(n @ 100..=599) => Ok(Status::Exact(n)),
                _ => Err(bad()),
            },
        }
    }

    /// The statuses it takes in, inclusive.
    pub fn range(self) -> (u16, u16) {
        match self {
            Status::Exact(n) => (n, n),
            Status::Class(d) => (u16::from(d) * 100, u16::from(d) * 100 + 99),
        }
    }
}

pub fn parse_outcome(s: &str) -> Result<Outcome, QueryError> {
    match s.trim() {
        "delivered" => Ok(Outcome::Delivered),
        "retry" => Ok(Outcome::Retry),
        "dead" => Ok(Outcome::Dead),
        _ => Err(QueryError::Outcome(s.to_string())),
    }
}

/// An RFC 3339 time, or a duration before `now`.
pub fn parse_time(s: &str, now: SystemTime) -> Result<SystemTime, QueryError> {
    let t = s.trim();
    if let Ok(at) = humantime::parse_rfc3339_weak(t) {
        return Ok(at);
    }
    humantime::parse_duration(t)
        .ok()
        .and_then(|ago| now.checked_sub(ago))
        .ok_or_else(|| QueryError::Time(s.to_string()))
}

/// An origin as records key it (`https://shop.example:443`): a URL with
/// no path, its port filled in.
pub fn parse_endpoint(s: &str) -> Result<String, QueryError> {
    match crate::message::target::Target::parse(s.trim()) {
        Ok(t) if t.is_origin() => Ok(t.origin_key()),
        _ => Err(QueryError::Endpoint(s.to_string())),
    }
}

pub fn parse_limit(s: &str) -> Result<u32, QueryError> {
    match s.trim().parse::<u32>() {
        Ok(n @ 1..=MAX_LIMIT) => Ok(n),
        _ => Err(QueryError::Limit(s.to_string())),
    }
}

/// A checked `list` query.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    pub endpoint: Option<String>,
    pub outcome: Option<Outcome>,
    pub status: Option<Status>,
    pub since: Option<SystemTime>,
    pub until: Option<SystemTime>,
    pub limit: u32,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            endpoint: None,
            outcome: None,
            status: None,
            since: None,
            until: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

impl Filter {
    /// Refuses an empty window (since after until).
    pub fn checked(self) -> Result<Filter, QueryError> {
        match (self.since, self.until) {
            (Some(s), Some(u)) if s > u => Err(QueryError::Window {
                since: humantime::format_rfc3339_seconds(s).to_string(),
                until: humantime::format_rfc3339_seconds(u).to_string(),
            }),
            _ => Ok(self),
        }
    }

    /// Whether `a`, which started at `started`, is in the answer (before
    /// the limit): the window is since ≤ started < until; a status filter
    /// never takes an attempt without a status.
    pub fn matches(&self, a: &Attempt, started: SystemTime) -> bool {
        let status_ok = match (self.status, a.status) {
            (None, _) => true,
            (Some(f), Some(s)) => {
                let (lo, hi) = f.range();
                (lo..=hi).contains(&s)
            }
            (Some(_), None) => false,
        };
        self.endpoint.as_ref().is_none_or(|e| *e == a.endpoint)
            && self.outcome.is_none_or(|o| o == a.outcome)
            && status_ok
            && self.since.is_none_or(|s| started >= s)
            && self.until.is_none_or(|u| started < u)
    }
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
