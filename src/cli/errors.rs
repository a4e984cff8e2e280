//! How a failed command reads on stderr: one line for the error and its
//! causes, and a hint where the cause is common and not obvious.

/// Bad input found after parsing (a resume of what is not paused, a
/// target nobody knows): the binary exits 2, as for a flag clap refuses.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Whether the error is bad input (exit 2) rather than a failure (exit 1).
pub fn is_usage(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Usage>().is_some()
}

/// Output cut short by the reader (`redeliver dlq list | head`) is not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// One line for an error and its causes, leaving out a cause whose text
/// the line already holds (lapin repeats its inner error in its own text).
/// A next step for errors whose cause is common and not obvious.
pub fn hint(line: &str) -> Option<&'static str> {
    if line.contains("invalid peer certificate") {
        return Some(
            "the broker's TLS certificate is not trusted by the system's roots; \
             point SSL_CERT_FILE (or SSL_CERT_DIR) at its CA, or fix the host name in the URL",
        );
    }
    None
}

pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
