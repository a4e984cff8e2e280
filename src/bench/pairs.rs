//! Ratios that repeat. On a shared 2-core machine one run of A against
//! one run of B moves by ±15–25%, so every "A ÷ B" figure comes from
//! alternating A/B pairs (A, B, A, B, …: a slow minute hits both sides),
//! and is read as the median of the pairs' ratios, with the smallest and
//! largest beside it. Targets are judged on the median.

/// Alternating pairs per ratio: 3, or 1 with `--quick`.
pub fn pairs(quick: bool) -> usize {
    match quick {
        true => 1,
        false => 3,
    }
}

/// The pairs' ratios, summarised.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// How many pairs.
    pub n: usize,
}

impl Spread {
    /// The median (of an even count, the mean of the middle two), min and
    /// max of `samples`, ignoring any that is not a finite number; `None`
    /// when none is.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        let mut s: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let mid = s.len() / 2;
        let median = match s.len() % 2 {
            1 => s[mid],
            _ => (s[mid - 1] + s[mid]) / 2.0,
        };
        Some(Spread {
            median,
            min: s[0],
            max: s[s.len() - 1],
            n: s.len(),
        })
    }

    /// The ratio of each pair `(a, b)`: `a / b`.
    pub fn of_pairs(pairs: &[(f64, f64)]) -> Option<Spread> {
        let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
        Spread::of(&ratios)
    }

    /// `0.91–1.04` for the table.
    pub fn range(&self) -> String {
        format!("{:.2}–{:.2}", self.min, self.max)
    }
}

/// The median of `samples` (see [`Spread::of`]).
pub fn median(samples: &[f64]) -> Option<f64> {
    Spread::of(samples).map(|s| s.median)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_odd_count_has_its_middle_sample_as_median() {
        let s = Spread::of(&[0.9, 0.48, 0.88]).unwrap();
        assert_eq!(
            s,
            Spread {
                median: 0.88,
                min: 0.48,
                max: 0.9,
                n: 3
            }
        );
        assert_eq!(s.range(), "0.48–0.90");
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_middle_two() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
    }

    #[test]
    fn pairs_are_divided_then_summarised() {
        let s = Spread::of_pairs(&[(9.0, 10.0), (12.0, 10.0), (5.0, 10.0)]).unwrap();
        assert_eq!((s.median, s.min, s.max), (0.9, 0.5, 1.2));
    }

    #[test]
    fn what_is_not_a_number_is_left_out() {
        let s = Spread::of_pairs(&[(1.0, 0.0), (f64::NAN, 1.0), (2.0, 4.0)]).unwrap();
        assert_eq!((s.median, s.n), (0.5, 1));
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn quick_runs_one_pair_and_a_full_run_three() {
        assert_eq!(pairs(true), 1);
        assert_eq!(pairs(false), 3);
    }
}
