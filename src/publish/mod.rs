//! Publishing with publisher confirms: new notifications, retries and dead
//! letters. Nothing is reported as published until the broker confirmed it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use crate::message::state::{is_broker_count_header, is_cascade_header};
use crate::message::InvalidMessage;
use crate::topology::Topology;

mod prepare;
pub use prepare::{prepare, Prepared};

/// Where a delayed copy is published. The delay backends (`crate::delay`)
/// compute it; this module only publishes there, so it never needs to know
/// how a backend makes a message wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayedRoute {
    pub exchange: String,
    pub routing_key: String,
    /// Whether to publish `mandatory`: an unroutable copy is then an error,
    /// not a silent drop. The plugin cannot use it.
    pub mandatory: bool,
}

/// The delay seam as the publisher sees it: given a delay, set its headers
/// and say where the copy goes. `crate::delay::DelayBackend` implements it.
pub trait DelayRouter: Send + Sync + 'static {
    /// `key`: the copy's bucket key ([`crate::topology::lanes`]), which
    /// brings it back to its lane when due.
    fn route(
        &self,
        t: &Topology,
        delay_ms: u32,
        key: &str,
        headers: &mut FieldTable,
    ) -> DelayedRoute;
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker refused the message (nack)")]
    Nacked,
    #[error("the message was not routed to any queue (is the topology declared?)")]
    Unroutable,
    #[error("no publisher confirm within {0:?}")]
    ConfirmTimeout(Duration),
    #[error("invalid notification: {0}")]
    Invalid(#[from] InvalidMessage),
    #[error(transparent)]
    History(#[from] crate::history::HistoryError),
}

/// Confirm-mode channels plus where things go. Publishes are spread over
/// the channels round-robin: a broker handles each channel in one process,
/// so one channel would serialise every confirm behind the previous one
/// (the local stand-in's fsync before each delayed confirm, for one).
#[derive(Clone)]
pub struct Publisher {
    channels: Arc<[Channel]>,
    next: Arc<AtomicUsize>,
    topology: Topology,
    delay: Arc<dyn DelayRouter>,
    confirm_timeout: Duration,
}

impl Publisher {
    /// One channel: enough for `publish` and the operator commands.
    pub async fn new(
        conn: &Connection,
        topology: Topology,
        delay: impl DelayRouter,
        confirm_timeout: Duration,
    ) -> Result<Self, lapin::Error> {
        Self::with_channels(conn, 1, topology, delay, confirm_timeout).await
    }

    /// `n` channels (at least one), for a worker's concurrent republishes.
    pub async fn with_channels(
        conn: &Connection,
        n: usize,
        topology: Topology,
        delay: impl DelayRouter,
        confirm_timeout: Duration,
    ) -> Result<Self, lapin::Error> {
        let mut channels = Vec::with_capacity(n.max(1));
        for _ in 0..n.max(1) {
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            channels.push(channel);
        }
        Ok(Publisher {
            channels: channels.into(),
            next: Arc::new(AtomicUsize::new(0)),
            topology,
            delay: Arc::new(delay),
            confirm_timeout,
        })
    }

    /// The names it publishes to.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn is_connected(&self) -> bool {
        self.channels.iter().all(|c| c.status().connected())
    }

    fn channel(&self) -> &Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        &self.channels[i]
    }

    /// Publishes a prepared notification: to the intake exchange, or with a
    /// `delay` straight to the work queue through the delay mechanism.
    pub async fn publish_new(
        &self,
        n: &Prepared,
        delay: Option<Duration>,
    ) -> Result<(), PublishError> {
        let mut props = notification_properties(&n.id);
        let mut headers = FieldTable::default();
        if let Some(t) = &n.trace {
            t.write(&mut headers);
        }
        let run = crate::message::state::long_string(&n.run);
        headers.insert(crate::message::run::H_RUN.into(), run);
        match delay {
            None => {
                props = props.with_headers(headers);
                // The bucket key picks the lane (`topology::lanes`).
                self.confirmed(&self.topology.intake, &n.key, true, &n.payload, props)
                    .await
            }
            // Not the bucket key: a producer cannot know the workers have
            // bound the buckets on the plugin's exchange yet, where an
            // unbound key is dropped. The single work queue's name is
            // always bound there, to lane 0 (or, before the workers moved
            // to lanes, to that queue); the cascade's exit takes it to lane
            // 0 too. Its retries then go to its bucket's lane.
            Some(d) => {
                let key = self.topology.work.clone();
                self.delayed(&n.payload, props, &key, &mut headers, d).await
            }
        }
    }

    /// Republishes a failed delivery to wait `delay` before its next attempt,
    /// then come back to the lane of bucket key `key`. The copy gets the
    /// original's properties (see [`republish_properties`]).
    pub async fn retry(
        &self,
        payload: &[u8],
        props: BasicProperties,
        key: &str,
        mut headers: FieldTable,
        delay: Duration,
    ) -> Result<(), PublishError> {
        self.delayed(payload, props, key, &mut headers, delay).await
    }

    async fn delayed(
        &self,
        payload: &[u8],
        props: BasicProperties,
        key: &str,
        headers: &mut FieldTable,
        delay: Duration,
    ) -> Result<(), PublishError> {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        // Stripped before the route adds this delay's own headers.
        strip_transit_headers(headers);
        let route = self.delay.route(&self.topology, ms, key, headers);
        let props = copy_properties(&props, std::mem::take(headers));
        self.confirmed(
            &route.exchange,
            &route.routing_key,
            route.mandatory,
            payload,
            props,
        )
        .await
    }

    /// Publishes to the dead-letter queue (default exchange, mandatory, so a
    /// missing queue is an error rather than a silent drop).
    pub async fn dead_letter(
        &self,
        payload: &[u8],
        props: BasicProperties,
    ) -> Result<(), PublishError> {
        self.confirmed("", &self.topology.dead, true, payload, props)
            .await
    }

    /// Publishes to `exchange` with `key` and waits for the broker's
    /// confirm: the building block of every publish above, and of the
    /// holder's release to the cascade's exit. One confirm timeout bounds
    /// the whole round trip.
    pub async fn confirmed(
        &self,
        exchange: &str,
        key: &str,
        mandatory: bool,
        payload: &[u8],
        props: BasicProperties,
    ) -> Result<(), PublishError> {
        let round_trip = async {
            let pending = self
                .publish(exchange, key, mandatory, payload, props)
                .await?;
            pending.await
        };
        self.bounded(round_trip).await.and_then(confirmation)
    }

    /// Publishes to the notification's lane (the lanes exchange, not the
    /// intake: no other queue bound to the intake gets it) and hands back
    /// the confirm, for a caller that keeps several in flight (a paced
    /// replay's batch) and waits for them with [`Publisher::settle`], in
    /// order.
    pub async fn start_to_work_queue(
        &self,
        payload: &[u8],
        props: BasicProperties,
    ) -> Result<lapin::PublisherConfirm, PublishError> {
        let key = crate::topology::lanes::key_of_payload(payload);
        let exchange = &self.topology.lanes_exchange;
        let publish = self.publish(exchange, &key, true, payload, props);
        self.bounded(publish).await
    }

    /// Waits for a started publish's confirm, at most the confirm timeout.
    pub async fn settle(&self, pending: lapin::PublisherConfirm) -> Result<(), PublishError> {
        self.bounded(pending).await.and_then(confirmation)
    }

    async fn publish(
        &self,
        exchange: &str,
        key: &str,
        mandatory: bool,
        payload: &[u8],
        props: BasicProperties,
    ) -> Result<lapin::PublisherConfirm, lapin::Error> {
        let opts = BasicPublishOptions {
            mandatory,
            ..Default::default()
        };
        self.channel()
            .basic_publish(exchange.into(), key.into(), opts, payload, props)
            .await
    }

    /// `step`, cut short after the confirm timeout.
    async fn bounded<T>(
        &self,
        step: impl std::future::Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, PublishError> {
        match tokio::time::timeout(self.confirm_timeout, step).await {
            Err(_) => Err(PublishError::ConfirmTimeout(self.confirm_timeout)),
            Ok(r) => Ok(r?),
        }
    }
}

