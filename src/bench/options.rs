//! What a benchmark run measures and how big: the phases, the options
//! and the sizes derived from them.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::BrokerSettings;

/// The phases, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// 1. Broker ceiling: bare publish-with-confirms and consume-and-ack.
    Broker,
    /// 2. Sink ceiling: the worker's HTTP client against the sink, no broker.
    Sink,
    /// 3. End to end: a preloaded backlog drained by `redeliver run`.
    E2e,
    /// 4. Retry path: every notification fails once, then succeeds.
    Retry,
    /// 5. Latency at half the end-to-end rate, and the worker's own overhead.
    Latency,
    /// 6. Delay accuracy: delayed notifications, lateness and early count.
    Delay,
    /// 7. Worker memory and CPU with small and large backlogs.
    Memory,
    /// 8. Horizontal scaling: 1, 2 and 4 worker processes, 20 ms receiver.
    Horizontal,
    /// 9. Noisy neighbour: a healthy endpoint beside one that hangs,
    ///    refuses, answers 429 or answers slowly (10% of the traffic).
    Noisy,
    /// 10. Cluster: end to end on a three-node cluster, a worker on each
    ///     node, next to three workers on the single node.
    Cluster,
    /// 11. Crashes: duplicate deliveries when a worker is killed with -9
    ///     or the broker restarts during the retry path, with and without
    ///     the retry settle.
    Crash,
    /// 12. A flaky single receiver (30% 500s, 5% hangs past the timeout)
    ///     drained by three workers, with and without isolation.
    Flaky,
    /// 13. Probe cost: an idle worker's and the broker's CPU with the
    ///     delay backend's liveness probe on (the default) and off.
    ProbeCost,
    /// 14. The delay plugin's confirm window: delayed copies published
    ///     with confirms, a broker kill -9 a round, the copies lost and how
    ///     long before the kill they were confirmed. Runs only when named
    ///     (it kills the local test node 16 times), not in a full run.
    ConfirmWindow,
    /// 15. Endpoint state: end to end with 1,000 other endpoints paused,
    ///     next to none, in alternating pairs: what the lookup costs.
    EndpointState,
    /// 16. Operational events: a receiver failing 30% of first attempts,
    ///     with a queue bound to every event next to none, and with every
    ///     failure and recovery an event next to none, in alternating pairs.
    Events,
    /// 17. The history console's index: ingest rate, and `show` and
    ///     filtered `list` p99 with 10 million records (no broker).
    HistoryIndex,
    /// 18. The web console's pages: the slowest server time of each with
    ///     1 million attempts indexed and 10,000 dead letters.
    ConsolePages,
}

impl Phase {
    pub const ALL: [Phase; 17] = [
        Phase::Broker,
        Phase::Sink,
        Phase::E2e,
        Phase::Retry,
        Phase::Latency,
        Phase::Delay,
        Phase::Memory,
        Phase::Horizontal,
        Phase::Noisy,
        Phase::Cluster,
        Phase::Crash,
        Phase::Flaky,
        Phase::ProbeCost,
        Phase::EndpointState,
        Phase::Events,
        Phase::HistoryIndex,
        Phase::ConsolePages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Broker => "1 broker ceiling",
            Phase::Sink => "2 sink ceiling",
            Phase::E2e => "3 end to end",
            Phase::Retry => "4 retry path",
            Phase::Latency => "5 latency",
            Phase::Delay => "6 delay accuracy",
            Phase::Memory => "7 memory and CPU",
            Phase::Horizontal => "8 horizontal",
            Phase::Noisy => "9 noisy neighbour",
            Phase::Cluster => "10 cluster",
            Phase::Crash => "11 crash",
            Phase::Flaky => "12 flaky receiver",
            Phase::ProbeCost => "13 probe cost",
            Phase::ConfirmWindow => "14 confirm window",
            Phase::EndpointState => "15 endpoint state",
            Phase::Events => "16 operational events",
            Phase::HistoryIndex => "17 history index",
            Phase::ConsolePages => "18 console pages",
        }
    }
}

