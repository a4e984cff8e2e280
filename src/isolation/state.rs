//! One endpoint's limits and state, shared by the admission (`mod.rs`),
//! the passes (`pass.rs`) and the parked deliveries (`park.rs`): how many
//! attempts it may have in flight now, why a delivery is deferred, how
//! long a parked one would wait, and the schedule deferred ones are
//! spread over.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::activity::Activity;
use crate::config::EndpointLimits;
use crate::message::target::Target;
use crate::policy::{Breaker, LimitPolicy, Limiter, Pacer, WindowMean, LATE_SLACK};

use super::reason::DeferReason;
use crate::telemetry;

/// While other endpoints have work, a parked delivery is expected to get
/// its turn within this long, or it is deferred instead: their deliveries
/// need the parking places.
pub const PARK_WAIT: Duration = Duration::from_secs(1);
/// Alone, an endpoint's deliveries wait their turn in order for up to
/// this long (a slow endpoint is not a dead one): there is nobody else to
/// make room for, and a deferral is a broker round trip.
pub const LONE_PARK_WAIT: Duration = Duration::from_secs(10);
/// While other endpoints have work, a parked delivery that waited this
/// long is deferred after all (its endpoint slowed after it was parked).
pub const PARK_TIMEOUT: Duration = Duration::from_secs(5);
/// How far ahead a busy endpoint's deferrals are spread at most. A
/// backlog longer than that circulates (deferred again when it comes back)
/// rather than sitting for minutes behind an endpoint that may recover in
/// seconds; a far rate turn is still waited for in full.
pub const MAX_SCHEDULE: Duration = Duration::from_secs(60);
/// An endpoint that answered before is in doubt after this long without
/// an answer (or its late threshold, if longer): a flaky endpoint's few
/// hangs can hold all of a small limit for a few hundred milliseconds.
pub const DOUBT_AFTER: Duration = Duration::from_millis(500);
/// An endpoint that had a delivery within this long competes for the
/// slots. The queue's order hides which endpoints have work waiting
/// behind the next delivery; recent arrivals stand in for them.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(1);

/// The worker's slots and how many endpoints compete for them: alone, an
/// endpoint may use every slot; while several have had deliveries within
/// [`ACTIVE_WINDOW`], each may use its fair share (the slots over the
/// active endpoints) and whatever the others do not claim (max-min
/// fairness, from the demands seen at the last count).
pub struct Shares {
    concurrency: usize,
    /// The worker's parking places (`--max-parked`).
    places: usize,
    active: AtomicUsize,
    /// The slots all active endpoints claimed at the last count.
    claimed: AtomicUsize,
}

impl Shares {
    pub(super) fn new(concurrency: usize, places: usize) -> Self {
        Shares {
            concurrency: concurrency.max(1),
            places,
            active: AtomicUsize::new(0),
            claimed: AtomicUsize::new(0),
        }
    }

    pub(super) fn set_active(&self, n: usize) {
        self.active.store(n, Ordering::Relaxed);
    }

    pub(super) fn set_claimed(&self, n: usize) {
        self.claimed.store(n, Ordering::Relaxed);
    }

    /// Whether another endpoint has work too.
    pub(super) fn contended(&self) -> bool {
        self.active.load(Ordering::Relaxed) > 1
    }

    /// Each active endpoint's fair share of the slots, at least one.
    pub(super) fn fair(&self) -> usize {
        (self.concurrency / self.active.load(Ordering::Relaxed).max(1)).max(1)
    }

    /// Each active endpoint's even share of the parking places: what an
    /// endpoint whose latency is not known yet may park while others have
    /// work ([`Endpoint::cold`]).
    pub(super) fn fair_places(&self) -> usize {
        self.places / self.active.load(Ordering::Relaxed).max(1)
    }

    /// An endpoint's share: every slot alone; else its fair share, or
    /// more if the others claim less (`own`: its own claim).
    pub(super) fn share(&self, own: usize) -> usize {
        if !self.contended() {
            return self.concurrency;
        }
        let others = self.claimed.load(Ordering::Relaxed).saturating_sub(own);
        self.fair().max(self.concurrency.saturating_sub(others))
    }

