//! What the pages show of the broker, read in the background so a page
//! never waits on it: the queues, the workers' reports and the shared
//! endpoint state (the [`Pulse`], every few seconds), and the dead-letter
//! queue's contents (a [`DeadList`], at most every 10 s). Both are read
//! only while somebody looks at a page, so an idle console costs the
//! broker nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::Connection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::BrokerSettings;
use crate::control::view::Row;
use crate::message::dead_letter::{DeadLetter, Filter};
use crate::message::target::Target;
use crate::ops::dlq::{walk, Op};
use crate::ops::status::ProbeSummary;
use crate::topology::Topology;

/// A pulse older than this is read again when a page asks.
const PULSE_FRESH: Duration = Duration::from_secs(3);
/// The dead letters are walked again at most this often.
const DEAD_FRESH: Duration = Duration::from_secs(10);
/// Reading stops this long after the last page view.
const VIEWED_WITHIN: Duration = Duration::from_secs(60);
/// At most this many dead letters are kept for the page (the rest counted).
pub const DEAD_KEPT: usize = 100_000;

/// The broker's side of the overview and the endpoints page.
#[derive(Clone, Debug, Default)]
pub struct Pulse {
    pub at_ms: u64,
    /// Ready messages and consumers of the work queue (`None`: not declared).
    pub work: Option<(u32, u32)>,
    pub dead: Option<u32>,
    pub probes: Vec<ProbeSummary>,
    pub endpoints: Vec<Row>,
    /// Workers that reported in the last 30 s.
    pub workers: usize,
    /// Why part of it could not be read.
    pub error: Option<String>,
}

/// One dead letter, as the page lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Dead {
    pub id: String,
    pub url: Option<String>,
    pub endpoint: Option<String>,
    pub reason: Option<String>,
    pub attempts: u32,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub dead_at_ms: Option<i64>,
}

impl Dead {
    fn of(d: &DeadLetter) -> Dead {
        // As the history shows a URL: no user, no password, and each
        // query value replaced (viewers see this list too).
        let parsed = d.url.as_deref().and_then(|u| url::Url::parse(u).ok());
        let endpoint = parsed
            .as_ref()
            .and_then(Target::origin_of)
            .map(|t| t.to_string());
        Dead {
            id: d.id.clone(),
            url: parsed.as_ref().map(crate::history::record::url_for_record),
            endpoint,
            reason: d.meta.reason.clone(),
            attempts: d.meta.attempts,
            last_status: d.meta.last_status,
            last_error: d.meta.last_error.clone(),
            dead_at_ms: d.meta.dead_at,
        }
    }
}

/// The dead-letter queue as one walk found it.
#[derive(Clone, Debug, Default)]
pub struct DeadList {
    pub at_ms: u64,
    /// In the queue when the walk started.
    pub total: usize,
    pub rows: Vec<Dead>,
    pub error: Option<String>,
}

/// The latest of both, and what wakes their reader.
pub struct Live {
    broker: BrokerSettings,
    pulse: ArcSwapOption<Pulse>,
    dead: ArcSwapOption<DeadList>,
    viewed_ms: AtomicU64,
    dead_viewed_ms: AtomicU64,
    wake_pulse: Notify,
    wake_dead: Notify,
    /// Told after every read stored, for pages waiting on the first.
    filled: Notify,
    /// Held by every walk, replay and purge of the dead letters: one at a
    /// time, so none of them sees the others' messages as missing.
    pub dlq: tokio::sync::Mutex<()>,
}

impl Live {
    pub fn new(broker: BrokerSettings) -> Arc<Live> {
        Arc::new(Live {
            broker,
            pulse: ArcSwapOption::empty(),
            dead: ArcSwapOption::empty(),
            viewed_ms: AtomicU64::new(0),
            dead_viewed_ms: AtomicU64::new(0),
            wake_pulse: Notify::new(),
            wake_dead: Notify::new(),
            filled: Notify::new(),
            dlq: tokio::sync::Mutex::new(()),
        })
    }

    pub fn broker(&self) -> &BrokerSettings {
        &self.broker
    }

    /// The latest pulse; the first one is waited for (at most 10 s).
    pub async fn pulse(&self) -> Arc<Pulse> {
        let fresh = |p: &Pulse| !stale(p.at_ms, PULSE_FRESH);
        self.latest(&self.pulse, &self.viewed_ms, &self.wake_pulse, fresh)
            .await
    }

    /// The latest walk of the dead letters; the first one is waited for.
    pub async fn dead(&self) -> Arc<DeadList> {
        let fresh = |d: &DeadList| !stale(d.at_ms, DEAD_FRESH);
        self.latest(&self.dead, &self.dead_viewed_ms, &self.wake_dead, fresh)
            .await
    }

    /// What `slot` holds, noting the view and waking the reader when it
    /// is stale; a placeholder that says so when the first read is slow.
    async fn latest<T: Default + HasError>(
        &self,
        slot: &ArcSwapOption<T>,
        viewed: &AtomicU64,
        wake: &Notify,
        fresh: impl Fn(&T) -> bool,
    ) -> Arc<T> {
        viewed.store(now_ms(), Ordering::Relaxed);
        let v = slot.load_full();
        if !v.as_deref().is_some_and(&fresh) {
            wake.notify_one();
        }
        let v = match v {
            Some(v) => Some(v),
            None => wait_for(slot, &self.filled).await,
        };
        v.unwrap_or_else(|| {
            let mut t = T::default();
            t.set_error(STILL_READING.into());
            Arc::new(t)
        })
    }

    /// After a change: the next page shows it.
    pub fn changed(&self) {
        self.pulse.store(None);
        self.dead.store(None);
        self.wake_pulse.notify_one();
        self.wake_dead.notify_one();
    }