/// What to run, and how big.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub broker: BrokerSettings,
    /// Empty: every phase.
    pub phases: Vec<Phase>,
    /// Notifications for phases 1–4 (default 20,000; 1,000 with `quick`).
    pub n: Option<usize>,
    /// Worker concurrency for phases 1–6.
    pub concurrency: usize,
    /// Small sizes that only show every phase runs (CI).
    pub quick: bool,
    /// The `redeliver` executable that runs the workers.
    pub worker_exe: PathBuf,
    /// Another build to compare end to end against (`--baseline-exe`).
    pub baseline_exe: Option<PathBuf>,
    /// The URLs of a three-node cluster's nodes, for the cluster phase
    /// (`None`: the local test cluster, which the phase starts and stops
    /// again; no figure where there is none).
    pub cluster_url: Option<crate::config::AmqpUrl>,
    /// The broker node's OS process, when it runs on this machine (the
    /// local test node), for its CPU per delivery; the crash phase
    /// restarts the broker only then.
    pub broker_pid: Option<u32>,
}

/// The sizes every phase uses, derived from the options.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sizes {
    pub n: usize,
    pub retry_n: usize,
    pub concurrency: usize,
    pub latency_run: Duration,
    pub delay_n: usize,
    pub delay_min: Duration,
    pub delay_max: Duration,
    /// Delays of 1 ms – 1 s, measured apart from the long ones.
    pub short_delay_n: usize,
    pub backlogs: [usize; 2],
    pub memory_concurrency: [usize; 2],
    pub memory_window: Duration,
    pub horizontal_n: usize,
    pub horizontal_concurrency: usize,
    pub horizontal_latency: Duration,
    /// Healthy notifications of each noisy-neighbour run.
    pub noisy_n: usize,
    /// Notifications of each crash run: enough for the retry traffic to be
    /// flowing when the crash comes, few enough for a run of seconds.
    pub crash_n: usize,
    /// Notifications of each flaky-receiver run: about 19 s here. A retry
    /// chain that meets a hang moves on when a 1 s timeout frees the slots
    /// it waits behind, so the last success lands on one of those waves;
    /// in a 6 s run (5,000) one wave more or less moved a pair by 15%
    /// either way, with isolation on or off alike.
    pub flaky_n: usize,
}

impl Sizes {
    pub fn new(o: &BenchOptions) -> Sizes {
        let q = o.quick;
        let n = o.n.unwrap_or(if q { 1_000 } else { 20_000 });
        Sizes {
            n,
            retry_n: (n / 2).max(1),
            concurrency: o.concurrency,
            latency_run: Duration::from_secs(if q { 2 } else { 6 }),
            delay_n: if q { 500 } else { 10_000 },
            delay_min: Duration::from_secs(if q { 1 } else { 5 }),
            delay_max: Duration::from_secs(if q { 3 } else { 30 }),
            short_delay_n: if q { 200 } else { 2_000 },
            backlogs: if q { [200, 2_000] } else { [1_000, 100_000] },
            memory_concurrency: [32, 256],
            memory_window: Duration::from_secs(if q { 1 } else { 5 }),
            horizontal_n: if q { 400 } else { 4_000 },
            horizontal_concurrency: 8,
            horizontal_latency: Duration::from_millis(20),
            noisy_n: if q { 500 } else { n },
            crash_n: (n / 2).clamp(1, if q { 300 } else { 5_000 }),
            flaky_n: if q { 300 } else { 20_000 },
        }
    }
}

/// The plugin backend's default `--retry-settle` as the flag reads it
/// ("3s"), so the bench's runs and labels follow the default.
pub(super) fn plugin_settle() -> String {
    humantime::format_duration(crate::config::DEFAULT_RETRY_SETTLE).to_string()
}
