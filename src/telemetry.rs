//! Logging: human-readable lines on stderr, filtered by `RUST_LOG`
//! (default `info,lapin=off`: lapin's own error lines would repeat what redeliver reports in one sentence). Stdout stays free for command output such as ids.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,lapin=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
