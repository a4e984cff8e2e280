//! The checker, run after the last heal: it reads only what the receiver
//! saw, what the producer's `publish` runs printed as confirmed, and what
//! the queues hold, as an outside observer would.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::receiver::{Receiver, Recorded};
use crate::common::TestApp;

use super::load::{delay_after, is_gone, Batch, Workers, CONFIRM_TIMEOUT};
use super::net::Timeline;

/// A retry after the last heal may come this much later than its delay
/// and the work queue's wait at that moment ([`QueueWait`]).
pub const LATE: Duration = Duration::from_secs(5);

/// How long after the last heal the checker may stop waiting, once no
/// request has come for [`IDLE`].
const GIVE_UP: Duration = Duration::from_secs(200);
const IDLE: Duration = Duration::from_secs(30);

/// One row of the table.
#[derive(Debug, Default)]
pub struct Report {
    pub published: usize,
    pub delivered: usize,
    pub dead: usize,
    pub lost: Vec<String>,
    /// Successful deliveries beyond each id's first.
    pub duplicates: usize,
    /// Dead letters that were not meant: another id, or another reason.
    pub wrong_dead: Vec<(String, String)>,
    /// From the last heal until the last id was accounted for.
    pub settle: Option<Duration>,
    /// Retries that failed after the last heal and were tried again.
    pub retries_after_heal: usize,
    /// The latest retry past its delay, and past its delay and the work
    /// queue's wait then (what [`LATE`] bounds).
    pub latest_retry: Duration,
    pub latest_past_wait: Duration,
    pub late_retries: usize,
    pub batches: usize,
    pub failed_batches: Vec<usize>,
    /// The first failed batch's last line on stderr, and how long it ran:
    /// why it failed, in the assertion's own message.
    pub first_failure: Option<String>,
    pub slowest_batch: Duration,
    pub longest_wait: Duration,
}

impl Report {
    /// The longest a batch may wait without confirming or moving on: the
    /// confirm timeout and a reconnect (the pause before it, and a connect
    /// or a topology lookup, each bounded like a confirm), and 5 s of slack
    /// for a busy machine.
    pub fn wait_bound() -> Duration {
        CONFIRM_TIMEOUT * 2 + redeliver::ops::produce::MAX_BACKOFF + Duration::from_secs(5)
    }

