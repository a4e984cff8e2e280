//! The mean of an endpoint's recent attempt durations, over a window of
//! samples. A flaky receiver's rare hangs dominate its mean: an average
//! that moves a tenth per sample jumps threefold on a burst of four
//! timeouts, and a queue estimate built on it defers deliveries that would
//! have gone within the second. A window of [`WINDOW`] samples holds a few
//! hangs in proportion.

use std::collections::VecDeque;
use std::time::Duration;

/// Samples in the window.
pub const WINDOW: usize = 64;
/// Samples before the mean is [`WindowMean::settled`]: one hang among the
/// first answers (a flaky endpoint's 5%) would otherwise read as "every
/// attempt takes the timeout".
pub const SETTLED: usize = 16;

/// The mean of the last [`WINDOW`] durations.
#[derive(Debug, Default)]
pub struct WindowMean {
    samples: VecDeque<Duration>,
    sum: Duration,
}

impl WindowMean {
    pub fn add(&mut self, took: Duration) {
        if self.samples.len() == WINDOW {
            if let Some(old) = self.samples.pop_front() {
                self.sum = self.sum.saturating_sub(old);
            }
        }
        self.samples.push_back(took);
        self.sum = self.sum.saturating_add(took);
    }

    /// `None` before the first sample.
    pub fn get(&self) -> Option<Duration> {
        let n = u32::try_from(self.samples.len()).ok().filter(|n| *n > 0)?;
        Some(self.sum / n)
    }

    /// The shortest duration in the window; `None` before the first. A
    /// floor from a few samples: a rare hang among them does not raise it,
    /// and a slow cold start (a connection set up) falls out of it at the
    /// next quick answer.
    pub fn min(&self) -> Option<Duration> {
        self.samples.iter().min().copied()
    }

    /// The mean once it holds [`SETTLED`] samples, for estimates a
    /// decision rests on; `None` before.
    pub fn settled(&self) -> Option<Duration> {
        (self.samples.len() >= SETTLED)
            .then(|| self.get())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_hangs_count_in_proportion_and_old_samples_leave() {
        let ms = Duration::from_millis;
        let mut m = WindowMean::default();
        assert_eq!(m.get(), None);
        for i in 0..WINDOW {
            m.add(if i % 16 == 0 { ms(1_000) } else { ms(4) });
        }
        // 4 hangs of 64: (4 x 1000 + 60 x 4) / 64 = 66.25 ms.
        assert_eq!(m.get(), Some(Duration::from_micros(66_250)));
        for _ in 0..WINDOW {
            m.add(ms(10));
        }
        assert_eq!(m.get(), Some(ms(10)));
    }

    #[test]
    fn a_first_hang_alone_is_not_a_settled_mean() {
        let ms = Duration::from_millis;
        let mut m = WindowMean::default();
        m.add(ms(1_000));
        assert_eq!((m.get(), m.settled()), (Some(ms(1_000)), None));
        for _ in 1..SETTLED {
            m.add(ms(4));
        }
        // (1000 + 15 x 4) / 16 = 66.25 ms.
        assert_eq!(m.settled(), Some(Duration::from_micros(66_250)));
    }

    #[test]
    fn the_floor_is_the_quickest_answer_so_far() {
        let ms = Duration::from_millis;
        let mut m = WindowMean::default();
        assert_eq!(m.min(), None);
        m.add(ms(80));
        assert_eq!(m.min(), Some(ms(80)));
        m.add(ms(1_000));
        m.add(ms(2));
        assert_eq!(m.min(), Some(ms(2)));
    }
}
