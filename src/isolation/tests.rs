use super::*;
use crate::policy::{BreakerPolicy, Signal, LATE_SLACK};
use rand::{rngs::StdRng, SeedableRng};

pub(super) fn url(s: &str) -> url::Url {
    s.parse().unwrap()
}

/// A ceiling of `concurrency`, with the adaptive limit below it.
pub(super) fn endpoints(concurrency: usize, max_parked: usize) -> Endpoints {
    with_settings(EndpointSettings {
        concurrency: Some(concurrency),
        ..settings(max_parked)
    })
}

pub(super) fn settings(max_parked: usize) -> EndpointSettings {
    EndpointSettings {
        max_parked,
        breaker: BreakerPolicy {
            failures: 2,
            open: Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A worker of 8 slots.
pub(super) fn with_settings(settings: EndpointSettings) -> Endpoints {
    Endpoints::new(settings, 8, Routes::default())
}

/// As the worker asks: with a parking place taken first, when one is free.
pub(super) fn admit(e: &Endpoints, u: &url::Url) -> Admission {
    let place = e.room.clone().try_acquire_owned().ok();
    e.try_admit(u, place)
}

pub(super) fn go(a: Admission) -> Pass {
    match a {
        Admission::Go(p) => p,
        Admission::Park(_) => panic!("parked"),
        Admission::Defer { reason, .. } => panic!("deferred: {reason:?}"),
    }
}

#[test]
fn the_endpoint_is_scheme_host_and_port() {
    assert_eq!(
        endpoint_key(&url("https://A.example/x?y")),
        "https://a.example:443"
    );
    assert_eq!(
        endpoint_key(&url("http://a.example:8080/")),
        "http://a.example:8080"
    );
}

#[tokio::test]
async fn the_ceiling_parks_and_an_ending_attempt_lets_the_parked_one_go() {
    // Isolation off: the ceiling is the limit.
    let e = with_settings(EndpointSettings {
        concurrency: Some(2),
        isolation: false,
        ..settings(8)
    });
    let (a, b) = (url("http://a.test/1"), url("http://b.test/1"));
    let first = go(admit(&e, &a));
    let _second = go(admit(&e, &a));
    let parked = match admit(&e, &a) {
        Admission::Park(p) => p,
        _ => panic!("the third to a full endpoint parks"),
    };
    // Another endpoint is not affected.
    let _other = go(admit(&e, &b));
    let waiter = tokio::spawn(async move { parked.wait(|| async {}).await.0 });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    first.finish(Signal::Alive, &done());
    assert!(matches!(waiter.await.unwrap(), Admission::Go(_)));
}

/// Admits to `u` until one parks, finishes every admitted one at once
/// with `signal`, and returns how many went.
fn one_round(e: &Endpoints, u: &url::Url, signal: Signal) -> usize {
    let mut passes = vec![];
    loop {
        match admit(e, u) {
            Admission::Go(p) => passes.push(p),
            Admission::Park(_) => break,
            Admission::Defer { reason, .. } => panic!("deferred: {reason:?}"),
        }
        if passes.len() > 64 {
            break;
        }
    }
    let n = passes.len();
    for p in passes {
        p.finish(signal, &done());
    }
    n
}

#[tokio::test]
async fn alone_a_healthy_endpoint_earns_every_slot_and_parks_the_rest_in_order() {
    let e = with_settings(settings(64));
    let a = url("http://a.test/");
    let rounds: Vec<usize> = (0..5).map(|_| one_round(&e, &a, Signal::Alive)).collect();
    assert_eq!(rounds[0], 1, "a new endpoint starts at one");
    assert_eq!(*rounds.last().unwrap(), 8, "{rounds:?}: every slot");
    // Full, alone: the next ones wait in order, none is deferred.
    let _held: Vec<Pass> = (0..8).map(|_| go(admit(&e, &a))).collect();
    let parked: Vec<Parked> = (0..40)
        .map(|_| match admit(&e, &a) {
            Admission::Park(p) => p,
            _ => panic!("alone, a busy endpoint's deliveries wait"),
        })
        .collect();
    assert_eq!(parked.len(), 40);
}

#[tokio::test]
async fn while_another_endpoint_has_work_each_gets_its_share_and_what_the_other_leaves() {
    let e = with_settings(settings(64));
    let (a, b) = (url("http://a.test/"), url("http://b.test/"));
    for _ in 0..4 {
        one_round(&e, &a, Signal::Alive);
    }
    // b arrives with one attempt in flight, a has seven; once counted, a
    // (fair share 4 of 8) may use what b does not claim: b claims its one
    // (one more would be its next delivery, but a new endpoint's own
    // limit is one), so a gets 7.
    let _b = go(admit(&e, &b));
    let _a: Vec<Pass> = (0..7).map(|_| go(admit(&e, &a))).collect();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        matches!(admit(&e, &a), Admission::Park(_)),
        "a is at its share while b has work"
    );
    assert_eq!(e.shares.fair(), 4);
}

#[tokio::test]
async fn a_flaky_endpoint_that_answers_beside_a_stuck_attempt_parks_more_than_a_round() {
    let e = with_settings(settings(64));
    let (a, f) = (url("http://a.test/"), url("http://flaky.test/"));
    let _a = go(admit(&e, &a));
    go(admit(&e, &f)).finish(Signal::Alive, &done());
    let _stuck = go(admit(&e, &f));
    tokio::time::sleep(LATE_SLACK * 2).await;
    // It still answers beside the stuck attempt (judged late by now).
    go(admit(&e, &f)).finish(Signal::Alive, &done());
    let mut held = Vec::new();
    let mut parked = Vec::new();
    while parked.len() < 8 {
        match admit(&e, &f) {
            Admission::Go(p) => held.push(p),
            Admission::Park(p) => parked.push(p),
            Admission::Defer { reason, .. } => {
                panic!("deferred ({reason:?}) after {}", parked.len())
            }
        }
    }
    let ep = e.endpoint(&f, None, Instant::now());
    let st = ep.state();
    assert_eq!(st.limiter.stuck(), 1, "the hang is judged late");
    assert!(parked.len() > ep.allowed(&st), "more than one round parked");
}

#[tokio::test]
async fn no_parking_place_or_a_stalled_endpoint_defers() {
    let e = endpoints(1, 0);
    let a = url("http://a.test/");
    let _held = go(admit(&e, &a));
    assert!(matches!(
        admit(&e, &a),
        Admission::Defer {
            reason: DeferReason::Busy,
            ..
        }
    ));
    let e = endpoints(1, 8);
    let _held = go(admit(&e, &a));
    tokio::time::sleep(PARK_WAIT + Duration::from_millis(50)).await;
    // Nothing finished for over a second, alone: the next one waits its
    // turn (the breaker, not the silence, defers for a dead endpoint).
    assert!(matches!(admit(&e, &a), Admission::Park(_)));
    // Beside an endpoint with work, it is not parked.
    let _b = go(admit(&e, &url("http://b.test/")));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(matches!(
        admit(&e, &a),
        Admission::Defer {
            reason: DeferReason::Busy,
            ..
        }
    ));
}

#[tokio::test]
async fn failures_open_the_breaker_and_deliveries_are_deferred_until_a_probe() {
    let e = endpoints(4, 8);
    let a = url("http://a.test/");
    for _ in 0..2 {
        go(admit(&e, &a)).finish(Signal::Failure, &done());
    }
    match admit(&e, &a) {
        Admission::Defer { wait, reason } => {
            assert_eq!(reason, DeferReason::Open);
            assert!(wait <= Duration::from_millis(200));
        }
        _ => panic!("an open breaker defers"),
    }
    tokio::time::sleep(Duration::from_millis(210)).await;
    let probe = go(admit(&e, &a));
    assert!(probe.is_probe());
    assert!(matches!(
        admit(&e, &a),
        Admission::Defer {
            reason: DeferReason::Probing,
            ..
        }
    ));
    probe.finish(Signal::Alive, &done());
    assert!(!go(admit(&e, &a)).is_probe());
}

#[tokio::test]
async fn a_dropped_probe_is_given_back() {
    let e = endpoints(4, 8);
    let a = url("http://a.test/");
    for _ in 0..2 {
        go(admit(&e, &a)).finish(Signal::Failure, &done());
    }
    tokio::time::sleep(Duration::from_millis(210)).await;
    drop(go(admit(&e, &a)));
    assert!(go(admit(&e, &a)).is_probe());
}

#[tokio::test]
async fn a_rate_parks_short_waits_and_defers_long_ones() {
    let settings = EndpointSettings {
        rate: Some("4/s".parse().unwrap()),
        ..Default::default()
    };
    let e = Endpoints::new(settings, 32, Routes::default());
    let a = url("http://a.test/");
    drop(go(admit(&e, &a)));
    // (A rated endpoint parks only near turns, alone too.)
    let mut parked = vec![];
    for _ in 0..4 {
        match admit(&e, &a) {
            Admission::Park(p) => {
                parked.push(tokio::spawn(async move { p.wait(|| async {}).await.0 }))
            }
            _ => panic!("a near turn parks"),
        }
    }
    // Turns at 250, 500, 750 and 1,000 ms are taken; a fifth would wait
    // 1.25 s, beyond PARK_WAIT, and is deferred at once.
    assert!(matches!(
        admit(&e, &a),
        Admission::Defer {
            reason: DeferReason::Rate,
            ..
        }
    ));
    let start = Instant::now();
    for p in parked {
        assert!(matches!(p.await.unwrap(), Admission::Go(_)));
    }
    assert!(start.elapsed() >= Duration::from_millis(950));
}

#[tokio::test]
async fn a_pause_defers_every_delivery_to_the_endpoint() {
    let e = endpoints(4, 8);
    let a = url("http://a.test/");
    go(admit(&e, &a)).finish(Signal::Pause(Duration::from_secs(2)), &done());
    match admit(&e, &a) {
        Admission::Defer { wait, reason } => {
            assert_eq!(reason, DeferReason::Paused);
            assert!(wait > Duration::from_millis(1900));
        }
        _ => panic!("a paused endpoint defers"),
    }
}

#[tokio::test]
async fn a_busy_endpoints_deferrals_are_spread_over_its_schedule() {
    let e = endpoints(1, 0);
    let a = url("http://a.test/");
    // A settled mean on record (16 attempts of 50 ms), then the endpoint
    // is full. Each recorded length lies between the two bounds (a busy
    // machine sleeps longer than asked).
    let (mut shortest, mut longest) = (Duration::MAX, Duration::ZERO);
    for _ in 0..crate::policy::mean::SETTLED {
        let mut p = go(admit(&e, &a));
        let t0 = std::time::Instant::now();
        p.start();
        tokio::time::sleep(Duration::from_millis(50)).await;
        shortest = shortest.min(t0.elapsed());
        p.finish(Signal::Alive, &done());
        longest = longest.max(t0.elapsed());
    }
    let _held = go(admit(&e, &a));
    let waits: Vec<Duration> = (0..4)
        .map(|_| match admit(&e, &a) {
            Admission::Defer { wait, reason } => {
                assert_eq!(reason, DeferReason::Busy);
                wait
            }
            _ => panic!("no parking place: deferred"),
        })
        .collect();
    // Each one a place further on: about the 50 ms an attempt takes.
    for w in waits.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap + Duration::from_millis(10) >= shortest
                && gap <= longest + Duration::from_millis(60),
            "{gap:?} for an attempt of {shortest:?} to {longest:?}"
        );
    }
    assert!(waits[0] >= PARK_WAIT);
}

