//! What operators do with a prefix: dead letters, status, the demo.

pub mod demo;
mod demo_receiver;
pub mod dlq;
pub mod local_node;
pub mod render;
pub mod status;
