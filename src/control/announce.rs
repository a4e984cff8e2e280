//! The operational event of a change to the shared state
//! (`endpoint.paused`, `.resumed`, `.disabled`, `.enabled`). Its writer
//! publishes it once its record took effect in the stream's order: the
//! command that made it, or the worker whose automatic disable (or
//! closing of an expired pause) won. Other workers fold the same record
//! and publish nothing, so there is one event per change, and its `id`
//! comes from the record's, which repeats of one decision share.

use std::time::{Duration, UNIX_EPOCH};

use super::book::Book;
use super::record::{Change, Record};
use crate::message::event::{self, EndpointData, Event, Kind};

/// The event for a pause, resume, disable or enable record.
pub fn event(prefix: &str, r: &Record) -> Option<Event> {
    let (kind, target, reason, until_ms) = match &r.change {
        Change::Pause {
            target,
            reason,
            until_ms,
        } => (Kind::Paused, target, reason.clone(), *until_ms),
        Change::Resume { target } => (Kind::Resumed, target, None, None),
        Change::Disable { target, reason, .. } => (Kind::Disabled, target, reason.clone(), None),
        Change::Enable { target } => (Kind::Enabled, target, None, None),
        _ => return None,
    };
    let data = EndpointData {
        endpoint: target.to_string(),
        by: r.by.clone(),
        automatic: r.by.starts_with("auto "),
        reason,
        until: until_ms.map(|ms| event::rfc3339_ms(UNIX_EPOCH + Duration::from_millis(ms))),
    };
    Some(event::endpoint(kind, prefix, &r.id, data))
}

/// Whether `r` is the last change its target's history holds: it took
/// effect (a repeat, or a change another made moot, did not).
pub fn took(book: &Book, r: &Record) -> bool {
    r.target()
        .and_then(|t| book.get(t))
        .and_then(|k| k.history.last())
        .is_some_and(|e| e.id == r.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::target::Target;

    fn target() -> Target {
        Target::parse("https://h.example/m/1/").unwrap()
    }

    #[test]
    fn each_control_change_has_its_event_and_the_rest_none() {
        let t = target();
        let pause = Change::Pause {
            target: t.clone(),
            reason: Some("deploy".into()),
            until_ms: Some(1_700_000_000_000),
        };
        let r = Record::with_id("r1".into(), 5, "command ops@h", pause);
        let e = event("p", &r).expect("a pause has one");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["type"], "endpoint.paused");
        assert_eq!(v["data"]["endpoint"], "https://h.example:443/m/1/");
        assert_eq!(v["data"]["automatic"], false);
        assert_eq!(v["data"]["reason"], "deploy");
        assert_eq!(v["data"]["until"], "2023-11-14T22:13:20.000Z");
        let disable = Change::Disable {
            target: t.clone(),
            reason: Some("auto: no success".into()),
            failing_since_ms: Some(1),
        };
        let d = Record::with_id("auto:x:1".into(), 5, "auto h/1", disable);
        let e = event("p", &d).unwrap();
        assert_eq!(e.kind, Kind::Disabled);
        let again = Record::with_id("auto:x:1".into(), 9, "auto h/2", d.change.clone());
        assert_eq!(e.id, event("p", &again).unwrap().id, "one decision, one id");
        let failing = Change::Failing {
            target: t,
            since_ms: 1,
            failures: 3,
        };
        assert!(event("p", &Record::new(5, "auto h/1", failing)).is_none());
    }
}
