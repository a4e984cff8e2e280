//! The `redeliver` binary: argv → logs → signals → one library call.
//! Everything else is in the library (`redeliver::cli`).

use redeliver::cli::{self, errors, merge, Command, DlqCommand};
use redeliver::telemetry::{self, LogFormat};
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc malloc: a delivery allocates and frees many
/// small buffers across threads (AMQP frames, HTTP requests, log lines), and
/// glibc's malloc/free showed as ~11% of the worker's CPU in a profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let argv: Vec<_> = std::env::args_os().collect();
    // Flags, then env, then the --config file, then defaults.
    let cli = match merge::parse_args(argv.clone()) {
        Ok((cli, _)) => cli,
        Err(e) => e.exit(),
    };
    let format = cli.global.log_format.unwrap_or_else(LogFormat::detect);
    let logs = match cli.command {
        Command::Demo => telemetry::init_with_default(format, "warn,lapin=off"),
        _ => telemetry::init(format),
    };
    // Only `run`, `demo` and `dlq replay` stop gracefully; every other
    // command keeps the default: one SIGINT or SIGTERM ends it.
    let shutdown = match &cli.command {
        Command::Run(_) => shutdown_on_signals(Second::Exits),
        // The demo deletes its queues when stopped; a second signal must
        // not cut that short.
        Command::Demo => shutdown_on_signals(Second::Ignored),
        // A replay settles its batch in flight; a second signal exits (what
        // was not acked stays a dead letter).
        Command::Dlq(DlqCommand::Replay(a)) if !a.dry_run => shutdown_on_signals(Second::Exits),
        _ => CancellationToken::new(),
    };
    let out = &mut std::io::stdout().lock();
    let result = cli::execute(&cli, argv, shutdown, out).await;
    if let Err(e) = result {
        if errors::is_broken_pipe(&e) {
            return;
        }
        // Flush the log lines before the error line and the exit.
        drop(logs);
        let line = errors::error_line(&e);
        eprintln!("error: {line}");
        if let Some(hint) = errors::hint(&line) {
            eprintln!("hint: {hint}");
        }
        // Bad input exits 2, as clap's own refusals do.
        std::process::exit(if errors::is_usage(&e) { 2 } else { 1 });
    }
}

/// What a second SIGINT or SIGTERM does once a graceful stop has begun.
#[derive(Clone, Copy)]
enum Second {
    /// Exit at once (a worker's unacked messages return to the queue).
    Exits,
    /// Nothing: the stop finishes its clean-up.
    Ignored,
}

/// Cancels the returned token on the first SIGINT or SIGTERM.
fn shutdown_on_signals(second: Second) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_signal().await;
        t.cancel();
        match second {
            Second::Exits => {
                tracing::info!("shutting down; a second signal exits at once");
                wait_signal().await;
                std::process::exit(130);
            }
            // Keep the handler installed, so a second signal is absorbed.
            Second::Ignored => loop {
                wait_signal().await;
            },
        }
    });
    token
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
