//! Embeds the redeliver worker in your own program, with your own delivery
//! handler instead of HTTP. The worker keeps doing everything else:
//! consuming with bounded concurrency, retrying on the backoff policy
//! through the delay exchange, dead-lettering, reconnecting, and shutting
//! down gracefully.
//!
//! This handler writes each notification to stdout (and appends it to the
//! file `EMBED_OUT` when set). To show the other two outcomes:
//! - an id ending in `-flaky` fails its first attempt and is retried;
//! - an id ending in `-poison` is refused, and dead-lettered at once.
//!
//! ```sh
//! export REDELIVER_AMQP_URL='amqp://guest:guest@127.0.0.1:5674/%2f'   # tests/broker/ctl up
//! cargo run --example embed &
//! # The URL is required by the wire format but this handler ignores it.
//! cargo run -- publish --url http://example.invalid/x --body '{"a":1}'
//! cargo run -- publish --url http://example.invalid/x --id order-7-flaky --schedule 1s --body '{"a":2}'
//! cargo run -- publish --url http://example.invalid/x --id order-8-poison --body '{"a":3}'
//! cargo run -- dlq list
//! ```
//!
//! Environment: `REDELIVER_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), `REDELIVER_PREFIX` (default
//! `redeliver`), `EMBED_OUT` (a file to append JSON lines to), `RUST_LOG`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use redeliver::config::DEFAULT_AMQP_URL;
use redeliver::topology::Topology;
use redeliver::{
    walk_dead_letters, AmqpUrl, AttemptResult, BrokerSettings, DeadLetterOp, DelayBackend,
    DeliveryHandler, Filter, Notification, QueueType, WorkerSettings,
};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// The worker calls [`DeliveryHandler::deliver`] once per attempt, with at
/// most `WorkerSettings::concurrency` calls in flight, and turns the
/// returned [`AttemptResult`] into ack, retry or dead letter.
///
/// Things the worker does *not* do for a handler:
/// - no timeout around `deliver` (the HTTP handler has its own): a call
///   that never returns holds a concurrency slot for good, so bound your
///   own I/O;
/// - when shutdown's grace period runs out the call is dropped mid-way and
///   the message goes back to the queue, so it will be delivered again;
/// - delivery is at-least-once: the same `n.id` can arrive again after
///   it succeeded (worker crash, broker restart), so the destination
///   should deduplicate on it.
struct PrintHandler {
    /// Where to append one JSON line per notification, besides stdout.
    out: Option<PathBuf>,
}

impl DeliveryHandler for PrintHandler {
    async fn deliver(&self, n: &Notification, attempt: u32) -> AttemptResult {
        // A transient failure: the worker schedules a retry on the
        // notification's policy (its `schedule`, or the worker's backoff)
        // and calls again later with `attempt + 1`.
        if n.id.ends_with("-flaky") && attempt == 1 {
            println!("{} attempt {attempt}: simulated failure", n.id);
            return AttemptResult::Failed {
                error: "simulated failure on the first attempt".into(),
            };
        }
        // A permanent failure: dead-lettered at once, with this error.
        if n.id.ends_with("-poison") {
            println!("{} attempt {attempt}: refused", n.id);
            return AttemptResult::Refused {
                error: "this handler refuses -poison ids".into(),
            };
        }

        // `body` is the exact JSON text the producer published.
        let body = n.body.as_ref().map(|b| b.get()).unwrap_or("null");
        println!("{} attempt {attempt}: {body}", n.id);
        if let Some(path) = &self.out {
            let at = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            let line = serde_json::json!({
                "id": n.id,
                "attempt": attempt,
                "at_ms": at,
                "url": n.url.as_str(),
                // Parse the raw text back into a value so it nests as JSON.
                "body": n.body.as_ref().and_then(|b| serde_json::from_str::<serde_json::Value>(b.get()).ok()),
            });
            // An I/O error is worth another try later, not a dead letter.
            // The timeout keeps a stuck disk from holding a slot forever.
            let write = append_line(path, format!("{line}\n"));
            match tokio::time::timeout(Duration::from_secs(5), write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return AttemptResult::Failed {
                        error: format!("appending to {}: {e}", path.display()),
                    }
                }
                Err(_) => {
                    return AttemptResult::Failed {
                        error: format!("appending to {}: timed out", path.display()),
                    }
                }
            }
        }