    pub fn row(&self, name: &str, backend: &str) -> String {
        format!(
            "| {name} | {backend} | {} | {} | {} | {} | {} | {} | {} | {:.1} s | {:.1} s |",
            self.published,
            self.delivered,
            self.dead,
            self.lost.len(),
            self.duplicates,
            self.settle
                .map(|d| format!("{:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "not settled".into()),
            self.late_retries,
            self.slowest_batch.as_secs_f64(),
            self.longest_wait.as_secs_f64(),
        )
    }
}

pub const HEADER: &str = "| nemesis | backend | published | delivered | dead-lettered | lost | duplicates | settled after last heal | late retries | slowest publish | longest publish wait |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// Waits (at most `within`) until every confirmed id is delivered or dead,
/// and the work queue is empty; then counts.
pub async fn check(
    app: &TestApp,
    rx: &Receiver,
    batches: &[Batch],
    timeline: &Timeline,
    within: Duration,
) -> Report {
    let published: HashSet<String> = batches
        .iter()
        .flat_map(|b| b.confirmed.iter().cloned())
        .collect();
    let deadline = Instant::now() + within;
    let mut dead: HashMap<String, String> = HashMap::new();
    let mut dead_seen: HashMap<String, Instant> = HashMap::new();
    loop {
        for d in app.drain_dead().await {
            let id = d.str(redeliver::message::state::H_ID).unwrap_or_default();
            let reason = d
                .str(redeliver::message::state::H_DEAD_REASON)
                .unwrap_or_default();
            dead_seen.entry(id.clone()).or_insert_with(Instant::now);
            dead.insert(id, reason);
        }
        let ok = delivered(&rx.requests());
        let accounted = published
            .iter()
            .all(|id| ok.contains_key(id) || dead.contains_key(id));
        // Past the broker's own retry of an unconfirmed dead-lettering hop
        // (`dead_letter_worker_publisher_confirm_timeout`, 180 s) and with
        // nothing arriving, what is missing will not come.
        let last = rx.requests().last().map(|q| q.at);
        let given_up = timeline
            .last_heal()
            .is_some_and(|h| h.elapsed() > GIVE_UP && last.is_none_or(|t| t.elapsed() > IDLE));
        if (accounted && app.queue_len("work").await == 0) || given_up || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let requests = rx.requests();
    let ok = delivered(&requests);
    let mut r = Report {
        published: published.len(),
        batches: batches.len(),
        ..Default::default()
    };
    for b in batches {
        r.slowest_batch = r.slowest_batch.max(b.took);
        r.longest_wait = r.longest_wait.max(b.longest_wait);
        if !b.exit_ok {
            r.failed_batches.push(b.n);
            r.first_failure.get_or_insert_with(|| {
                let last = b.stderr.lines().last().unwrap_or("(nothing on stderr)");
                let last: String = last.chars().take(400).collect();
                format!("batch {} after {:.1} s: {last}", b.n, b.took.as_secs_f64())
            });
        }
    }
    let mut done_at: Option<Instant> = None;
    for id in &published {
        let at = ok
            .get(id)
            .map(|v| v[0])
            .or_else(|| dead_seen.get(id).copied());
        match at {
            Some(t) => done_at = done_at.max(Some(t)),
            None => r.lost.push(id.clone()),
        }
    }
    r.lost.sort();
    r.delivered = published.iter().filter(|id| ok.contains_key(*id)).count();
    r.duplicates = ok.values().map(|v| v.len() - 1).sum();
    r.dead = dead.len();
    r.wrong_dead = dead
        .iter()
        .filter(|(id, reason)| !(is_gone(id) && reason.as_str() == "permanent-status"))
        .map(|(i, w)| (i.clone(), w.clone()))
        .collect();
    let heal = timeline.last_heal();
    r.settle = match (heal, done_at) {
        (Some(h), Some(d)) if r.lost.is_empty() => Some(d.saturating_duration_since(h)),
        (None, Some(_)) if r.lost.is_empty() => Some(Duration::ZERO),
        _ => None,
    };
    if let Some(h) = heal {
        lateness(&requests, h, &QueueWait::of(batches, &requests), &mut r);
    }
    r
}

/// Each id's successful deliveries' times.
fn delivered(requests: &[Recorded]) -> HashMap<String, Vec<Instant>> {
    let mut ok: HashMap<String, Vec<Instant>> = HashMap::new();
    for q in requests.iter().filter(|q| q.reply == 200) {
        ok.entry(q.id()).or_default().push(q.at);
    }
    ok
}

/// What a first attempt waited in the work queue, batch by batch: the
/// median from a batch's end (its ids all confirmed) to its ids' first
/// attempts. A retry whose delay is up re-enters that same queue, behind
/// the same backlog: that wait is the workers' pace (a busy machine, the
/// backlog the faults left), not the delay backend's. A backend that
/// holds retries back shows as lateness past it.
pub struct QueueWait(Vec<(Instant, Duration)>);

impl QueueWait {
    pub fn of(batches: &[Batch], requests: &[Recorded]) -> Self {
        let mut first: HashMap<String, Instant> = HashMap::new();
        for q in requests {
            if q.header("redeliver-attempt").as_deref() == Some("1") {
                let t = first.entry(q.id()).or_insert(q.at);
                *t = (*t).min(q.at);
            }
        }
        let mut waits = vec![];
        for b in batches {
            let end = b.started + b.took;
            let mut w: Vec<Duration> = b
                .confirmed
                .iter()
                .filter_map(|id| first.get(id))
                .map(|t| t.saturating_duration_since(end))
                .collect();
            w.sort();
            if let Some(median) = w.get(w.len() / 2) {
                waits.push((end, *median));
            }
        }
        QueueWait(waits)
    }

    /// The longest wait of the batches that ended within 2 s of `t`; with
    /// none (after the producer stopped), the nearest batch's.
    fn at(&self, t: Instant) -> Duration {
        let apart = |e: &Instant| e.saturating_duration_since(t) + t.saturating_duration_since(*e);
        let near = self
            .0
            .iter()
            .filter(|(e, _)| apart(e) <= Duration::from_secs(2));
        near.map(|(_, w)| *w)
            .max()
            .or_else(|| self.0.iter().min_by_key(|(e, _)| apart(e)).map(|(_, w)| *w))
            .unwrap_or_default()
    }
}

/// For each attempt that failed after `heal`, how long after its delay the
/// next attempt of that id came, and how much of that the work queue's
/// wait does not explain.
fn lateness(requests: &[Recorded], heal: Instant, waits: &QueueWait, r: &mut Report) {
    let mut by_id: HashMap<String, Vec<(usize, Instant, u16)>> = HashMap::new();
    for q in requests {
        let attempt = q
            .header("redeliver-attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        by_id
            .entry(q.id())
            .or_default()
            .push((attempt, q.at, q.reply));
    }
    for tries in by_id.values() {
        for (a, at, _) in tries.iter().filter(|t| t.1 >= heal && t.2 == 500) {
            let next = tries
                .iter()
                .filter(|t| t.0 == a + 1 && t.1 > *at)
                .map(|t| t.1)
                .min();
            let Some(next) = next else { continue };
            r.retries_after_heal += 1;
            let due = *at + delay_after(*a);
            let late = next.saturating_duration_since(due);
            let past_wait = late.saturating_sub(waits.at(due));
            r.latest_retry = r.latest_retry.max(late);
            r.latest_past_wait = r.latest_past_wait.max(past_wait);
            if past_wait > LATE {
                r.late_retries += 1;
            }
        }
    }
}

/// The ids that settled last after the last heal, with their requests'
/// times (from the heal) and replies: where the time to settle went.
pub fn slowest(r: &Report, rx: &Receiver, heal: Option<Instant>) -> String {
    let Some(heal) = heal else {
        return String::new();
    };
    let requests = rx.requests();
    let ok = delivered(&requests);
    let mut firsts: Vec<(&String, Instant)> = ok.iter().map(|(id, v)| (id, v[0])).collect();
    firsts.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
    let mut out = String::new();
    for (id, _) in firsts
        .iter()
        .take(if r.settle.is_some_and(|s| s > LATE * 4) {
            5
        } else {
            0
        })
    {
        let tries: Vec<String> = requests
            .iter()
            .filter(|q| &&q.id() == id)
            .map(|q| {
                let t = q.at.checked_duration_since(heal).map(|d| d.as_secs_f64());
                let t = t.unwrap_or_else(|| -(heal - q.at).as_secs_f64());
                format!("{t:+.1}s:{}", q.reply)
            })
            .collect();
        out.push_str(&format!("settled late {id}: {}\n", tries.join(" ")));
    }
    out
}

/// What a loss leaves behind: each lost id, the fault active when it was
/// last seen (its last request at the receiver, or its batch's start),
/// and the worker log lines that name it.
pub fn explain_losses(
    r: &Report,
    rx: &Receiver,
    batches: &[Batch],
    timeline: &Timeline,
    workers: &Workers,
) -> String {
    let requests = rx.requests();
    let mut out = String::new();
    for id in r.lost.iter().take(50) {
        let seen = requests
            .iter()
            .filter(|q| &q.id() == id)
            .map(|q| q.at)
            .max();
        let batch = batches.iter().find(|b| b.confirmed.contains(id));
        let at = seen.or(batch.map(|b| b.started));
        let during = at.map(|t| timeline.at(t)).unwrap_or_default();
        let how = if seen.is_some() {
            "last request"
        } else {
            "published"
        };
        out.push_str(&format!("lost {id}: {how} during {during}\n"));
        for line in workers.log_lines(&format!("\"{id}\"")).iter().take(20) {
            out.push_str(&format!("    {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, Method};

    fn req(id: &str, attempt: usize, at: Instant, reply: u16) -> Recorded {
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", id.parse().unwrap());
        headers.insert("redeliver-attempt", attempt.to_string().parse().unwrap());
        Recorded {
            at,
            method: Method::POST,
            path: "/".into(),
            headers,
            body: Default::default(),
            nth: attempt,
            reply,
        }
    }

    /// The checker's own arithmetic, without a cluster: a retry after the
    /// heal is late past its delay plus [`LATE`]; one before the heal is
    /// not judged; the timeline names the fault active at a moment.
    #[test]
    fn lateness_and_timeline() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let heal = t0 + s(10);
        let requests = [
            // failed before the heal: not judged
            req("a", 1, t0, 500),
            req("a", 2, t0 + s(30), 500),
            // failed after it (attempt 2 waits 2 s): 2 s late
            req("a", 3, t0 + s(34), 200),
            // attempt 1 waits 1 s: 7 s late
            req("b", 1, heal + s(1), 500),
            req("b", 2, heal + s(9), 200),
        ];
        let mut r = Report::default();
        lateness(&requests, heal, &QueueWait(vec![]), &mut r);
        assert_eq!(r.retries_after_heal, 2);
        assert_eq!(r.late_retries, 1);
        assert_eq!(r.latest_retry, s(7));
        // A batch that ended when b's retry fell due waited 3 s for its
        // first attempts: b is 4 s late past that, within LATE.
        let waits = QueueWait(vec![(heal + s(2), s(3))]);
        let mut r = Report::default();
        lateness(&requests, heal, &waits, &mut r);
        assert_eq!((r.late_retries, r.latest_past_wait), (0, s(4)));
        assert_eq!(r.latest_retry, s(7));
        let ok = delivered(&requests);
        assert_eq!(ok.len(), 2);

        let tl = Timeline {
            spans: vec![("Isolate(1)".into(), t0, Some(heal))],
        };
        assert_eq!(tl.at(t0 + s(5)), "Isolate(1)");
        assert_eq!(tl.at(heal + s(1)), "none");
        assert_eq!(tl.last_heal(), Some(heal));
    }
}
