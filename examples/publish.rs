//! Publishes one notification with the library, waiting for the broker's
//! confirm.
//!
//! ```sh
//! REDELIVER_AMQP_URL=amqp://guest:guest@127.0.0.1:5674/%2f \
//!   cargo run --example publish -- http://127.0.0.1:8080/hook
//! ```

use std::time::Duration;

use anyhow::Context;
use redeliver::config::DEFAULT_AMQP_URL;
use redeliver::{prepare, AmqpUrl, BrokerSettings, DelayBackend, Publisher, QueueType};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080/hook".into());
    let url = AmqpUrl::new(
        std::env::var("REDELIVER_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.into()),
    );
    let prefix = std::env::var("REDELIVER_PREFIX").unwrap_or_else(|_| "redeliver".into());

    let conn = url
        .connect("publish example")
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let broker = BrokerSettings {
        url: url.clone(),
        prefix,
        queue_type: QueueType::Quorum,
        delay: DelayBackend::Plugin,
    };
    let topology = redeliver::delay::declare_topology(&broker, &conn).await?;
    let publisher = Publisher::new(
        &conn,
        topology,
        DelayBackend::Plugin,
        Duration::from_secs(30),
    )
    .await?;

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
    publisher.publish_new(&prepared, None).await?;
    println!("{}", prepared.id);
    conn.close(200, "done".into()).await?;
    Ok(())
}
