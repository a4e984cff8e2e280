//! W3C trace context (`traceparent`, `tracestate`) as a notification
//! carries it: in its AMQP headers, from the producer, and on every copy
//! the worker makes (retries, deferrals, dead letters), so that all the
//! attempts of one notification sit in one trace.
//!
//! Only the carrier lives here; spans are made in `telemetry::trace`.

use lapin::types::{AMQPValue, FieldTable, LongString};

/// The AMQP header (and HTTP header) names the W3C specification gives.
pub const H_TRACEPARENT: &str = "traceparent";
pub const H_TRACESTATE: &str = "tracestate";

/// W3C's limit on `tracestate`; a longer one is dropped, not truncated,
/// since a cut list member would be wrong.
const MAX_TRACESTATE: usize = 512;

/// One `traceparent` and its `tracestate`, well-formed (version 00).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// `None` for a malformed `traceparent`: W3C says a receiver starts
    /// afresh rather than fail, so a bad header never costs a delivery.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let tp = traceparent.trim();
        if !well_formed(tp) {
            return None;
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii())
            .map(str::to_string);
        Some(TraceContext {
            traceparent: tp.to_string(),
            tracestate,
        })
    }

    /// From a trace id, a span id and the sampled flag (lowercase hex).
    pub fn from_parts(
        trace_id: &str,
        span_id: &str,
        sampled: bool,
        state: Option<&str>,
    ) -> Option<Self> {
        let flags = if sampled { "01" } else { "00" };
        Self::parse(&format!("00-{trace_id}-{span_id}-{flags}"), state)
    }

    /// The context in a message's headers, if it has a well-formed one.
    pub fn from_headers(h: Option<&FieldTable>) -> Option<Self> {
        let m = h?.inner();
        let tp = m.get(H_TRACEPARENT).and_then(text)?;
        let ts = m.get(H_TRACESTATE).and_then(text);
        Self::parse(&tp, ts.as_deref())
    }

    /// Sets both headers (and removes a stale `tracestate`).
    pub fn write(&self, h: &mut FieldTable) {
        h.insert(H_TRACEPARENT.into(), long(&self.traceparent));
        match &self.tracestate {
            Some(s) => {
                h.insert(H_TRACESTATE.into(), long(s));
            }
            // FieldTable has no remove: rebuilt without it.
            None if h.inner().contains_key(H_TRACESTATE) => {
                let mut kept = FieldTable::default();
                for (k, v) in h.inner() {
                    if k.as_str() != H_TRACESTATE {
                        kept.insert(k.clone(), v.clone());
                    }
                }
                *h = kept;
            }
            None => {}
        }
    }

    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32 hex digits that name the trace.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16 hex digits of the span that made this context.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, ids not all zero.
fn well_formed(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && nonzero(parts[1])
        && hex(parts[2], 16)
        && nonzero(parts[2])
        && hex(parts[3], 2)
}

fn text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example_and_refuses_malformed_ones() {
        let c = TraceContext::parse(TP, Some("congo=t61rcWkgMzE")).expect("valid");
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id(), "00f067aa0ba902b7");
        assert!(c.sampled());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad}");
        }
        let long_state = "a=".to_string() + &"b".repeat(600);
        let c = TraceContext::parse(TP, Some(&long_state)).expect("valid");
        assert_eq!(c.tracestate(), None);
    }

    #[test]
    fn round_trips_through_amqp_headers() {
        let c = TraceContext::parse(TP, Some("k=v")).expect("valid");
        let mut h = FieldTable::default();
        h.insert(H_TRACESTATE.into(), long("stale=1"));
        c.write(&mut h);
        assert_eq!(TraceContext::from_headers(Some(&h)), Some(c));
        let bare = TraceContext::parse(TP, None).expect("valid");
        bare.write(&mut h);
        assert_eq!(TraceContext::from_headers(Some(&h)), Some(bare));
        h.insert(H_TRACEPARENT.into(), AMQPValue::LongLongInt(1));
        assert_eq!(TraceContext::from_headers(Some(&h)), None);
    }
}
