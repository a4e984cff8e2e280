//! The plugin-free delay backend: a cascade of TTL queues, as NServiceBus
//! and Celery/Kombu 5.5 build it, in millisecond units and hexadecimal
//! digits.
//!
//! A delay is written in base 16: eight digits cover the plugin's whole
//! range (≤ 2^32 − 1 ms). Stage s (0..8) is a headers exchange
//! `<prefix>.cascade.<s>` with fifteen quorum queues `<prefix>.cascade.<s>.<d>`
//! (d = 1..15) whose every message waits d × 16^s ms (`x-message-ttl`), then
//! is dead-lettered to stage s−1's exchange (stage 0's goes to
//! `<prefix>.cascade.out`, which feeds the work queue). A message carries
//! its digits as headers `redeliver-cascade-<s>`; at stage s the digit
//! picks the queue to wait in, and 0 skips straight to stage s−1. A message
//! enters at the stage of its highest non-zero digit, so it waits in at
//! most 8 queues, and a delay ≤ 4,095 ms in at most 3.
//!
//! Why hexadecimal and headers: every queue a message waits in costs a
//! quorum-queue write and a dead-lettering hop (~1.5 ms, and broker CPU),
//! so fewer, wider digits make delays both more accurate and cheaper
//! (binary needed up to 12 hops for a 4 s delay). A headers exchange
//! matches a digit with one table lookup per binding, where topic patterns
//! on a bit-string key cost hundreds of trie lookups per exchange; measured
//! on RabbitMQ 3.10, that routing capped a 2 s level at ~300 dead letters/s.
//!
//! Every queue has one TTL, so FIFO order is expiry order: nothing waits
//! behind a longer delay. Quorum queues with `x-dead-letter-strategy:
//! at-least-once` and `x-overflow: reject-publish` hand a message on only
//! once the next hop has it, so a broker crash at any hop loses nothing.
//!
//! Delays up to [`HOLD_MAX_MS`] skip the stages: they go to one quorum
//! queue, `<prefix>.cascade.hold`, whose consumers (every `run` worker of
//! the prefix, [`crate::delay::hold`]) keep each message unacked until its due
//! time and then publish it to the exit. A queue's expiry path costs
//! ~1.5 ms per hop, more than a whole short delay's worth of the plugin's
//! timer; a timer in the worker is as accurate as the plugin's.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

pub use crate::message::state::is_cascade_header;
use crate::message::state::H_CASCADE_PREFIX;
use crate::topology::{classify, Topology, TopologyError};

/// Hexadecimal digits: 8 stages cover delays up to 16^8 − 1 = 2^32 − 1 ms.
pub const STAGES: u32 = 8;
/// Bits per digit.
const DIGIT_BITS: u32 = 4;
/// The largest digit; digit 0 means "skip this stage".
pub const MAX_DIGIT: u32 = (1 << DIGIT_BITS) - 1;
/// The header carrying stage s's digit: `redeliver-cascade-<s>`.
const HEADER: &str = H_CASCADE_PREFIX;

/// Delays up to this long are held by the workers (see the module doc):
/// the "as accurate as the plugin" range. Longer ones wait in the
/// stages, whose lateness does not grow with the delay.
pub const HOLD_MAX_MS: u32 = 1_000;
/// The header with a held message's due time: microseconds since the Unix
/// epoch on the publisher's clock (whole milliseconds would need rounding
/// up to never be early, which costs half a millisecond on average). It
/// shares the digits' prefix, so [`is_cascade_header`] strips it from
/// copies with everything else.
pub const DUE_HEADER: &str = "redeliver-cascade-due-us";

/// The queue that short delays wait in, held by the workers.
pub fn hold(t: &Topology) -> String {
    format!("{}.cascade.hold", t.prefix)
}

/// Whether a delay is held by the workers rather than cascaded.
pub fn is_held(delay_ms: u32) -> bool {
    (1..=HOLD_MAX_MS).contains(&delay_ms)
}

/// Sets a held message's due time: `now_us` (microseconds since the Unix
/// epoch) plus `delay_ms`. A clock that reads 0 (set before 1970) sets
/// none, and the holder then waits the whole delay from arrival.
pub fn hold_entry(delay_ms: u32, now_us: u64, headers: &mut FieldTable) {
    if now_us == 0 {
        return;
    }
    let due = now_us.saturating_add(u64::from(delay_ms) * 1000);
    let due = i64::try_from(due).unwrap_or(i64::MAX);
    headers.insert(DUE_HEADER.into(), AMQPValue::LongLongInt(due));
}

/// The header with a held message's bucket key: the hold queue is reached
/// through the default exchange (its name as the key), so the holder
/// releases it to the exit with this key, back to its lane.
pub const ROUTE_HEADER: &str = "redeliver-cascade-route";

/// Sets a held message's bucket key (see [`ROUTE_HEADER`]).
pub fn hold_key(key: &str, headers: &mut FieldTable) {
    headers.insert(ROUTE_HEADER.into(), AMQPValue::LongString(key.into()));
}

