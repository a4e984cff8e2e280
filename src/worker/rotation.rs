//! When the feed replaces a lane's consumer (`feed.rs`), pure: the time
//! is passed in.

use std::time::{Duration, Instant};

/// A lane rotates for a wait in the worker at most this often: a lane
/// where most deliveries wait (a paused endpoint's) would otherwise open a
/// channel for each, and gains nothing, its acks going out of order
/// anyway. So a bad lane keeps at most about ten consumers alive (a
/// delivery waits 10 s at most, `crate::policy::wait`).
const WAIT_EVERY: Duration = Duration::from_secs(1);

/// Why a lane's consumer is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// It holds half its room in settling originals.
    Full,
    /// A delivery began to wait in the worker on it (spaced by
    /// [`WAIT_EVERY`]: the caller stamps the time).
    Wait,
}

/// The lane to rotate and why (pure): the first whose consumer holds
/// `threshold` or more, else the first whose consumer had a delivery wait
/// in the worker (`lanes[k]`: held, waited) and no rotation for a wait
/// within [`WAIT_EVERY`] (`wait_rotated[k]`).
pub(super) fn pick(
    lanes: &[(usize, bool)],
    wait_rotated: &[Option<Instant>],
    threshold: usize,
    now: Instant,
) -> Option<(usize, Why)> {
    if let Some(k) = lanes.iter().position(|&(held, _)| held >= threshold) {
        return Some((k, Why::Full));
    }
    let spaced = |k: usize| {
        let last = wait_rotated.get(k).copied().flatten();
        last.is_none_or(|at| now.saturating_duration_since(at) >= WAIT_EVERY)
    };
    let k = (0..lanes.len()).find(|&k| lanes[k].1 && spaced(k))?;
    Some((k, Why::Wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_lane_rotates_first_and_a_wait_at_most_once_a_second() {
        let now = Instant::now();
        let never = [None, None];
        // Nothing held: nothing to do.
        assert_eq!(pick(&[(0, false), (0, false)], &never, 128, now), None);
        // Half the room held in lane 1 goes before a wait in lane 0.
        let full = Some((1, Why::Full));
        assert_eq!(pick(&[(1, true), (128, false)], &never, 128, now), full);
        // A wait rotates its lane at once...
        let wait = Some((1, Why::Wait));
        assert_eq!(pick(&[(0, false), (1, true)], &never, 128, now), wait);
        // ...but not again within WAIT_EVERY; then again.
        let just = [None, Some(now)];
        assert_eq!(pick(&[(0, false), (1, true)], &just, 128, now), None);
        let later = now + WAIT_EVERY;
        assert_eq!(pick(&[(0, false), (1, true)], &just, 128, later), wait);
        // Many held without a wait (settling originals) wait for the threshold.
        assert_eq!(pick(&[(127, false)], &[None], 128, now), None);
    }
}
