//! The delay backend's liveness probe.
//!
//! A delay backend can stop routing without an error anywhere: the
//! upstream plugin's timer loop spins for ever on an index entry a crash
//! left without its message, and a cascade stage stops handing messages on
//! when a policy caps its length or a binding goes missing. Retries then
//! simply never come back. So every `run` worker sends a tiny probe every
//! `--delay-probe-every` along the very path a retry takes, and expects it
//! back within its delay plus `--delay-probe-grace`:
//! - plugin: the prefix's `x-delayed-message` exchange with an `x-delay`,
//!   routed by key to the worker's own probe queue (the work queue is
//!   bound by its own name, so it never matches);
//! - cascade: two stages' queues, leaving at stage 0 for the worker's
//!   queue and a sink ([`cascade::PROBE_DIGIT`]), never the work queue.
//!
//! The probe queue is exclusive: it dies with the worker's connection, and
//! a probe that comes out after that is routed to nothing (or to the
//! cascade's sink, which drops it). What the probes say ([`book`]) goes to
//! a gauge, the log, `/readyz` and the reports `status` reads
//! ([`crate::delay::report`]); a stalled plugin flips the failover switch
//! ([`crate::delay::failover`]).

pub mod book;
mod watch;

pub use watch::{probe_delay, Watch, PLUGIN_PROBE_DELAY_MS};

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::{BrokerSettings, DelayBackend};
use crate::delay::cascade;
use crate::events::lease::{self, Announcer, News};
use crate::events::Emitter;
use crate::message::state::{self, H_DELAY};
use crate::topology::{Topology, TopologyError};

/// The probe queue's name, in every probe and in its cascade binding.
pub const H_PROBE: &str = "redeliver-probe";
/// The probe's sequence number in its backend's [`book::Book`].
const H_SEQ: &str = "redeliver-probe-seq";
/// `plugin` or `cascade`: which path the probe took.
const H_BACKEND: &str = "redeliver-probe-backend";
/// A bound on declaring the cascade at a session's start (the first
/// time takes a few seconds): the session must not wait for ever on a
/// broker that does not answer.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the books are checked for an overdue probe.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A probe publish that takes longer (a blocked connection) is given up;
/// the probe is out all the same, and goes overdue.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// One connection's probe: its channel, queue and consumer.
pub struct Prober {
    /// For the cascade's declaration on failover, on a channel of its own
    /// (a refusal closes the channel it happens on).
    conn: Arc<Connection>,
    channel: Channel,
    consumer: lapin::Consumer,
    queue: String,
    topology: Topology,
    broker: BrokerSettings,
    watch: Watch,
    /// Whether this connection bound the queue to the cascade's stage 0.
    cascade_bound: bool,
}

