//! What the delay cascade's queues of a test's prefix still hold.

use std::time::{Duration, Instant};

use super::app::TestApp;

/// Waits up to `within` until the cascade's queues are empty twice in a
/// row, 1.5 s apart (longer than a probe's last hops, which a passive
/// declare may not count while the next queue has not confirmed them);
/// returns what they still hold.
pub async fn cascade_drained(app: &TestApp, within: Duration) -> Vec<(String, u32)> {
    let deadline = Instant::now() + within;
    let mut empty_before = false;
    loop {
        let held = cascade_held(app).await;
        if held.is_empty() && empty_before || Instant::now() > deadline {
            return held;
        }
        empty_before = held.is_empty();
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
}

/// What each of the cascade's queues holds, asked of its leader (a
/// passive declare). `list_queues` shows a quorum queue's count as of its
/// last tick (5 s): it can miss a probe that just came in and still show
/// one that left.
pub async fn cascade_held(app: &TestApp) -> Vec<(String, u32)> {
    let args = ["rabbitmqctl", "list_queues", "-q", "name"];
    let names = super::ctl_output(super::default_port(), &args);
    let ours = format!("{}.", app.prefix);
    let mut held = vec![];
    for name in names
        .lines()
        .filter(|l| l.starts_with(&format!("{ours}cascade.")))
    {
        let n = app.queue_len(&name[ours.len()..]).await;
        if n > 0 {
            held.push((name.to_string(), n));
        }
    }
    held
}
