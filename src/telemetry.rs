//! Logging: human-readable lines on stderr, filtered by `RUST_LOG`. The
//! default, `info,lapin=off`, leaves out lapin's own error lines, which would
//! repeat what redeliver reports in one sentence. Stdout stays free for
//! command output such as ids.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    init_with_default("info,lapin=off")
}

/// Like [`init`], with another default filter (the demo prints its own
/// progress, so it only wants warnings).
pub fn init_with_default(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // lapin's I/O loop traces raw frames, the login's credentials included;
    // no RUST_LOG setting may turn that on.
    let filter = match "lapin::io_loop=off".parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
