use super::*;

fn policy() -> BreakerPolicy {
    BreakerPolicy {
        failures: 3,
        ratio: 0.5,
        window: Duration::from_secs(10),
        min_requests: 10,
        open: Duration::from_secs(1),
        max_open: Duration::from_secs(4),
        probes: 1,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn consecutive_failures_open_it_and_a_success_resets_the_count() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    assert_eq!(
        b.record(t0, &p, Signal::Failure, false, b.generation()),
        None
    );
    assert_eq!(
        b.record(t0, &p, Signal::Failure, false, b.generation()),
        None
    );
    assert_eq!(b.record(t0, &p, Signal::Alive, false, b.generation()), None);
    assert_eq!(
        b.record(t0, &p, Signal::Failure, false, b.generation()),
        None
    );
    assert_eq!(
        b.record(t0, &p, Signal::Failure, false, b.generation()),
        None
    );
    let opened = b.record(t0, &p, Signal::Failure, false, b.generation());
    assert_eq!(
        opened,
        Some(Transition::Opened {
            for_: secs(1.0),
            reason: "3 consecutive failures".into()
        })
    );
    assert_eq!(
        b.gate(t0 + secs(0.25), &p, true),
        Gate::Wait(secs(0.75), WaitReason::Open)
    );
}

#[test]
fn a_failure_ratio_over_the_window_opens_it() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    // Alternating: never 3 in a row, but half of 10 failed.
    for i in 0..9 {
        let s = if i % 2 == 0 {
            Signal::Alive
        } else {
            Signal::Failure
        };
        assert_eq!(
            b.record(t0, &p, s, false, b.generation()),
            None,
            "attempt {i}"
        );
    }
    let t = b.record(t0, &p, Signal::Failure, false, b.generation());
    assert!(
        matches!(t, Some(Transition::Opened { ref reason, .. }) if reason == "5 of 10 attempts failed")
    );
}

#[test]
fn the_window_forgets_old_attempts() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    for i in 0..9 {
        let s = if i % 2 == 0 {
            Signal::Alive
        } else {
            Signal::Failure
        };
        b.record(t0, &p, s, false, b.generation());
    }
    // Eleven seconds later the window is new: one failure is not a ratio.
    assert_eq!(
        b.record(t0 + secs(11.0), &p, Signal::Failure, false, b.generation()),
        None
    );
    assert_eq!(b.state(), State::Closed);
}

fn opened(p: &BreakerPolicy, t0: Instant) -> Breaker {
    let mut b = Breaker::new(t0);
    for _ in 0..p.failures {
        b.record(t0, p, Signal::Failure, false, b.generation());
    }
    assert!(matches!(b.state(), State::Open { .. }));
    b
}

#[test]
fn half_open_lets_one_probe_through_and_a_success_closes_it() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = opened(&p, t0);
    let t1 = t0 + secs(1.0);
    assert_eq!(b.gate(t1, &p, false), Gate::Probe, "looking takes no probe");
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    assert_eq!(
        b.gate(t1, &p, true),
        Gate::Wait(secs(0.5), WaitReason::Probing),
        "one probe at a time"
    );
    let t = b.record(t1 + secs(0.1), &p, Signal::Alive, true, b.generation());
    assert_eq!(t, Some(Transition::Closed));
    assert_eq!(b.gate(t1 + secs(0.1), &p, true), Gate::Pass);
}

#[test]
fn failed_probes_double_the_open_time_up_to_the_cap() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = opened(&p, t0);
    let mut opens = vec![];
    for _ in 0..4 {
        let now = match b.state() {
            State::Open { until } => until,
            s => panic!("not open: {s:?}"),
        };
        assert_eq!(b.gate(now, &p, true), Gate::Probe);
        match b.record(now, &p, Signal::Failure, true, b.generation()) {
            Some(Transition::Opened { for_, reason }) => {
                assert_eq!(reason, "a probe failed");
                opens.push(for_.as_secs());
            }
            t => panic!("expected an opening, got {t:?}"),
        }
    }
    assert_eq!(opens, [2, 4, 4, 4]);
    // A success closes it, and the next opening is short again.
    let until = match b.state() {
        State::Open { until } => until,
        s => panic!("not open: {s:?}"),
    };
    assert_eq!(b.gate(until, &p, true), Gate::Probe);
    assert_eq!(
        b.record(until, &p, Signal::Alive, true, b.generation()),
        Some(Transition::Closed)
    );
    let mut again = None;
    for _ in 0..3 {
        again = b.record(until, &p, Signal::Failure, false, b.generation());
    }
    assert!(matches!(again, Some(Transition::Opened { for_, .. }) if for_ == secs(1.0)));
}