    /// What an endpoint with `demand` ([`Endpoint::demand`]) claims: its
    /// demand and one more (its next delivery), up to its own limit (a
    /// hanging endpoint at one claims one: a slot it could not use would
    /// be a slot the others lose) and its fair share.
    pub(super) fn claim(&self, demand: usize, own_limit: usize) -> usize {
        (demand + 1).min(own_limit.max(1)).min(self.fair())
    }
}

/// One endpoint's limits and state.
pub struct Endpoint {
    /// `scheme://host:port`, or the route's URL prefix: for log lines.
    pub(super) key: String,
    /// Its metrics label (bounded, see [`Endpoints::label`]).
    pub(super) label: String,
    /// The key as operators name it (`None` if it does not parse).
    pub(super) target: Option<Target>,
    pub(super) limits: EndpointLimits,
    pub(super) shares: Arc<Shares>,
    /// Its claim at the last count (see [`Shares::claim`]).
    pub(super) claim: AtomicUsize,
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    pub(super) breaker: Breaker,
    pub(super) pacer: Pacer,
    /// The adaptive limit and the attempts in flight.
    pub(super) limiter: Limiter,
    /// The mean of its recent attempt durations, hangs and timeouts
    /// included: with its limit, the pace its queue moves at.
    pub(super) latency: WindowMean,
    /// Parked deliveries let go, not yet attempting (waiting for a slot).
    pub(super) reserved: usize,
    /// Parked deliveries' tickets, in arrival order, each with the
    /// [`Notify`] that wakes it: only the front is woken when room comes
    /// (no herd of every parked delivery on each ended attempt).
    pub(super) queue: VecDeque<(u64, Arc<Notify>)>,
    pub(super) next_ticket: u64,
    /// Until when the deliveries deferred as busy or rate-limited are
    /// expected to keep the endpoint occupied (see [`Endpoint::deferral`]).
    pub(super) deferred_until: Option<Instant>,
    /// The limit last shown on its gauge.
    pub(super) shown_limit: usize,
    /// Moving share of answers that were application errors, and the
    /// value last shown on its gauge.
    pub(super) app_errors: f64,
    pub(super) shown_app_errors: f64,
    /// What it did lately, for operators and the failing-since clock.
    pub(super) activity: Activity,
}

impl Endpoint {
    pub(super) fn new(
        key: String,
        label: String,
        limits: EndpointLimits,
        shares: Arc<Shares>,
        now: Instant,
    ) -> Self {
        let policy = limits
            .adaptive
            .unwrap_or_else(|| LimitPolicy::for_max(limits.concurrency));
        let state = State {
            breaker: Breaker::new(now),
            pacer: Pacer::default(),
            limiter: Limiter::new(policy, now),
            latency: WindowMean::default(),
            reserved: 0,
            queue: VecDeque::new(),
            next_ticket: 0,
            deferred_until: None,
            shown_limit: 0,
            app_errors: 0.0,
            shown_app_errors: 0.0,
            activity: Activity::default(),
        };
        let ep = Endpoint {
            target: Target::parse(&key).ok(),
            key,
            label,
            limits,
            shares,
            claim: AtomicUsize::new(0),
            state: Mutex::new(state),
        };
        ep.show_limit(&mut ep.state());
        ep
    }

    /// The state, even if a holder panicked: it is counters only.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its own limit: the adaptive one under the ceiling, or the ceiling
    /// with isolation off.
    pub(super) fn own_limit(&self, st: &State) -> usize {
        match self.limits.adaptive {
            Some(_) => st.limiter.limit().min(self.limits.concurrency),
            None => self.limits.concurrency,
        }
    }

    /// Attempts it may have in flight now: its own limit, and its share
    /// while other endpoints have work.
    pub(super) fn allowed(&self, st: &State) -> usize {
        match self.limits.adaptive {
            Some(_) => {
                let own = self.claim.load(Ordering::Relaxed);
                self.own_limit(st).min(self.shares.share(own))
            }
            None => self.limits.concurrency,
        }
    }