/// The broker's answer to a confirmed publish.
fn confirmation(c: Confirmation) -> Result<(), PublishError> {
    match c {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
    }
}

/// Removes the headers that record a message's last trip through the
/// broker rather than the notification:
/// - `x-death` and `x-first-death-*`/`x-last-death-*`. The cascade delay
///   backend dead-letters a message through its queues, and the broker
///   records each hop there. A copy that kept them would look like a
///   dead-lettering cycle on its next delay through a queue it passed
///   before, and the broker would never hand it on (RabbitMQ's cycle
///   detection).
/// - `x-delivery-count` and `x-acquired-count`, which quorum queues add to
///   a redelivered message (the hold queue's, for one): they count another
///   queue's deliveries ([`is_broker_count_header`]).
/// - the cascade's digits and due time of the last delay
///   ([`is_cascade_header`]): a delayed copy gets its own,
///   and elsewhere they mean nothing.
pub fn strip_transit_headers(headers: &mut FieldTable) {
    retain_headers(headers, |k| {
        !(k == "x-death"
            || is_broker_count_header(k)
            || k.starts_with("x-first-death-")
            || k.starts_with("x-last-death-")
            || is_cascade_header(k))
    });
}

/// Keeps only the headers whose name passes `keep`.
pub fn retain_headers(headers: &mut FieldTable, keep: impl Fn(&str) -> bool) {
    if headers.inner().keys().all(|k| keep(k.as_str())) {
        return;
    }
    // FieldTable has no remove: rebuild it without them.
    let mut kept = FieldTable::default();
    for (k, v) in headers.inner() {
        if keep(k.as_str()) {
            kept.insert(k.clone(), v.clone());
        }
    }
    *headers = kept;
}

/// The properties of a republished copy: the original's, minus what would
/// make the broker drop or refuse it (`expiration`, `user-id` of another
/// user), persistent, and with the given headers, less those of its last
/// trip through the broker (see [`strip_transit_headers`]).
pub fn republish_properties(orig: &BasicProperties, mut headers: FieldTable) -> BasicProperties {
    strip_transit_headers(&mut headers);
    copy_properties(orig, headers)
}

/// [`republish_properties`] for headers already stripped.
fn copy_properties(orig: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut p = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    if let Some(v) = orig.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = orig.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = orig.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = orig.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = orig.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = orig.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = orig.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = orig.app_id() {
        p = p.with_app_id(v.clone());
    }
    p
}

/// Persistent JSON with the notification id as the AMQP message-id.
pub fn notification_properties(id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        // delivery_mode 2: persistent, written to disk by the queue.
        .with_delivery_mode(2)
        .with_message_id(id.into())
}
