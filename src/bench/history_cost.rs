//! What the delivery history costs: phase 3's drains with `--history
//! off`, in the same alternating pairs as the default (history on), so
//! the ratio and the CPU difference are medians of pairs.

use super::e2e::{med, Drain};
use super::options::Phase;
use super::pairs::Spread;
use super::phases::Bench;

impl Bench {
    /// History on ÷ off end to end (target ≥ 0.95), and the worker CPU
    /// per 10,000 deliveries that recording adds (target ≤ 0.05 s).
    pub(super) fn push_history(&mut self, on: &[Drain], off: &[Drain]) {
        let p = Phase::E2e;
        let rates = |d: &[Drain]| d.iter().map(|d| d.rate).collect::<Vec<f64>>();
        let name = "deliveries, --history off (median)";
        self.push(p, name, super::pairs::median(&rates(off)), "msg/s");
        let pairs: Vec<(f64, f64)> = rates(on).into_iter().zip(rates(off)).collect();
        let spread = Spread::of_pairs(&pairs);
        self.push_pairs(p, "history on ÷ off", spread, Some("≥ 0.95"), |r| {
            r >= 0.95
        });
        let worker = |d: &[Drain]| med(d, |d| d.worker_cpu);
        let cpu = added(worker(on), worker(off));
        let name = "worker CPU per 10,000 added by the history (median on − off)";
        self.push_target(p, name, cpu, "s", "≤ 0.05", |s| s <= 0.05);
        let broker = |d: &[Drain]| med(d, |d| d.broker_cpu);
        let name = "broker CPU per 10,000, --history off (local node, median)";
        self.push(p, name, broker(off), "s");
        let name = "broker CPU per 10,000 added by the history (median on − off)";
        self.push(p, name, added(broker(on), broker(off)), "s");
    }
}

/// What history on adds to a median, when both were measured.
fn added(on: Option<f64>, off: Option<f64>) -> Option<f64> {
    Some(on? - off?)
}
