//! The benchmark's own HTTP receiver on 127.0.0.1: it counts successes,
//! can fail every first attempt or add latency, and can measure how late a
//! notification arrived from timestamps the benchmark put in its body.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio_util::sync::CancellationToken;

/// How the sink answers and what it records, per phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mode {
    /// Answer 500 to attempt 1 (the `redeliver-attempt` header), 200 after.
    pub fail_first: bool,
    /// Sleep this long before answering.
    pub latency: Duration,
    /// Record `now - t` (or `now - due`) from the body, in microseconds.
    pub measure: bool,
    /// Count requests per notification (the `webhook-id` header), for the
    /// crash phase's duplicates; off elsewhere, as it takes a lock.
    pub per_id: bool,
    /// Answer 500 to [`FLAKY_ERRORS`] of requests, and hang for
    /// [`FLAKY_HANG`] (then 500) on [`FLAKY_HANGS`] of them. Which ones
    /// is drawn from this seed, the body and the attempt number
    /// ([`flaky_draw`]), not at random: two runs with one seed meet the
    /// same failures, notification by notification.
    pub flaky: Option<u64>,
    /// Answer 500 to [`FLAKY_ERRORS`] of attempt-1 requests, at random,
    /// and 200 to every later attempt.
    pub flaky_first: bool,
}

/// The share of requests a flaky sink answers 500 at once.
pub const FLAKY_ERRORS: f64 = 0.30;
/// The share it hangs on, past a 1 s timeout.
pub const FLAKY_HANGS: f64 = 0.05;
/// How long a hang lasts.
pub const FLAKY_HANG: Duration = Duration::from_secs(3);

/// Requests one notification received, when the sink counts per id.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerId {
    /// Attempt-1 requests (answered 500 under `fail_first`).
    pub first: u32,
    /// Requests answered 200.
    pub ok: u32,
}

#[derive(Default)]
struct Shared {
    fail_first: AtomicBool,
    latency_us: AtomicU64,
    measure: AtomicBool,
    per_id: AtomicBool,
    flaky: AtomicBool,
    flaky_seed: AtomicU64,
    flaky_first: AtomicBool,
    ok: AtomicU64,
    failed: AtomicU64,
    /// Microseconds since the epoch of the first request (any answer) and
    /// of the last 200.
    first_us: AtomicU64,
    last_us: AtomicU64,
    samples: Mutex<Vec<i64>>,
    ids: Mutex<HashMap<String, PerId>>,
    /// Distinct ids answered 200 at least once (with `per_id`).
    ids_ok: AtomicU64,
}

/// A running sink; dropped, it stops.
pub struct Sink {
    pub addr: SocketAddr,
    /// More listeners of the same sink: each is an endpoint of its own
    /// (scheme, host and port), so a backlog spread over them spreads
    /// over the lanes (phase 10).
    others: Vec<SocketAddr>,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

/// What a phase saw at the sink.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub ok: u64,
    pub failed: u64,
    /// Seconds from the first request (whatever its answer) to the last success.
    pub span_s: f64,
    pub samples_us: Vec<i64>,
}

impl Seen {
    /// Successes per second over `span_s`.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.span_s.max(1e-9)
    }
}

/// Listeners past the main one.
pub const SPREAD: usize = 15;

