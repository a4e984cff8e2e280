//! `status`: queue depths and consumers over AMQP (passive declares), the
//! delay mechanism's availability, and, when a management API is given,
//! what AMQP cannot tell: unacked counts, the node this connection is on,
//! the cluster's nodes and where each queue's leader and members are.

use lapin::options::ExchangeDeleteOptions;
use lapin::types::FieldTable;
use serde::Serialize;

use crate::amqp::bounded;
use crate::config::{AmqpUrl, BrokerSettings};
use crate::ops::events_status::{self, EventsStatus};
use crate::ops::management::{Api, NodeStatus};
use crate::topology::{lanes, Topology};

use super::status_probe::{read_cascade, read_parked, Probe};
pub use super::status_probe::{CascadeQueueStatus, QueueStatus};

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Status {
    pub prefix: String,
    /// Every URL given, redacted.
    pub broker: String,
    /// The URL this report was read through, redacted.
    pub connected: String,
    /// That connection's node (from the management API).
    pub node: Option<String>,
    /// The cluster's nodes (from the management API).
    pub cluster: Option<Vec<NodeStatus>>,
    /// The lanes as one queue ([`sum`]).
    pub work: QueueStatus,
    /// Each lane, and the old single work queue while it drains.
    pub lanes: LanesStatus,
    /// How many lanes each node leads (from the management API).
    pub lane_leaders: std::collections::BTreeMap<String, u32>,
    /// How many `run` workers of this prefix each node serves (from the
    /// management API).
    pub workers_by_node: std::collections::BTreeMap<String, u32>,
    pub dead: QueueStatus,
    pub delay_backend: &'static str,
    /// Whether the broker has the `x-delayed-message` exchange type.
    pub retry_exchange_type_available: bool,
    /// Messages the plugin still holds for this prefix (`messages_delayed`
    /// of the retry exchange, from the management API); `None` when not
    /// asked, not reachable, or not reported.
    pub plugin_delayed: Option<u64>,
    /// The cascade's hold queue: short delays waiting for a worker
    /// (`ready`) or held by one (`unacked`, from the management API), and
    /// the workers holding (`consumers`).
    pub hold: QueueStatus,
    /// The cascade's queues that exist, with the messages waiting in each
    /// (whichever backend is selected, so a migration can be watched).
    pub cascade: Vec<CascadeQueueStatus>,
    /// How many of the cascade's queues each node leads (from the
    /// management API; empty when unknown).
    pub cascade_leaders: std::collections::BTreeMap<String, u32>,
    /// What the `run` workers' delay probes report, per backend (empty
    /// when no worker reported in the last 90 s, or probes are off).
    pub delay_probes: Vec<ProbeSummary>,
    /// Endpoints by state over the live workers (`endpoint list`'s rows);
    /// `None` when the shared state could not be read.
    pub endpoints: Option<EndpointsStatus>,
    /// The operational events' exchange and what is bound to it.
    pub events: EventsStatus,
    /// Notifications waiting in the parking queues (`<prefix>.park.K`), all
    /// endpoints together: the broker's count.
    pub parked: u32,
}

/// How many endpoints are in each state, and workers reporting.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EndpointsStatus {
    pub active: usize,
    pub paused: usize,
    pub disabled: usize,
    pub breaker_open: usize,
    pub workers: usize,
    /// Notifications parked per paused endpoint, as the live workers that
    /// parked them count them (those with none are left out).
    pub parked: std::collections::BTreeMap<String, u64>,
}

/// The endpoint tally, from the shared state and the workers' reports.
async fn endpoints(broker: &BrokerSettings) -> Option<EndpointsStatus> {
    let o = crate::ops::endpoints::overview(broker).await.ok()?;
    let [active, paused, disabled, breaker_open] = crate::control::view::tally(&o.rows);
    Some(EndpointsStatus {
        active,
        paused,
        disabled,
        breaker_open,
        workers: o.reports.len(),
        parked: o
            .rows
            .iter()
            .filter(|r| r.parked > 0)
            .map(|r| (r.endpoint.clone(), r.parked))
            .collect(),
    })
}

