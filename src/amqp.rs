//! AMQP helpers shared by the layers: the options that settle deliveries
//! (the worker, the holder, the DLQ walk) and a bound on a round trip (the
//! read-only commands). A leaf: it imports nothing of the crate.

use lapin::options::BasicNackOptions;

/// A nack that returns the delivery to its queue, to be delivered again
/// (to this or another consumer).
pub fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        ..Default::default()
    }
}

/// A broker round trip that must end: a reply that never comes (`status`
/// saw one once on 4.3.6, among a run of channels the broker closed)
/// becomes a timeout error, so a read-only command says so and exits
/// instead of hanging.
pub async fn bounded<T>(
    op: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, lapin::Error> {
    const ROUND_TRIP: std::time::Duration = std::time::Duration::from_secs(10);
    match tokio::time::timeout(ROUND_TRIP, op).await {
        Ok(done) => done,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the broker did not answer within 10 s",
        )
        .into()),
    }
}
