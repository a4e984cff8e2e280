//! What operators do with a prefix: dead letters, endpoints, status, the demo.

pub(crate) mod demo;
mod demo_receiver;
pub mod dlq;
pub mod endpoints;
pub mod events_status;
pub(crate) mod local_cluster;
pub(crate) mod local_node;

pub use local_node::test_rabbitmq;
pub mod management;
pub mod produce;
pub(crate) mod render;
pub mod status;
mod status_probe;
