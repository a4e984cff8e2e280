//! Per-endpoint rate limits, pure: a [`Rate`] ("50/s", "600/min") and the
//! [`Pacer`] that spaces attempts by it. The caller passes the clock in.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::backoff::parse_duration;

/// At most `n` attempts per `per`. The [`Pacer`] spaces them evenly
/// (`per / n` apart, no burst), so no window of length `per` ever holds
/// more than `n`: a limit that never overshoots, unlike a token bucket
/// that lets a full bucket out at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub n: u32,
    pub per: Duration,
}

impl Rate {
    /// The spacing between two attempts, rounded up to the nanosecond so
    /// that `n` of them never fit in less than `per`.
    pub fn interval(&self) -> Duration {
        let ns = self.per.as_nanos().div_ceil(u128::from(self.n));
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid rate {0:?}: {1} (expected N/s, N/min, N/h or N/<duration>, e.g. 50/s)")]
pub struct BadRate(pub String, pub &'static str);

impl FromStr for Rate {
    type Err = BadRate;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadRate(s.to_string(), why);
        let (n, per) = s.trim().split_once('/').ok_or_else(|| bad("no `/`"))?;
        let n: u32 = n
            .trim()
            .parse()
            .map_err(|_| bad("N is not a whole number"))?;
        if n == 0 {
            return Err(bad("N must be at least 1"));
        }
        let per = match per.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            other => parse_duration(other).map_err(|_| bad("unknown interval"))?,
        };
        if per.is_zero() || per > Duration::from_secs(86_400) {
            return Err(bad("the interval must be between 1 ms and 24 h"));
        }
        Ok(Rate { n, per })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per.as_secs() {
            1 if self.per.subsec_nanos() == 0 => write!(f, "{}/s", self.n),
            60 if self.per.subsec_nanos() == 0 => write!(f, "{}/min", self.n),
            3600 if self.per.subsec_nanos() == 0 => write!(f, "{}/h", self.n),
            _ => write!(f, "{}/{}", self.n, humantime::format_duration(self.per)),
        }
    }
}

/// The earliest time the next attempt may start (GCRA's "theoretical
/// arrival time" with no burst tolerance).
#[derive(Clone, Copy, Debug, Default)]
pub struct Pacer {
    next: Option<Instant>,
}

impl Pacer {
    /// How long an attempt starting now would have to wait for its turn.
    pub fn wait(&self, now: Instant) -> Duration {
        self.next
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Takes the next turn: returns how long to wait for it (zero: go now),
    /// and moves the following turn one interval later.
    pub fn reserve(&mut self, now: Instant, rate: Rate) -> Duration {
        let turn = self.next.map_or(now, |t| t.max(now));
        self.next = Some(turn + rate.interval());
        turn - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print() {
        let r: Rate = "50/s".parse().unwrap();
        assert_eq!(r.interval(), Duration::from_millis(20));
        assert_eq!(r.to_string(), "50/s");
        let m: Rate = "600/min".parse().unwrap();
        assert_eq!(m.interval(), Duration::from_millis(100));
        assert_eq!(m.to_string(), "600/min");
        let d: Rate = "5/500ms".parse().unwrap();
        assert_eq!(d.interval(), Duration::from_millis(100));
        assert_eq!("2 / h".parse::<Rate>().unwrap().to_string(), "2/h");
        for bad in ["50", "0/s", "x/s", "5/fortnight", "5/0s", "-1/s", "5/2d"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn the_pacer_spaces_turns_evenly_and_never_bursts() {
        let rate: Rate = "10/s".parse().unwrap();
        let (t0, mut p) = (Instant::now(), Pacer::default());
        assert_eq!(p.reserve(t0, rate), Duration::ZERO);
        // Three more at the same instant queue up 100 ms apart.
        let waits: Vec<_> = (0..3).map(|_| p.reserve(t0, rate)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(waits, [ms(100), ms(200), ms(300)]);
        assert_eq!(p.wait(t0 + ms(150)), ms(250));
        // After a long idle time the next turn is at once, with no credit
        // saved up: the one after it is still a full interval later.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve(later, rate), Duration::ZERO);
        assert_eq!(p.reserve(later, rate), ms(100));
    }

    #[test]
    fn no_window_of_one_interval_holds_more_than_n() {
        let rate: Rate = "7/s".parse().unwrap();
        let (t0, mut p) = (Instant::now(), Pacer::default());
        let starts: Vec<_> = (0..50).map(|_| t0 + p.reserve(t0, rate)).collect();
        for (i, s) in starts.iter().enumerate() {
            let within = starts[i..].iter().filter(|t| **t < *s + rate.per).count();
            assert!(within <= 7, "{within} turns within 1 s of turn {i}");
        }
    }
}
