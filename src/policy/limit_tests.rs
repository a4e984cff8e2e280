use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One round trip with the endpoint full: `limit` attempts start at `*t`,
/// all end `took` later with `signal(i)`. Returns the limit after it.
fn round(
    l: &mut Limiter,
    t: &mut Instant,
    took: Duration,
    signal: impl Fn(usize) -> Signal,
) -> usize {
    let tickets: Vec<Ticket> = (0..l.limit()).map(|_| l.start(*t)).collect();
    *t += took;
    for (i, tk) in tickets.into_iter().enumerate() {
        l.finish(*t, tk, took, signal(i));
    }
    l.limit()
}

fn alive(_: usize) -> Signal {
    Signal::Alive
}

#[test]
fn a_new_endpoint_starts_at_one_and_a_healthy_one_doubles_each_round_trip() {
    for max in [1, 3, 8, 32] {
        assert_eq!(LimitPolicy::for_max(max).initial, 1);
    }
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    assert_eq!(l.limit(), 1);
    let seen: Vec<usize> = (0..6)
        .map(|_| round(&mut l, &mut t, ms(2), alive))
        .collect();
    assert_eq!(seen[0], 2, "doubles in its first round trip");
    for w in seen.windows(2) {
        assert!(w[1] * 2 >= w[0] * 3 || w[1] == 32, "{seen:?}");
    }
    assert!(seen[4] >= 16, "16 within five round trips: {seen:?}");
    assert_eq!(seen[5], 32, "at max within six round trips: {seen:?}");
    round(&mut l, &mut t, ms(2), alive);
    assert_eq!(l.limit(), 32, "never above max");
    // A 500 ms endpoint gets there within six round trips too.
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    let start = t;
    while l.limit() < 32 {
        round(&mut l, &mut t, ms(500), alive);
    }
    assert!(t - start <= ms(3000), "{:?}", t - start);
}

#[test]
fn an_endpoint_that_does_not_use_its_limit_does_not_inflate_it() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..1000 {
        let tk = l.start(t);
        t += ms(1);
        l.finish(t, tk, ms(1), Signal::Alive);
    }
    assert_eq!(
        l.limit(),
        3,
        "one at a time earns no more than twice what it uses, and one"
    );
}

#[test]
fn a_healthy_endpoint_that_turns_slow_falls_and_rises_again_when_it_recovers() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..20 {
        round(&mut l, &mut t, ms(2), alive);
    }
    assert_eq!(l.limit(), 32);
    // It turns slow: 2 ms → 400 ms. Each late round halves the limit.
    let fell_from = t;
    while l.limit() > 2 {
        round(&mut l, &mut t, ms(400), alive);
        assert!(
            t - fell_from <= ms(2000),
            "still {} after {:?}",
            l.limit(),
            t - fell_from
        );
    }
    // It recovers: fast answers bring the baseline down at once and the
    // limit doubles back up within a few round trips.
    let rose_from = t;
    while l.limit() < 32 {
        round(&mut l, &mut t, ms(2), alive);
    }
    assert!(t - rose_from <= ms(200), "{:?}", t - rose_from);
}

#[test]
fn an_endpoint_slow_for_good_earns_its_limit_back_at_its_new_pace() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..20 {
        round(&mut l, &mut t, ms(2), alive);
    }
    for _ in 0..60 {
        round(&mut l, &mut t, ms(300), alive);
    }
    assert!(l.baseline().unwrap() > ms(100), "{:?}", l.baseline());
    assert_eq!(l.limit(), 32, "300 ms is its normal now");
}

#[test]
fn a_hang_counts_while_in_flight_before_any_timeout() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..20 {
        round(&mut l, &mut t, ms(2), alive);
    }
    assert_eq!(l.limit(), 32);
    // It hangs: its 32 attempts go out and nothing comes back.
    let hung: Vec<Ticket> = (0..32).map(|_| l.start(t)).collect();
    t += ms(40);
    l.check(t);
    assert_eq!(l.limit(), 32, "not late yet (3 × 2 ms + 50 ms)");
    t += ms(30);
    l.check(t);
    // Its rounds of attempts are late: halved 70 ms in, once per round
    // (the 32 fill the open round and the next), long before any timeout
    // (the slots it holds cannot be taken back; the limit says how many it
    // may take when they come free).
    let cut = l.limit();
    assert!((8..=16).contains(&cut), "{cut}");
    assert_eq!(l.stuck(), 32);
    // Their timeouts, later, are not counted twice.
    for tk in hung {
        l.finish(t + ms(10_000), tk, ms(10_000), Signal::Failure);
    }
    assert_eq!(l.limit(), cut);
    assert_eq!(l.stuck(), 0);
    // It stays hanging: each round it is given halves it, down to one.
    let mut seen = vec![];
    for _ in 0..4 {
        t += ms(10_000);
        let hung: Vec<Ticket> = (0..l.limit()).map(|_| l.start(t)).collect();
        l.check(t + ms(100));
        for tk in hung {
            l.finish(t + ms(1000), tk, ms(1000), Signal::Failure);
        }
        seen.push(l.limit());
    }
    assert!(seen[0] <= 8, "a few slots after one more timeout: {seen:?}");
    assert!(seen.windows(2).all(|w| w[1] <= w[0]), "{seen:?}");
    assert!(seen[3] <= 2, "{seen:?}");
}