#[test]
fn a_released_probe_lets_the_next_one_through() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = opened(&p, t0);
    let t1 = t0 + secs(1.0);
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    b.release_probe(b.generation());
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
}

#[test]
fn retry_after_pauses_the_endpoint_without_opening_it() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    assert_eq!(
        b.record(t0, &p, Signal::Pause(secs(2.0)), false, b.generation()),
        None
    );
    assert_eq!(
        b.gate(t0 + secs(0.5), &p, true),
        Gate::Wait(secs(1.5), WaitReason::Paused)
    );
    assert_eq!(b.gate(t0 + secs(2.0), &p, true), Gate::Pass);
    assert_eq!(b.state(), State::Closed);
    // A pause is capped by max_open, so a hostile Retry-After cannot
    // silence an endpoint for a day.
    b.record(t0, &p, Signal::Pause(secs(86_400.0)), false, b.generation());
    assert_eq!(
        b.gate(t0, &p, true),
        Gate::Wait(secs(4.0), WaitReason::Paused)
    );
}

#[test]
fn turned_off_it_never_opens_but_still_pauses() {
    let p = BreakerPolicy {
        failures: 0,
        ..policy()
    };
    let t0 = Instant::now();
    let mut b = Breaker::new(t0);
    for _ in 0..100 {
        assert_eq!(
            b.record(t0, &p, Signal::Failure, false, b.generation()),
            None
        );
    }
    assert_eq!(b.gate(t0, &p, true), Gate::Pass);
    b.record(t0, &p, Signal::Pause(secs(1.0)), false, b.generation());
    assert!(matches!(
        b.gate(t0, &p, true),
        Gate::Wait(_, WaitReason::Paused)
    ));
}

#[test]
fn attempts_that_started_before_it_opened_do_not_move_it() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    let old = b.generation();
    for _ in 0..3 {
        b.record(t0, &p, Signal::Failure, false, old);
    }
    let t1 = t0 + secs(1.0);
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    // A hanging attempt from before the opening times out now: not a probe.
    assert_eq!(b.record(t1, &p, Signal::Failure, false, old), None);
    assert_eq!(b.record(t1, &p, Signal::Alive, false, old), None);
    assert!(matches!(b.state(), State::HalfOpen { probing: 1 }));
    // The real probe decides.
    let t = b.record(t1, &p, Signal::Alive, true, b.generation());
    assert_eq!(t, Some(Transition::Closed));
}

#[test]
fn application_errors_never_open_it_and_reset_the_count() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    for i in 0..1000 {
        let t = t0 + secs(f64::from(i) * 0.01);
        assert_eq!(
            b.record(t, &p, Signal::AppError, false, b.generation()),
            None
        );
    }
    assert_eq!(b.state(), State::Closed);
    // Two failures short of opening, an application error in between:
    // the count starts again.
    for _ in 0..p.failures - 1 {
        b.record(t0, &p, Signal::Failure, false, b.generation());
    }
    b.record(t0, &p, Signal::AppError, false, b.generation());
    for _ in 0..p.failures - 1 {
        assert_eq!(
            b.record(t0, &p, Signal::Failure, false, b.generation()),
            None
        );
    }
    assert_eq!(b.state(), State::Closed);
}

#[test]
fn a_probe_answered_with_an_application_error_closes_it() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = opened(&p, t0);
    let after = t0 + p.open + secs(0.1);
    assert_eq!(b.gate(after, &p, true), Gate::Probe);
    let t = b.record(after, &p, Signal::AppError, true, b.generation());
    assert_eq!(
        t,
        Some(Transition::Closed),
        "the endpoint answered: it is up"
    );
    assert_eq!(b.gate(after, &p, true), Gate::Pass);
}

