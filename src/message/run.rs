//! A notification's run: one publish of it, or one replay from the
//! dead-letter queue. Every copy a worker makes (a retry, a deferral, a
//! dead letter) carries its run in `redeliver-run`, so that a chain forked
//! by a crash inside the settle window (the retry copy confirmed, the
//! original redelivered too) stays one run: its operational events keep
//! one id, and its attempts read as duplicates of one run, not as two
//! notifications.
//!
//! Pure: no clock, no randomness except where a new run begins.

/// The AMQP header that carries the run.
pub const H_RUN: &str = "redeliver-run";

/// A new run, for a publish: `run_` and a random UUID. A publish that is
/// sent again (its confirm lost) sends the same run, since the run is
/// drawn once per prepared notification.
pub fn new_run() -> String {
    format!("run_{}", uuid::Uuid::new_v4().simple())
}

/// The run of a message published without one (by a plain AMQP client):
/// derived from its id and exact bytes, so every delivery of that message,
/// the original redelivered after a crash or its first copy, finds the
/// same run. The same bytes published twice are one run: a duplicate
/// publish, which receivers deduplicate by the id anyway.
pub fn derived(id: &str, body: &[u8]) -> String {
    run_of(&[b"publish", id.as_bytes(), body])
}

/// The run a replay starts: derived from the dead letter it replays (its
/// id, its run and when it died), so a replay sent again after a crash is
/// the same run, and a second replay of the same notification, after it
/// died again, is a new one.
pub fn replayed(id: &str, old_run: Option<&str>, dead_at_ms: Option<i64>) -> String {
    let at = dead_at_ms.map(|t| t.to_string()).unwrap_or_default();
    run_of(&[
        b"replay",
        id.as_bytes(),
        old_run.unwrap_or("").as_bytes(),
        at.as_bytes(),
    ])
}

/// `run_` and a UUID (v5) of the parts, each length-prefixed so that no
/// two lists of parts give the same name.
fn run_of(parts: &[&[u8]]) -> String {
    let mut name = Vec::new();
    for p in parts {
        name.extend_from_slice(&(p.len() as u64).to_be_bytes());
        name.extend_from_slice(p);
    }
    format!(
        "run_{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &name).simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_run_is_stable_and_tells_bytes_apart() {
        assert_eq!(derived("a", b"{}"), derived("a", b"{}"));
        assert_ne!(derived("a", b"{}"), derived("a", b"{ }"));
        assert_ne!(derived("a", b"{}"), derived("b", b"{}"));
        // Length prefixes: moving a byte between parts is another run.
        assert_ne!(derived("ab", b"c"), derived("a", b"bc"));
        assert!(derived("a", b"").starts_with("run_"));
    }

    #[test]
    fn a_replay_is_stable_per_death_and_new_per_replay() {
        let once = replayed("a", Some("run_1"), Some(10));
        assert_eq!(once, replayed("a", Some("run_1"), Some(10)));
        assert_ne!(once, replayed("a", Some("run_1"), Some(11)));
        assert_ne!(once, replayed("a", Some("run_2"), Some(10)));
        assert_ne!(once, derived("a", b""));
        assert_ne!(new_run(), new_run());
    }
}
