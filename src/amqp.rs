//! AMQP option helpers shared by the layers that settle deliveries (the
//! worker, the holder, the DLQ walk). A leaf: it imports nothing of the crate.

use lapin::options::BasicNackOptions;

/// A nack that returns the delivery to its queue, to be delivered again
/// (to this or another consumer).
pub fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        ..Default::default()
    }
}
