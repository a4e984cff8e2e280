//! What each `run` worker sees of its endpoints, for `redeliver endpoint
//! list` and `status`: every [`REPORT_EVERY`] a worker publishes its view
//! to `<prefix>.endpoint-reports` (a quorum queue whose reports expire
//! after [`REPORT_TTL`]), in parts of at most [`PART`] endpoints. Readers
//! take each worker's newest complete report without taking any message.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Connection};
use serde::{Deserialize, Serialize};

use crate::isolation::{Counts, Failure, View};
use crate::message::target::Target;
use crate::topology::Topology;

/// How often a worker reports.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);
/// A report is readable this long: a worker missing for longer is gone.
pub const REPORT_TTL: Duration = Duration::from_secs(30);
/// An endpoint is in a report while it had a delivery this recently.
pub const SEEN_WITHIN: Duration = Duration::from_secs(600);
/// Endpoints per message, so a worker with thousands stays in small ones.
const PART: usize = 500;

/// One part of one worker's report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// host/pid.
    pub worker: String,
    pub at_ms: u64,
    /// The stream offset its state was folded through.
    pub through: Option<u64>,
    pub part: usize,
    pub parts: usize,
    pub endpoints: Vec<EndpointReport>,
    /// Targets held back by a pause or a disable, with what it held.
    pub held: Vec<HeldReport>,
}

/// One endpoint as one worker saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EndpointReport {
    /// The isolation key: `scheme://host:port`, or a route's URL prefix.
    pub key: String,
    pub target: Option<Target>,
    pub seen_ms: u64,
    pub in_flight: usize,
    pub limit: usize,
    pub breaker_open: bool,
    pub counts: Counts,
    pub last_success_ms: Option<u64>,
    pub last_failure: Option<Failure>,
    pub waiting: u64,
}

/// What one worker held back for a paused or disabled target.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeldReport {
    pub target: Target,
    /// Deferred by the pause and not due back yet: always 0 since pauses
    /// park ([`HeldReport::parked`]); an earlier build's reports fill it.
    pub waiting: u64,
    /// Dead-lettered as `endpoint-disabled`, since this worker started.
    pub dead_lettered: u64,
    /// Parked by this worker since the pause began (absent in the reports
    /// of builds before parking).
    #[serde(default)]
    pub parked: u64,
}

impl From<View> for EndpointReport {
    fn from(v: View) -> Self {
        EndpointReport {
            key: v.key,
            target: v.target,
            seen_ms: v.seen_ms,
            in_flight: v.in_flight,
            limit: v.limit,
            breaker_open: v.breaker_open,
            counts: v.counts,
            last_success_ms: v.last_success_ms,
            last_failure: v.last_failure,
            waiting: v.waiting,
        }
    }
}

/// Splits a worker's view into the parts it publishes (at least one).
pub fn parts(
    worker: &str,
    at_ms: u64,
    through: Option<u64>,
    endpoints: Vec<EndpointReport>,
    held: Vec<HeldReport>,
) -> Vec<Report> {
    let chunks: Vec<Vec<EndpointReport>> = match endpoints.is_empty() {
        true => vec![vec![]],
        false => endpoints.chunks(PART).map(<[_]>::to_vec).collect(),
    };
    let n = chunks.len();
    let mut held = Some(held);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, endpoints)| Report {
            worker: worker.to_string(),
            at_ms,
            through,
            part: i,
            parts: n,
            endpoints,
            held: held.take().unwrap_or_default(),
        })
        .collect()
}

/// Publishes one part (no confirm: the next report follows soon).
pub async fn publish(ch: &Channel, t: &Topology, r: &Report) -> Result<(), lapin::Error> {
    let body = serde_json::to_vec(r).unwrap_or_default();
    let props = BasicProperties::default().with_content_type("application/json".into());
    let key = t.endpoint_reports.as_str().into();
    ch.basic_publish("".into(), key, BasicPublishOptions::default(), &body, props)
        .await
        .map(drop)
}

/// Declares the report queue (a quorum queue with a TTL, like the delay
/// probes' reports).
pub async fn declare(
    conn: &Connection,
    t: &Topology,
) -> Result<(), crate::delay::report::ReportError> {
    crate::delay::report::declare_queue(conn, &t.endpoint_reports, REPORT_TTL).await
}

/// Each live worker's newest complete report, its parts joined.
pub async fn read(conn: &Connection, t: &Topology) -> Vec<Report> {
    let bodies = crate::delay::report::read_bodies(conn, &t.endpoint_reports).await;
    let parsed = bodies
        .iter()
        .filter_map(|b| serde_json::from_slice::<Report>(b).ok());
    newest_complete(parsed)
}

/// Per worker, the newest report whose every part is there, as one.
pub fn newest_complete(all: impl Iterator<Item = Report>) -> Vec<Report> {
    let mut by: BTreeMap<(String, u64), Vec<Report>> = BTreeMap::new();
    for r in all {
        by.entry((r.worker.clone(), r.at_ms)).or_default().push(r);
    }
    let mut newest: BTreeMap<String, Report> = BTreeMap::new();
    for ((worker, _), mut parts) in by {
        parts.sort_by_key(|p| p.part);
        parts.dedup_by_key(|p| p.part);
        if parts.len() != parts[0].parts {
            continue;
        }
        let mut whole = parts.remove(0);
        for p in parts {
            whole.endpoints.extend(p.endpoints);
            whole.held.extend(p.held);
        }
        // Keys sort by (worker, at): the later one replaces the earlier.
        newest.insert(worker, whole);
    }
    newest.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(key: &str) -> EndpointReport {
        EndpointReport {
            key: key.into(),
            target: Target::parse(key).ok(),
            seen_ms: 1,
            in_flight: 0,
            limit: 1,
            breaker_open: false,
            counts: Counts::default(),
            last_success_ms: None,
            last_failure: None,
            waiting: 0,
        }
    }

    #[test]
    fn a_report_in_parts_is_read_whole_and_only_when_complete() {
        let eps: Vec<_> = (0..1_200).map(|i| ep(&format!("http://h{i}:80"))).collect();
        let mut older = parts("w/1", 10, None, eps.clone(), vec![]);
        assert_eq!(older.len(), 3);
        let newer = parts("w/1", 20, Some(4), eps, vec![]);
        // The newer one lost a part: the older, complete one stands.
        let mut all = newer[..2].to_vec();
        all.append(&mut older);
        let read = newest_complete(all.into_iter());
        assert_eq!(read.len(), 1);
        assert_eq!((read[0].at_ms, read[0].endpoints.len()), (10, 1_200));
        let read = newest_complete(newer.into_iter());
        assert_eq!((read[0].at_ms, read[0].through), (20, Some(4)));
        let empty = parts("w/2", 1, None, vec![], vec![]);
        assert_eq!(newest_complete(empty.into_iter()).len(), 1);
    }
}
