use super::super::tests::{admit, done, endpoints, go, url};
use crate::isolation::{Admission, DeferReason, ProbeTurn};
use crate::message::target::Target;
use crate::policy::Signal;
use std::time::Duration;

fn wall() -> u64 {
    u64::try_from(crate::clock::now_ms()).unwrap()
}

#[tokio::test]
async fn a_worker_that_never_saw_it_fail_opens_its_breaker_and_sends_one_candidate() {
    let e = endpoints(4, 8);
    let a = url("http://a.test/x");
    let paused = wall();
    // Its breaker was closed: opened now; this delivery is the opening's
    // candidate, which the admission defers to the half-open.
    assert_eq!(e.probe_turn(&a, paused), ProbeTurn::Candidate);
    assert!(matches!(
        admit(&e, &a),
        Admission::Defer {
            reason: DeferReason::Open,
            ..
        }
    ));
    assert_eq!(e.probe_turn(&a, paused), ProbeTurn::Park, "the rest park");
    let seen = e.breakers(wall());
    assert_eq!(seen.len(), 1);
    assert!(seen[0].open_since_ms.is_some_and(|s| s + 1_000 > paused));
    tokio::time::sleep(Duration::from_millis(210)).await;
    assert_eq!(
        e.probe_turn(&a, paused),
        ProbeTurn::Go,
        "half-open: the probe goes"
    );
    let probe = go(admit(&e, &a));
    assert!(probe.is_probe());
    assert_eq!(
        e.probe_turn(&a, paused),
        ProbeTurn::Park,
        "its probe is out"
    );
    probe.finish(Signal::Alive, &done());
    // Closed since the pause: through, while the resume is on its way.
    assert_eq!(e.probe_turn(&a, paused), ProbeTurn::Go);
    let seen = e.breakers(wall());
    assert_eq!(seen[0].open_since_ms, None);
    assert!(seen[0].closed_ms.is_some_and(|c| c >= paused));
}

#[tokio::test]
async fn another_workers_probe_closes_this_ones_breaker() {
    let e = endpoints(4, 8);
    let a = url("http://a.test/");
    for _ in 0..2 {
        go(admit(&e, &a)).finish(Signal::Failure, &done());
    }
    let target = Target::parse("http://a.test").unwrap();
    assert!(!e.close_breaker(&Target::parse("http://b.test").unwrap()));
    assert!(e.close_breaker(&target));
    assert!(!go(admit(&e, &a)).is_probe(), "closed: attempts go");
    assert!(!e.close_breaker(&target), "already closed");
}
