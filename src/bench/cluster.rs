//! Phase 10: end to end on a three-node cluster, next to the single node.
//!
//! Both runs drain the same preloaded backlog with three `redeliver run`
//! processes. On the cluster each worker is given one node's URL, so every
//! node serves a worker, and the work queue is a quorum queue with a member
//! on each node: every enqueue is written to disk on a majority before it
//! is confirmed. On a machine of few cores the three nodes share them, so
//! the ratio shows what replication costs there, not how a cluster scales.

use anyhow::Context as _;

use super::load::{self, Item};
use super::options::Phase;
use super::phases::Bench;
use super::procs::Spawner;
use super::sink::Mode;
use crate::config::{AmqpUrl, BrokerSettings};
use crate::ops::local_cluster;

/// Workers in each run: one a node on the cluster.
const WORKERS: usize = 3;

impl Bench {
    /// On `--cluster-url`, or else on the local test cluster, started for
    /// this phase only (three idle nodes would share the cores with the
    /// other phases) and stopped after it when it was not running before.
    pub(super) async fn cluster(&mut self) -> anyhow::Result<()> {
        if let Some(urls) = self.opts.cluster_url.clone() {
            return self.cluster_on(&urls).await;
        }
        let local = match local_cluster::up(&mut std::io::stderr()).await {
            Ok(Some(local)) => local,
            Ok(None) => return self.skip_cluster("no --cluster-url, and no checkout to start one"),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the local test cluster did not start");
                return self.skip_cluster("the local test cluster did not start");
            }
        };
        let result = self.cluster_on(&AmqpUrl::new(local.urls.clone())).await;
        local.release().await?;
        result
    }

    fn skip_cluster(&mut self, why: &str) -> anyhow::Result<()> {
        self.push(Phase::Cluster, format!("skipped: {why}"), None, "msg/s");
        Ok(())
    }

    /// Alternating pairs, each kind first in turn: the single node, then
    /// the cluster. The backlog is spread over the sink's endpoints
    /// ([`super::sink::SPREAD`] + 1), so over the lanes and their leaders:
    /// one receiver's notifications all go to one lane, led by one node.
    async fn cluster_on(&mut self, urls: &AmqpUrl) -> anyhow::Result<()> {
        let p = Phase::Cluster;
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let args = Self::concurrency_args(c);
        let conn = urls
            .connect("redeliver bench cluster")
            .await
            .with_context(|| format!("cannot connect to the cluster at {urls}"))?;
        let cluster = BrokerSettings {
            url: urls.clone(),
            ..self.opts.broker.clone()
        };
        let single = vec![self.spawner.clone(); WORKERS];
        let on_nodes = node_spawners(self, &cluster);
        let pids = [self.opts.broker_pid.into_iter().collect(), node_pids(urls)];
        let runs = [
            (&self.conn, &self.opts.broker, &single),
            (&conn, &cluster, &on_nodes),
        ];
        let (mut singles, mut clustered, mut pairs) = (vec![], vec![], vec![]);
        let mut cpu: [Vec<f64>; 2] = [vec![], vec![]];
        for i in 0..self.pairs() {
            let mut rates = [0.0; 2];
            for kind in [i % 2, 1 - i % 2] {
                let (conn, broker, spawners) = runs[kind];
                let before = cpu_of(&pids[kind]);
                rates[kind] = self.drain_spread(conn, broker, spawners, n, &args).await?;
                cpu[kind].push(cpu_of(&pids[kind]) - before);
            }
            singles.push(rates[0]);
            clustered.push(rates[1]);
            pairs.push((rates[1], rates[0]));
        }
        self.push_cluster_cpu(n, &pids, &cpu);
        let _ = conn.close(200, "bench done".into()).await;
        let name = format!("single node, {WORKERS} workers × concurrency {c} (median)");
        self.push(p, name, super::pairs::median(&singles), "msg/s");
        let nodes = urls.urls().len();
        let name = format!("{nodes}-node cluster, a worker on each node (median)");
        self.push(p, name, super::pairs::median(&clustered), "msg/s");
        let spread = super::pairs::Spread::of_pairs(&pairs);
        self.push_pairs(
            p,
            "ratio cluster / single node",
            spread,
            Some("≥ 1.0"),
            |r| r >= 1.0,
        );
        Ok(())
    }

    /// Broker CPU per 10,000 deliveries, all nodes summed: how much more
    /// work a delivery is for the cluster than for one node (its
    /// replication), the figure the arithmetic in BENCHMARKS.md rests on.
    /// Not given when a node's pid is unknown (not a local node).
    fn push_cluster_cpu(&mut self, n: usize, pids: &[Vec<u32>; 2], cpu: &[Vec<f64>; 2]) {
        let per_10k = 10_000.0 / n.max(1) as f64;
        let known = |k: usize, want: usize| pids[k].len() == want;
        let single = super::pairs::median(&cpu[0]).filter(|_| known(0, 1));
        let cluster = super::pairs::median(&cpu[1]).filter(|_| known(1, 3));
        let p = Phase::Cluster;
        let name = "broker CPU per 10,000 deliveries, single node (median)";
        self.push(p, name, single.map(|s| s * per_10k), "s");
        let name = "broker CPU per 10,000 deliveries, cluster, 3 nodes summed (median)";
        self.push(p, name, cluster.map(|s| s * per_10k), "s");
    }

    /// Preloads `n` notifications spread over the sink's endpoints on
    /// `conn` under a fresh prefix, drains them with a worker from each of
    /// `spawners`, deletes the prefix; the rate at the sink.
    async fn drain_spread(
        &self,
        conn: &lapin::Connection,
        broker: &BrokerSettings,
        spawners: &[Spawner],
        n: usize,
        args: &[String],
    ) -> anyhow::Result<f64> {
        self.sink.reset(Mode::default());
        let prefix = self.prefix("cluster");
        let items = (0..n).map(|i| Item {
            json: format!(
                r#"{{"url":"{}","id":"b-{i}","body":{{"i":{i}}}}}"#,
                self.sink.spread_url(i, "/ok")
            ),
            delay: None,
        });
        let drained = match load::preload(conn, broker, &prefix, items).await {
            Ok(_) => self.drain_on(&prefix, spawners, args, n).await,
            Err(e) => Err(e),
        };
        load::remove(conn, &prefix).await;
        drained?;
        Ok(self.sink.seen().rate())
    }
}

/// The local nodes' pids, by the ports of `urls` (none found: empty).
fn node_pids(urls: &AmqpUrl) -> Vec<u32> {
    urls.urls()
        .iter()
        .filter_map(|u| url::Url::parse(u).ok()?.port())
        .filter_map(crate::ops::local_node::pid_at)
        .collect()
}

/// The CPU seconds `pids` used so far, summed.
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| super::procs::cpu_seconds(*p))
        .sum()
}

/// A worker spawner per node of `cluster`, each given that node's URL
/// only, so every node serves a worker.
fn node_spawners(bench: &Bench, cluster: &BrokerSettings) -> Vec<Spawner> {
    cluster
        .url
        .urls()
        .iter()
        .map(|u| Spawner {
            exe: bench.opts.worker_exe.clone(),
            env: vec![],
            broker: BrokerSettings {
                url: AmqpUrl::new(u.clone()),
                ..cluster.clone()
            },
        })
        .collect()
}
