//! redeliver: reliable HTTP notification delivery over RabbitMQ.
//!
//! The path of a notification, one module per stage (each imports only
//! the ones before it; see `docs/architecture.md`):
//! [`policy`] (pure: retry or not, how long, the decision) →
//! [`message`] (wire format, retry-state headers, dead-letter records) →
//! [`telemetry`] → [`config`] (settings) → [`topology`] → [`publish`]
//! (confirmed publishing) → [`delay`] (plugin, cascade, hold) →
//! [`deliver`] (HTTP) → [`worker`] (consume, one delivery) → [`ops`]
//! (dead letters, status, demo) → `bench` → [`cli`].

mod amqp;
pub mod bench;
pub mod cli;
mod clock;
pub mod config;
pub mod delay;
pub mod deliver;
pub mod message;
pub mod ops;
pub mod policy;
pub mod publish;
pub mod telemetry;
pub mod topology;
pub mod worker;

pub use config::{AmqpUrl, BrokerSettings, WorkerSettings};
pub use deliver::{DeliveryHandler, HttpDeliverer};
pub use message::Notification;
pub use policy::AttemptResult;
pub use worker::run;
