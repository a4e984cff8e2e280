//! The history's flags: what `run` records (`--history*`), `redeliver
//! console`, and `redeliver history show/list`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::{duration, on_off};

#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "History")]
pub struct HistoryArgs {
    /// Record every attempt in the stream <prefix>.history: `redeliver
    /// console` indexes it and `redeliver history` asks the console. Each
    /// delivery is acked only once its record is confirmed. on or off.
    #[arg(long = "history", env = "REDELIVER_HISTORY", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// How long the stream keeps records (its x-max-age; whole segments
    /// of 100 MB go at a time). Every worker of a prefix must give the same.
    #[arg(long, env = "REDELIVER_HISTORY_MAX_AGE", default_value = "7d", value_parser = duration)]
    pub history_max_age: Duration,
    /// The stream's size bound on each node (its x-max-length-bytes), e.g.
    /// 10GB or 500MB. Every worker of a prefix must give the same.
    #[arg(long, env = "REDELIVER_HISTORY_MAX_BYTES", default_value = "10GB", value_parser = byte_size)]
    pub history_max_bytes: u64,
    /// Bytes of each response body a record keeps.
    #[arg(long, env = "REDELIVER_HISTORY_RESPONSE_BYTES", default_value_t = crate::history::DEFAULT_RESPONSE_BYTES)]
    pub history_response_bytes: usize,
    /// Bytes of the request body kept, once per run on its first attempt;
    /// 0 keeps none.
    #[arg(long, env = "REDELIVER_HISTORY_REQUEST_BYTES", default_value_t = crate::history::DEFAULT_REQUEST_BYTES)]
    pub history_request_bytes: usize,
    /// Request headers never recorded, besides Authorization, Cookie,
    /// Proxy-Authorization, X-Api-Key and other credential headers, which
    /// never are. Comma-separated.
    #[arg(long, env = "REDELIVER_HISTORY_REDACT_HEADERS", value_delimiter = ',')]
    pub history_redact_headers: Vec<String>,
}

impl HistoryArgs {
    pub fn settings(&self) -> crate::history::HistorySettings {
        crate::history::HistorySettings {
            enabled: self.enabled,
            max_age: self.history_max_age,
            max_bytes: self.history_max_bytes,
            response_bytes: self.history_response_bytes,
            request_bytes: self.history_request_bytes,
            redact_headers: self.history_redact_headers.clone(),
        }
    }
}

/// A size such as 10GB, 500MB, 64KiB or a number of bytes.
fn byte_size(s: &str) -> Result<u64, String> {
    let n: bytesize::ByteSize = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a size such as 10GB: {e}"))?;
    match n.as_u64() {
        0 => Err("must be more than 0 bytes".into()),
        b => Ok(b),
    }
}

/// `redeliver console`.
#[derive(Debug, Args, Clone)]
pub struct ConsoleArgs {
    /// Where the console's pages, API and /readyz listen. Any address
    /// other than loopback needs --token.
    #[arg(
        long,
        env = "REDELIVER_CONSOLE_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// The directory of its index (SQLite); created if missing. A fresh
    /// one is rebuilt from the stream.
    #[arg(long, env = "REDELIVER_CONSOLE_DATA", value_name = "DIR")]
    pub data: PathBuf,
    /// The operator's token: the web pages' sign-in and the API's bearer
    /// token. It may change things (pause, resume, replay, purge).
    #[arg(long, env = "REDELIVER_CONSOLE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A read-only token, for viewers: they see every page and call every
    /// GET, and change nothing (403). Needs --token.
    #[arg(
        long,
        env = "REDELIVER_CONSOLE_READ_TOKEN",
        hide_env_values = true,
        requires = "token"
    )]
    pub read_token: Option<String>,
    /// The stream's retention, as the workers declare it (the console
    /// declares the stream too, and prunes its index to this age).
    #[arg(long, env = "REDELIVER_HISTORY_MAX_AGE", default_value = "7d", value_parser = duration)]
    pub history_max_age: Duration,
    /// The stream's size bound, as the workers declare it.
    #[arg(long, env = "REDELIVER_HISTORY_MAX_BYTES", default_value = "10GB", value_parser = byte_size)]
    pub history_max_bytes: u64,
}

/// `redeliver history`: ask a console what happened.
#[derive(Debug, Subcommand)]
pub enum HistoryCommand {
    /// One notification's attempts, oldest first: one line each.
    Show {
        /// The notification's id (its webhook-id).
        id: String,
        #[command(flatten)]
        console: ConsoleClientArgs,
    },
    /// Attempts across notifications, newest first.
    List(HistoryListArgs),
}

#[derive(Debug, Args, Clone)]
pub struct HistoryListArgs {
    /// Only this endpoint: an origin such as https://shop.example (its
    /// port may be left out).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// delivered, retry or dead.
    #[arg(long)]
    pub outcome: Option<String>,
    /// A status (503) or a class (5xx).
    #[arg(long)]
    pub status: Option<String>,
    /// From this time: RFC 3339, or a duration back from now (1h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Before this time: RFC 3339, or a duration back from now.
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many attempts (1 to 10000).
    #[arg(long, default_value = "50")]
    pub limit: String,
    #[command(flatten)]
    pub console: ConsoleClientArgs,
}

#[derive(Debug, Args, Clone)]
pub struct ConsoleClientArgs {
    /// A JSON array of attempt objects instead of lines.
    #[arg(long)]
    pub json: bool,
    /// The console to ask.
    #[arg(
        long,
        env = "REDELIVER_CONSOLE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub console_url: String,
    /// The console's token.
    #[arg(long, env = "REDELIVER_CONSOLE_TOKEN", hide_env_values = true)]
    pub console_token: Option<String>,
}