pub use crate::delay::report::Summary as ProbeSummary;

/// The longest `status` may take: each of its reads is bounded too, but
/// a command an operator (or a script) runs must end with an error rather
/// than hang (CI once saw one wait 8 minutes).
const STATUS_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

pub async fn status(
    broker: &BrokerSettings,
    management_url: Option<&str>,
) -> Result<Status, lapin::Error> {
    match tokio::time::timeout(STATUS_WITHIN, read_status(broker, management_url)).await {
        Ok(read) => read,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the broker did not answer every read of `status` within 60 s",
        )
        .into()),
    }
}

async fn read_status(
    broker: &BrokerSettings,
    management_url: Option<&str>,
) -> Result<Status, lapin::Error> {
    let t = Topology::new(&broker.prefix);
    let (conn, connected) = broker.url.connect_to("redeliver status").await?;
    let mut probe = Probe::new(&conn);
    let lanes = read_lanes(&conn, &t).await?;
    let parked = read_parked(&conn, &t).await;
    let dead = probe.queue(&t.dead).await?;
    let hold = probe.queue(&crate::delay::cascade::hold(&t)).await?;
    let cascade = read_cascade(&mut probe, &t, hold.exists).await?;
    probe.close().await;
    let events = events_status::read(&conn, &t).await?;
    let delay_probes =
        crate::delay::report::summarize(&crate::delay::report::read(&conn, &t).await);
    let mut s = Status {
        parked,
        delay_probes,
        endpoints: endpoints(broker).await,
        prefix: broker.prefix.clone(),
        broker: broker.url.redacted(),
        connected,
        node: None,
        cluster: None,
        work: sum(&broker.prefix, &lanes),
        lanes,
        lane_leaders: Default::default(),
        workers_by_node: Default::default(),
        dead,
        hold,
        delay_backend: broker.delay.as_str(),
        retry_exchange_type_available: delayed_type_available(&broker.url, &broker.prefix).await,
        plugin_delayed: None,
        cascade,
        cascade_leaders: Default::default(),
        events,
    };
    if let Some(api) = management_url.and_then(|m| Api::new(m, &broker.url)) {
        s.node = api.node_at(&s.connected).await;
        add_management(&mut s, &api, &t).await;
    }
    let _ = conn.close(200, "status done".into()).await;
    Ok(s)
}

/// What only the management API knows. Its figures can lag by its
/// sampling interval (`collect_statistics_interval`, 5 s by default).
async fn add_management(s: &mut Status, api: &Api, t: &Topology) {
    s.cluster = api.nodes().await;
    let mut placed = api.placements(&format!("{}.", t.prefix)).await;
    let lanes = s.lanes.lanes.iter_mut().chain(s.lanes.legacy.iter_mut());
    for q in lanes.chain([&mut s.dead, &mut s.hold]) {
        q.unacked = api.u64("queues", &q.name, "messages_unacknowledged").await;
        q.placement = placed.remove(&q.name);
    }
    s.work = sum(&s.prefix, &s.lanes);
    s.lane_leaders = leaders(&s.lanes);
    s.workers_by_node = api.workers_by_node(&t.prefix).await;
    s.plugin_delayed = api.u64("exchanges", &t.retry, "messages_delayed").await;
    events_status::add_management(&mut s.events, api).await;
    for q in &s.cascade {
        let leader = placed.get(&q.queue).and_then(|p| p.leader.clone());
        *s.cascade_leaders
            .entry(leader.unwrap_or_else(|| "?".into()))
            .or_default() += 1;
    }
}

/// One passive declare on a channel of its own (see [`Probe`]).
pub(crate) async fn queue(
    conn: &lapin::Connection,
    name: &str,
) -> Result<QueueStatus, lapin::Error> {
    let mut probe = Probe::new(conn);
    let q = probe.queue(name).await;
    probe.close().await;
    q
}