    /// Attempts in flight, let go and parked, up to its own limit: what
    /// it can use of the slots (a hanging endpoint's parked deliveries
    /// cannot go, so they claim nothing).
    pub(super) fn demand(&self, st: &State) -> usize {
        let wants = st.limiter.in_flight() + st.reserved + st.queue.len();
        wants.min(self.own_limit(st))
    }

    /// Whether one more attempt may start (parked ones let go count).
    pub(super) fn has_room(&self, st: &State) -> bool {
        st.limiter.in_flight() + st.reserved < self.allowed(st)
    }

    /// Judges the attempts in flight (see [`Limiter::check`]).
    pub(super) fn check(&self, st: &mut State, now: Instant) {
        if st.limiter.check(now) {
            self.show_limit(st);
        }
    }

    pub(super) fn show_limit(&self, st: &mut State) {
        let limit = self.own_limit(st);
        if limit != st.shown_limit {
            st.shown_limit = limit;
            let label = self.label.clone();
            metrics::gauge!(telemetry::ENDPOINT_LIMIT, "endpoint" => label).set(limit as f64);
        }
    }

    /// While other endpoints have work: no answer for twice its usual
    /// latency, and for at least [`PARK_WAIT`], while attempts are in
    /// flight. It makes no progress (hangs, or every attempt fails
    /// slowly), and its deliveries must not hold parking places the
    /// others need. Alone it is never stalled: a flaky receiver whose few
    /// hangs hold its slots for a second answers again right after, and
    /// deferring its backlog (at a floor that doubles per deferral) left
    /// a drain of six seconds waiting 78. Alone, its deliveries wait
    /// their turn: the silence counts in their estimate (up to
    /// [`LONE_PARK_WAIT`]), and the breaker defers for an endpoint that
    /// is down.
    pub(super) fn stalled(&self, st: &State, now: Instant) -> bool {
        let usual = st.limiter.baseline().unwrap_or_default() * 2;
        self.shares.contended() && st.limiter.silent_for(now) > usual.max(PARK_WAIT)
    }

    /// In doubt: it may be hanging. Nothing it had in flight answered for
    /// [`DOUBT_AFTER`] or its late threshold (or [`LATE_SLACK`] before its
    /// first answer). Attempts stuck among answered ones are not doubt: a
    /// flaky endpoint whose few hangs hold most of its slots still answers.
    pub(super) fn in_doubt(&self, st: &State, now: Instant) -> bool {
        let quiet = match st.limiter.late_after() {
            Some(late) => late.max(DOUBT_AFTER),
            None => LATE_SLACK,
        };
        st.limiter.silent_for(now) > quiet
    }

    /// It has not answered yet, so [`Endpoint::park_estimate`] counts only
    /// the silence, and every delivery looks due at once.
    ///
    /// Why it matters: a delivery takes a parking place before it is
    /// pulled. At a cold start beside a healthy endpoint, one answering in
    /// 500 ms parked every delivery its lane handed over before its first
    /// answers; with a lane's room past the worker's 256 places they took
    /// every one, and the pump stopped for the healthy lane too (bench
    /// phase 9: 0.18 of alone). So a cold endpoint parks no more than its
    /// share of the places ([`Shares::fair_places`]) while others have
    /// work. Only until its first answer: a healthy endpoint is cold too,
    /// and deferring what its lane handed over in its first milliseconds
    /// held its lane's acks for seconds.
    pub(super) fn cold(&self, st: &State) -> bool {
        st.latency.get().is_none()
    }

    /// How long a parked delivery may expect to wait: [`LONE_PARK_WAIT`]
    /// alone, [`PARK_WAIT`] while others have work or when the endpoint
    /// has a rate (its pace is known: a far turn is deferred to it, at one
    /// broker round trip, rather than held in a parking place).
    pub(super) fn park_bound(&self) -> Duration {
        match self.shares.contended() || self.limits.rate.is_some() {
            true => PARK_WAIT,
            false => LONE_PARK_WAIT,
        }
    }

