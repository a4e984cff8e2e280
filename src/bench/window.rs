//! Phase 14, `confirm-window` (runs only when named: it kills the broker):
//! how long the delay backend's confirm runs ahead of its disk write, the
//! window `--retry-settle` must cover.
//!
//! Each round publishes retry copies (persistent, 400 bytes, `x-delay`
//! 15 s) to the plugin backend's delay exchange at a steady rate, as a
//! worker with `--retry-settle 0s` does, and records when each confirm
//! arrived. It then `kill -9`s the local node mid-load, starts it again and
//! drains the work queue once every copy fell due. A confirmed copy that
//! never arrives is lost; its age is the time from its confirm to the
//! kill. The oldest such age is the window a settle must outlast. Rates
//! alternate, since a write cache that flushes by size fills faster under
//! load: the slow rate is where the window is longest.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection};

use super::load;
use super::options::Phase;
use super::phases::Bench;
use crate::config::BrokerSettings;
use crate::delay::DelayBackend;
use crate::ops::local_node;
use crate::topology::Topology;

/// Copies per second, one rate a round, in turn.
const RATES: [f64; 4] = [2.0, 20.0, 200.0, 2_000.0];

/// Rounds (broker kills): four of each rate.
const ROUNDS: usize = 16;

/// The copies' delay: longer than a kill and a restart, so that every
/// copy is still held when the plugin's tables are looked at.
const DELAY: Duration = Duration::from_secs(15);

/// Publishing lasts this long before the kill, plus a share of
/// [`SPREAD`] that moves with the round, so kills land at different
/// moments of the plugin's write cycle.
const RUN: Duration = Duration::from_secs(3);
const SPREAD: Duration = Duration::from_millis(2_000);

/// Once the last copy fell due, the drain ends after this long without a
/// delivery.
const QUIET: Duration = Duration::from_secs(2);

/// The plugin's tables after a start, read before any copy falls due:
/// index keys without a message (the wedge: deleted here, as
/// `docs/operations.md` tells operators to) and messages without an index
/// key (never routed). `none` when the upstream plugin does not run there.
const TABLES: &str = r#"T = list_to_atom("rabbit_delayed_message" ++ atom_to_list(node())),
I = list_to_atom(atom_to_list(T) ++ "_index"),
case lists:member(I, mnesia:system_info(tables)) of
  false -> none;
  true ->
    Os = [K || K <- mnesia:dirty_all_keys(I), mnesia:dirty_read(T, K) == []],
    [mnesia:dirty_delete(I, K) || K <- Os],
    Ms = [K || K <- mnesia:dirty_all_keys(T), mnesia:dirty_read(I, K) == []],
    {length(Os), length(Ms)}
end."#;

/// What one round saw.
#[derive(Debug, Default)]
struct Round {
    confirmed: usize,
    /// Confirm-to-kill ages of the confirmed copies never delivered.
    lost: Vec<Duration>,
    /// `(orphan index keys, messages without index)`, when readable.
    tables: Option<(u64, u64)>,
}

impl Bench {
    /// Phase 14: rounds of delayed publishing, a broker `kill -9` each.
    pub(super) async fn confirm_window(&mut self) -> anyhow::Result<()> {
        let p = Phase::ConfirmWindow;
        if let Some(why) = self.restart_refused() {
            writeln_err(&format!("bench: confirm window left out: {why}"));
            self.push(p, "copies lost after a broker kill -9", None, "msg");
            return Ok(());
        }
        let mut all: Vec<(f64, Round)> = vec![];
        for r in 0..ROUNDS {
            let rate = RATES[r % RATES.len()];
            let round = self.window_round(rate, r).await?;
            writeln_err(&format!(
                "bench: window round {r} at {rate}/s: {} confirmed, {} lost, oldest lost {:?}, tables {:?}",
                round.confirmed,
                round.lost.len(),
                round.lost.iter().max(),
                round.tables
            ));
            all.push((rate, round));
        }
        self.push_window(&all);
        Ok(())
    }

    fn push_window(&mut self, all: &[(f64, Round)]) {
        let p = Phase::ConfirmWindow;
        let ms = |d: Option<&Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        for rate in RATES {
            let of = || all.iter().filter(move |(r, _)| *r == rate).map(|x| &x.1);
            let confirmed: usize = of().map(|r| r.confirmed).sum();
            let lost: Vec<Duration> = of().flat_map(|r| r.lost.iter().copied()).collect();
            let name = format!("copies confirmed, {rate}/s");
            self.push(p, name, Some(confirmed as f64), "msg");
            let name = format!("copies lost, {rate}/s");
            self.push(p, name, Some(lost.len() as f64), "msg");
            let name = format!("oldest lost copy's confirm before the kill, {rate}/s");
            self.push(p, name, ms(lost.iter().max()), "ms");
        }
        let oldest = all.iter().flat_map(|(_, r)| r.lost.iter()).max();
        let name = "oldest lost copy's confirm before the kill, all rounds";
        self.push(p, name, ms(oldest), "ms");
        let wedged = all
            .iter()
            .filter(|(_, r)| matches!(r.tables, Some((o, _)) if o > 0));
        let name = "restarts with an orphan index key (a wedge, repaired)";
        self.push(p, name, Some(wedged.count() as f64), "");
        let unindexed: u64 = all.iter().filter_map(|(_, r)| r.tables).map(|t| t.1).sum();
        let name = "held messages without an index key (never routed)";
        self.push(p, name, Some(unindexed as f64), "msg");
    }

