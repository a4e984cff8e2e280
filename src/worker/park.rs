//! Parking: a paused endpoint's notification waits, unattempted, in its
//! lane's parking queue (`crate::topology`'s `park.rs`), which nobody reads
//! until a pause ends (`unpark.rs`). It does not go round the delay backend
//! while the pause lasts.
//!
//! A park is a copy confirmed before the original's ack, like a retry. It
//! happens under a read lock of `Context::parking`: a release takes the write lock
//! before it reads the queue, so a park still under way when a resume is
//! read lands before the release reads, and one that starts after sees the
//! resume and delivers instead.

use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tracing::debug;

use super::context::{effective_policy, Context, Done};
use super::copy::lane_key;
use crate::clock::now_ms;
use crate::message::state::RetryState;
use crate::message::target::Target;
use crate::message::Notification;
use crate::publish::{republish_properties, PublishError};
use crate::telemetry;
use crate::topology::lanes::lane_of_key;

/// When the copy was parked, in ms since the epoch: a release reads what
/// was parked before it began and stops at what was parked after.
pub(super) const PARKED_AT: &str = "redeliver-parked-at";

/// Parks `d`, held back by `target`'s pause: a confirmed copy in its lane's
/// parking queue, expiring when its `--max-age` is reached. Its age starts
/// now if nothing started it (as a deferral's does).
pub(super) async fn park<H>(
    ctx: &Context<H>,
    d: &Delivery,
    mut st: RetryState,
    n: &Notification,
    target: &Target,
) -> Result<Done, PublishError> {
    let now = now_ms();
    st.id = Some(n.id.clone());
    st.defer(now);
    let max_age = effective_policy(&ctx.settings, n).max_age;
    let left = max_age.map(|m| (m.as_millis() as u64).saturating_sub(st.age_ms(now)));
    let mut headers = st.to_headers(d.properties.headers().as_ref(), None);
    headers.insert(PARKED_AT.into(), AMQPValue::LongLongInt(now));
    let topology = ctx.publisher.topology();
    let queue = topology.park(lane_of_key(&lane_key(d), topology.lanes));
    let props = with_expiry(republish_properties(&d.properties, headers), left);
    ctx.publisher
        .confirmed("", &queue, true, &d.data, props)
        .await?;
    debug!(id = n.id, %target, queue, "parked while its endpoint is paused");
    ctx.control.parked(target);
    metrics::counter!(telemetry::PARKING, "op" => "parked").increment(1);
    Ok(Done::Ack(None))
}

/// `props` with a TTL of `left_ms` (at least 1: 0 would mean "deliver now
/// or drop"), or none.
pub(super) fn with_expiry(
    props: lapin::BasicProperties,
    left_ms: Option<u64>,
) -> lapin::BasicProperties {
    match left_ms {
        Some(ms) => props.with_expiration(ShortString::from(ms.max(1).to_string())),
        None => props,
    }
}

/// Where a release sends one parked notification.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Move {
    /// Back to its lane: its pause is over (or it is disabled, expired or
    /// unreadable, which its worker deals with as it would anywhere).
    Lane,
    /// Parked again, still paused, with what is left of its TTL.
    Park { left_ms: Option<u64> },
}

/// Decides one parked notification's move: `paused`, its endpoint's gate
/// now; `expiration_ms` and `parked_at_ms`, its TTL and when it was parked.
pub(super) fn plan(
    paused: bool,
    expiration_ms: Option<u64>,
    parked_at_ms: Option<i64>,
    now_ms: i64,
) -> Move {
    if !paused {
        return Move::Lane;
    }
    let Some(ttl) = expiration_ms else {
        return Move::Park { left_ms: None };
    };
    let spent = parked_at_ms.map_or(0, |at| u64::try_from(now_ms - at).unwrap_or(0));
    match ttl.checked_sub(spent).filter(|&l| l > 0) {
        Some(left) => Move::Park {
            left_ms: Some(left),
        },
        // Due already: its worker dead-letters it as expired.
        None => Move::Lane,
    }
}

/// The `redeliver-parked-at` header, if it has one.
pub(super) fn parked_at(headers: Option<&FieldTable>) -> Option<i64> {
    match headers?.inner().get(PARKED_AT)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifted_pause_sends_it_to_its_lane() {
        assert_eq!(plan(false, Some(10), Some(0), 5), Move::Lane);
        assert_eq!(plan(false, None, None, 5), Move::Lane);
    }

    #[test]
    fn still_paused_it_parks_again_with_what_is_left_of_its_ttl() {
        let again = |left_ms| Move::Park { left_ms };
        assert_eq!(plan(true, None, Some(0), 5), again(None));
        assert_eq!(plan(true, Some(1_000), Some(100), 400), again(Some(700)));
        assert_eq!(plan(true, Some(1_000), None, 400), again(Some(1_000)));
        // A clock behind the parker's spends nothing.
        assert_eq!(plan(true, Some(1_000), Some(500), 400), again(Some(1_000)));
    }

    #[test]
    fn still_paused_but_due_it_goes_to_its_lane_to_expire() {
        assert_eq!(plan(true, Some(1_000), Some(0), 1_000), Move::Lane);
        assert_eq!(plan(true, Some(1_000), Some(0), 5_000), Move::Lane);
    }

    #[test]
    fn the_parked_at_header_is_read_back() {
        let mut h = FieldTable::default();
        assert_eq!(parked_at(Some(&h)), None);
        h.insert(PARKED_AT.into(), AMQPValue::LongLongInt(42));
        assert_eq!(parked_at(Some(&h)), Some(42));
    }
}