#[test]
fn the_least_recently_used_endpoints_are_forgotten() {
    let settings = EndpointSettings {
        max_endpoints: 10,
        ..Default::default()
    };
    let e = Endpoints::new(settings, 32, Routes::default());
    for i in 0..100 {
        drop(go(admit(&e, &url(&format!("http://h{i}.test/")))));
    }
    assert!(e.map.lock().unwrap().endpoints.len() <= 10);
}

#[test]
fn defer_delays_grow_with_deferrals_and_keep_the_wait() {
    let mut rng = StdRng::seed_from_u64(7);
    let ms = Duration::from_millis;
    for (wait, deferrals, lo) in [
        (ms(0), 0, 1_000),
        (ms(0), 3, 8_000),
        (ms(5_000), 0, 5_000),
        (ms(0), 30, 30_000),
    ] {
        let d = defer_delay(wait, deferrals, false, &mut rng);
        assert!(
            d >= ms(lo) && d <= ms(lo * 3 / 2),
            "{wait:?} x{deferrals}: {d:?}"
        );
    }
}

/// A busy endpoint's own schedule is the delay: no floor that doubles,
/// whatever the streak (phase 12's stall), and a tenth of jitter.
#[test]
fn a_scheduled_deferral_keeps_its_place_whatever_the_streak() {
    let mut rng = StdRng::seed_from_u64(7);
    let ms = Duration::from_millis;
    for (wait, streak, lo) in [(ms(0), 0, 1_000), (ms(0), 9, 1_000), (ms(2_500), 30, 2_500)] {
        let d = defer_delay(wait, streak, true, &mut rng);
        assert!(
            d >= ms(lo) && d <= ms(lo * 11 / 10),
            "{wait:?} x{streak}: {d:?}"
        );
    }
}

/// What an attempt came to, for the activity: these tests judge the
/// endpoint by its signal alone.
pub(super) fn done() -> super::Outcome {
    super::Outcome {
        success: true,
        status: Some(200),
        error: None,
        retry_due_ms: None,
    }
}
