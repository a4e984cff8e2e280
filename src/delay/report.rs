//! Where `status` learns what the workers' probes see: each `run` worker
//! publishes its view of the delay backends to `<prefix>.delay-state` on
//! every change and every [`REPORT_EVERY`]; reports expire after
//! [`REPORT_TTL`], so the queue holds a few per live worker and nothing of
//! workers long gone. `status` reads them without taking them.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::FutureExt;
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Channel, Connection};
use serde::{Deserialize, Serialize};

use crate::config::DelayBackend;
use crate::topology::{classify, work_args, QueueType, Topology, TopologyError};

/// How often a worker repeats its report when nothing changed.
pub const REPORT_EVERY: Duration = Duration::from_secs(30);
/// How long a report stays readable: three periods, so one lost report
/// does not make a live worker look gone.
pub const REPORT_TTL: Duration = Duration::from_secs(90);
/// Reports read at most by one `status` (a bound, should many workers run).
const MAX_READ: usize = 10_000;
/// A bound on every operation on the report queue. On RabbitMQ 3.10 a
/// quorum queue declared shortly before a broker crash can come back
/// without a leader, and an operation on it then waits for ever; a
/// worker's session start and `status` must not.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("no answer within {0:?} (a quorum queue without a leader?)")]
    Timeout(Duration),
}

/// The queue of reports.
pub fn queue(t: &Topology) -> String {
    format!("{}.delay-state", t.prefix)
}

/// One worker's view of the delay backends it probes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// host/pid of the worker.
    pub worker: String,
    /// When the report was made (ms since the Unix epoch).
    pub at_ms: u64,
    pub backends: Vec<BackendReport>,
    /// Whether new delays go through the cascade because the plugin stalled.
    pub failover_active: bool,
}

/// A backend as probes see it; in reports and `status` JSON as
/// `routing`, `stalled` or `unknown`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ProbeState {
    Routing,
    Stalled,
    /// No probe back or overdue yet (and any state a newer build reports
    /// that this one does not know).
    #[serde(other)]
    Unknown,
}

/// One backend as a worker's probes see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BackendReport {
    pub backend: DelayBackend,
    pub state: ProbeState,
    /// Since when (ms since the Unix epoch): for `stalled`, when the
    /// first overdue probe was sent.
    pub since_ms: Option<u64>,
    /// The last probe's round trip, its delay included.
    pub last_round_trip_ms: Option<u64>,
}

/// Declares the report queue (see [`declare_queue`]).
pub async fn declare(conn: &Connection, t: &Topology) -> Result<(), ReportError> {
    declare_queue(conn, &queue(t), REPORT_TTL).await
}

/// Declares a queue of reports, on a channel of its own (a refusal closes
/// the channel it happens on): always a quorum queue, whatever
/// `--queue-type` says, so that no later flag makes its declaration
/// inequivalent; readable whichever node is down; reports expiring after
/// `ttl`. `crate::control` keeps its endpoint reports in one too.
pub async fn declare_queue(
    conn: &Connection,
    name: &str,
    ttl: Duration,
) -> Result<(), ReportError> {
    match tokio::time::timeout(OP_TIMEOUT, declare_now(conn, name, ttl)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ReportError::Timeout(OP_TIMEOUT)),
    }
}

async fn declare_now(conn: &Connection, name: &str, ttl: Duration) -> Result<(), TopologyError> {
    let fail = |e| classify("queue", name, e);
    let ch = conn.create_channel().await.map_err(fail)?;
    let mut args = work_args(QueueType::Quorum);
    // x-message-ttl: a report is dropped once it is this old.
    args.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(ttl.as_millis() as i64),
    );
    // x-max-length: a bound, whatever the number of workers; the oldest
    // go first (the default overflow, drop-head).
    args.insert(
        "x-max-length".into(),
        AMQPValue::LongLongInt(MAX_READ as i64),
    );
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let declared = ch.queue_declare(name.into(), opts, args).await;
    let _ = ch.close(200, "declared".into()).await;
    declared.map(|_| ()).map_err(fail)
}

/// Publishes a report (no confirm: the next one follows soon).
pub async fn publish(ch: &Channel, t: &Topology, r: &Report) -> Result<(), lapin::Error> {
    let body = serde_json::to_vec(r).unwrap_or_default();
    let props = BasicProperties::default().with_content_type("application/json".into());
    ch.basic_publish(
        "".into(),
        queue(t).as_str().into(),
        BasicPublishOptions::default(),
        &body,
        props,
    )
    .await
    .map(|_| ())
}

