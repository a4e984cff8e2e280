//! Which lane a notification travels in: pure, so producers, the delay
//! backends and the workers agree without asking the broker.
//!
//! The work queue is N lanes, quorum queues `<prefix>.work.0` …
//! `<prefix>.work.{N-1}`, fed by the direct exchange `<prefix>.lanes`.
//! A publisher hashes the notification's origin (`scheme://host:port`)
//! into one of [`BUCKETS`] buckets and uses `bucket.<b>` as the routing
//! key; the bindings map bucket b to lane b mod N. So a producer needs
//! to know nothing about N: only the workers' declare does, and changing
//! N is a change of bindings, not of any producer.
//!
//! Why hash on the publishing side: it works on every broker, with no
//! plugin (the consistent-hash exchange must be enabled, and
//! `x-modulus-hash` exists only from RabbitMQ 4.3), and the hash is one
//! documented function a raw producer can copy. A raw producer that sends
//! any other routing key still reaches a lane: the lanes exchange's
//! alternate exchange `<prefix>.lanes.default` takes whatever no binding
//! matches to lane 0.

use url::Url;

use crate::message::target::Target;

/// Buckets a key hashes into; also the most lanes there can be.
pub const BUCKETS: u16 = 64;
pub use crate::config::DEFAULT_LANES;