impl Prober {
    /// Declares this connection's probe queue, binds it to the backends
    /// in use (the cascade too while failing over, declaring it first) and
    /// starts consuming. `None` when probes are off.
    pub async fn start(
        conn: &Arc<Connection>,
        broker: &BrokerSettings,
        topology: &Topology,
        watch: &Watch,
    ) -> Result<Option<Self>, ProbeError> {
        if watch.settings().every.is_none() {
            return Ok(None);
        }
        let channel = conn.create_channel().await?;
        let queue = format!(
            "{}.probe.{}",
            topology.prefix,
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        declare_queue(&channel, &queue).await?;
        if let Err(e) = crate::delay::report::declare(conn, topology).await {
            // The probe works without; only `status` misses this worker.
            warn!(error = %e, "the delay-state queue could not be declared; `status` will not show this worker's probes");
        }
        let mut p = Prober {
            conn: conn.clone(),
            consumer: consume(&channel, &queue).await?,
            channel,
            queue,
            topology: topology.clone(),
            broker: broker.clone(),
            watch: watch.clone(),
            cascade_bound: false,
        };
        p.watch.forget_out();
        match broker.delay {
            DelayBackend::Plugin => p.bind_plugin().await?,
            DelayBackend::Cascade => p.bind_cascade().await?,
        }
        let reports = match watch.can_adopt() {
            true => crate::delay::report::read(conn, topology).await,
            false => vec![],
        };
        if watch.adopt_reported_stall(&reports) || watch.failover_on() {
            // The publisher routes to the cascade from the first retry.
            // If it cannot be declared, retries stay on the plugin (and
            // failover is tried again with the next report).
            let declared = tokio::time::timeout(FAILOVER_TIMEOUT, p.failover()).await;
            if let Err(e) = declared.unwrap_or(Err(ProbeError::Timeout(FAILOVER_TIMEOUT))) {
                tracing::error!(error = %e, "failing over to the cascade failed: its topology could not be declared; retries stay on the plugin");
                watch.release_failover();
            }
        }
        Ok(Some(p))
    }

    /// Runs the probe until `stop`. The token returned is cancelled if it
    /// ends before that (its channel closed, its queue deleted): a worker
    /// that no longer probes must not look fine, so the session reconnects.
    /// Stalls and recoveries are also published as operational `events`.
    pub fn spawn(self, stop: CancellationToken, events: Emitter) -> CancellationToken {
        let failed = CancellationToken::new();
        let f = failed.clone();
        tokio::spawn(async move {
            let stopped = self.run(stop.clone(), events).await;
            if !stop.is_cancelled() {
                warn!(reason = stopped, "the delay probe stopped");
                f.cancel();
            }
        });
        failed
    }

    /// Returns why it ended.
    async fn run(mut self, stop: CancellationToken, events: Emitter) -> &'static str {
        let events = lease::announcer(self.conn.clone(), events);
        let every = self.watch.settings().every.unwrap_or(Duration::MAX);
        let mut send = tokio::time::interval(every);
        send.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(CHECK_EVERY);
        let mut report = tokio::time::interval(crate::delay::report::REPORT_EVERY);
        let why = loop {
            tokio::select! {
                _ = stop.cancelled() => break "stopped",
                _ = send.tick() => self.send_all().await,
                _ = check.tick() => {
                    for change in self.watch.check() {
                        Self::announce(&change, &events);
                        self.changed(change).await;
                    }
                }
                _ = report.tick() => {
                    self.retry_failover().await;
                    self.report().await;
                }
                d = self.consumer.next() => match d {
                    Some(Ok(d)) => self.back(&d, &events).await,
                    Some(Err(_)) => break "its channel failed",
                    None => break "its consumer was cancelled (was its queue deleted?)",
                },
            }
        };
        let _ = self.channel.close(200, "probe done".into()).await;
        why
    }

    /// A failover whose declaration failed is tried again (every report),
    /// bounded like the first try: a broker that does not answer must not
    /// hold up the probe loop.
    async fn retry_failover(&mut self) {
        if self.watch.wants_failover() && !self.watch.failover_on() {
            let declared = tokio::time::timeout(FAILOVER_TIMEOUT, self.failover()).await;
            if let Err(e) = declared.unwrap_or(Err(ProbeError::Timeout(FAILOVER_TIMEOUT))) {
                tracing::error!(error = %e, "failing over to the cascade failed again; retries stay on the plugin");
            }
        }
    }

