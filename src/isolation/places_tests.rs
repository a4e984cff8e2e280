//! An endpoint that has not answered yet ([`Endpoint::cold`]) and the
//! parking places.

use super::tests::{admit, done, endpoints, go, settings, url, with_settings};
use super::*;
use crate::policy::{Signal, LATE_SLACK};

/// Admits `a` deliveries while they park; those parked, and the first
/// answer that was not a park.
fn parked_before_not(e: &Endpoints, a: &url::Url) -> (Vec<Parked>, Admission) {
    let mut parked = Vec::new();
    loop {
        match admit(e, a) {
            Admission::Park(p) => parked.push(p),
            other => return (parked, other),
        }
    }
}

/// An endpoint limited to one attempt at a time that answered `answers`
/// times, and has one attempt in flight now.
fn answered(e: &Endpoints, a: &url::Url, answers: usize) -> Pass {
    for _ in 0..answers {
        go(admit(e, a)).finish(Signal::Alive, &done());
    }
    go(admit(e, a))
}

/// With 64 places: an endpoint that answered `answers` times (each in a
/// few microseconds) and has an attempt in flight, beside another with
/// one; its deliveries parked, and the first answer that was not a park.
fn beside_another(answers: usize) -> (Vec<Parked>, Admission) {
    let e = endpoints(1, 64);
    let (a, b) = (url("http://a.test/"), url("http://b.test/"));
    let _busy = answered(&e, &a, answers);
    let _b = go(admit(&e, &b));
    parked_before_not(&e, &a)
}

#[tokio::test]
async fn beside_another_endpoint_a_cold_one_parks_its_share_of_the_places() {
    // No answer yet, its first attempt in flight.
    let (parked, next) = beside_another(0);
    assert_eq!(parked.len(), 32, "64 places, two active endpoints");
    assert!(matches!(
        next,
        Admission::Defer {
            reason: DeferReason::Busy,
            ..
        }
    ));
}

#[tokio::test]
async fn once_it_answered_it_parks_what_it_can_take_within_the_wait() {
    // One answer of a few microseconds: every parked one is due at once.
    let (parked, _) = beside_another(1);
    // Every place but the one `b`'s attempt took from the helper's own.
    assert!(parked.len() > 32, "parked {}", parked.len());
}

#[tokio::test]
async fn alone_a_cold_endpoint_parks_in_every_place() {
    let e = endpoints(1, 16);
    let a = url("http://a.test/");
    let _busy = answered(&e, &a, 0);
    let (parked, _) = parked_before_not(&e, &a);
    assert_eq!(parked.len(), 16);
}

#[tokio::test]
async fn beside_another_endpoint_its_first_answers_count_in_the_estimate() {
    let e = endpoints(1, 64);
    let (a, b) = (url("http://a.test/"), url("http://b.test/"));
    let _b = go(admit(&e, &b));
    // One answer that took 100 ms: not settled (16 answers), but beside
    // another endpoint it counts.
    let started = std::time::Instant::now();
    let slow = go(admit(&e, &a));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    slow.finish(Signal::Alive, &done());
    // What the endpoint measured: 100 ms, more on a loaded machine.
    let took = started.elapsed().as_millis() as usize;
    let _busy = go(admit(&e, &a));
    let (parked, next) = parked_before_not(&e, &a);
    // A second's worth at one attempt at a time, give or take one: far
    // from the 32 places it would park with no answer counted.
    let want = 1_000 / took;
    let near = want.saturating_sub(2)..=want + 1;
    assert!(
        near.contains(&parked.len()),
        "parked {} after {took} ms",
        parked.len()
    );
    assert!(matches!(next, Admission::Defer { .. }));
}

#[tokio::test]
async fn an_endpoint_that_never_answered_parks_one_round_while_others_have_work() {
    let e = with_settings(settings(64));
    let (a, hang) = (url("http://a.test/"), url("http://hang.test/"));
    let _a = go(admit(&e, &a));
    // A new endpoint starts at one in flight.
    let _hung = go(admit(&e, &hang));
    // Not in doubt before it had time to answer.
    tokio::time::sleep(LATE_SLACK + Duration::from_millis(20)).await;
    let _parked: Vec<Parked> = (0..1)
        .map(|_| match admit(&e, &hang) {
            Admission::Park(p) => p,
            _ => panic!("one round parks"),
        })
        .collect();
    assert!(matches!(
        admit(&e, &hang),
        Admission::Defer {
            reason: DeferReason::Busy,
            ..
        }
    ));
}

/// One delivery parked while another endpoint had work (so without a
/// worker slot), two more behind it once its endpoint was alone (each
/// keeping its slot, and between them every slot). When room comes, the
/// first is let go and waits for a slot the other two hold, while they
/// wait for the room it holds: it gives its turn back after
/// [`PARK_TIMEOUT`] and they go. (The likely cause of a worker CI saw
/// silent for minutes with its deliveries unfinished.)
#[tokio::test]
async fn a_delivery_let_go_without_a_slot_gives_its_turn_back_to_those_holding_the_slots() {
    let e = endpoints(1, 8);
    let (a, b) = (url("http://a.test/"), url("http://b.test/"));
    let busy = go(admit(&e, &a));
    let other = go(admit(&e, &b));
    // Counted: two endpoints have work.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let Admission::Park(first) = admit(&e, &a) else {
        panic!("a is at its limit: it parks");
    };
    assert!(!first.keeps_slot(), "beside b it parks without its slot");
    other.finish(Signal::Alive, &done());
    tokio::time::sleep(ACTIVE_WINDOW + Duration::from_millis(150)).await;
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    let mut keepers = Vec::new();
    for _ in 0..2 {
        let Admission::Park(p) = admit(&e, &a) else {
            panic!("alone, it parks behind the first");
        };
        assert!(p.keeps_slot(), "alone it parks keeping its slot");
        let slot = slots.clone().try_acquire_owned().unwrap();
        keepers.push(tokio::spawn(async move {
            let answer = p.wait(|| async {}).await.0;
            let went = matches!(answer, Admission::Go(_));
            if let Admission::Go(pass) = answer {
                pass.finish(Signal::Alive, &done());
            }
            drop(slot);
            went
        }));
    }
    let held = slots.clone();
    let first = tokio::spawn(async move { first.wait(|| held.clone().acquire_owned()).await });
    busy.finish(Signal::Alive, &done());
    let bound = PARK_TIMEOUT + Duration::from_secs(3);
    let (answer, slot) = tokio::time::timeout(bound, first)
        .await
        .expect("the first one gave its turn back")
        .unwrap();
    assert!(slot.is_none(), "without a slot");
    assert!(matches!(
        answer,
        Admission::Defer {
            reason: DeferReason::Busy,
            ..
        }
    ));
    for k in keepers {
        let went = tokio::time::timeout(bound, k)
            .await
            .expect("it went")
            .unwrap();
        assert!(went, "a keeper is let go once the turn is given back");
    }
}