    /// Reads what was asked for, until `stop`: the pulse and the dead
    /// letters each in a loop of its own, so a long walk of the dead
    /// letters never holds up the pulse.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        tokio::join!(self.pulse_loop(&stop), self.dead_loop(&stop));
    }

    async fn pulse_loop(&self, stop: &CancellationToken) {
        while wait(&self.wake_pulse, stop).await {
            let due = self
                .pulse
                .load()
                .as_ref()
                .is_none_or(|p| stale(p.at_ms, PULSE_FRESH));
            if due && viewed(&self.viewed_ms) {
                let p = read_pulse(&self.broker).await;
                self.pulse.store(Some(Arc::new(p)));
                self.filled.notify_waiters();
            }
        }
    }

    async fn dead_loop(&self, stop: &CancellationToken) {
        while wait(&self.wake_dead, stop).await {
            let due = self
                .dead
                .load()
                .as_ref()
                .is_none_or(|d| stale(d.at_ms, DEAD_FRESH));
            if !due || !viewed(&self.dead_viewed_ms) {
                continue;
            }
            // A replay or purge holds the queue: the list waits for it.
            if let Ok(_held) = self.dlq.try_lock() {
                let list = read_dead(&self.broker, &Filter::default()).await;
                self.dead.store(Some(Arc::new(list)));
                self.filled.notify_waiters();
            }
        }
    }
}

/// Until woken or a pulse's time has passed; `false` once stopped.
async fn wait(wake: &Notify, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = wake.notified() => true,
        _ = tokio::time::sleep(PULSE_FRESH) => true,
    }
}

/// A page was viewed lately.
fn viewed(at: &AtomicU64) -> bool {
    !stale(at.load(Ordering::Relaxed), VIEWED_WITHIN)
}

/// A read that can say why it is incomplete.
trait HasError {
    fn set_error(&mut self, e: String);
}

impl HasError for Pulse {
    fn set_error(&mut self, e: String) {
        self.error = Some(e);
    }
}

impl HasError for DeadList {
    fn set_error(&mut self, e: String) {
        self.error = Some(e);
    }
}

/// What a page says when the first read takes longer than it waits.
const STILL_READING: &str =
    "still reading the broker (a long dead-letter queue takes a while); reload in a moment";

/// The first value of `slot`, waited for up to 10 s: woken by `filled`,
/// which is armed before each look so a store between them is not missed.
async fn wait_for<T>(slot: &ArcSwapOption<T>, filled: &Notify) -> Option<Arc<T>> {
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    loop {
        let told = filled.notified();
        tokio::pin!(told);
        told.as_mut().enable();
        if let Some(v) = slot.load_full() {
            return Some(v);
        }
        tokio::select! {
            _ = &mut told => {}
            _ = &mut deadline => return None,
        }
    }
}

fn stale(at_ms: u64, fresh: Duration) -> bool {
    now_ms().saturating_sub(at_ms) > fresh.as_millis() as u64
}

fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}

/// Reads the queues, the probes' reports and the endpoint state.
pub async fn read_pulse(broker: &BrokerSettings) -> Pulse {
    let t = Topology::new(&broker.prefix);
    let mut p = Pulse {
        at_ms: now_ms(),
        ..Pulse::default()
    };
    match broker.url.connect("redeliver console").await {
        Ok(conn) => {
            // The lanes as one queue: ready summed, the workers on them all.
            let lanes = crate::ops::status::read_lanes(&conn, &t).await.ok();
            let work = lanes.map(|l| crate::ops::status::sum(&t.prefix, &l));
            p.work = work.filter(|w| w.exists).map(|w| (w.ready, w.consumers));
            p.dead = declared(&conn, &t.dead).await.map(|(ready, _)| ready);
            p.probes =
                crate::delay::report::summarize(&crate::delay::report::read(&conn, &t).await);
            let _ = conn.close(200, "read".into()).await;
        }
        Err(e) => p.error = Some(format!("cannot connect to the broker: {e}")),
    }
    match crate::ops::endpoints::overview(broker).await {
        Ok(o) => {
            p.workers = o.reports.len();
            p.endpoints = o.rows;
        }
        Err(e) => p.error = Some(e.to_string()),
    }
    p
}

/// A queue's ready messages and consumers; `None` when it does not exist.
async fn declared(conn: &Connection, name: &str) -> Option<(u32, u32)> {
    let ch = conn.create_channel().await.ok()?;
    let opts = QueueDeclareOptions {
        // Only asks: a missing queue is an error that closes the channel.
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let q = ch
        .queue_declare(name.into(), opts, FieldTable::default())
        .await
        .ok()?;
    let _ = ch.close(200, "read".into()).await;
    Some((q.message_count(), q.consumer_count()))
}

/// Walks the dead letters (keeping them all in the queue).
pub async fn read_dead(broker: &BrokerSettings, f: &Filter) -> DeadList {
    let mut list = DeadList {
        at_ms: now_ms(),
        ..DeadList::default()
    };
    let conn = match broker.url.connect("redeliver console").await {
        Ok(c) => c,
        Err(e) => {
            list.error = Some(format!("cannot connect to the broker: {e}"));
            return list;
        }
    };
    let t = Topology::new(&broker.prefix);
    let rows = &mut list.rows;
    let walked = walk(&conn, &t, f, None, Op::Keep, |d| {
        if rows.len() < DEAD_KEPT {
            rows.push(Dead::of(d));
        }
    })
    .await;
    match walked {
        Ok(s) => list.total = s.total,
        Err(e) => list.error = Some(e.to_string()),
    }
    if let Err(e) = conn.close(200, "read".into()).await {
        warn!(error = %e, "closing the dead-letter walk's connection");
    }
    list
}