    /// One probe through each backend in use.
    async fn send_all(&mut self) {
        let mut backends = vec![self.broker.delay];
        if self.cascade_bound && self.broker.delay == DelayBackend::Plugin {
            backends.push(DelayBackend::Cascade);
        }
        for backend in backends {
            let seq = self.watch.sent(backend);
            let publish = self.publish(backend, seq);
            match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, backend = backend.as_str(), "probe not sent"),
                Err(_) => debug!(backend = backend.as_str(), "probe publish timed out"),
            }
        }
    }

    async fn publish(&self, backend: DelayBackend, seq: u64) -> Result<(), lapin::Error> {
        let mut h = FieldTable::default();
        h.insert(
            H_PROBE.into(),
            AMQPValue::LongString(self.queue.as_str().into()),
        );
        h.insert(H_SEQ.into(), AMQPValue::LongLongInt(seq as i64));
        h.insert(
            H_BACKEND.into(),
            AMQPValue::LongString(backend.as_str().into()),
        );
        let delay = probe_delay(backend).as_millis() as i64;
        // x-delay: the plugin holds the probe this long (the cascade reads
        // its digits; set there too, as on every copy).
        h.insert(H_DELAY.into(), AMQPValue::LongLongInt(delay));
        let (exchange, key) = match backend {
            DelayBackend::Plugin => (self.topology.retry.clone(), self.queue.clone()),
            DelayBackend::Cascade => (cascade::probe_entry(&self.topology, &mut h), String::new()),
        };
        // Transient, and no confirm: a probe that is lost is a probe that
        // does not come back, which is what the probe is for.
        let props = BasicProperties::default().with_headers(h);
        self.channel
            .basic_publish(
                exchange.as_str().into(),
                key.as_str().into(),
                BasicPublishOptions::default(),
                b"",
                props,
            )
            .await
            .map(|_| ())
    }

    async fn back(&mut self, d: &Delivery, events: &Announcer) {
        let headers = d.properties.headers().as_ref();
        let seq = state::get(headers, H_SEQ).and_then(state::int);
        let name = state::get(headers, H_BACKEND).and_then(state::string);
        let Some(backend) = name.as_deref().and_then(DelayBackend::from_name) else {
            return;
        };
        let Some(seq) = seq.and_then(|s| u64::try_from(s).ok()) else {
            return;
        };
        if let Some(change) = self.watch.back(backend, seq) {
            Self::announce(&change, events);
            self.changed(change).await;
        }
    }

    /// Tells the stall's announcer (`crate::events::lease`) of a stall or
    /// of probes coming back; it publishes the events in order, in the
    /// background: the probe goes on meanwhile.
    fn announce(change: &watch::Event, to: &Announcer) {
        let news = match change.change {
            book::Change::Stalled { sent, .. } => News::Stalled(sent),
            book::Change::Cleared { .. } | book::Change::Routing => News::Routing,
            book::Change::None => return,
        };
        to.send(change.backend.as_str(), news);
    }

    /// Logs, gauges and reports a change, and fails over or back.
    async fn changed(&mut self, change: watch::Event) {
        let failover = self.watch.apply(&change, &self.topology);
        // Reported first: declaring the cascade takes seconds.
        self.report().await;
        match failover {
            watch::Failover::Engage => {
                if let Err(e) = self.failover().await {
                    tracing::error!(error = %e, "failing over to the cascade failed: its topology could not be declared; retries stay on the plugin");
                }
            }
            watch::Failover::Release => self.watch.release_failover(),
            watch::Failover::Stay => return,
        }
        self.report().await;
    }

    /// Declares the cascade, binds this connection's probes to it and
    /// turns the switch on (in that order: a delay routed there must find
    /// its queues).
    async fn failover(&mut self) -> Result<(), ProbeError> {
        if !self.cascade_bound {
            let ch = self.conn.create_channel().await?;
            let declared = cascade::declare(&ch, &self.topology).await;
            let _ = ch.close(200, "cascade declared".into()).await;
            declared?;
            self.bind_cascade().await?;
        }
        self.watch.engage_failover();
        Ok(())
    }

    async fn bind_plugin(&self) -> Result<(), ProbeError> {
        // Key: the probe queue's own name; the retry exchange routes like a
        // direct exchange, and the work queue is bound by its name.
        let (q, x) = (&self.queue, &self.topology.retry);
        let args = FieldTable::default();
        Ok(bind(&self.channel, q, x, q, args).await?)
    }

    async fn bind_cascade(&mut self) -> Result<(), ProbeError> {
        let stage0 = cascade::stage(&self.topology, 0);
        let args = cascade::probe_match(&[(H_PROBE, self.queue.as_str())]);
        bind(&self.channel, &self.queue, &stage0, "", args).await?;
        self.cascade_bound = true;
        Ok(())
    }

    async fn report(&self) {
        let r = self.watch.report();
        if let Err(e) = crate::delay::report::publish(&self.channel, &self.topology, &r).await {
            debug!(error = %e, "delay-state report not sent");
        }
    }
}

/// An exclusive, auto-deleted classic queue: it goes with the connection.
async fn declare_queue(ch: &Channel, queue: &str) -> Result<(), lapin::Error> {
    let opts = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..Default::default()
    };
    let mut args = FieldTable::default();
    // x-queue-type: classic; exclusive queues cannot be quorum, and a
    // vhost's default queue type must not apply.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    ch.queue_declare(queue.into(), opts, args).await.map(|_| ())
}

async fn consume(ch: &Channel, queue: &str) -> Result<lapin::Consumer, lapin::Error> {
    // no_ack: a probe is read and forgotten; the broker keeps nothing.
    let opts = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    ch.basic_consume(queue.into(), "".into(), opts, FieldTable::default())
        .await
}

async fn bind(
    ch: &Channel,
    q: &str,
    x: &str,
    key: &str,
    args: FieldTable,
) -> Result<(), lapin::Error> {
    ch.queue_bind(
        q.into(),
        x.into(),
        key.into(),
        QueueBindOptions::default(),
        args,
    )
    .await
}
