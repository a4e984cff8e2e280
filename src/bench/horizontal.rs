//! Phase 8, horizontal scaling: the same backlog to a 20 ms receiver
//! drained by 1, 2 and 4 worker processes, in turn, for each pair; the
//! speedups are the medians of the pairs'.

use super::options::Phase;
use super::pairs::{median, Spread};
use super::phases::Bench;
use super::sink::Mode;

/// The process counts, the first the baseline.
const WORKERS: [usize; 3] = [1, 2, 4];

impl Bench {
    pub(super) async fn horizontal(&mut self) -> anyhow::Result<()> {
        let (n, c) = (self.sizes.horizontal_n, self.sizes.horizontal_concurrency);
        let latency = self.sizes.horizontal_latency;
        let p = Phase::Horizontal;
        // rates[i]: the runs with WORKERS[i] processes, pair after pair.
        let mut rates: [Vec<f64>; 3] = Default::default();
        for _ in 0..self.pairs() {
            for (i, workers) in WORKERS.into_iter().enumerate() {
                self.sink.reset(Mode {
                    latency,
                    ..Mode::default()
                });
                let args = Self::concurrency_args(c);
                let drained = self.preload_and_drain("horizontal", n, workers, &args);
                rates[i].push(drained.await?.1.rate());
            }
        }
        for (i, workers) in WORKERS.into_iter().enumerate() {
            let name =
                format!("{workers} process(es) × concurrency {c}, {latency:?} receiver (median)");
            self.push(p, name, median(&rates[i]), "msg/s");
        }
        let speedup = |i: usize| -> Option<Spread> {
            let pairs: Vec<(f64, f64)> = rates[i]
                .iter()
                .copied()
                .zip(rates[0].iter().copied())
                .collect();
            Spread::of_pairs(&pairs)
        };
        self.push_pairs(
            p,
            "speedup, 2 processes",
            speedup(1),
            Some("≥ 1.8"),
            |s| s >= 1.8,
        );
        self.push_pairs(p, "speedup, 4 processes", speedup(2), None, |_| true);
        Ok(())
    }
}