        // Success. `AttemptResult` is shaped after HTTP, so a non-HTTP
        // success is a 2xx `Response`. The worker still applies the
        // success-body rule to it: a notification's own `success_body`
        // (echoed here, since "the receiver's reply" means nothing for
        // this transport), else the worker's (`rules.success_body`, left
        // unset below).
        AttemptResult::Response {
            status: 200,
            body: n.success_body.clone().unwrap_or_default(),
            retry_after: None,
            content_type: None,
        }
    }
}

async fn append_line(path: &PathBuf, line: String) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    f.write_all(line.as_bytes()).await?;
    f.flush().await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The worker reports through `tracing` (reconnects, redeliveries, one
    // line per attempt); without a subscriber those lines are lost. Your
    // program owns the subscriber. Whatever you install, keep
    // `lapin::io_loop` off: lapin traces raw frames there, the login's
    // credentials included. (`redeliver::telemetry` has the CLI's setup.)
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lapin=off"))
        .add_directive("lapin::io_loop=off".parse()?);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    // Which broker and which names. The prefix selects the topology
    // (`<prefix>.notifications`, `.retry`, `.work`, `.dead`), so a worker
    // and the producers must agree on it; the worker declares it
    // idempotently on every (re)connect.
    let broker = BrokerSettings {
        // `AmqpUrl` hides the password whenever it is printed or logged.
        url: AmqpUrl::new(
            std::env::var("REDELIVER_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.into()),
        ),
        prefix: std::env::var("REDELIVER_PREFIX").unwrap_or_else(|_| "redeliver".into()),
        // Only used when the work queue is first declared; an existing
        // queue keeps its type (a mismatch stops the worker with an error).
        queue_type: QueueType::Quorum,
        // How retries wait: the `x-delayed-message` exchange today.
        delay: DelayBackend::default(),
    };

    // How the worker delivers and decides. `..Default::default()` keeps
    // this compiling when fields are added, and gives the CLI's defaults:
    // exponential backoff (10s doubling to 1h, equal jitter), 10 attempts,
    // 410 permanent, 30s confirm timeout and shutdown grace, 2s retry
    // settle, prefetch = concurrency + room for confirm waits.
    let settings = WorkerSettings {
        // At most 8 `deliver` calls in flight in this process.
        concurrency: 8,
        ..Default::default()
    };

    // Graceful shutdown: cancelling the token stops taking deliveries, lets
    // in-flight ones finish within `shutdown_grace`, returns the rest to the
    // queue, and makes `run` return Ok. A second Ctrl-C exits at once;
    // unacked messages go back to the queue through the broker.
    // (the `redeliver` binary does the same on SIGINT and SIGTERM.)
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("shutting down; Ctrl-C again exits at once");
        token.cancel();
        let _ = tokio::signal::ctrl_c().await;
        std::process::exit(130);
    });

    let handler = PrintHandler {
        out: std::env::var_os("EMBED_OUT").map(PathBuf::from),
    };
    eprintln!(
        "embedded worker on {} with prefix {:?}; Ctrl-C stops it",
        broker.url, broker.prefix
    );
    // Runs until `shutdown` is cancelled. A lost connection is retried
    // inside; it returns an error only for what waiting cannot fix: bad
    // URL or credentials, no `x-delayed-message` type, a queue declared
    // with other settings.
    redeliver::run(&broker, settings, handler, shutdown)
        .await
        .context("the worker stopped")?;
    eprintln!("stopped");
    report_dead_letters(&broker).await
}

/// What `redeliver dlq list` shows, through the library: the dead letters
/// are read without being removed (`DeadLetterOp::Keep`); `Replay` and
/// `Purge` are the other operations.
async fn report_dead_letters(broker: &BrokerSettings) -> anyhow::Result<()> {
    let conn = broker.url.connect("embed example").await?;
    let topology = Topology::new(&broker.prefix);
    let op = DeadLetterOp::Keep;
    let summary = walk_dead_letters(&conn, &topology, &Filter::default(), None, op, |d| {
        let reason = d.meta.reason.as_deref().unwrap_or("-");
        eprintln!("dead: {} ({reason}, {} attempts)", d.id, d.meta.attempts);
    })
    .await?;
    eprintln!("{} dead letter(s) in {}", summary.selected, topology.dead);
    let _ = conn.close(200, "".into()).await;
    Ok(())
}
