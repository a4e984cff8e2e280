//! What can go wrong with the shared endpoint state.

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("declaring the endpoint-state stream {name:?} failed: {source}{hint}")]
    Declare {
        name: String,
        source: lapin::Error,
        hint: &'static str,
    },
    #[error("no answer in time: {0}")]
    Timeout(&'static str),
    #[error("the broker did not take a record for {0} (was it deleted?)")]
    Refused(String),
    #[error("the endpoint-state stream's consumer ended while it was read")]
    Ended,
}

impl ControlError {
    pub(super) fn declare(name: &str, source: lapin::Error) -> Self {
        let text = source.to_string();
        let hint = match text.contains("stream") || text.contains("x-queue-type") {
            true => " (redeliver keeps endpoint state in a stream: RabbitMQ 3.9+ with the stream_queue feature flag enabled, as every 4.x has)",
            false => "",
        };
        ControlError::Declare {
            name: name.into(),
            source,
            hint,
        }
    }
}
