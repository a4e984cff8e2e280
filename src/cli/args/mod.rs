//! The command line. The global options and those of `run` and `publish`
//! can also be set as `REDELIVER_*` environment variables (each flag's
//! `--help` names its variable); the `dlq`, `bench` and `config` options
//! cannot. A `--config` file sets the global and `run` options.

mod dlq;
mod endpoint;
mod history;
mod ops;
mod parse;
mod publish;
mod run;

pub use dlq::*;
pub use endpoint::*;
pub use history::*;
pub use ops::*;
pub use parse::OrOff;
pub use publish::*;
pub use run::*;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::topology::QueueType;

#[derive(Debug, Parser)]
#[command(
    name = "redeliver",
    version,
    about = "Reliable HTTP notification delivery over RabbitMQ",
    after_help = "Quick start, from a checkout (the same as the README):\n  cargo run --release -- demo    # the whole lifecycle; starts the local test broker node if none answers\n  cargo test\n\nBy hand, against the local test node (tests/broker/ctl up):\n  export REDELIVER_AMQP_URL='amqp://guest:guest@127.0.0.1:5674/%2f'\n  redeliver run &\n  redeliver publish --url http://127.0.0.1:8080/hook --body '{\"order\":\"A-1001\",\"status\":\"paid\"}'\n  redeliver status\n  redeliver endpoint list\n  redeliver dlq list"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Broker URL (amqp:// or amqps://), or the comma-separated URLs of
    /// one cluster's nodes: each connection starts at a random one and a
    /// lost connection tries the others in a random order (so the workers of a
    /// lost node spread over the rest), its old node last. Passwords are never printed.
    /// [default: amqp://guest:guest@127.0.0.1:5672/%2f; for `demo` and
    /// `bench`, the local test node amqp://guest:guest@127.0.0.1:5674/%2f]
    #[arg(
        long,
        global = true,
        env = "REDELIVER_AMQP_URL",
        hide_env_values = true
    )]
    pub amqp_url: Option<String>,
    /// Prefix of every exchange and queue name (<prefix>.work, <prefix>.dead, ...).
    #[arg(
        long,
        global = true,
        env = "REDELIVER_PREFIX",
        default_value = "redeliver"
    )]
    pub prefix: String,
    /// Type of the work and dead-letter queues when each is first declared
    /// (an existing queue keeps its type). Quorum queues are replicated
    /// across a cluster's nodes; a classic queue lives on one node.
    #[arg(
        long,
        global = true,
        env = "REDELIVER_QUEUE_TYPE",
        value_enum,
        default_value = "quorum"
    )]
    pub queue_type: QueueType,
    /// How retries wait: the x-delayed-message plugin, or a cascade of TTL
    /// quorum queues that needs no plugin (RabbitMQ 4.3+, managed brokers;
    /// delays of 1 s or less are then held by the `run` workers).
    #[arg(
        long,
        global = true,
        env = "REDELIVER_DELAY_BACKEND",
        value_enum,
        default_value = "plugin"
    )]
    pub delay_backend: crate::delay::DelayBackend,
    /// TOML config file: the same settings under the flags' long names, and
    /// per-URL-prefix [[route]] overrides. Flags > env > file > defaults.
    #[arg(long, global = true, env = "REDELIVER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log lines as human-readable text or JSON objects, filtered by
    /// RUST_LOG [default: pretty on a terminal, json otherwise].
    #[arg(long, global = true, env = "REDELIVER_LOG_FORMAT", value_enum)]
    pub log_format: Option<crate::telemetry::LogFormat>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume the work queue and deliver notifications over HTTP.
    Run(Box<RunArgs>),
    /// Publish notifications (one from flags, or JSON lines from a file).
    Publish(PublishArgs),
    /// Inspect, replay, purge or export dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Queue depths, workers attached, and whether the delay mechanism is available.
    Status(StatusArgs),
    /// See and steer endpoints across every worker of the prefix: list,
    /// show, pause, resume, disable, enable.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// The whole lifecycle in well under a minute: a failing receiver,
    /// retries, dead letters (own prefix, deleted at the end). Without
    /// --amqp-url it uses the local test node, and starts it when nothing
    /// answers there.
    Demo,
    /// Measure throughput, latency, delay accuracy, memory and scaling against
    /// the broker and an embedded HTTP sink (own prefixes, cleaned up).
    Bench(BenchArgs),
    /// Check a config file, or print the effective settings of `run`.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The web console and the history API: follows the history stream
    /// into an index, and serves pages (overview, endpoints with pause and
    /// resume, a notification's attempts, dead letters to replay or purge)
    /// and the JSON API that `redeliver history` and scripts use.
    Console(ConsoleArgs),
    /// What happened to a notification: its attempts, from a console.
    #[command(subcommand)]
    History(HistoryCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file; errors name the line.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
    /// The settings `run` would use (flags > env > --config file > defaults),
    /// with where each comes from; secrets redacted. Takes `run`'s flags.
    Show(Box<RunArgs>),
}