/// The bucket key a held message is released with; `""` (lane 0, through
/// the lanes exchange's alternate) when it has none.
pub fn held_key(headers: Option<&FieldTable>) -> String {
    match headers.and_then(|h| h.inner().get(ROUTE_HEADER)) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        _ => String::new(),
    }
}

/// The headers exchange of stage `s`.
pub fn stage(t: &Topology, s: u32) -> String {
    format!("{}.cascade.{s}", t.prefix)
}

/// The queue of stage `s` that holds a message for `digit` × 16^s ms.
pub fn queue(t: &Topology, s: u32, digit: u32) -> String {
    format!("{}.cascade.{s}.{digit}", t.prefix)
}

/// How long each message of stage `s`, digit `digit` waits.
pub fn ttl_ms(s: u32, digit: u32) -> u64 {
    u64::from(digit) << (DIGIT_BITS * s)
}

/// Where a message leaves the cascade for the work queue.
pub fn out(t: &Topology) -> String {
    format!("{}.cascade.out", t.prefix)
}

/// Stage `s`'s digit of `delay_ms`.
fn digit(delay_ms: u32, s: u32) -> u32 {
    (delay_ms >> (DIGIT_BITS * s)) & MAX_DIGIT
}

/// Sets the digit headers of `delay_ms` and returns the exchange it enters
/// at: the stage of its highest non-zero digit. A zero delay goes straight
/// to the exit. Digits of an earlier delay are the caller's to remove
/// first ([`crate::publish::strip_transit_headers`], as `Publisher` does);
/// stages above this delay's top would otherwise keep stale ones.
pub fn entry(t: &Topology, delay_ms: u32, headers: &mut FieldTable) -> String {
    if delay_ms == 0 {
        return out(t);
    }
    let top = (31 - delay_ms.leading_zeros()) / DIGIT_BITS;
    for s in 0..=top {
        let d = digit(delay_ms, s).to_string();
        headers.insert(header(s).into(), AMQPValue::LongString(d.into()));
    }
    stage(t, top)
}

/// The header carrying stage `s`'s digit.
pub fn header(s: u32) -> String {
    format!("{HEADER}{s}")
}

/// A liveness probe's stage-0 "digit" ([`crate::delay::probe`]). Probes
/// wait in the stages' queues like any delay, but no stage-0 queue nor the
/// skip binding matches this, so at stage 0 they leave for their worker's
/// own queue and the [`probe_sink`], never the work queue.
pub const PROBE_DIGIT: &str = "p";
/// A probe's delay: 0x410 = 1,040 ms, stage 2's digit 4 (1,024 ms) then
/// stage 1's digit 1 (16 ms): two quorum queues' expiry and two
/// dead-letterings, what every delay over 4 s goes through too.
pub const PROBE_DELAY_MS: u32 = 0x410;

/// Where every probe also goes at stage 0, so that one whose worker (and
/// its queue) is gone is still routed somewhere: at-least-once
/// dead-lettering would otherwise keep it in stage 1 for ever. Its TTL of
/// 0 drops it at once.
pub fn probe_sink(t: &Topology) -> String {
    format!("{}.cascade.probes", t.prefix)
}

/// Sets a probe's digits and returns the exchange it enters at.
pub fn probe_entry(t: &Topology, headers: &mut FieldTable) -> String {
    let exchange = entry(t, PROBE_DELAY_MS, headers);
    headers.insert(header(0).into(), AMQPValue::LongString(PROBE_DIGIT.into()));
    exchange
}

/// Binding arguments that match the probes at stage 0, and with `more`
/// also those headers.
pub fn probe_match(more: &[(&str, &str)]) -> FieldTable {
    let mut a = FieldTable::default();
    // x-match: all: every listed header must be present and equal.
    a.insert("x-match".into(), AMQPValue::LongString("all".into()));
    a.insert(header(0).into(), AMQPValue::LongString(PROBE_DIGIT.into()));
    for (k, v) in more {
        a.insert((*k).into(), AMQPValue::LongString((*v).into()));
    }
    a
}

/// The probes' sink (see [`probe_sink`]): a quorum queue, so it is there
/// whichever node is down, whose messages expire at once.
async fn declare_probe_sink(ch: &Channel, t: &Topology) -> Result<(), TopologyError> {
    let sink = probe_sink(t);
    let mut args = FieldTable::default();
    // x-queue-type: quorum, available while a majority of nodes is up.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    // x-message-ttl: 0: nothing stays; there is no dead-letter exchange, so
    // an expired probe is dropped.
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(0));
    ch.queue_declare(sink.as_str().into(), durable(), args)
        .await
        .map_err(|e| classify("queue", &sink, e))?;
    bind_queue(ch, &sink, &stage(t, 0), probe_match(&[])).await
}

/// Binding arguments that match messages whose stage-`s` digit is `digit`.
fn matches(s: u32, digit: u32) -> FieldTable {
    let mut a = FieldTable::default();
    // x-match: all: every listed header must be present and equal.
    a.insert("x-match".into(), AMQPValue::LongString("all".into()));
    a.insert(
        header(s).into(),
        AMQPValue::LongString(digit.to_string().into()),
    );
    a
}