/// Declares and deletes a throw-away `x-delayed-message` exchange, on a
/// connection of its own: an unknown type is a connection-level error.
pub async fn delayed_type_available(url: &AmqpUrl, prefix: &str) -> bool {
    let Ok(conn) = url.connect("redeliver status probe").await else {
        return false;
    };
    let name = format!(
        "{prefix}.probe.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let ok = match conn.create_channel().await {
        Ok(ch) => {
            let mut args = FieldTable::default();
            args.insert(
                "x-delayed-type".into(),
                lapin::types::AMQPValue::LongString("direct".into()),
            );
            let kind = lapin::ExchangeKind::Custom("x-delayed-message".into());
            let declare = ch.exchange_declare(name.as_str().into(), kind, Default::default(), args);
            let declared = bounded(declare).await.is_ok();
            if declared {
                let delete =
                    ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default());
                let _ = bounded(delete).await;
            }
            declared
        }
        Err(_) => false,
    };
    let _ = conn.close(200, "probe done".into()).await;
    ok
}

// The lanes: each lane's depth, consumers and leader, the sum `work`
// shows, and the single work queue of an earlier build while it drains.

/// Every lane that exists, and what is left to drain.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct LanesStatus {
    /// Lanes `<prefix>.work.0` … that exist, in order.
    pub lanes: Vec<QueueStatus>,
    /// The single work queue of an earlier build, if it still exists: the
    /// workers drain it, then it is deleted.
    pub legacy: Option<QueueStatus>,
}

/// The lanes found by passive declares, from lane 0 to the first missing.
pub(crate) async fn read_lanes(
    conn: &lapin::Connection,
    t: &Topology,
) -> Result<LanesStatus, lapin::Error> {
    let mut found = Vec::new();
    for k in 0..lanes::BUCKETS {
        let q = queue(conn, &t.lane(k)).await?;
        if !q.exists {
            break;
        }
        found.push(q);
    }
    let legacy = queue(conn, &t.work).await?;
    Ok(LanesStatus {
        lanes: found,
        legacy: Some(legacy).filter(|q| q.exists),
    })
}

/// The work queue as one: every lane's ready and unacked messages summed,
/// and the consumers of the least-consumed lane (each worker consumes
/// every lane, so that is the workers consuming them all).
pub fn sum(prefix: &str, l: &LanesStatus) -> QueueStatus {
    let all = l.lanes.iter().chain(l.legacy.iter());
    let unacked = all.clone().map(|q| q.unacked).sum::<Option<u64>>();
    QueueStatus {
        name: format!("{prefix}.work.*"),
        exists: !l.lanes.is_empty(),
        ready: all.clone().map(|q| q.ready).sum(),
        unacked,
        consumers: l.lanes.iter().map(|q| q.consumers).min().unwrap_or(0),
        placement: None,
    }
}

/// How many lanes each node leads, `?` for unknown.
pub fn leaders(l: &LanesStatus) -> std::collections::BTreeMap<String, u32> {
    let mut by = std::collections::BTreeMap::new();
    for q in &l.lanes {
        let leader = q.placement.as_ref().and_then(|p| p.leader.clone());
        *by.entry(leader.unwrap_or_else(|| "?".into())).or_insert(0) += 1;
    }
    by
}

#[cfg(test)]
mod lanes_tests {
    use super::*;

    fn q(name: &str, ready: u32, consumers: u32, unacked: Option<u64>) -> QueueStatus {
        QueueStatus {
            name: name.into(),
            exists: true,
            ready,
            unacked,
            consumers,
            placement: None,
        }
    }

    #[test]
    fn the_sum_adds_depths_and_counts_the_workers_on_every_lane() {
        let l = LanesStatus {
            lanes: vec![q("p.work.0", 3, 2, Some(1)), q("p.work.1", 4, 1, Some(2))],
            legacy: Some(q("p.work", 5, 0, Some(0))),
        };
        let s = sum("p", &l);
        assert_eq!((s.ready, s.consumers, s.unacked), (12, 1, Some(3)));
        let l = LanesStatus {
            lanes: vec![q("p.work.0", 3, 2, Some(1)), q("p.work.1", 4, 1, None)],
            legacy: None,
        };
        assert_eq!(sum("p", &l).unacked, None, "unknown when any is");
        assert!(!sum("p", &LanesStatus::default()).exists);
    }
}
