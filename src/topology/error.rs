//! Why a declare failed, in sentences an operator can act on.

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "the broker has no `x-delayed-message` exchange type: enable the \
         rabbitmq_delayed_message_exchange plugin \
         (`rabbitmq-plugins enable rabbitmq_delayed_message_exchange`), \
         or use the plugin-free `--delay-backend cascade`; for development, \
         `tests/broker/ctl up` starts a local broker with it"
    )]
    DelayedExchangeMissing,
    #[error("{what} {name:?} exists with different settings ({detail}); delete it or use another --prefix")]
    Mismatch {
        what: &'static str,
        name: String,
        detail: String,
    },
    #[error("declaring {what} {name:?} failed: {source}")]
    Amqp {
        what: &'static str,
        name: String,
        source: lapin::Error,
    },
}

impl TopologyError {
    /// Whether the broker refused a declare for a moment only: RabbitMQ
    /// answers `NOT_FOUND - home node '...' of durable queue '...' is down
    /// or inaccessible` when a durable queue's record exists but its
    /// process does not run yet, as while another connection is creating
    /// that quorum queue (a fleet starting at once, each worker declaring
    /// the cascade's 121 queues); 4.3.6 did so on a single node. Declared
    /// again, the queue is found running.
    pub fn is_transient(&self) -> bool {
        match self {
            TopologyError::Amqp { source, .. } => match source.kind() {
                lapin::ErrorKind::ProtocolError(amqp) => {
                    refused_for_now(&amqp.get_message().to_string())
                }
                _ => false,
            },
            _ => false,
        }
    }
}

/// The broker's text for a queue whose process is not running (yet).
fn refused_for_now(text: &str) -> bool {
    text.contains("NOT_FOUND") && text.contains("is down or inaccessible")
}

/// Turns the broker's refusals into sentences an operator can act on.
pub(crate) fn classify(what: &'static str, name: &str, e: lapin::Error) -> TopologyError {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        let text = amqp.get_message().as_str().to_string();
        if text.contains("x-delayed-message")
            && (text.contains("unknown exchange type") || text.contains("invalid"))
        {
            return TopologyError::DelayedExchangeMissing;
        }
        if text.contains("PRECONDITION_FAILED") || text.contains("inequivalent") {
            return TopologyError::Mismatch {
                what,
                name: name.to_string(),
                detail: text,
            };
        }
    }
    TopologyError::Amqp {
        what,
        name: name.to_string(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::refused_for_now;

    #[test]
    fn a_queue_not_running_yet_is_declared_again_and_nothing_else_is() {
        let home = "NOT_FOUND - home node 'rabbit@h' of durable queue 'p.cascade.1.12' \
                    in vhost '/' is down or inaccessible";
        assert!(refused_for_now(home));
        assert!(!refused_for_now(
            "NOT_FOUND - no exchange 'p.retry' in vhost '/'"
        ));
        assert!(!refused_for_now(
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'"
        ));
    }
}