impl Sink {
    pub async fn start() -> std::io::Result<Sink> {
        let shared = Arc::new(Shared::default());
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let mut addrs = Vec::new();
        for _ in 0..=SPREAD {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?);
            let (app, signal) = (app.clone(), stop.clone().cancelled_owned());
            tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await;
            });
        }
        let addr = addrs.remove(0);
        Ok(Sink {
            addr,
            others: addrs,
            shared,
            stop,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The URL of endpoint `i` of [`SPREAD`] + 1 (the main one is 0).
    pub fn spread_url(&self, i: usize, path: &str) -> String {
        match i % (SPREAD + 1) {
            0 => self.url(path),
            k => format!("http://{}{path}", self.others[k - 1]),
        }
    }

    /// Clears the counters and sets how to answer.
    pub fn reset(&self, mode: Mode) {
        let s = &self.shared;
        s.fail_first.store(mode.fail_first, Ordering::SeqCst);
        s.latency_us
            .store(mode.latency.as_micros() as u64, Ordering::SeqCst);
        s.measure.store(mode.measure, Ordering::SeqCst);
        s.per_id.store(mode.per_id, Ordering::SeqCst);
        s.flaky.store(mode.flaky.is_some(), Ordering::SeqCst);
        s.flaky_seed
            .store(mode.flaky.unwrap_or_default(), Ordering::SeqCst);
        s.flaky_first.store(mode.flaky_first, Ordering::SeqCst);
        for c in [&s.ok, &s.failed, &s.first_us, &s.last_us, &s.ids_ok] {
            c.store(0, Ordering::SeqCst);
        }
        s.samples.lock().map(|mut v| v.clear()).ok();
        s.ids.lock().map(|mut m| m.clear()).ok();
    }

    /// Distinct notifications answered 200 so far (counted with `per_id`).
    pub fn ids_ok(&self) -> u64 {
        self.shared.ids_ok.load(Ordering::SeqCst)
    }

    /// What each notification received (with `per_id`), by id.
    pub fn per_id(&self) -> HashMap<String, PerId> {
        self.shared
            .ids
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    pub fn ok(&self) -> u64 {
        self.shared.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` successes arrived, or `within` passed.
    pub async fn wait_for(&self, n: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.ok() < n {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    pub fn seen(&self) -> Seen {
        let s = &self.shared;
        let (first, last) = (
            s.first_us.load(Ordering::SeqCst),
            s.last_us.load(Ordering::SeqCst),
        );
        Seen {
            ok: s.ok.load(Ordering::SeqCst),
            failed: s.failed.load(Ordering::SeqCst),
            span_s: last.saturating_sub(first) as f64 / 1e6,
            samples_us: s.samples.lock().map(|v| v.clone()).unwrap_or_default(),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Microseconds since the Unix epoch (the clock the probes carry).
pub use crate::clock::now_us;

/// The timestamps a measuring phase puts in a notification's body.
#[derive(serde::Deserialize)]
struct Probe {
    /// When it was published.
    t: Option<i64>,
    /// When it was due (delayed publishes).
    due: Option<i64>,
}

async fn answer(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let _ = s
        .first_us
        .compare_exchange(0, now_us(), Ordering::SeqCst, Ordering::SeqCst);
    let latency = s.latency_us.load(Ordering::Relaxed);
    if latency > 0 {
        tokio::time::sleep(Duration::from_micros(latency)).await;
    }
    let first_attempt = headers
        .get("redeliver-attempt")
        .is_some_and(|v| v.as_bytes() == b"1");
    if s.per_id.load(Ordering::Relaxed) {
        count_id(&s, &headers, first_attempt);
    }
    if s.fail_first.load(Ordering::Relaxed) && first_attempt {
        s.failed.fetch_add(1, Ordering::Relaxed);
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let flaky_first = s.flaky_first.load(Ordering::Relaxed) && first_attempt;
    if flaky_first && rand::random::<f64>() < FLAKY_ERRORS {
        s.failed.fetch_add(1, Ordering::Relaxed);
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if s.flaky.load(Ordering::Relaxed) && flaky_fails(flaky_draw(&s, &headers, &body)).await {
        s.failed.fetch_add(1, Ordering::Relaxed);
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let now = now_us();
    if s.measure.load(Ordering::Relaxed) {
        if let Ok(p) = serde_json::from_slice::<Probe>(&body) {
            if let Some(base) = p.due.or(p.t) {
                s.samples.lock().map(|mut v| v.push(now as i64 - base)).ok();
            }
        }
    }
    s.last_us.fetch_max(now, Ordering::SeqCst);
    s.ok.fetch_add(1, Ordering::SeqCst);
    StatusCode::OK
}

/// Whether a flaky sink fails this request, from its draw `u` in [0, 1):
/// a 500 for [`FLAKY_ERRORS`] of them, and for [`FLAKY_HANGS`] a 500
/// after [`FLAKY_HANG`].
async fn flaky_fails(u: f64) -> bool {
    if u < FLAKY_HANGS {
        tokio::time::sleep(FLAKY_HANG).await;
    }
    u < FLAKY_HANGS + FLAKY_ERRORS
}

/// A request's draw in [0, 1), from the seed, its body (the bench's
/// bodies are unique) and its `redeliver-attempt`: a repeat of one attempt
/// draws the same. Why not at random: a run's settle time is its unluckiest
/// notification's, a chain of failed attempts, and the phase compares two
/// runs. With independent draws the pair compares two different chains as
/// much as it compares the workers; with one seed both runs meet the same.
fn flaky_draw(s: &Shared, headers: &HeaderMap, body: &[u8]) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    s.flaky_seed.load(Ordering::Relaxed).hash(&mut h);
    body.hash(&mut h);
    let attempt = headers.get("redeliver-attempt").map(|v| v.as_bytes());
    attempt.hash(&mut h);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Counts one request against its `webhook-id`, before it is answered:
/// whether it will be an attempt-1 request (a 500 under `fail_first`) or a
/// 200. Counted as a 200 only when the sink will answer 200.
fn count_id(s: &Shared, headers: &HeaderMap, first_attempt: bool) {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let fails = first_attempt && s.fail_first.load(Ordering::Relaxed);
    let Ok(mut ids) = s.ids.lock() else { return };
    let e = ids.entry(id.to_string()).or_default();
    if first_attempt {
        e.first += 1;
    }
    if !fails {
        e.ok += 1;
        if e.ok == 1 {
            s.ids_ok.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(seed: u64, i: usize, attempt: &str) -> f64 {
        let s = Shared::default();
        s.flaky_seed.store(seed, Ordering::Relaxed);
        let mut h = HeaderMap::new();
        h.insert("redeliver-attempt", attempt.parse().unwrap());
        flaky_draw(&s, &h, format!(r#"{{"i":{i}}}"#).as_bytes())
    }

    #[test]
    fn one_seed_draws_the_same_failures_and_in_the_stated_shares() {
        assert_eq!(draw(2, 7, "1"), draw(2, 7, "1"));
        assert_ne!(draw(2, 7, "1"), draw(2, 7, "2"));
        assert_ne!(draw(2, 7, "1"), draw(3, 7, "1"));
        let draws: Vec<f64> = (0..20_000).map(|i| draw(0, i, "1")).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let share = |below: f64| draws.iter().filter(|u| **u < below).count() as f64 / 20_000.0;
        assert!((share(FLAKY_HANGS) - FLAKY_HANGS).abs() < 0.01);
        let failing = FLAKY_HANGS + FLAKY_ERRORS;
        assert!((share(failing) - failing).abs() < 0.01);
    }
}