    /// The answer for a delivery that must wait `wait` or more, counted in
    /// the metrics. A delivery deferred because the endpoint is busy or at
    /// its rate gets the next free place in the endpoint's schedule: one
    /// every `spacing` (its rate's interval, or its average attempt time
    /// over its limit) after those deferred before it, up to
    /// [`MAX_SCHEDULE`] ahead. So a backlog comes back at about the pace the
    /// endpoint can take it, instead of all at once and deferred again.
    pub(super) fn deferral(
        &self,
        st: &mut State,
        now: Instant,
        wait: Duration,
        reason: DeferReason,
    ) -> (Duration, DeferReason) {
        let label = self.label.clone();
        metrics::counter!(telemetry::ENDPOINT_DEFERRED, "endpoint" => label, "reason" => reason.as_str())
            .increment(1);
        if !matches!(reason, DeferReason::Busy | DeferReason::Rate) {
            return (wait, reason);
        }
        let per = st
            .latency
            .settled()
            .unwrap_or_else(|| st.limiter.silent_for(now));
        let limit = u32::try_from(self.allowed(st).max(1)).unwrap_or(u32::MAX);
        let spacing = (per / limit).max(self.limits.rate.map_or(Duration::ZERO, |r| r.interval()));
        let earliest = now + wait;
        let slot = st.deferred_until.map_or(earliest, |u| u.max(earliest));
        // Never sooner than it could go (a `1/h` rate waits its hour).
        let slot = slot.min(earliest.max(now + MAX_SCHEDULE));
        st.deferred_until = Some(slot + spacing);
        (slot - now, reason)
    }

    /// How long a delivery with `ahead` parked deliveries before it would
    /// wait for its turn: the queue ahead of it at the average latency
    /// over its limit, or at its rate, and at least how long the endpoint
    /// has been silent with attempts in flight.
    pub(super) fn park_estimate(&self, st: &State, now: Instant, ahead: usize) -> Duration {
        // The settled mean: at a cold start, one hang among the first
        // answers read as "each attempt takes the timeout" and deferred a
        // lone flaky endpoint's queue 10 to 60 s out (bench phase 12's
        // stall). Before it, beside others, the quickest answer so far: an
        // endpoint that takes 500 ms must not park for seconds what its
        // lane handed over while the others need the places; one whose
        // first answer was slow (its connection set up) answers quickly
        // next. (The mean of the first answers deferred a healthy
        // endpoint's start beside a slow one: phase 9 read 0.03 in a
        // short run.)
        let unsettled = || match self.shares.contended() {
            true => st.latency.min(),
            false => None,
        };
        let per = st.latency.settled().or_else(unsettled).unwrap_or_default();
        let queued = u32::try_from(ahead + 1).unwrap_or(u32::MAX);
        let limit = u32::try_from(self.allowed(st).max(1)).unwrap_or(u32::MAX);
        let by_rate = self.limits.rate.map_or(Duration::ZERO, |r| {
            st.pacer.wait(now) + r.interval().saturating_mul(queued - 1)
        });
        (per.saturating_mul(queued) / limit)
            .max(by_rate)
            .max(st.limiter.silent_for(now))
    }
}

/// Wakes the first parked delivery, which may go now: an attempt ended,
/// or the one before it left the queue. A wake with nobody waiting is
/// kept for it ([`Notify::notify_one`]), so none is lost.
pub(super) fn wake_front(st: &State) {
    if let Some((_, wake)) = st.queue.front() {
        wake.notify_one();
    }
}

/// How long until the endpoint's rate allows an attempt (zero: no rate).
pub(super) fn rate_wait_at(ep: &Endpoint, st: &State, now: Instant) -> Duration {
    match ep.limits.rate {
        Some(_) => st.pacer.wait(now),
        None => Duration::ZERO,
    }
}
