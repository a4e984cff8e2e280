//! `redeliver endpoint ...`: see and steer endpoints across every worker
//! of the prefix.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::positive_duration;
use crate::message::target::Target;

const TARGET_HELP: &str = "An endpoint's ORIGIN (https://hooks.example.com: scheme, host and \
port) or a URL prefix (https://hooks.example.com/m/123/): a prefix applies to the \
notifications whose URL starts with it, and the longest paused or disabled one wins.";

#[derive(Debug, Subcommand)]
#[command(
    after_help = "Every change reaches every `run` worker of the prefix within 2 s, and \
a worker started later applies it before its first delivery. The state is kept in the \
stream <prefix>.endpoint-state (see the Endpoints section of docs/operations.md)."
)]
pub enum EndpointCommand {
    /// Every endpoint a live worker saw in the last 10 minutes, and every
    /// paused or disabled target, merged over all workers: state, in
    /// flight and limit, the last 5 minutes, last success and failure,
    /// failing since, and the notifications waiting on it.
    List(EndpointListArgs),
    /// One endpoint or target in full: its state and who set it, its
    /// activity, its failing clock, its history and each worker's view.
    Show(EndpointShowArgs),
    /// Stop attempts to an endpoint or URL prefix. Its notifications wait
    /// (deferred, with no attempt spent; --max-age still bounds them) and
    /// are delivered within a minute of the resume.
    Pause(EndpointPauseArgs),
    /// End a pause.
    Resume(TargetArg),
    /// Dead-letter every notification for an endpoint or URL prefix at
    /// once, without an attempt (reason `endpoint-disabled`), until it is
    /// enabled; `dlq replay --endpoint` puts them back.
    Disable(EndpointDisableArgs),
    /// End a disable (by hand or the automatic one, `run --disable-after`).
    Enable(TargetArg),
}

#[derive(Debug, Args, Clone)]
pub struct EndpointListArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct EndpointShowArgs {
    #[arg(help = TARGET_HELP, value_name = "ORIGIN")]
    pub target: Target,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct TargetArg {
    #[arg(help = TARGET_HELP, value_name = "ORIGIN")]
    pub target: Target,
}

#[derive(Debug, Args, Clone)]
pub struct EndpointPauseArgs {
    #[arg(help = TARGET_HELP, value_name = "ORIGIN")]
    pub target: Target,
    /// Why, for the history and `endpoint show`.
    #[arg(long)]
    pub reason: Option<String>,
    /// Resume by itself after this long (e.g. 2h). Default: until `resume`.
    #[arg(long = "for", value_name = "DURATION", value_parser = positive_duration)]
    pub for_: Option<Duration>,
}

#[derive(Debug, Args, Clone)]
pub struct EndpointDisableArgs {
    #[arg(help = TARGET_HELP, value_name = "ORIGIN")]
    pub target: Target,
    /// Why, for the history and `endpoint show`.
    #[arg(long)]
    pub reason: Option<String>,
}
