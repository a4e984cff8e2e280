//! `redeliver bench` and `redeliver status`.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args, Clone)]
#[command(
    after_help = "Phases: broker, sink, e2e, retry, latency, delay, memory, horizontal, noisy, \
cluster, crash, flaky, probe-cost, endpoint-state (all by default), and confirm-window, which runs only when \
named: it kills the local test node with -9 sixteen times to measure the delay plugin's confirm \
window (run it on a node of its own, with REDELIVER_TEST_UPSTREAM_PLUGIN for the upstream plugin). \
Workers run as `redeliver run` processes of this executable. \
Against the local test node unless --amqp-url is given; the cluster phase against \
--cluster-url, or else the local three-node test cluster, started for it and stopped \
after. The crash phase restarts the broker only when it is the local test node \
(tests/broker/ctl, on REDELIVER_TEST_BROKER_PORT), and not with --quick. See BENCHMARKS.md."
)]
pub struct BenchArgs {
    /// Run only these phases (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub phase: Vec<crate::bench::Phase>,
    /// Notifications for the broker, sink, end-to-end and retry phases
    /// [default: 20000; 1000 with --quick].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(2..))]
    pub n: Option<u64>,
    /// Worker concurrency for phases 2-6 (phase 1 uses it as its prefetch).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Small sizes that only show every phase runs (about 20 s; for CI).
    #[arg(long)]
    pub quick: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The cluster phase's cluster: the comma-separated URLs of its three
    /// nodes [default: the local test cluster, `tests/broker/ctl cluster`].
    #[arg(long, env = "REDELIVER_BENCH_CLUSTER_URL", hide_env_values = true)]
    pub cluster_url: Option<String>,
    /// Another build of redeliver (the last release, say) to compare end
    /// to end against: each e2e pair also drains with it, and `this build
    /// ÷ baseline` is reported.
    #[arg(long)]
    pub baseline_exe: Option<PathBuf>,
}

#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// RabbitMQ management API (e.g. http://127.0.0.1:15672) for the unacked
    /// count, which AMQP cannot tell. Credentials come from --amqp-url.
    #[arg(long, env = "REDELIVER_MANAGEMENT_URL")]
    pub management_url: Option<String>,
}
