//! `redeliver demo`: the whole lifecycle in under a minute, against a real
//! broker, on a prefix of its own that it deletes at the end.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::{AttemptEvent, BrokerSettings, WorkerSettings};
use crate::delay::DelayBackend;
use crate::deliver::HttpDeliverer;
use crate::message::dead_letter::Filter;
use crate::ops::dlq::{walk, Op};
use crate::policy::Action;
use crate::policy::{parse_schedule, Backoff, RetryPolicy};
use crate::publish::{prepare, Publisher};
use crate::topology::Topology;

const SCHEDULE: &str = "1s,2s,4s";
const MAX_ATTEMPTS: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(1);
/// (path, how many notifications)
const MIX: &[(&str, usize)] = &[
    ("ok", 9),
    ("flaky", 4),
    ("slow", 3),
    ("gone", 2),
    ("down", 2),
];

#[derive(Default)]
struct Tally {
    delivered: usize,
    dead: usize,
    retrying: usize,
    first_try: usize,
    dead_reasons: HashMap<&'static str, usize>,
}

/// Runs the demo; `broker.prefix` is the base of the demo's own prefix.
pub async fn demo(
    broker: &BrokerSettings,
    out: &mut dyn Write,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut b = broker.clone();
    b.prefix = format!(
        "{}.demo-{}",
        broker.prefix,
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let (addr, receiver) =
        crate::ops::demo_receiver::start(TIMEOUT + Duration::from_millis(500)).await?;
    writeln!(
        out,
        "redeliver demo: receiver on http://{addr}, broker {}, prefix {}",
        b.url, b.prefix
    )?;
    writeln!(
        out,
        "policy: schedule {SCHEDULE}, max {MAX_ATTEMPTS} attempts, timeout {}s\n",
        TIMEOUT.as_secs()
    )?;
    // A shutdown (Ctrl-C in the binary) still cleans up: the demo's queues
    // never outlive it.
    let result = tokio::select! {
        r = run(&b, addr, out) => r,
        _ = shutdown.cancelled() => Err(anyhow::anyhow!("interrupted")),
    };
    receiver.abort();
    let cleaned = cleanup(&b).await;
    result?;
    cleaned.context("deleting the demo's queues")?;
    writeln!(
        out,
        "\nThe demo's exchanges and queues ({}.*) have been deleted.",
        b.prefix
    )?;
    Ok(())
}

async fn run(
    b: &BrokerSettings,
    addr: std::net::SocketAddr,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let conn = b
        .url
        .connect("redeliver demo")
        .await
        .with_context(|| format!("cannot connect to the broker at {}", b.url))?;
    let topology = crate::delay::declare_topology(b, &conn).await?;
    let publisher =
        Publisher::new(&conn, topology.clone(), b.delay, Duration::from_secs(30)).await?;
    let mut labels = HashMap::new();
    for (kind, count) in MIX {
        for i in 1..=*count {
            let label = format!("{kind}/{i}");
            // One endpoint, /gone, answers 410 for everyone.
            let path = if *kind == "gone" { "gone" } else { &label };
            let n = serde_json::json!({"url": format!("http://{addr}/{path}"), "body": {"demo": label}});
            let p = prepare(&n.to_string(), crate::message::DEFAULT_MAX_MESSAGE_BYTES)?;
            publisher.publish_new(&p, None).await?;
            labels.insert(p.id, label);
        }
    }
    let total = labels.len();
    writeln!(out, "published {total} notifications; starting a worker\n")?;

    let (tx, mut rx) = broadcast::channel(1024);
    let settings = WorkerSettings {
        concurrency: 8,
        policy: RetryPolicy {
            max_attempts: MAX_ATTEMPTS,
            backoff: Backoff::Schedule(parse_schedule(SCHEDULE)?),
        },
        events: Some(tx),
        shutdown_grace: Duration::from_secs(5),
        ..Default::default()
    };
    let handler = HttpDeliverer::new(TIMEOUT, 8)?;
    let stop = CancellationToken::new();
    let (b2, s2) = (b.clone(), stop.clone());
    let worker = tokio::spawn(async move { crate::worker::run(&b2, settings, handler, s2).await });

    let started = Instant::now();
    let mut t = Tally::default();
    while t.delivered + t.dead < total && started.elapsed() < Duration::from_secs(50) {
        match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
            Ok(Ok(e)) => progress(out, started, &labels, &mut t, &e)?,
            Ok(Err(broadcast::error::RecvError::Lagged(_))) | Err(_) => continue,
            Ok(Err(broadcast::error::RecvError::Closed)) => break,
        }
    }
    stop.cancel();
    worker.await.context("worker task")??;
    summary(out, &conn, (&topology, b.delay), &t, total).await?;
    let _ = conn.close(200, "demo done".into()).await;
    Ok(())
}

