//! The wall clock, in the units the wire format uses. A leaf: every layer
//! may read the time through it, and it imports nothing of the crate.

/// This host's clock in microseconds since the Unix epoch (0 for a clock
/// set before 1970, which the cascade's holder does not trust).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch, as the retry-state headers carry them.
pub fn now_ms() -> i64 {
    (now_us() / 1000) as i64
}
