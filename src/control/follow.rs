//! A worker's two tasks for the shared state, per connection: one follows
//! the stream and applies each record as it comes; the other ticks every
//! second to write what the planner decides (the failing clock, automatic
//! disables, closed pauses, snapshots), to set the `redeliver_endpoints`
//! gauge, and every [`REPORT_EVERY`] to publish this worker's report.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::error::ControlError;
use super::plan;
use super::record::{Change, Record};
use super::reports::{self, EndpointReport, REPORT_EVERY, SEEN_WITHIN};
use super::shared::{lock, now_ms, Shared};
use super::stream::{Reader, Writer};
use crate::endpoint::{Endpoints, View};
use crate::telemetry;
use crate::topology::Topology;

/// How often the planner runs.
const TICK: Duration = Duration::from_secs(1);
/// A snapshot at most this often (plus this worker's spread, in minutes:
/// so workers rarely write one each).
const SNAPSHOT_EVERY_MS: u64 = 3_600_000;

/// What the tasks share.
pub(super) struct Tasks {
    pub(super) shared: Arc<Shared>,
    pub(super) endpoints: Arc<Endpoints>,
    pub(super) topology: Topology,
    pub(super) conn: Arc<Connection>,
    pub(super) stop: CancellationToken,
    pub(super) failed: CancellationToken,
}

impl Tasks {
    pub(super) fn spawn(self, reader: Reader, writer: Writer) {
        let tasks = Arc::new(self);
        let t = tasks.clone();
        tokio::spawn(async move { t.follow(reader).await });
        tokio::spawn(async move { tasks.tick(writer).await });
    }

    /// Applies records as they come, until stopped or the consumer ends.
    async fn follow(&self, mut reader: Reader) {
        loop {
            let next = tokio::select! {
                _ = self.stop.cancelled() => break,
                n = reader.next() => n,
            };
            match next {
                Ok(Some((offset, r))) => self.shared.apply(offset, r),
                Ok(None) => return self.fail(&ControlError::Ended),
                Err(e) => return self.fail(&e),
            }
        }
        reader.close().await;
    }

    fn fail(&self, e: &ControlError) {
        if !self.stop.is_cancelled() {
            warn!(error = %e, "following the endpoint-state stream stopped; reconnecting");
            self.failed.cancel();
        }
    }

    /// Plans and writes every [`TICK`]; reports every [`REPORT_EVERY`].
    async fn tick(&self, writer: Writer) {
        let mut reports: Option<Channel> = None;
        let mut reported = 0u64;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep(TICK) => {}
            }
            let now = now_ms();
            let views = self.endpoints.views(now, SEEN_WITHIN, true);
            for r in self.planned(now, &views) {
                if let Err(e) = writer.append(&r).await {
                    return self.fail(&e);
                }
            }
            self.gauges(now, &views);
            if now >= reported + REPORT_EVERY.as_millis() as u64 {
                reported = now;
                self.report(&mut reports, now, views).await;
            }
        }
        writer.close().await;
    }

    /// The planner's records, and a snapshot when one is due.
    fn planned(&self, now: u64, views: &[View]) -> Vec<Record> {
        let inner = &self.shared;
        let deltas: Vec<_> = views
            .iter()
            .filter(|v| !v.delta.is_empty())
            .filter_map(|v| Some((v.target.clone()?, v.delta.clone(), v.last_success_ms)))
            .collect();
        let mut book = lock(&inner.book);
        let mut carry = lock(&inner.carry);
        let mut out = plan::plan(now, &book, &deltas, &mut carry, &inner.plan, &inner.me);
        let every = SNAPSHOT_EVERY_MS + inner.plan.spread_ms * 60_000;
        if book.snapshot_due(now, every) {
            let change = Change::Snapshot {
                through: book.through().unwrap_or(0),
                keys: book.compact(now),
            };
            out.push(Record::new(now, &inner.me, change));
        }
        out
    }

    /// `redeliver_endpoints{state}`: this worker's endpoints seen lately by
    /// state, and the targets paused and disabled.
    fn gauges(&self, now: u64, views: &[View]) {
        let table = self.shared.table();
        let (paused, disabled) = table.counts(now);
        let recent = views
            .iter()
            .filter(|v| now.saturating_sub(v.seen_ms) <= SEEN_WITHIN.as_millis() as u64);
        let (mut active, mut open) = (0, 0);
        for v in recent {
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
        for (state, n) in [
            ("active", active),
            ("paused", paused),
            ("disabled", disabled),
            ("breaker-open", open),
        ] {
            metrics::gauge!(telemetry::ENDPOINTS_BY_STATE, "state" => state).set(n as f64);
        }
    }

    /// Publishes this worker's report, opening its channel when needed.
    /// A report that cannot be sent is skipped: the next follows soon.
    async fn report(&self, ch: &mut Option<Channel>, now: u64, views: Vec<View>) {
        let endpoints: Vec<EndpointReport> = views
            .into_iter()
            .filter(|v| now.saturating_sub(v.seen_ms) <= SEEN_WITHIN.as_millis() as u64)
            .map(EndpointReport::from)
            .collect();
        let inner = &self.shared;
        let through = lock(&inner.book).through();
        let held = self.shared.held_reports();
        let parts = reports::parts(&inner.worker, now, through, endpoints, held);
        if ch.as_ref().is_none_or(|c| !c.status().connected()) {
            *ch = self.conn.create_channel().await.ok();
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
