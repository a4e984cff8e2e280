//! A worker's two tasks for the shared state, per connection: one follows
//! the stream and applies each record as it comes (and reads the stream
//! afresh should following break); the other ticks every second to write
//! what the planner decides (the failing clock, claims and automatic
//! disables, closed pauses, snapshots), to set the `redeliver_endpoints`
//! gauge, and every [`REPORT_EVERY`] to publish this worker's report.
//! Neither can stop deliveries: a record that cannot be written is tried
//! again with the next tick's, on a fresh channel.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::book::PROBED;
use super::error::ControlError;
use super::plan::{self, Inputs};
use super::record::{Change, Record};
use super::reports::{self, EndpointReport, REPORT_EVERY, SEEN_WITHIN};
use super::shared::{lock, now_ms, Shared};
use super::stream::{self, Reader, Writer};
use crate::events::Emitter;
use crate::isolation::activity::Delta;
use crate::isolation::{Endpoints, View};
use crate::message::target::Target;
use crate::telemetry;
use crate::topology::Topology;

/// How often the planner runs.
const TICK: Duration = Duration::from_secs(1);
/// A broken follow is read afresh after this, doubling up to a minute.
const REFOLLOW: Duration = Duration::from_secs(1);
/// After a snapshot that could not be written, none is tried for this long.
const SNAPSHOT_BACKOFF_MS: u64 = 600_000;
/// The largest snapshot written: well within RabbitMQ 4.x's default
/// `max_message_size` of 16 MiB.
const MAX_SNAPSHOT_BYTES: usize = 8 << 20;
/// Automatic disables wait while more than half of this many endpoints
/// or more (seen in the last 10 minutes) fail without a success.
const MIN_FOR_HOLD: usize = 4;

/// What the tasks share.
pub(super) struct Tasks {
    pub(super) shared: Arc<Shared>,
    pub(super) endpoints: Arc<Endpoints>,
    pub(super) topology: Topology,
    pub(super) conn: Arc<Connection>,
    pub(super) events: Emitter,
    pub(super) stop: CancellationToken,
}

impl Tasks {
    /// Starts both tasks; without a reader, the follow task first reads
    /// the stream afresh.
    pub(super) fn spawn(self, reader: Option<Reader>, writer: Option<Writer>) {
        let tasks = Arc::new(self);
        let t = tasks.clone();
        tokio::spawn(async move { t.follow(reader).await });
        tokio::spawn(async move { tasks.tick(writer).await });
    }

    /// Applies records as they come, until stopped; reads the stream
    /// afresh when the consumer ends or fails, backing off while it keeps
    /// failing (a read that broke within a minute counts as failing).
    async fn follow(&self, reader: Option<Reader>) {
        let mut wait = REFOLLOW;
        let mut reader = match reader {
            Some(r) => r,
            None => match self.refollow(&mut wait).await {
                Some(r) => r,
                None => return,
            },
        };
        loop {
            let since = std::time::Instant::now();
            let e = loop {
                let next = tokio::select! {
                    _ = self.stop.cancelled() => return reader.close().await,
                    n = reader.next() => n,
                };
                match next {
                    Ok(Some((offset, Some(r)))) => self.apply(offset, r),
                    Ok(Some((offset, None))) => self.shared.skip(offset),
                    Ok(None) => break ControlError::Ended,
                    Err(e) => break e,
                }
            };
            warn!(error = %e, "following the endpoint-state stream broke; reading it afresh (deliveries go on with the state as it was)");
            if since.elapsed() >= Duration::from_secs(60) {
                wait = REFOLLOW;
            }
            match self.refollow(&mut wait).await {
                Some(r) => reader = r,
                None => return,
            }
        }
    }

    /// Applies a record as it comes. A resume written after a probe closed
    /// a breaker (`super::breakers`) closes this worker's breaker for the
    /// endpoint at once: the released backlog must not meet it open and
    /// go round the delay backend again.
    fn apply(&self, offset: u64, r: Record) {
        let probed = match &r.change {
            Change::Resume { target } if r.id.starts_with(PROBED) => Some(target.clone()),
            _ => None,
        };
        self.shared.apply(offset, r);
        if let Some(t) = probed {
            self.endpoints.close_breaker(&t);
        }
    }

