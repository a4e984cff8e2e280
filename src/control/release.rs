//! Which pauses ended, so that what they parked can go back to the lanes
//! (`crate::worker`'s unpark): pure, with the time passed in.
//!
//! A pause ends three ways: a record read from the stream lifts it (a
//! resume, or a disable, whose notifications the worker then dead-letters),
//! or its `until` passes, which no record marks.

use super::state::Mode;
use super::table::Table;
use crate::message::target::Target;

/// Targets paused in `before` at `now_ms` that `after` no longer holds
/// paused: nothing covers them, or a disable does. One still covered by a
/// longer pause (a prefix resumed inside a paused origin) stays parked.
pub fn released(before: &Table, after: &Table, now_ms: u64) -> Vec<Target> {
    paused(before, now_ms)
        .filter(|t| !still_paused(after, t, now_ms))
        .cloned()
        .collect()
}

/// Targets whose pause ran out in `(from_ms, to_ms]` and that nothing else
/// holds paused at `to_ms`.
pub fn ended(table: &Table, from_ms: u64, to_ms: u64) -> Vec<Target> {
    table
        .entries()
        .filter(|(_, m)| until(m).is_some_and(|u| from_ms < u && u <= to_ms))
        .map(|(t, _)| t)
        .filter(|t| !still_paused(table, t, to_ms))
        .cloned()
        .collect()
}

/// The first end of a pause after `after_ms`, if any pause has one.
pub fn next_end(table: &Table, after_ms: u64) -> Option<u64> {
    table
        .entries()
        .filter_map(|(_, m)| until(m))
        .filter(|&u| u > after_ms)
        .min()
}

fn paused(table: &Table, now_ms: u64) -> impl Iterator<Item = &Target> {
    table
        .entries()
        .filter(move |(_, m)| matches!(m, Mode::Paused { .. }) && m.in_force(now_ms))
        .map(|(t, _)| t)
}

fn still_paused(table: &Table, t: &Target, now_ms: u64) -> bool {
    matches!(table.covering(t, now_ms), Some((_, Mode::Paused { .. })))
}

fn until(m: &Mode) -> Option<u64> {
    match m {
        Mode::Paused { until_ms, .. } => *until_ms,
        _ => None,
    }
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
