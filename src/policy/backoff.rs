//! Backoff: *how long to wait* before retry n, and the policy's limits.
//! Whether to retry at all is decided in `decide.rs` only.

use std::time::Duration;

use rand::Rng;

/// The largest `x-delay` the delayed-message exchange accepts (2^32 - 1 ms).
pub const MAX_DELAY: Duration = Duration::from_millis(u32::MAX as u64);
/// Upper bound on `max_attempts`, so a typo cannot keep a message alive forever.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
/// Default `max_attempts`: the first delivery plus 9 retries.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// AWS-style jitter applied to the exponential delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Jitter {
    /// uniform in [0, d]: spreads retries most, may retry at once.
    Full,
    /// d/2 + uniform in [0, d/2]: keeps at least half the delay.
    Equal,
    /// exactly d.
    None,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Backoff {
    /// Retry n waits the n-th entry; past the end the last entry repeats.
    Schedule(Vec<Duration>),
    /// min(max, initial * factor^(n-1)), then jitter.
    Exponential {
        initial: Duration,
        factor: f64,
        max: Duration,
        jitter: Jitter,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Every delivery counts, the first one included.
    pub max_attempts: u32,
    pub backoff: Backoff,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("max attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {0}")]
    MaxAttempts(u64),
    #[error("the schedule is empty")]
    EmptySchedule,
    #[error("the schedule has {0} entries; at most {MAX_ATTEMPTS_LIMIT} are allowed")]
    LongSchedule(usize),
    #[error("delay {0} exceeds the delayed-message limit of 4294967295 ms (~49.7 days)")]
    DelayTooLong(String),
    #[error("the backoff factor must be a finite number >= 1, got {0}")]
    Factor(f64),
    #[error("invalid duration {0:?}: {1}")]
    Duration(String, String),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::Exponential {
                initial: Duration::from_secs(10),
                factor: 2.0,
                max: Duration::from_secs(3600),
                jitter: Jitter::Equal,
            },
        }
    }
}

impl RetryPolicy {
    /// Rejects policies whose delays the delay mechanism cannot carry.
    pub fn validate(&self) -> Result<(), PolicyError> {
        check_max_attempts(self.max_attempts as u64)?;
        match &self.backoff {
            Backoff::Schedule(s) if s.is_empty() => return Err(PolicyError::EmptySchedule),
            Backoff::Schedule(s) if s.len() > MAX_ATTEMPTS_LIMIT as usize => {
                return Err(PolicyError::LongSchedule(s.len()))
            }
            Backoff::Exponential { factor, .. } if !(factor.is_finite() && *factor >= 1.0) => {
                return Err(PolicyError::Factor(*factor))
            }
            _ => {}
        }
        let max = self.max_delay();
        if max > MAX_DELAY {
            return Err(PolicyError::DelayTooLong(
                humantime::format_duration(max).to_string(),
            ));
        }
        Ok(())
    }

    /// The longest delay this policy can produce; also the cap for Retry-After.
    pub fn max_delay(&self) -> Duration {
        match &self.backoff {
            Backoff::Schedule(s) => s.iter().copied().max().unwrap_or_default(),
            Backoff::Exponential { initial, max, .. } => (*initial).max(*max),
        }
    }

    /// The delay before retry `n` (1 = the first retry, after attempt 1).
    pub fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let n = n.max(1);
        match &self.backoff {
            Backoff::Schedule(s) => {
                let i = (n as usize - 1).min(s.len().saturating_sub(1));
                s.get(i).copied().unwrap_or_default()
            }
            Backoff::Exponential {
                initial,
                factor,
                max,
                jitter,
            } => apply_jitter(exponential(*initial, *factor, *max, n), *jitter, rng),
        }
    }
}

pub fn check_max_attempts(n: u64) -> Result<u32, PolicyError> {
    if (1..=MAX_ATTEMPTS_LIMIT as u64).contains(&n) {
        Ok(n as u32)
    } else {
        Err(PolicyError::MaxAttempts(n))
    }
}

/// min(max, initial * factor^(n-1)), computed in f64 so large n saturates
/// at `max` instead of overflowing.
fn exponential(initial: Duration, factor: f64, max: Duration, n: u32) -> Duration {
    let exp = i32::try_from(n - 1).unwrap_or(i32::MAX);
    let secs = initial.as_secs_f64() * factor.powi(exp);
    if !secs.is_finite() || secs >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(secs)
    }
}

fn apply_jitter(d: Duration, jitter: Jitter, rng: &mut impl Rng) -> Duration {
    let ms = d.as_millis() as u64;
    match jitter {
        Jitter::None => d,
        Jitter::Full => Duration::from_millis(rng.random_range(0..=ms)),
        Jitter::Equal => Duration::from_millis(ms / 2 + rng.random_range(0..=ms - ms / 2)),
    }
}

/// Parses one duration such as `15s`, `3m`, `1h30m` or `250ms`.
pub fn parse_duration(s: &str) -> Result<Duration, PolicyError> {
    humantime::parse_duration(s.trim())
        .map_err(|e| PolicyError::Duration(s.to_string(), e.to_string()))
}

/// Parses a schedule list: `15s,15s,30s,3m`.
pub fn parse_schedule(s: &str) -> Result<Vec<Duration>, PolicyError> {
    s.split(',').map(parse_duration).collect()
}

#[cfg(test)]
#[path = "backoff_tests.rs"]
mod tests;