#[test]
fn an_endpoint_that_hangs_from_the_start_falls_to_one() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..3 {
        round(&mut l, &mut t, ms(1000), |_| Signal::Failure);
    }
    assert_eq!(l.limit(), 1);
    round(&mut l, &mut t, ms(1000), |_| Signal::Failure);
    assert_eq!(l.limit(), 1, "never below one: a probe must still go");
}

#[test]
fn a_flaky_endpoint_keeps_its_limit() {
    // 30% fast 500s, 5% timeouts: an endpoint that is up.
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(16), t);
    for r in 0..200 {
        round(&mut l, &mut t, ms(2), |i| match (i + r) % 20 {
            0 => Signal::Failure,
            1..=6 => Signal::AppError,
            _ => Signal::Alive,
        });
    }
    assert_eq!(l.limit(), 16);
}

#[test]
fn overload_answers_halve_it_and_unjudged_attempts_count_for_nothing() {
    let mut t = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    for _ in 0..8 {
        round(&mut l, &mut t, ms(2), alive);
    }
    assert_eq!(l.limit(), 32);
    // Abandoned attempts and ones that said nothing count for nothing.
    let tk = l.start(t);
    l.abandon(tk);
    round(&mut l, &mut t, ms(2), |_| Signal::Nothing);
    assert_eq!(l.limit(), 32);
    assert_eq!(l.in_flight(), 0);
    let mut l = Limiter::new(LimitPolicy::for_max(32), t);
    while l.limit() < 32 {
        round(&mut l, &mut t, ms(2), alive);
    }
    // 32 attempts: they complete the open round (if any) and a round of
    // 20, and start the next: halved once per round judged.
    round(&mut l, &mut t, ms(2), |_| Signal::Pause(ms(1000)));
    let cut = l.limit();
    assert!((8..=16).contains(&cut), "429s halve it per round: {cut}");
}

/// Steps a simulated endpoint 1 ms at a time for `secs`: attempts start
/// while the limit (and `slots`) allow, each lasting what `took(n)` says
/// for the n-th attempt (`None`: hangs until a 1 s timeout). Returns the
/// limit averaged over the run.
fn simulate(slots: usize, secs: u64, took: impl Fn(u64) -> Option<Duration>) -> f64 {
    let t0 = Instant::now();
    let mut l = Limiter::new(LimitPolicy::for_max(slots), t0);
    let mut flight: Vec<(Instant, Ticket, Duration, Signal)> = vec![];
    let (mut n, mut sum) = (0u64, 0.0);
    for step in 0..secs * 1000 {
        let t = t0 + ms(step);
        let (done, still): (Vec<_>, Vec<_>) = flight.into_iter().partition(|f| f.0 <= t);
        flight = still;
        for (_, tk, d, sig) in done {
            l.finish(t, tk, d, sig);
        }
        l.check(t);
        while flight.len() < l.limit().min(slots) {
            n += 1;
            let (d, sig) = match took(n) {
                Some(d) => (
                    d,
                    if n % 10 < 3 {
                        Signal::AppError
                    } else {
                        Signal::Alive
                    },
                ),
                None => (ms(1000), Signal::Failure),
            };
            flight.push((t + d, l.start(t), d, sig));
        }
        sum += l.limit() as f64;
    }
    sum / (secs * 1000) as f64
}

#[test]
fn a_flaky_endpoint_keeps_its_limit_when_its_hangs_fill_the_slots() {
    // 30% quick 500s, 5% hangs to a 1 s timeout, the rest 2 ms: the hangs
    // hold most slots, so answers come in bursts between silences.
    use rand::{rngs::StdRng, Rng, SeedableRng};
    for seed in 0..5 {
        let mut rng = StdRng::seed_from_u64(seed);
        let hangs: Vec<bool> = (0..100_000).map(|_| rng.random_bool(0.05)).collect();
        let flaky = |n: u64| (!hangs[n as usize % hangs.len()]).then(|| ms(2));
        let avg = simulate(16, 20, flaky);
        assert!(avg >= 14.0, "seed {seed}: average limit {avg:.1} of 16");
    }
}

#[test]
fn a_simulated_hang_falls_to_a_few_slots() {
    let avg = simulate(16, 10, |n| (n < 200).then(|| ms(2)));
    assert!(
        avg <= 4.0,
        "average limit {avg:.1} of 16 for a hanging endpoint"
    );
}
