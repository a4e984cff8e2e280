//! redeliver: reliable HTTP notification delivery over RabbitMQ.
//!
//! The path of a notification, one module per stage:
//! [`publish`] → [`topology`] → [`worker`] (consume, bounded concurrency) →
//! [`process`] (one delivery's stages) → [`deliver`] (HTTP) →
//! [`outcome`] (retry or not) → [`retry`] (the decision) with
//! [`policy`] (how long to wait) → [`delay`] (how the wait is done:
//! the plugin, or the [`cascade`] with its [`hold`]er for short delays).

pub mod admin;
pub mod app;
pub mod bench;
pub mod cascade;
pub mod cli;
pub mod config;
pub mod config_cmd;
pub mod config_file;
pub mod config_route;
pub mod dead_letter;
pub mod delay;
pub mod deliver;
pub mod demo;
pub mod demo_receiver;
pub mod dlq;
pub mod guard;
pub mod hold;
pub mod message;
pub mod ops;
pub mod outcome;
pub mod policy;
pub mod process;
pub mod publish;
pub mod retry;
pub mod routes;
pub mod signing;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod topology;
pub mod worker;

pub use config::{AmqpUrl, BrokerSettings, WorkerSettings};
pub use deliver::{DeliveryHandler, HttpDeliverer};
pub use message::Notification;
pub use outcome::AttemptResult;
pub use worker::run;
