//! Publishes one notification with the library, waiting for the broker's
//! confirm: `publish_all` bounds each wait by a confirm timeout and moves
//! to the next node of a URL list on a timeout, a nack or a lost
//! connection, as `redeliver publish` does.
//!
//! ```sh
//! REDELIVER_AMQP_URL=amqp://guest:guest@127.0.0.1:5674/%2f \
//!   cargo run --example publish -- http://127.0.0.1:8080/hook
//! ```

use redeliver::config::DEFAULT_AMQP_URL;
use redeliver::{
    prepare, publish_all, AmqpUrl, BrokerSettings, DelayBackend, ProduceOptions, QueueType,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080/hook".into());
    let url = AmqpUrl::new(
        std::env::var("REDELIVER_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.into()),
    );
    let prefix = std::env::var("REDELIVER_PREFIX").unwrap_or_else(|_| "redeliver".into());
    let broker = BrokerSettings {
        url,
        prefix,
        queue_type: QueueType::Quorum,
        delay: DelayBackend::Plugin,
    };

    let notification = serde_json::json!({
        "v": 1,
        "url": target,
        "body": {"event": "payment.succeeded", "order": "A-1001", "amount": "12.50"},
        "headers": {"X-Tenant": "acme"},
        "schedule": ["15s", "15s", "30s", "3m", "10m"],
    });
    let prepared = prepare(
        &notification.to_string(),
        redeliver::message::DEFAULT_MAX_MESSAGE_BYTES,
    )?;
    // Default options: no delay, a 10 s confirm timeout, 6 tries.
    publish_all(&broker, &[prepared], &ProduceOptions::default(), |id| {
        println!("{id}");
        Ok(())
    })
    .await?;
    Ok(())
}