fn progress(
    out: &mut (impl Write + ?Sized),
    started: Instant,
    labels: &HashMap<String, String>,
    t: &mut Tally,
    e: &AttemptEvent,
) -> std::io::Result<()> {
    let result = match (e.status, &e.error) {
        (Some(s), _) => format!("HTTP {s}"),
        (None, Some(err)) => crate::message::state::truncate(err, 28).to_string(),
        (None, None) => "-".into(),
    };
    let then = match e.action {
        Action::Ack => {
            t.delivered += 1;
            t.retrying = t.retrying.saturating_sub(usize::from(e.attempt > 1));
            t.first_try += usize::from(e.attempt == 1);
            "delivered".to_string()
        }
        Action::Retry { delay } => {
            t.retrying += usize::from(e.attempt == 1);
            format!("retry in {}", humantime::format_duration(delay))
        }
        Action::DeadLetter { reason } => {
            t.dead += 1;
            t.retrying = t.retrying.saturating_sub(usize::from(e.attempt > 1));
            *t.dead_reasons.entry(reason.as_str()).or_default() += 1;
            format!("DEAD ({})", reason.as_str())
        }
    };
    let label = labels.get(&e.id).map(String::as_str).unwrap_or("?");
    writeln!(
        out,
        "[{:>5.1}s] {label:<8} attempt {}  {result:<28} → {then:<24} delivered {:>2} · retrying {:>2} · dead {}",
        started.elapsed().as_secs_f64(),
        e.attempt,
        t.delivered,
        t.retrying,
        t.dead
    )
}

async fn summary(
    out: &mut (impl Write + ?Sized),
    conn: &lapin::Connection,
    (topology, delay): (&Topology, DelayBackend),
    t: &Tally,
    total: usize,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "\nThe dead-letter queue {} (`redeliver dlq list`), before the demo deletes it:",
        topology.dead
    )?;
    crate::ops::render::table_header(out)?;
    let mut io = Ok(());
    walk(conn, topology, &Filter::default(), None, Op::Keep, |d| {
        if io.is_ok() {
            io = crate::ops::render::table_row(out, d);
        }
    })
    .await?;
    io?;
    let reasons = |r| t.dead_reasons.get(r).copied().unwrap_or(0);
    let waited = match delay {
        DelayBackend::Plugin => format!("republished to {} with an x-delay", topology.retry),
        DelayBackend::Cascade => format!(
            "republished into the delay cascade for a delay (up to 1 s held by the worker in {}, \
             longer through TTL quorum queues {}.cascade.<s>.<d>)",
            crate::delay::cascade::hold(topology),
            topology.prefix
        ),
    };
    writeln!(
        out,
        "\nWhat happened: {total} notifications were published. {} were delivered on the first attempt. {} more \
         were delivered after retries: flaky receivers answered 500 and slow ones timed out, and each failure was \
         {waited} from the schedule ({SCHEDULE}). The original was acked only after the \
         broker confirmed the copy. {} were dead-lettered: {} because the receiver answered 410 Gone (a permanent \
         status, no retry) and {} because it failed all {MAX_ATTEMPTS} attempts. Dead letters keep their attempt \
         history in headers. Operators inspect them with `redeliver dlq list/show`, and replay (`dlq replay`) or \
         purge them once the receiver is fixed. Every request carried the same webhook-id on each attempt, so \
         receivers can deduplicate.",
        t.first_try,
        t.delivered.saturating_sub(t.first_try),
        t.dead,
        reasons("permanent-status"),
        reasons("max-attempts"),
    )?;
    Ok(())
}

/// Deletes the demo's prefix: both backends' queues and exchanges.
async fn cleanup(b: &BrokerSettings) -> anyhow::Result<()> {
    let conn = b.url.connect("redeliver demo cleanup").await?;
    crate::delay::delete(&Topology::new(&b.prefix), &conn).await?;
    let _ = conn.close(200, "".into()).await;
    Ok(())
}
