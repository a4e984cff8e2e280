//! Phase 10: end to end on a three-node cluster, next to the single node.
//!
//! Both runs drain the same preloaded backlog with three `redeliver run`
//! processes. On the cluster each worker is given one node's URL, so every
//! node serves a worker, and the work queue is a quorum queue with a member
//! on each node: every enqueue is written to disk on a majority before it
//! is confirmed. On a machine of few cores the three nodes share them, so
//! the ratio shows what replication costs there, not how a cluster scales.

use anyhow::Context as _;

use super::load;
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

    async fn cluster_on(&mut self, urls: &AmqpUrl) -> anyhow::Result<()> {
        let p = Phase::Cluster;
        let (n, c) = (self.sizes.n, self.sizes.concurrency);
        let args = Self::concurrency_args(c);
        self.sink.reset(Mode::default());
        let (_, seen) = self
            .preload_and_drain("cluster-single", n, WORKERS, &args)
            .await?;
        let single = seen.rate();
        let name = format!("single node, {WORKERS} workers × concurrency {c}");
        self.push(p, name, Some(single), "msg/s");
        self.sink.reset(Mode::default());
        let rate = self.drain_cluster(urls, n, &args).await?;
        let name = format!("{}-node cluster, a worker on each node", urls.urls().len());
        self.push(p, name, Some(rate), "msg/s");
        let name = "ratio cluster / single node";
        self.push(p, name, Some(rate / single), "x");
        Ok(())
    }

    /// Preloads `n` notifications on the cluster under a fresh prefix and
    /// drains them with one worker per node URL; deletes the prefix after.
    async fn drain_cluster(
        &self,
        urls: &AmqpUrl,
        n: usize,
        args: &[String],
    ) -> anyhow::Result<f64> {
        let broker = BrokerSettings {
            url: urls.clone(),
            ..self.opts.broker.clone()
        };
        let conn = urls
            .connect("redeliver bench cluster")
            .await
            .with_context(|| format!("cannot connect to the cluster at {urls}"))?;
        let spawners: Vec<Spawner> = urls
            .urls()
            .iter()
            .map(|u| Spawner {
                exe: self.opts.worker_exe.clone(),
                env: vec![],
                broker: BrokerSettings {
                    url: AmqpUrl::new(u.clone()),
                    ..broker.clone()
                },
            })
            .collect();
        let prefix = self.prefix("cluster");
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let drained = match load::preload(&conn, &broker, &prefix, items).await {
            Ok(_) => self.drain_on(&prefix, &spawners, args, n).await,
            Err(e) => Err(e),
        };
        load::remove(&conn, &prefix).await;
        let _ = conn.close(200, "bench done".into()).await;
        drained?;
        Ok(self.sink.seen().rate())
    }
}
