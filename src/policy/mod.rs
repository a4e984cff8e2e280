//! The retry policy, pure: no I/O, no AMQP, no clock but the caller's.
//!
//! - [`classify`](classify()): *retry or not*, from what one attempt returned.
//! - [`backoff`](RetryPolicy::delay): *how long to wait* before retry n.
//! - [`decide`](decide()): the one retry decision, from the attempt's result,
//!   the retry state and the effective policy: ack, retry after a delay, or
//!   dead-letter with a reason.
//!
//! The worker carries the decision out; nothing else decides.

mod backoff;
mod classify;
mod decide;

pub use backoff::*;
pub use classify::*;
pub use decide::*;
