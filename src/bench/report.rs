//! The benchmark's figures: a table for people, JSON for tools.

use std::io::Write;

use super::options::Sizes;

/// One measured figure, and the target it is read against, if any.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Figure {
    pub phase: &'static str,
    pub name: String,
    /// `None` when it could not be measured (e.g. no `/proc`).
    pub value: Option<f64>,
    pub unit: &'static str,
    /// The target, as text (e.g. "≥ 0.70").
    pub target: Option<&'static str>,
    pub met: Option<bool>,
    /// For a ratio of alternating pairs: `value` is their median, and this
    /// its spread (`pairs.rs`).
    pub spread: Option<super::pairs::Spread>,
}

/// The machine the figures come from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: Option<f64>,
    pub os: &'static str,
}

impl Machine {
    pub fn here() -> Machine {
        let memory_gib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            let kb: f64 = m
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(kb / 1024.0 / 1024.0)
        });
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib,
            os: std::env::consts::OS,
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub machine: Machine,
    /// The broker URL, password redacted.
    pub broker: String,
    pub queue_type: &'static str,
    pub sizes: Sizes,
    pub elapsed_s: f64,
    pub figures: Vec<Figure>,
}

impl Report {
    pub fn write_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let m = &self.machine;
        writeln!(
            out,
            "redeliver bench: {} cores, {} memory, {}, broker {} ({} queues), {:.0} s",
            m.cores,
            m.memory_gib
                .map_or("unknown".to_string(), |g| format!("{g:.1} GiB")),
            m.os,
            self.broker,
            self.queue_type,
            self.elapsed_s
        )?;
        writeln!(
            out,
            "{:<18} {:<52} {:>10} {:<6} target",
            "phase", "figure", "value", "unit"
        )?;
        for f in &self.figures {
            let value = f.value.map_or("n/a".to_string(), format_value);
            let target = match (f.target, f.met) {
                (Some(t), Some(true)) => format!("{t} met"),
                (Some(t), Some(false)) => format!("{t} MISSED"),
                (Some(t), None) => t.to_string(),
                _ => String::new(),
            };
            let target = match f.spread {
                Some(s) if s.n > 1 => format!("{target} (median of {}, {})", s.n, s.range()),
                _ => target,
            };
            writeln!(
                out,
                "{:<18} {:<52} {:>10} {:<6} {target}",
                f.phase, f.name, value, f.unit
            )?;
        }
        Ok(())
    }
}

fn format_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// p50, p99 and max of `v` (sorted in place); zeros when empty.
pub fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.50), at(0.99), v[v.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::percentiles;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut v), (50.0, 99.0, 100.0));
        assert_eq!(percentiles(&mut [7.0]), (7.0, 7.0, 7.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0, 0.0));
    }
}