/// The newest report of each worker, read without taking any (see
/// [`read_bodies`]). Empty when no worker has reported (or the queue does
/// not exist).
pub async fn read(conn: &Connection, t: &Topology) -> Vec<Report> {
    let mut newest: BTreeMap<String, Report> = BTreeMap::new();
    for body in read_bodies(conn, &queue(t)).await {
        let Ok(r) = serde_json::from_slice::<Report>(&body) else {
            continue;
        };
        match newest.get(&r.worker) {
            Some(old) if old.at_ms >= r.at_ms => {}
            _ => {
                newest.insert(r.worker.clone(), r);
            }
        }
    }
    newest.into_values().collect()
}

/// Every message in the queue `name`, read without taking any: they stay
/// unacked until the read channel closes, which returns them. What was
/// read when the queue does not answer within [`OP_TIMEOUT`]; nothing when
/// it does not exist.
pub async fn read_bodies(conn: &Connection, name: &str) -> Vec<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
    let opened = tokio::time::timeout_at(deadline, conn.create_channel()).await;
    let Ok(Ok(ch)) = opened else {
        return vec![];
    };
    let mut out = vec![];
    for _ in 0..MAX_READ {
        let get = ch.basic_get(name.into(), BasicGetOptions { no_ack: false });
        let Ok(Ok(Some(m))) = tokio::time::timeout_at(deadline, get).await else {
            break;
        };
        out.push(m.delivery.data);
    }
    // Closing returns every message got; bounded, as `status` must end.
    let close = ch.close(200, "reports read".into()).map(|_| ());
    let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
    out
}

/// What `status` shows of one backend, from every worker's report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub backend: DelayBackend,
    /// Stalled if any worker sees it stalled, else routing if any sees it
    /// routing, else unknown.
    pub state: ProbeState,
    /// For `stalled`: the earliest `since` among the workers that see it.
    pub since_ms: Option<u64>,
    /// Workers reporting this backend, and how many of them see it stalled.
    pub workers: usize,
    pub stalled_workers: usize,
    /// Workers whose new delays go through the cascade.
    pub failover_workers: usize,
}

/// Folds the workers' reports into one line per backend.
pub fn summarize(reports: &[Report]) -> Vec<Summary> {
    let mut by: BTreeMap<&str, Summary> = BTreeMap::new();
    for r in reports {
        for b in &r.backends {
            let s = by.entry(b.backend.as_str()).or_insert_with(|| Summary {
                backend: b.backend,
                state: ProbeState::Unknown,
                since_ms: None,
                workers: 0,
                stalled_workers: 0,
                failover_workers: 0,
            });
            s.workers += 1;
            s.failover_workers += usize::from(r.failover_active);
            match b.state {
                ProbeState::Stalled => {
                    s.stalled_workers += 1;
                    s.state = ProbeState::Stalled;
                    s.since_ms = match (s.since_ms, b.since_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                ProbeState::Routing if s.state == ProbeState::Unknown => {
                    s.state = ProbeState::Routing;
                }
                _ => {}
            }
        }
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProbeState::*;

    fn report(worker: &str, state: ProbeState, since: u64, failover: bool) -> Report {
        Report {
            worker: worker.into(),
            at_ms: 1,
            backends: vec![BackendReport {
                backend: DelayBackend::Plugin,
                state,
                since_ms: Some(since),
                last_round_trip_ms: None,
            }],
            failover_active: failover,
        }
    }

    #[test]
    fn one_stalled_worker_makes_the_backend_stalled_since_the_earliest() {
        let s = summarize(&[
            report("a", Routing, 5, false),
            report("b", Stalled, 30, true),
            report("c", Stalled, 20, true),
        ]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].state, Stalled);
        assert_eq!(s[0].since_ms, Some(20));
        assert_eq!((s[0].workers, s[0].stalled_workers), (3, 2));
        assert_eq!(s[0].failover_workers, 2);
        let s = summarize(&[
            report("a", Unknown, 0, false),
            report("b", Routing, 9, false),
        ]);
        assert_eq!(s[0].state, Routing);
    }

    /// Reports are JSON on the wire between builds: the names stay, and a
    /// state this build does not know reads as unknown.
    #[test]
    fn reports_read_the_wire_names() {
        let text = r#"{"worker":"h/1","at_ms":1,"failover_active":false,"backends":[
            {"backend":"plugin","state":"stalled","since_ms":7,"last_round_trip_ms":null},
            {"backend":"cascade","state":"draining","since_ms":null,"last_round_trip_ms":null}]}"#;
        let r: Report = serde_json::from_str(text).expect("a report");
        assert_eq!(r.backends[0].backend, DelayBackend::Plugin);
        assert_eq!(r.backends[0].state, Stalled);
        assert_eq!(r.backends[1].state, Unknown);
        let back = serde_json::to_value(&r.backends[0]).expect("json");
        assert_eq!(back["state"], "stalled");
        assert_eq!(back["backend"], "plugin");
    }
}
