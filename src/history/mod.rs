//! Delivery history: a record of every attempt, so that "what happened to
//! notification X?" has an answer outside the workers' logs. A room of its
//! own: the worker records through one narrow seam, and the console indexes
//! and queries the `<prefix>.history` stream. This first part is the pure
//! one: the record's shape and what it may keep (`record`), and what a
//! query may ask and what it means (`query`).

pub mod query;
pub mod record;
