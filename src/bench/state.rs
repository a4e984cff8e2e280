//! Phase 15, endpoint state: what the shared endpoint state costs a
//! delivery (`crate::control`). End to end on the default flags, with no
//! target paused, next to end to end with 1,000 other endpoints paused
//! (each delivery then asks the table of what is in force), in pairs on
//! fresh prefixes, each kind first in turn, 100,000 notifications a drain;
//! the target is the median of the pairs' ratios.

use super::load;
use super::options::Phase;
use super::phases::Bench;
use super::sink::Mode;
use crate::control::record::{Change, Record};
use crate::control::stream;
use crate::message::target::Target;
use crate::topology::Topology;

/// Paused endpoints beside the one delivered to.
const PAUSED: usize = 1_000;
/// Alternating pairs in a full run.
const PAIRS: usize = 5;
/// Notifications per drain in a full run, at least.
const MIN_N: usize = 100_000;

impl Bench {
    pub(super) async fn endpoint_state(&mut self) -> anyhow::Result<()> {
        let c = self.sizes.concurrency;
        // Drains of a few seconds: at the default n one lasts about one,
        // and a single hiccup moves its rate by several percent.
        let (n, pairs) = match self.opts.quick {
            true => (self.sizes.n, 1),
            false => (self.sizes.n.max(MIN_N), PAIRS),
        };
        let args = Self::concurrency_args(c);
        let (mut none, mut paused, mut ratios) = (vec![], vec![], vec![]);
        for i in 0..pairs {
            // Each kind goes first in turn, so order costs neither.
            let order = if i % 2 == 0 { [0, PAUSED] } else { [PAUSED, 0] };
            let mut rates = [0.0; 2];
            for (slot, k) in rates.iter_mut().zip(order) {
                *slot = self.drain_beside_paused(n, &args, k).await?;
            }
            let (a, b) = if i % 2 == 0 {
                (rates[0], rates[1])
            } else {
                (rates[1], rates[0])
            };
            none.push(a);
            paused.push(b);
            ratios.push(b / a);
        }
        let p = Phase::EndpointState;
        self.push(
            p,
            "deliveries, nothing paused (median)",
            Some(median(&none)),
            "msg/s",
        );
        let name = format!("deliveries, {PAUSED} other endpoints paused (median)");
        self.push(p, name, Some(median(&paused)), "msg/s");
        let name = format!("{PAUSED} paused ÷ none (pairs, each first in turn)");
        let spread = super::pairs::Spread::of(&ratios);
        self.push_pairs(p, name, spread, Some("≥ 0.97"), |r| r >= 0.97);
        Ok(())
    }

    /// Drains `n` notifications with one worker on a fresh prefix whose
    /// state has `paused` other endpoints paused first; the rate.
    async fn drain_beside_paused(
        &self,
        n: usize,
        args: &[String],
        paused: usize,
    ) -> anyhow::Result<f64> {
        self.sink.reset(Mode::default());
        let prefix = self.prefix("state");
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let drained = async {
            load::preload(&self.conn, &self.opts.broker, &prefix, items).await?;
            pause_others(&self.conn, &prefix, paused).await?;
            self.drain_with(&prefix, 1, args, n).await
        }
        .await;
        load::remove(&self.conn, &prefix).await;
        drained?;
        Ok(self.sink.seen().rate())
    }
}

/// Pauses `n` endpoints on hosts the sink is not, as `endpoint pause` would.
async fn pause_others(conn: &lapin::Connection, prefix: &str, n: usize) -> anyhow::Result<()> {
    let t = Topology::new(prefix);
    stream::declare(conn, &t.endpoint_state).await?;
    let writer = stream::Writer::open(conn, &t.endpoint_state).await?;
    for i in 0..n {
        let target = Target::parse(&format!("https://paused-{i}.bench.invalid"))?;
        let change = Change::Pause {
            target,
            reason: Some("bench".into()),
            until_ms: None,
        };
        writer
            .append(&Record::new(now_ms(), "bench", change))
            .await?;
    }
    writer.close().await;
    Ok(())
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}