/// Declares the exit, then every stage from the bottom up (each stage
/// dead-letters into the one below, which must exist first).
pub async fn declare(ch: &Channel, t: &Topology) -> Result<(), TopologyError> {
    let out = out(t);
    exchange(ch, &out, ExchangeKind::Fanout).await?;
    // The exit fans out to the lanes exchange, which routes a copy by the
    // bucket key it was published with (dead-lettering keeps it).
    ch.exchange_bind(
        t.lanes_exchange.as_str().into(),
        out.as_str().into(),
        "".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| classify("binding to", &out, e))?;
    let hold = hold(t);
    // The hold queue has no TTL: a message leaves it when a worker acks
    // it, after its released copy was confirmed.
    ch.queue_declare(hold.as_str().into(), durable(), dead_lettering(&out))
        .await
        .map_err(|e| classify("queue", &hold, e))?;
    for s in 0..STAGES {
        let name = stage(t, s);
        let next = if s == 0 { out.clone() } else { stage(t, s - 1) };
        exchange(ch, &name, ExchangeKind::Headers).await?;
        for d in 1..=MAX_DIGIT {
            let q = queue(t, s, d);
            ch.queue_declare(
                q.as_str().into(),
                durable(),
                queue_args(ttl_ms(s, d), &next),
            )
            .await
            .map_err(|e| classify("queue", &q, e))?;
            bind_queue(ch, &q, &name, matches(s, d)).await?;
        }
        // Digit 0: skip this stage (exchange-to-exchange binding).
        ch.exchange_bind(
            next.as_str().into(),
            name.as_str().into(),
            "".into(),
            ExchangeBindOptions::default(),
            matches(s, 0),
        )
        .await
        .map_err(|e| classify("binding to", &next, e))?;
    }
    declare_probe_sink(ch, t).await
}

async fn bind_queue(ch: &Channel, q: &str, x: &str, args: FieldTable) -> Result<(), TopologyError> {
    ch.queue_bind(
        q.into(),
        x.into(),
        "".into(),
        QueueBindOptions::default(),
        args,
    )
    .await
    .map_err(|e| classify("binding to", q, e))
}

async fn exchange(ch: &Channel, name: &str, kind: ExchangeKind) -> Result<(), TopologyError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(name.into(), kind, durable, FieldTable::default())
        .await
        .map_err(|e| classify("exchange", name, e))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// A stage's queue: [`dead_lettering`] to `next`, after `ttl_ms`.
fn queue_args(ttl_ms: u64, next: &str) -> FieldTable {
    let mut a = dead_lettering(next);
    // x-message-ttl: every message of this queue waits exactly this long.
    a.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(ttl_ms as i64),
    );
    a
}

/// A quorum queue that dead-letters to `next` without ever dropping: the
/// stages' queues on expiry, and the hold queue for a message the broker
/// would otherwise drop (quorum queues on RabbitMQ 4.0+ drop one returned
/// more than `delivery-limit`, default 20, times, and every holder crash
/// or shutdown returns what it held: early, not lost).
fn dead_lettering(next: &str) -> FieldTable {
    let mut a = FieldTable::default();
    let s = |v: &str| AMQPValue::LongString(v.into());
    // x-queue-type: quorum, a replicated Raft log fsync'd before confirming.
    a.insert("x-queue-type".into(), s("quorum"));
    // x-dead-letter-exchange: on to `next` (the headers are kept, so the
    // next stage reads its own digit).
    a.insert("x-dead-letter-exchange".into(), s(next));
    // x-dead-letter-strategy: at-least-once: the message leaves this queue
    // only once the next hop confirmed it; a crash mid-hop loses nothing.
    a.insert("x-dead-letter-strategy".into(), s("at-least-once"));
    // x-overflow: reject-publish, which at-least-once dead-lettering needs
    // (with drop-head a full queue would silently drop its oldest).
    a.insert("x-overflow".into(), s("reject-publish"));
    a
}

/// Every queue of the cascade, stage by stage, digit by digit.
pub fn queues(t: &Topology) -> impl Iterator<Item = (u32, u32, String)> + '_ {
    (0..STAGES).flat_map(move |s| (1..=MAX_DIGIT).map(move |d| (s, d, queue(t, s, d))))
}

/// Every queue and exchange of the cascade, the hold queue included, for
/// deletion.
pub fn names(t: &Topology) -> (Vec<String>, Vec<String>) {
    let mut queues: Vec<String> = queues(t).map(|(_, _, q)| q).collect();
    queues.push(hold(t));
    queues.push(probe_sink(t));
    let mut exchanges: Vec<String> = (0..STAGES).map(|s| stage(t, s)).collect();
    exchanges.push(out(t));
    (queues, exchanges)
}

/// How many of the stages' queues a delay waits in: its non-zero
/// hexadecimal digits, or none when it is held ([`is_held`]).
pub fn hops(delay_ms: u32) -> u32 {
    if is_held(delay_ms) {
        return 0;
    }
    (0..STAGES).filter(|&s| digit(delay_ms, s) != 0).count() as u32
}

#[cfg(test)]
#[path = "cascade_tests.rs"]
mod tests;
