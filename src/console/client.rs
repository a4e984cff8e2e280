//! `redeliver history show/list`: asks a console's API and prints a
//! timeline (one line per attempt) or the JSON array as the API gave it.
//! Receiver text (response bodies, errors) is printed escaped: it is
//! untrusted and must not drive the terminal.

use std::io::Write;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use url::Url;

use crate::history::query::Filter;
use crate::history::record::Attempt;

/// Where the console is and how to print.
pub struct Client {
    pub url: String,
    pub token: Option<SecretString>,
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad input: the CLI exits 2.
    #[error("{0}")]
    Usage(String),
    #[error("the console at {url} does not answer: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the console at {url} refused the request: {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the console's answer is not a list of attempts: {0}")]
    BadAnswer(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How long one API request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

impl Client {
    /// `history show ID`: the attempts, oldest first; how many.
    pub async fn show(&self, id: &str, out: &mut dyn Write) -> Result<usize, ClientError> {
        crate::message::check_id(id)
            .map_err(|e| ClientError::Usage(format!("{id:?} is not a notification id: {e}")))?;
        let mut url = self.base()?;
        url.path_segments_mut()
            .map_err(|_| self.bad_url())?
            .pop_if_empty()
            .extend(["api", "notifications", id, "attempts"]);
        let got = self.get(url).await?;
        self.print(&got, out, show_line)
    }

    /// `history list`: the attempts that match `f`, newest first.
    pub async fn list(&self, f: &Filter, out: &mut dyn Write) -> Result<usize, ClientError> {
        let mut url = self.base()?;
        url.path_segments_mut()
            .map_err(|_| self.bad_url())?
            .pop_if_empty()
            .extend(["api", "attempts"]);
        {
            let mut q = url.query_pairs_mut();
            let time = |t| humantime::format_rfc3339_millis(t).to_string();
            if let Some(e) = &f.endpoint {
                q.append_pair("endpoint", e);
            }
            if let Some(o) = f.outcome {
                q.append_pair("outcome", outcome_text(o));
            }
            if let Some(s) = f.status {
                let (lo, hi) = s.range();
                let s = if lo == hi {
                    lo.to_string()
                } else {
                    format!("{}xx", lo / 100)
                };
                q.append_pair("status", &s);
            }
            if let Some(t) = f.since {
                q.append_pair("since", &time(t));
            }
            if let Some(t) = f.until {
                q.append_pair("until", &time(t));
            }
            q.append_pair("limit", &f.limit.to_string());
        }
        let got = self.get(url).await?;
        self.print(&got, out, list_line)
    }

    fn base(&self) -> Result<Url, ClientError> {
        match Url::parse(self.url.trim()) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(u),
            _ => Err(self.bad_url()),
        }
    }

    fn bad_url(&self) -> ClientError {
        ClientError::Usage(format!(
            "--console-url {:?} is not an http(s) URL such as http://127.0.0.1:8080",
            self.url
        ))
    }

    /// The API's answer: the records, as JSON values and as attempts.
    async fn get(&self, url: Url) -> Result<Vec<serde_json::Value>, ClientError> {
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.url.clone(),
            reason: chain(&e),
        };
        let mut req = reqwest::Client::new().get(url).timeout(TIMEOUT);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose_secret());
        }
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let body = resp.text().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(ClientError::Refused {
                url: self.url.clone(),
                status: status.as_u16(),
                body: body.chars().take(300).collect(),
            });
        }
        serde_json::from_str(&body).map_err(|e| ClientError::BadAnswer(e.to_string()))
    }

    /// Prints the array as it came (`--json`) or one line per attempt.
    fn print(
        &self,
        got: &[serde_json::Value],
        out: &mut dyn Write,
        line: fn(&Attempt) -> String,
    ) -> Result<usize, ClientError> {
        if self.json {
            serde_json::to_writer_pretty(&mut *out, got)
                .map_err(|e| ClientError::BadAnswer(e.to_string()))?;
            writeln!(out)?;
            return Ok(got.len());
        }
        for v in got {
            let a: Attempt = serde_json::from_value(v.clone())
                .map_err(|e| ClientError::BadAnswer(e.to_string()))?;
            writeln!(out, "{}", line(&a))?;
        }
        Ok(got.len())
    }
}

fn outcome_text(o: crate::history::record::Outcome) -> &'static str {
    use crate::history::record::Outcome::*;
    match o {
        Delivered => "delivered",
        Retry => "retry",
        Dead => "dead",
    }
}

/// What an attempt answered: its status, or its error (escaped).
fn answer(a: &Attempt) -> String {
    match (a.status, &a.error) {
        (Some(s), _) => s.to_string(),
        (None, Some(e)) => format!("{:?}", clip(e, 60)),
        (None, None) => "-".into(),
    }
}

/// What comes next: the retry's time or the dead reason.
fn then(a: &Attempt) -> String {
    match (&a.next_attempt_at, &a.dead_reason) {
        (Some(t), _) => format!("next {t}"),
        (None, Some(r)) => format!("reason {r}"),
        _ => String::new(),
    }
}

/// `history show`'s line: when, which attempt, what it answered, how long,
/// the outcome, what next, the worker and the response's first bytes.
fn show_line(a: &Attempt) -> String {
    let body = a
        .response_body
        .as_deref()
        .map(|b| format!("  {:?}", clip(b, 80)))
        .unwrap_or_default();
    format!(
        "{}  #{:<2} {:>5}  {:>6}ms  {:<9} {}  {}  {}{}",
        a.started_at,
        a.attempt,
        answer(a),
        a.duration_ms,
        outcome_text(a.outcome),
        then(a),
        a.run.as_deref().unwrap_or("-"),
        a.worker,
        body
    )
}

/// `history list`'s line: when, which notification and attempt, where,
/// what it answered, the outcome.
fn list_line(a: &Attempt) -> String {
    format!(
        "{}  {}  #{:<2} {}  {:>5}  {:>6}ms  {}",
        a.started_at,
        a.notification_id,
        a.attempt,
        a.endpoint,
        answer(a),
        a.duration_ms,
        outcome_text(a.outcome)
    )
}

/// The first `n` characters.
fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// An error and its causes on one line (reqwest's own text says little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        cause = c.source();
    }
    line
}
