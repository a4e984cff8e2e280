//! Phase 16, operational events: what they cost deliveries, for a
//! receiver that fails 30% of first attempts (at random; every retry
//! succeeds). One worker, fresh prefixes, 50,000 notifications a drain,
//! alternating pairs (each kind first in turn); each ratio is the median
//! of the pairs'.
//!
//! - The target: the default flags with a queue bound to every event
//!   (`#`), as an operator's would be, next to nothing bound. On the
//!   defaults (`--failing-after 4`) this receiver's notifications make no
//!   event: what is measured is the events' machinery on every outcome.
//! - The worst case, without a target: `--failing-after 1`, so each
//!   failure publishes `notification.failing` and its retry's success
//!   `notification.recovered` (0.6 events per notification), routed to
//!   the bound queue, next to `--failing-after 0` and nothing bound. Each
//!   event is one more persistent, confirmed message for the broker.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::load;
use super::options::Phase;
use super::phases::Bench;
use super::sink::Mode;
use super::state::median;
use crate::topology::Topology;

/// Alternating pairs in a full run.
const PAIRS: usize = 5;
/// Notifications per drain in a full run, at least: a drain of a few
/// seconds, so one hiccup moves its rate less.
const MIN_N: usize = 50_000;
/// Retries come back at once, so the drain measures the worker, not the
/// schedule.
const ARGS: [&str; 2] = ["--schedule", "100ms"];

/// What one drain runs with.
#[derive(Clone, Copy)]
struct Variant {
    /// `--failing-after`; `None`: the default.
    failing_after: Option<&'static str>,
    /// A queue bound to every event.
    bound: bool,
}

const OFF: Variant = Variant {
    failing_after: None,
    bound: false,
};
const ON: Variant = Variant {
    failing_after: None,
    bound: true,
};
const NONE: Variant = Variant {
    failing_after: Some("0"),
    bound: false,
};
const EVERY: Variant = Variant {
    failing_after: Some("1"),
    bound: true,
};

impl Bench {
    pub(super) async fn events(&mut self) -> anyhow::Result<()> {
        let pairs = if self.opts.quick { 1 } else { PAIRS };
        let p = Phase::Events;
        let (off, on, ratio) = self.events_pairs(pairs, OFF, ON).await?;
        self.push(
            p,
            "deliveries, default flags, nothing bound (median)",
            Some(off),
            "msg/s",
        );
        self.push(
            p,
            "deliveries, default flags, a queue bound to # (median)",
            Some(on),
            "msg/s",
        );
        let name = format!("bound ÷ nothing bound (median of {pairs} pairs, each first in turn)");
        self.push_target(p, name, Some(ratio), "x", "≥ 0.95", |r| r >= 0.95);
        let (none, every, ratio) = self.events_pairs(pairs, NONE, EVERY).await?;
        self.push(
            p,
            "deliveries, --failing-after 0 (no event at all)",
            Some(none),
            "msg/s",
        );
        let name = "deliveries, --failing-after 1: 0.6 events a notification, bound";
        self.push(p, name, Some(every), "msg/s");
        let name = format!("every failure an event ÷ none (median of {pairs} pairs; no target)");
        self.push(p, name, Some(ratio), "x");
        Ok(())
    }

    /// `pairs` alternating drains of `a` and `b`: their median rates and
    /// the median of the pairs' `b ÷ a`.
    async fn events_pairs(
        &self,
        pairs: usize,
        a: Variant,
        b: Variant,
    ) -> anyhow::Result<(f64, f64, f64)> {
        let (mut ra, mut rb, mut ratios) = (vec![], vec![], vec![]);
        for i in 0..pairs {
            let order = if i % 2 == 0 { [a, b] } else { [b, a] };
            let first = self.events_drain(order[0]).await?;
            let second = self.events_drain(order[1]).await?;
            let (x, y) = if i % 2 == 0 {
                (first, second)
            } else {
                (second, first)
            };
            ra.push(x);
            rb.push(y);
            ratios.push(y / x);
        }
        Ok((median(&ra), median(&rb), median(&ratios)))
    }

    /// Drains the phase's notifications with one worker on a fresh prefix;
    /// the rate.
    async fn events_drain(&self, v: Variant) -> anyhow::Result<f64> {
        let n = match self.opts.quick {
            true => self.sizes.n,
            false => self.sizes.n.max(MIN_N),
        };
        self.sink.reset(Mode {
            flaky_first: true,
            ..Mode::default()
        });
        let prefix = self.prefix("events");
        let mut args = Self::concurrency_args(self.sizes.concurrency);
        args.extend(ARGS.iter().map(|a| a.to_string()));
        if let Some(f) = v.failing_after {
            args.extend(["--failing-after".to_string(), f.to_string()]);
        }
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let t = Topology::new(&prefix);
        let bound = format!("{prefix}.bench-events");
        let drained = async {
            load::preload(&self.conn, &self.opts.broker, &prefix, items).await?;
            if v.bound {
                bind_all(&self.conn, &t, &bound).await?;
            }
            self.drain_with(&prefix, 1, &args, n).await
        }
        .await;
        load::remove(&self.conn, &prefix).await;
        if let Ok(ch) = self.conn.create_channel().await {
            let _ = ch
                .queue_delete(bound.as_str().into(), Default::default())
                .await;
            let _ = ch.close(200, "".into()).await;
        }
        drained?;
        Ok(self.sink.seen().rate())
    }
}

/// A durable queue bound to every event, as a user's would be.
async fn bind_all(conn: &lapin::Connection, t: &Topology, queue: &str) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let (x, topic) = (t.events.as_str(), lapin::ExchangeKind::Topic);
    ch.exchange_declare(x.into(), topic, durable, FieldTable::default())
        .await?;
    let q = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), q, FieldTable::default())
        .await?;
    let (key, opts) = ("#", QueueBindOptions::default());
    ch.queue_bind(
        queue.into(),
        x.into(),
        key.into(),
        opts,
        FieldTable::default(),
    )
    .await?;
    let _ = ch.close(200, "".into()).await;
    Ok(())
}
