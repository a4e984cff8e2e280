//! What can go wrong with the shared endpoint state.

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused the stream itself: an operator must act.
    #[error("the broker refused the endpoint-state stream {name:?}: {source}{hint}")]
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
    /// A declaration's failure: a refusal an operator must fix (no
    /// streams, a queue of that name with other settings) is `Declare`;
    /// anything else (a lost connection, a leader election) is `Amqp`,
    /// which a reconnect may cure.
    pub(super) fn declare(name: &str, source: lapin::Error) -> Self {
        let lapin::ErrorKind::ProtocolError(amqp) = source.kind() else {
            return ControlError::Amqp(source);
        };
        let text = amqp.get_message().as_str().to_string();
        let refused = [
            "PRECONDITION_FAILED",
            "inequivalent",
            "invalid arg",
            "not enabled",
            "unsupported",
            "unknown",
        ]
        .iter()
        .any(|needle| text.contains(needle));
        if !refused {
            return ControlError::Amqp(source);
        }
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
