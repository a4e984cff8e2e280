//! `redeliver console` and `redeliver history show/list`: the flags turned
//! into the console's settings or the client's query, and the query's bad
//! input into a usage error (exit 2).

use std::io::Write;
use std::time::SystemTime;

use anyhow::Context as _;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use super::args::{ConsoleArgs, ConsoleClientArgs, GlobalArgs, HistoryListArgs};
use super::errors::Usage;
use super::settings::broker_settings;
use crate::console::client::{Client, ClientError};
use crate::console::ConsoleSettings;
use crate::history::query::{self, Filter};
use crate::history::HistorySettings;

/// `redeliver console`.
pub async fn console(
    g: &GlobalArgs,
    a: &ConsoleArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let s = ConsoleSettings {
        listen: a.listen,
        data: a.data.clone(),
        token: a
            .token
            .clone()
            .filter(|t| !t.is_empty())
            .map(SecretString::from),
        read_token: a
            .read_token
            .clone()
            .filter(|t| !t.is_empty())
            .map(SecretString::from),
        history: HistorySettings {
            max_age: a.history_max_age,
            max_bytes: a.history_max_bytes,
            ..HistorySettings::default()
        },
    };
    match crate::console::run(&broker_settings(g), s, shutdown).await {
        Err(e @ crate::console::ConsoleError::NoToken(_)) => Err(Usage(e.to_string()).into()),
        r => r.context("the console stopped"),
    }
}

/// `redeliver history show ID`.
pub async fn show(id: &str, c: &ConsoleClientArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let n = client(c).show(id, out).await.map_err(usage)?;
    none_recorded(n);
    Ok(())
}

/// `redeliver history list`.
pub async fn list(a: &HistoryListArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let f = filter(a, SystemTime::now()).map_err(|e| Usage(e.to_string()))?;
    let n = client(&a.console).list(&f, out).await.map_err(usage)?;
    none_recorded(n);
    Ok(())
}

fn client(c: &ConsoleClientArgs) -> Client {
    Client {
        url: c.console_url.clone(),
        token: c
            .console_token
            .clone()
            .filter(|t| !t.is_empty())
            .map(SecretString::from),
        json: c.json,
    }
}

/// An empty answer is no error: said on stderr, exit 0.
fn none_recorded(n: usize) {
    if n == 0 {
        eprintln!("no attempts recorded");
    }
}

fn usage(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Usage(m) => Usage(m).into(),
        other => other.into(),
    }
}

/// The flags as a checked filter (bad input is the caller's exit 2).
fn filter(a: &HistoryListArgs, now: SystemTime) -> Result<Filter, query::QueryError> {
    let time = |t: &Option<String>| t.as_deref().map(|t| query::parse_time(t, now)).transpose();
    Filter {
        endpoint: a
            .endpoint
            .as_deref()
            .map(query::parse_endpoint)
            .transpose()?,
        outcome: a.outcome.as_deref().map(query::parse_outcome).transpose()?,
        status: a.status.as_deref().map(query::Status::parse).transpose()?,
        since: time(&a.since)?,
        until: time(&a.until)?,
        limit: query::parse_limit(&a.limit)?,
    }
    .checked()
}
