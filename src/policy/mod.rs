//! The retry policy, pure: no I/O, no AMQP, no clock but the caller's.
//!
//! - [`classify`](classify()): *retry or not*, from what one attempt returned.
//! - [`backoff`](RetryPolicy::delay): *how long to wait* before retry n.
//! - [`decide`](decide()): the one retry decision, from the attempt's result,
//!   the retry state and the effective policy: ack, retry after a delay, or
//!   dead-letter with a reason.
//! - [`breaker`](Breaker) and [`rate`](Pacer): whether an *endpoint* may be
//!   tried now (circuit breaker, `Retry-After` pauses, rate limits), and
//!   [`limit`](Limiter): how many attempts it has earned in flight, and
//!   [`mean`](WindowMean): how long they take; the
//!   per-endpoint state lives in `crate::isolation`.
//! - [`wait`]: whether a deferred delivery waits in the worker or through
//!   the delay backend.
//!
//! The worker carries the decision out; nothing else decides.

mod backoff;
mod breaker;
mod classify;
mod decide;
mod limit;
pub mod mean;
mod rate;
mod signal;
pub mod wait;

pub use backoff::*;
pub use breaker::*;
pub use classify::*;
pub use decide::*;
pub use limit::*;
pub use mean::*;
pub use rate::*;