/// FNV-1a, 32 bits: small, stable across versions and languages, and
/// spreads short ASCII keys well enough over 64 buckets.
pub fn fnv1a(text: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The bucket of an origin key such as `https://shop.example:443`.
pub fn bucket_of(origin: &str) -> u16 {
    (fnv1a(origin) % u32::from(BUCKETS)) as u16
}

/// The routing key of bucket `b`.
pub fn bucket_key(b: u16) -> String {
    format!("bucket.{b}")
}

/// The routing key of a notification to `url`; `""` (lane 0, through
/// the alternate exchange) for a URL with no origin.
pub fn key_for_url(url: &Url) -> String {
    match Target::origin_of(url) {
        Some(t) => bucket_key(bucket_of(&t.origin_key())),
        None => String::new(),
    }
}

/// The routing key of a notification's JSON, read for its `url` alone;
/// `""` when it has none that parses. For copies made from a payload
/// (a replay, a relayed event) whose notification is not decoded.
pub fn key_of_payload(payload: &[u8]) -> String {
    url_of_payload(payload).map_or_else(String::new, |u| key_for_url(&u))
}

/// A notification's `url`, read from its JSON alone.
pub fn url_of_payload(payload: &[u8]) -> Option<Url> {
    #[derive(serde::Deserialize)]
    struct UrlOnly {
        url: String,
    }
    let u = serde_json::from_slice::<UrlOnly>(payload).ok()?;
    Url::parse(&u.url).ok()
}

/// The lane bucket `b` is bound to when there are `lanes` lanes.
pub fn lane_of(b: u16, lanes: u16) -> u16 {
    b % lanes.max(1)
}

/// The buckets lane `lane` of `lanes` takes.
pub fn buckets_of(lane: u16, lanes: u16) -> impl Iterator<Item = u16> {
    (0..BUCKETS).filter(move |&b| lane_of(b, lanes) == lane)
}

/// The lane a routing key reaches: its bucket's, or lane 0 for a key
/// that is not a bucket's.
pub fn lane_of_key(key: &str, lanes: u16) -> u16 {
    key.strip_prefix("bucket.")
        .and_then(|b| b.parse::<u16>().ok())
        .filter(|&b| b < BUCKETS)
        .map_or(0, |b| lane_of(b, lanes))
}

/// A bucket and the lane it is bound to.
pub type Binding = (u16, u16);

/// What laying the buckets for `lanes` lanes changes, when they were laid
/// for `before` lanes (`None`: never): each bucket bound to its new lane,
/// then unbound from the old one where that differs, as (bucket, lane).
/// Pure, so a change of `--lanes` is planned (and tested) apart from the
/// AMQP calls that make it.
pub fn relay_plan(before: Option<u16>, lanes: u16) -> (Vec<Binding>, Vec<Binding>) {
    let bind = (0..BUCKETS).map(|b| (b, lane_of(b, lanes))).collect();
    let unbind = match before {
        Some(old) if old != lanes => (0..BUCKETS)
            .map(|b| (b, lane_of(b, old)))
            .filter(|&(b, lane)| lane != lane_of(b, lanes))
            .collect(),
        _ => Vec::new(),
    };
    (bind, unbind)
}

/// Whether `key` is one of the [`BUCKETS`] bucket keys.
pub fn is_bucket_key(key: &str) -> bool {
    key.strip_prefix("bucket.")
        .and_then(|b| b.parse::<u16>().ok())
        .is_some_and(|b| b < BUCKETS && bucket_key(b) == key)
}

/// Why `--lanes` was refused.
pub fn check(lanes: u16) -> Result<u16, String> {
    match lanes {
        1..=BUCKETS => Ok(lanes),
        _ => Err(format!("--lanes must be 1 to {BUCKETS}, not {lanes}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_documented_fnv1a() {
        // The reference values of FNV-1a 32 (docs/lanes.md quotes them).
        assert_eq!(fnv1a(""), 0x811c_9dc5);
        assert_eq!(fnv1a("a"), 0xe40c_292c);
        assert_eq!(fnv1a("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn an_origin_keeps_its_bucket_whatever_the_path() {
        let a = Url::parse("https://Shop.Example/a?x=1").unwrap();
        let b = Url::parse("https://shop.example:443/b").unwrap();
        assert_eq!(key_for_url(&a), key_for_url(&b));
        let key = bucket_key(bucket_of("https://shop.example:443"));
        assert_eq!(key_for_url(&a), key);
        let payload = br#"{"url":"https://shop.example/x","body":{}}"#;
        assert_eq!(key_of_payload(payload), key);
        assert_eq!(key_of_payload(b"not json"), "");
        assert_eq!(key_of_payload(br#"{"url":"::"}"#), "");
    }

    #[test]
    fn every_bucket_has_one_lane_and_the_lanes_share_them_evenly() {
        for lanes in [1, 3, 8, 64] {
            let mut seen = vec![0; usize::from(lanes)];
            for lane in 0..lanes {
                for b in buckets_of(lane, lanes) {
                    assert_eq!(lane_of(b, lanes), lane);
                    seen[usize::from(lane)] += 1;
                }
            }
            assert_eq!(seen.iter().sum::<u16>(), BUCKETS);
            let (min, max) = (seen.iter().min().unwrap(), seen.iter().max().unwrap());
            assert!(max - min <= 1, "{lanes}: {seen:?}");
        }
    }

    #[test]
    fn a_key_that_is_no_bucket_goes_to_lane_0() {
        assert_eq!(lane_of_key("bucket.13", 8), 5);
        for key in ["", "orders", "bucket.64", "bucket.x", "redeliver.work"] {
            assert_eq!(lane_of_key(key, 8), 0, "{key}");
            assert!(!is_bucket_key(key), "{key}");
        }
        assert!(is_bucket_key("bucket.63") && !is_bucket_key("bucket.07"));
    }

    #[test]
    fn a_new_lane_count_binds_every_bucket_and_unbinds_only_the_moved() {
        let (bind, unbind) = relay_plan(None, 8);
        assert_eq!(bind.len(), 64);
        assert!(unbind.is_empty(), "nothing was laid before");
        assert!(
            relay_plan(Some(8), 8).1.is_empty(),
            "the same count moves nothing"
        );
        let (bind, unbind) = relay_plan(Some(8), 3);
        assert!(bind.iter().all(|&(b, lane)| lane == b % 3));
        // Every bucket whose lane changes leaves its old lane, no other.
        for b in 0..64 {
            let moved = b % 8 != b % 3;
            assert_eq!(unbind.contains(&(b, b % 8)), moved, "bucket {b}");
        }
        assert_eq!(unbind.len(), (0..64).filter(|b| b % 8 != b % 3).count());
    }

    #[test]
    fn lanes_outside_1_to_64_are_refused() {
        assert!(check(0).is_err());
        assert!(check(65).is_err());
        assert_eq!(check(64), Ok(64));
    }

    #[test]
    fn many_origins_spread_over_the_lanes() {
        let mut per = [0u32; 8];
        for port in 8000..9000 {
            let key = bucket_key(bucket_of(&format!("http://127.0.0.1:{port}")));
            per[usize::from(lane_of_key(&key, 8))] += 1;
        }
        assert!(per.iter().all(|&n| (75..=175).contains(&n)), "{per:?}");
    }
}
