//! When the feed replaces a lane's consumer (`feed.rs`), pure: the time
//! is passed in.

use std::time::{Duration, Instant};

/// A lane rotates for a wait in the worker at most this often: a lane
/// where most deliveries wait (a paused endpoint's) would otherwise open a
/// channel for each, and gains nothing, its acks going out of order
/// anyway. So a bad lane keeps at most about ten consumers alive (a
/// delivery waits 10 s at most, `crate::policy::wait`).
const WAIT_EVERY: Duration = Duration::from_secs(1);

/// The lane to rotate (pure): the first whose consumer holds `threshold`
/// or more, else the first whose consumer had a delivery wait in the
/// worker (`lanes[k]`: held, waited) and no rotation for a wait within
/// [`WAIT_EVERY`] (`wait_rotated[k]`).
pub(super) fn pick(
    lanes: &[(usize, bool)],
    wait_rotated: &[Option<Instant>],
    threshold: usize,
    now: Instant,
) -> Option<usize> {
    let full = lanes.iter().position(|&(held, _)| held >= threshold);
    full.or_else(|| {
        let spaced = |k: usize| {
            let last = wait_rotated.get(k).copied().flatten();
            last.is_none_or(|at| now.saturating_duration_since(at) >= WAIT_EVERY)
        };
        (0..lanes.len()).find(|&k| lanes[k].1 && spaced(k))
    })
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
        assert_eq!(pick(&[(1, true), (128, false)], &never, 128, now), Some(1));
        // A wait rotates its lane at once...
        assert_eq!(pick(&[(0, false), (1, true)], &never, 128, now), Some(1));
        // ...but not again within WAIT_EVERY; then again.
        let just = [None, Some(now)];
        assert_eq!(pick(&[(0, false), (1, true)], &just, 128, now), None);
        let later = now + WAIT_EVERY;
        assert_eq!(pick(&[(0, false), (1, true)], &just, 128, later), Some(1));
        // Many held without a wait (settling originals) wait for the threshold.
        assert_eq!(pick(&[(127, false)], &[None], 128, now), None);
    }
}