    /// One round under a fresh prefix (deleted afterwards).
    async fn window_round(&mut self, rate: f64, r: usize) -> anyhow::Result<Round> {
        let prefix = self.prefix("window");
        let broker = BrokerSettings {
            prefix: prefix.clone(),
            delay: DelayBackend::Plugin,
            ..self.opts.broker.clone()
        };
        let t = crate::delay::declare_topology(&broker, &self.conn).await?;
        let run = RUN + SPREAD.mul_f64((r as f64 * 0.618).fract());
        let pid = self.opts.broker_pid.context("the local node's pid")?;
        let (confirms, killed_at) = publish_until_kill(&self.conn, &t, rate, run, pid).await?;
        self.start_broker().await?;
        let tables = read_tables().await;
        let last_due = confirms.iter().map(|c| c.1).max().unwrap_or(killed_at) + DELAY;
        // Published with the single work queue's name as the key, as an
        // earlier build's copies were: lane 0 takes that key.
        let got = drain(&self.conn, &t.lane(0), last_due).await;
        load::remove(&self.conn, &prefix).await;
        let got = got?;
        let lost = confirms.iter().filter(|(seq, _)| !got.contains(seq));
        Ok(Round {
            confirmed: confirms.len(),
            lost: lost
                .map(|(_, at)| killed_at.saturating_duration_since(*at))
                .collect(),
            tables,
        })
    }

    /// `ctl up` after the kill; reconnects the bench's connection.
    async fn start_broker(&mut self) -> anyhow::Result<()> {
        local_node::start().await?;
        let url = &self.opts.broker.url;
        self.conn = url
            .connect("redeliver bench")
            .await
            .with_context(|| format!("cannot reconnect to {url} after the kill"))?;
        self.opts.broker_pid = local_node::pid();
        Ok(())
    }
}

fn writeln_err(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Publishes copies at `rate` for `run`, then kills the node. Returns each
/// acked copy's sequence number and confirm instant, and the kill's instant.
async fn publish_until_kill(
    conn: &Connection,
    t: &Topology,
    rate: f64,
    run: Duration,
    pid: u32,
) -> anyhow::Result<(Vec<(u64, Instant)>, Instant)> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut confirms = tokio::task::JoinSet::new();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut seq = 0u64;
    while start.elapsed() < run {
        tokio::time::sleep_until(start + interval.mul_f64(seq as f64)).await;
        let mut body = format!("{seq:08} ").into_bytes();
        body.resize(400, b'x');
        let confirm = ch
            .basic_publish(
                t.retry.as_str().into(),
                t.work.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                copy_props(),
            )
            .await?;
        confirms.spawn(async move {
            let ok = matches!(confirm.await, Ok(Confirmation::Ack(_)));
            ok.then(|| (seq, Instant::now()))
        });
        seq += 1;
    }
    let killed_at = Instant::now();
    local_node::kill_9(pid).await?;
    let mut acked = vec![];
    let wait = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(r) = confirms.join_next().await {
            acked.extend(r.ok().flatten());
        }
    });
    wait.await
        .context("the confirms never settled after the kill")?;
    Ok((acked, killed_at))
}

/// A retry copy's properties: persistent, with its delay.
fn copy_props() -> BasicProperties {
    let mut headers = FieldTable::default();
    // x-delay: the plugin holds the copy this many milliseconds.
    let ms = DELAY.as_millis() as i64;
    headers.insert("x-delay".into(), AMQPValue::LongLongInt(ms));
    // delivery_mode 2: persistent, as every retry copy is.
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// The plugin's tables after the start (see [`TABLES`]); `None` when they
/// could not be read or the node does not run the upstream plugin.
async fn read_tables() -> Option<(u64, u64)> {
    let out = local_node::eval(TABLES).await.ok()?;
    let (o, m) = out.trim_matches(|c| c == '{' || c == '}').split_once(',')?;
    Some((o.trim().parse().ok()?, m.trim().parse().ok()?))
}

/// Consumes the work queue (auto-ack: a throwaway queue) until `last_due`
/// has passed and nothing arrived for [`QUIET`]; returns the sequence
/// numbers seen.
async fn drain(conn: &Connection, queue: &str, last_due: Instant) -> anyhow::Result<HashSet<u64>> {
    let ch = conn.create_channel().await?;
    let opts = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let mut consumer = ch
        .basic_consume(queue.into(), "window".into(), opts, FieldTable::default())
        .await?;
    let mut seen = HashSet::new();
    loop {
        let until = Instant::now().max(last_due) + QUIET;
        let next = tokio::time::timeout_at(until.into(), consumer.next()).await;
        let Ok(Some(d)) = next else { break };
        let d = d.context("the drain's consumer failed")?;
        let seq = std::str::from_utf8(d.data.get(..8).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        seen.extend(seq);
    }
    let _ = ch.close(200, "drained".into()).await;
    Ok(seen)
}
