//! Phase 15, endpoint state: what the shared endpoint state costs a
//! delivery (`crate::control`). End to end on the default flags, with no
//! target paused, next to end to end with 1,000 other endpoints paused
//! (each delivery then asks the table of what is in force) and one
//! notification to each of them in the backlog (parked as it comes:
//! `crate::worker`'s parking), in pairs on fresh prefixes, each kind
//! first in turn, 100,000 notifications a drain; the target is the median
//! of the pairs' ratios. Broker CPU and single ack frames per 10,000
//! deliveries, and the parked count, are read for each kind.

use super::load::{self, Item};
use super::noisy::Cost;
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
        // Drains of a few seconds: at the default n one lasts about one,
        // and a single hiccup moves its rate by several percent.
        let (n, pairs) = match self.opts.quick {
            true => (self.sizes.n, 1),
            false => (self.sizes.n.max(MIN_N), PAIRS),
        };
        let (mut none, mut paused, mut ratios) = (vec![], vec![], vec![]);
        let mut costs: [Vec<Cost>; 2] = [vec![], vec![]];
        for i in 0..pairs {
            // Each kind goes first in turn, so order costs neither.
            let order = if i % 2 == 0 { [0, PAUSED] } else { [PAUSED, 0] };
            let mut rates = [0.0; 2];
            for (slot, k) in rates.iter_mut().zip(order) {
                let (rate, cost) = self.drain_beside_paused(n, k).await?;
                costs[usize::from(k > 0)].push(cost);
                *slot = rate;
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
        self.push_state_costs(n, &costs);
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

    /// Medians per kind (none, paused) of the broker CPU and single ack
    /// frames per 10,000 deliveries, and of the parked count.
    fn push_state_costs(&mut self, n: usize, costs: &[Vec<Cost>; 2]) {
        let p = Phase::EndpointState;
        let per_10k = 10_000.0 / n.max(1) as f64;
        for (kind, runs) in ["nothing paused", "1,000 paused"].iter().zip(costs) {
            let m = |f: fn(&Cost) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            let name = format!("{kind}: broker CPU per 10,000 deliveries");
            let broker = Some(m(|c| c.broker_cpu_s) * per_10k).filter(|s| *s > 0.0);
            self.push(p, name, broker, "s");
            let name = format!("{kind}: single ack frames per 10,000 deliveries");
            self.push(p, name, Some(m(|c| c.single_acks) * per_10k), "n");
            let name = format!("{kind}: parked at the end");
            self.push(p, name, Some(m(|c| c.parked)), "n");
        }
    }

    /// Drains `n` notifications with one worker on a fresh prefix whose
    /// state has `paused` other endpoints paused first, with one
    /// notification to each of those spread through the backlog; the
    /// rate of the `n`, and what the drain cost.
    async fn drain_beside_paused(&self, n: usize, paused: usize) -> anyhow::Result<(f64, Cost)> {
        self.sink.reset(Mode::default());
        let prefix = self.prefix("state");
        let healthy = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let every = (n / paused.max(1)).max(1);
        let items = healthy.enumerate().flat_map(move |(i, item)| {
            let k = i / every;
            let to_paused = (i % every == every - 1 && k < paused).then(|| Item {
                json: format!(r#"{{"url":"{}/","body":{{}}}}"#, paused_url(k)),
                delay: None,
            });
            std::iter::once(item).chain(to_paused)
        });
        let drained = async {
            load::preload(&self.conn, &self.opts.broker, &prefix, items).await?;
            pause_others(&self.conn, &prefix, paused).await?;
            self.drain_and_count(&prefix, n, None, &[]).await
        }
        .await;
        load::remove(&self.conn, &prefix).await;
        let (_, cost) = drained?;
        Ok((self.sink.seen().rate(), cost))
    }
}

/// Paused endpoint `i`: a host the sink is not.
fn paused_url(i: usize) -> String {
    format!("https://paused-{i}.bench.invalid")
}

/// Pauses `n` endpoints on hosts the sink is not, as `endpoint pause` would.
async fn pause_others(conn: &lapin::Connection, prefix: &str, n: usize) -> anyhow::Result<()> {
    let t = Topology::new(prefix);
    stream::declare(conn, &t.endpoint_state).await?;
    let writer = stream::Writer::open(conn, &t.endpoint_state).await?;
    for i in 0..n {
        let target = Target::parse(&paused_url(i))?;
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
