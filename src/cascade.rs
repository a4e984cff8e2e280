//! The plugin-free delay backend: a cascade of TTL queues, as NServiceBus
//! and Celery/Kombu 5.5 build it, in millisecond units.
//!
//! Level k (0..=31) is a topic exchange `<prefix>.delay.<k>` and a quorum
//! queue of the same name whose every message waits 2^k ms
//! (`x-message-ttl`), then is dead-lettered to level k−1's exchange (level
//! 0's goes to `<prefix>.delay.out`, which feeds the work queue). The
//! routing key is the delay in binary, one word per bit, lowest bit last:
//! 5 ms is `1.0.1`. At level k the bit k decides: 1 waits in the level's
//! queue, 0 skips straight to level k−1. A message enters at the level of
//! its delay's highest set bit, so it passes at most 32 queues and waits in
//! as many as its delay has set bits.
//!
//! Every queue has one TTL, so FIFO order is expiry order: nothing waits
//! behind a longer delay. Quorum queues with `x-dead-letter-strategy:
//! at-least-once` and `x-overflow: reject-publish` hand a message on only
//! once the next hop has it, so a broker crash at any hop loses nothing.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::topology::{classify, Topology, TopologyError};

/// Enough levels for the plugin's whole range: delays up to 2^32 − 1 ms.
pub const LEVELS: u32 = 32;

/// The exchange and queue name of level `k`.
pub fn level(t: &Topology, k: u32) -> String {
    format!("{}.delay.{k}", t.prefix)
}

/// Where a message leaves the cascade for the work queue.
pub fn out(t: &Topology) -> String {
    format!("{}.delay.out", t.prefix)
}

/// The level a delay enters at, and its routing key: the bits from the
/// highest set one down to bit 0. A zero delay goes straight to the exit.
pub fn entry(t: &Topology, delay_ms: u32) -> (String, String) {
    if delay_ms == 0 {
        return (out(t), String::new());
    }
    let top = 31 - delay_ms.leading_zeros();
    let bits: Vec<&str> = (0..=top)
        .rev()
        .map(|b| if delay_ms >> b & 1 == 1 { "1" } else { "0" })
        .collect();
    (level(t, top), bits.join("."))
}

/// `#.<bit>` followed by k `*`: matches keys whose bit k (k+1-th word from
/// the right) is `bit`.
fn pattern(k: u32, bit: char) -> String {
    let mut p = format!("#.{bit}");
    for _ in 0..k {
        p.push_str(".*");
    }
    p
}

/// Declares the exit, then every level from the bottom up (each level
/// dead-letters into the one below, which must exist first).
pub async fn declare(ch: &Channel, t: &Topology) -> Result<(), TopologyError> {
    let out = out(t);
    exchange(ch, &out, ExchangeKind::Fanout).await?;
    ch.queue_bind(
        t.work.as_str().into(),
        out.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| classify("binding to", &out, e))?;
    for k in 0..LEVELS {
        let name = level(t, k);
        let next = if k == 0 { out.clone() } else { level(t, k - 1) };
        exchange(ch, &name, ExchangeKind::Topic).await?;
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(name.as_str().into(), q, level_args(k, &next))
            .await
            .map_err(|e| classify("queue", &name, e))?;
        let wait = pattern(k, '1');
        ch.queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            wait.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| classify("binding to", &name, e))?;
        // Bit k is 0: skip this level's wait (exchange-to-exchange binding).
        let skip = pattern(k, '0');
        ch.exchange_bind(
            next.as_str().into(),
            name.as_str().into(),
            skip.as_str().into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| classify("binding to", &next, e))?;
    }
    Ok(())
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

fn level_args(k: u32, next: &str) -> FieldTable {
    let mut a = FieldTable::default();
    let s = |v: &str| AMQPValue::LongString(v.into());
    // x-queue-type: quorum, a replicated Raft log fsync'd before confirming.
    a.insert("x-queue-type".into(), s("quorum"));
    // x-message-ttl: every message of level k waits exactly 2^k ms.
    a.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1i64 << k));
    // x-dead-letter-exchange: on expiry, on to the next level down (the
    // routing key is kept, so the next level reads its own bit).
    a.insert("x-dead-letter-exchange".into(), s(next));
    // x-dead-letter-strategy: at-least-once: the message leaves this queue
    // only once the next hop confirmed it; a crash mid-hop loses nothing.
    a.insert("x-dead-letter-strategy".into(), s("at-least-once"));
    // x-overflow: reject-publish, which at-least-once dead-lettering needs
    // (with drop-head a full queue would silently drop its oldest).
    a.insert("x-overflow".into(), s("reject-publish"));
    a
}

/// Every queue and exchange of the cascade, for deletion.
pub fn names(t: &Topology) -> (Vec<String>, Vec<String>) {
    let queues: Vec<String> = (0..LEVELS).map(|k| level(t, k)).collect();
    let mut exchanges = queues.clone();
    exchanges.push(out(t));
    (queues, exchanges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_level_and_key_follow_the_bits() {
        let t = Topology::new("p");
        assert_eq!(entry(&t, 0), ("p.delay.out".into(), "".into()));
        assert_eq!(entry(&t, 1), ("p.delay.0".into(), "1".into()));
        assert_eq!(entry(&t, 5), ("p.delay.2".into(), "1.0.1".into()));
        assert_eq!(entry(&t, 8), ("p.delay.3".into(), "1.0.0.0".into()));
        let (x, key) = entry(&t, u32::MAX);
        assert_eq!(x, "p.delay.31");
        assert_eq!(key.split('.').count(), 32);
        assert!(key.split('.').all(|w| w == "1"));
    }

    #[test]
    fn patterns_read_bit_k_from_the_right() {
        assert_eq!(pattern(0, '1'), "#.1");
        assert_eq!(pattern(2, '0'), "#.0.*.*");
    }
}