#[test]
fn failures_count_as_consecutive_by_when_their_attempts_started() {
    // The consecutive rule alone (no ratio rule).
    let p = BreakerPolicy {
        min_requests: u32::MAX,
        ..policy()
    };
    let t0 = Instant::now();
    let mut b = Breaker::new(t0);
    // A flaky endpoint: hangs started together at t0 and time out together
    // at t0 + 1 s, but attempts started after them answered meanwhile.
    let answered = t0 + secs(0.5);
    b.record_started(answered, answered, &p, Signal::Alive, false, b.generation());
    for _ in 0..3 * p.failures {
        let t = b.record_started(
            t0 + secs(1.0),
            t0,
            &p,
            Signal::Failure,
            false,
            b.generation(),
        );
        assert_eq!(t, None, "older than an answer: not a run");
    }
    assert_eq!(b.state(), State::Closed);
    // Failures of attempts started after the last answer are a run.
    let later = t0 + secs(0.6);
    for _ in 0..p.failures - 1 {
        b.record_started(
            t0 + secs(2.0),
            later,
            &p,
            Signal::Failure,
            false,
            b.generation(),
        );
    }
    let t = b.record_started(
        t0 + secs(2.0),
        later,
        &p,
        Signal::Failure,
        false,
        b.generation(),
    );
    assert!(matches!(t, Some(Transition::Opened { .. })), "{t:?}");
}

#[test]
fn open_since_spans_every_reopening_until_it_closes() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    let fail = |b: &mut Breaker, at: Instant, probe| {
        let g = b.generation();
        b.record(at, &p, Signal::Failure, probe, g)
    };
    for _ in 0..3 {
        fail(&mut b, t0, false);
    }
    assert_eq!(b.open_since(), Some(t0));
    // Half-open after 1 s; the probe fails: open again, still since t0.
    let t1 = t0 + secs(1.5);
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    assert!(fail(&mut b, t1, true).is_some());
    assert_eq!(b.open_since(), Some(t0));
    let t2 = t1 + secs(3.0);
    assert_eq!(b.gate(t2, &p, true), Gate::Probe);
    let g = b.generation();
    assert_eq!(
        b.record(t2, &p, Signal::AppError, true, g),
        Some(Transition::Closed)
    );
    assert_eq!((b.open_since(), b.closed_at()), (None, Some(t2)));
}

#[test]
fn trip_opens_only_a_closed_breaker_and_close_ends_any_state() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    assert!(b.trip(t0, &p));
    assert_eq!(
        b.gate(t0, &p, false),
        Gate::Wait(secs(1.0), WaitReason::Open)
    );
    assert!(!b.trip(t0 + secs(0.5), &p), "already open");
    assert_eq!(b.open_since(), Some(t0));
    // A probe taken before the close reports to a generation that is over.
    let t1 = t0 + secs(1.0);
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    let g = b.generation();
    assert!(b.close(t1));
    assert_eq!(b.record(t1, &p, Signal::Failure, true, g), None);
    assert_eq!(b.state(), State::Closed);
    assert!(!b.close(t1), "already closed");
    let off = BreakerPolicy {
        failures: 0,
        ..policy()
    };
    assert!(
        !Breaker::new(t0).trip(t0, &off),
        "a breaker that is off stays closed"
    );
}

#[test]
fn one_probe_candidate_per_opening() {
    let (p, t0) = (policy(), Instant::now());
    let mut b = Breaker::new(t0);
    assert!(!b.take_candidate(), "closed: no candidate");
    b.trip(t0, &p);
    assert!(b.take_candidate());
    assert!(!b.take_candidate(), "one per opening");
    let t1 = t0 + secs(1.0);
    assert_eq!(b.gate(t1, &p, true), Gate::Probe);
    assert!(!b.take_candidate(), "half-open: the probe itself goes");
    let g = b.generation();
    b.record(t1, &p, Signal::Failure, true, g);
    assert!(b.take_candidate(), "open again: a new candidate");
}
