//! redeliver: reliable HTTP notification delivery over RabbitMQ.
//!
//! The path of a notification, one module per stage (each imports only
//! the ones before it; see `docs/architecture.md`):
//! [`policy`] (pure: retry or not, how long, the decision) →
//! [`message`] (wire format, retry-state headers, dead-letter records) →
//! [`history`] (the record of each attempt) →
//! [`telemetry`] → [`config`] (settings) → [`topology`] → [`publish`]
//! (confirmed publishing) → [`events`] (operational events) → [`delay`] (plugin, cascade, hold) →
//! [`deliver`] (HTTP) → [`isolation`] (per-endpoint limits) → [`control`]
//! (pause, disable, the shared failing clock) → [`worker`] (consume, one delivery) → [`ops`]
//! (dead letters, status, demo) → `bench` → [`cli`].

mod amqp;
#[doc(hidden)]
pub mod bench;
/// The `redeliver` binary's command line (clap arguments, the config
/// file, one function per subcommand). Public for `main.rs`; embedders use
/// the items re-exported below instead.
pub mod cli;
mod clock;
pub mod config;
pub mod console;
pub mod control;
pub mod delay;
pub mod deliver;
pub mod events;
pub mod history;
pub mod isolation;
pub mod message;
pub mod ops;
pub mod policy;
pub mod publish;
pub mod telemetry;
pub mod topology;
pub mod worker;

// The embedding API: run a worker with your own delivery handler, publish,
// and work with dead letters (`examples/embed.rs` shows it).
pub use config::{AmqpUrl, BrokerSettings, DelayBackend, QueueType, WorkerSettings};
pub use deliver::{DeliveryHandler, HttpDeliverer};
pub use message::dead_letter::{DeadLetter, Filter};
pub use message::Notification;
pub use ops::dlq::{
    replay as replay_dead_letters, walk as walk_dead_letters, Op as DeadLetterOp, ReplayOptions,
    ReplayProgress, Summary as DeadLetterSummary,
};
pub use ops::produce::{publish_all, ProduceError, ProduceOptions};
pub use policy::{AttemptResult, Backoff, Jitter, RetryPolicy};
pub use publish::{prepare, Prepared, PublishError, Publisher};
pub use worker::{run, WorkerError};
