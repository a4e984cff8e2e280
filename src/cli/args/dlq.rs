//! `redeliver dlq ...`: which dead letters, and what to do with them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::duration;

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// A table of dead letters (non-destructive; order and headers kept).
    List(DlqListArgs),
    /// One dead letter in full: body, notification fields, attempt history.
    Show {
        /// The notification id.
        id: String,
    },
    /// Republish dead letters to the work queue with a fresh attempt counter,
    /// paced by --rate. Ctrl-C stops cleanly (what is left stays, in order);
    /// the same command again continues there, replaying nothing twice.
    Replay(DlqReplayArgs),
    /// Delete dead letters (requires --yes; without it, counts and exits 1).
    Purge(DlqPurgeArgs),
    /// Write dead letters as JSON lines (non-destructive); re-import with `publish --file`.
    Export(DlqExportArgs),
}

/// Which dead letters: all filters must match.
#[derive(Debug, Args, Clone, Default)]
pub struct DlqFilterArgs {
    /// Only this dead-letter reason.
    #[arg(long, value_parser = crate::policy::DeadReason::ALL)]
    pub reason: Option<String>,
    /// Only notifications to this endpoint: an ORIGIN
    /// (https://hooks.example.com) or a URL prefix they start with.
    #[arg(long, value_name = "ORIGIN")]
    pub endpoint: Option<crate::message::target::Target>,
    /// Only notifications whose URL contains this text.
    #[arg(long)]
    pub url_contains: Option<String>,
    /// Only those dead-lettered within this long (e.g. 1h).
    #[arg(long, value_parser = duration)]
    pub since: Option<Duration>,
}

#[derive(Debug, Args, Clone)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// At most this many rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// One JSON object per line, with every recorded field.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct DlqReplayArgs {
    /// Notification ids to replay.
    pub ids: Vec<String>,
    /// Replay every dead letter.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only list what would be replayed, with the count and, with --rate,
    /// how long it would take.
    #[arg(long)]
    pub dry_run: bool,
    /// Republish at most this many per interval (N/s, N/min, N/h), so a
    /// receiver that just came back is not flooded (default: as fast as
    /// the broker confirms). Its workers deliver them as they arrive.
    #[arg(long, value_name = "N/s")]
    pub rate: Option<crate::policy::Rate>,
    /// Republishes in flight before their confirms are awaited and the dead
    /// letters removed. A stop (Ctrl-C) settles the batch first; a kill -9
    /// may replay at most one batch twice.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
}

#[derive(Debug, Args, Clone)]
pub struct DlqPurgeArgs {
    /// Notification ids to delete (default: all that match the filters).
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// Really delete. Without it, nothing changes: the count is shown and
    /// the command fails (exit 1), so `dlq purge && ...` stops there.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args, Clone)]
pub struct DlqExportArgs {
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// JSON lines (the only format; accepted for symmetry with `list --json`).
    #[arg(long)]
    pub json: bool,
    /// Write to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep credential header values (Authorization, Cookie, *-token, ...)
    /// and URL passwords; by default they are redacted, like everywhere else.
    #[arg(long)]
    pub include_secrets: bool,
}