    /// Reads the stream afresh after `wait` (doubled after each failure,
    /// up to a minute), until it works or the session stops (`None`).
    async fn refollow(&self, wait: &mut Duration) -> Option<Reader> {
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return None,
                _ = tokio::time::sleep(*wait) => {}
            }
            *wait = (*wait * 2).min(Duration::from_secs(60));
            let (name, me) = (&self.topology.endpoint_state, &self.shared.me);
            match stream::open_and_read(&self.conn, name, me, stream::CATCH_UP).await {
                Ok((book, reader, writer)) => {
                    writer.close().await;
                    self.shared.install(book);
                    info!("following the endpoint-state stream again");
                    return Some(reader);
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?wait, "reading the endpoint-state stream failed")
                }
            }
        }
    }

    /// Plans and writes every [`TICK`]; every [`REPORT_EVERY`] looks at
    /// every endpoint, for the gauges, the report and the hold on
    /// automatic disables.
    async fn tick(&self, mut writer: Option<Writer>) {
        let mut reports: Option<Channel> = None;
        let (mut reported, mut hold, mut snapshots_after) = (0u64, false, 0u64);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep(TICK) => {}
            }
            let now = now_ms();
            if now >= reported + REPORT_EVERY.as_millis() as u64 {
                reported = now;
                let views = self.endpoints.views(now, SEEN_WITHIN);
                hold = self.hold(hold, &views);
                self.gauges(now, &views);
                self.report(&mut reports, now, views).await;
            }
            self.held_gauges(now);
            let mut records = self.planned(now, &self.endpoints.deltas(), hold);
            // The snapshot goes last, so that it cannot hold the rest up.
            if now >= snapshots_after {
                records.extend(self.snapshot(now));
            }
            let failed = self.write(&mut writer, &records).await;
            self.announce().await;
            if failed.is_some_and(|r| matches!(r.change, Change::Snapshot { .. })) {
                snapshots_after = now + SNAPSHOT_BACKOFF_MS;
            }
        }
        if let Some(w) = writer {
            w.close().await;
        }
    }

    /// Publishes the events of this worker's changes that took effect; one
    /// not confirmed is tried again next tick.
    async fn announce(&self) {
        let records = std::mem::take(&mut *lock(&self.shared.to_announce));
        for (i, r) in records.iter().enumerate() {
            let Some(e) = super::announce::event(self.events.prefix(), r) else {
                continue;
            };
            if let Err(err) = self.events.emit(&e).await {
                warn!(error = %err, event = e.kind.as_str(), "an endpoint event was not confirmed; trying again next tick");
                lock(&self.shared.to_announce).extend_from_slice(&records[i..]);
                return;
            }
        }
    }

    /// Whether automatic disables wait (see [`mostly_failing`]), said once
    /// each way.
    fn hold(&self, was: bool, views: &[View]) -> bool {
        let now = mostly_failing(views);
        match (was, now) {
            (false, true) => warn!("most of this worker's endpoints fail without a success; automatic disables wait (is its own network, DNS or proxy failing?)"),
            (true, false) => info!("automatic disables no longer wait"),
            _ => {}
        }
        now
    }

    /// Appends `records`, opening the writer's channel when needed. On a
    /// failure the rest wait for the planner's next decisions (it plans
    /// again from the state it reads back).
    /// Returns the record that failed, if one did.
    async fn write<'r>(
        &self,
        writer: &mut Option<Writer>,
        records: &'r [Record],
    ) -> Option<&'r Record> {
        for r in records {
            if writer.as_ref().is_none_or(|w| !w.is_connected()) {
                let name = &self.topology.endpoint_state;
                *writer = Writer::open(&self.conn, name).await.ok();
            }
            let Some(w) = writer.as_ref() else {
                return Some(r);
            };
            let change = super::announce::event(self.events.prefix(), r).is_some();
            if change {
                lock(&self.shared.written).push(r.clone());
            }
            if let Err(e) = w.append(r).await {
                warn!(error = %e, "a record for the endpoint-state stream was not confirmed; planning again next tick");
                // Unconfirmed, it may still be in the stream: `apply` or
                // `install` finds out, the planner plans it again if not.
                *writer = None;
                return Some(r);
            }
        }
        None
    }

    /// A snapshot of the whole state, when one is due (see
    /// [`super::book::Book::snapshot_due`]) and not too large.
    fn snapshot(&self, now: u64) -> Option<Record> {
        let book = lock(&self.shared.book);
        // A spread of up to ten seconds, so workers rarely write one each.
        if !book.snapshot_due(now, self.shared.plan.spread_ms * 20) {
            return None;
        }
        let change = Change::Snapshot {
            through: book.through().unwrap_or(0),
            keys: book.snapshot_keys(now),
        };
        let r = Record::new(now, &self.shared.me, change);
        let size = r.to_json().len();
        if size > MAX_SNAPSHOT_BYTES {
            warn!(size, "the endpoint state is too large for one snapshot; none written (targets older than the stream's 7 days may be forgotten)");
            return None;
        }
        Some(r)
    }

    /// The planner's records.
    fn planned(
        &self,
        now: u64,
        deltas: &[(Target, Delta, Option<u64>)],
        hold: bool,
    ) -> Vec<Record> {
        let inner = &self.shared;
        let book = lock(&inner.book);
        let inputs = Inputs {
            now_ms: now,
            book: &book,
            deltas,
            hold_disables: hold,
        };
        let mut out = plan::plan(&inputs, &mut lock(&inner.carry), &inner.plan, &inner.me);
        if let Some(after) = inner.plan.breaker_park_after {
            // Read with the breakers: `now` was read before the report.
            let now_ms = now_ms();
            let seen = self.endpoints.breakers(now_ms);
            let i = super::breakers::Inputs {
                now_ms,
                book: &book,
                seen: &seen,
                after,
                hold,
            };
            out.extend(super::breakers::plan(&i, &inner.me));
        }
        out
    }

    /// `redeliver_endpoints{state}` for the paused and disabled targets,
    /// every tick: a change shows within a second.
    fn held_gauges(&self, now: u64) {
        let (paused, disabled) = self.shared.table().counts(now);
        for (state, n) in [("paused", paused), ("disabled", disabled)] {
            metrics::gauge!(telemetry::ENDPOINTS_BY_STATE, "state" => state).set(n as f64);
        }
    }

    /// `redeliver_endpoints{state}` for this worker's endpoints seen
    /// lately that are active or behind an open breaker.
    fn gauges(&self, now: u64, views: &[View]) {
        let table = self.shared.table();
        let (mut active, mut open) = (0, 0);
        for v in views {
            let held = v
                .target
                .as_ref()
                .is_some_and(|t| table.covering(t, now).is_some());
            match (held, v.breaker_open) {
                (true, _) => {}
                (false, true) => open += 1,
                (false, false) => active += 1,
            }
        }
        for (state, n) in [("active", active), ("breaker-open", open)] {
            metrics::gauge!(telemetry::ENDPOINTS_BY_STATE, "state" => state).set(n as f64);
        }
    }

    /// Publishes this worker's report, opening its channel when needed.
    /// A report that cannot be sent is skipped: the next follows soon.
    async fn report(&self, ch: &mut Option<Channel>, now: u64, views: Vec<View>) {
        let endpoints: Vec<EndpointReport> = views.into_iter().map(EndpointReport::from).collect();
        let inner = &self.shared;
        let through = lock(&inner.book).through();
        let held = self.shared.held_reports();
        let parts = reports::parts(&inner.worker, now, through, endpoints, held);
        if ch.as_ref().is_none_or(|c| !c.status().connected()) {
            let open = self.conn.create_channel();
            *ch = tokio::time::timeout(stream::OP_TIMEOUT, open)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(c) = ch.as_ref() else { return };
        for p in &parts {
            if let Err(e) = reports::publish(c, &self.topology, p).await {
                tracing::debug!(error = %e, "endpoint report not sent");
                return;
            }
        }
    }
}

/// Whether most of this worker's recent endpoints (four or more) failed
/// over the last five minutes without one success: its own network, DNS
/// or proxy is then the likelier culprit than every receiver at once.
fn mostly_failing(views: &[View]) -> bool {
    let failing = views
        .iter()
        .filter(|v| v.counts.failures > 0 && v.counts.successes == 0)
        .count();
    views.len() >= MIN_FOR_HOLD && failing * 2 > views.len()
}
