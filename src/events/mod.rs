//! Operational events, published: every event goes to the topic exchange
//! `<prefix>.events` with its type as the routing key ([`Emitter`]). With
//! `--events-url`, workers also bind a queue of their own to it and relay
//! what it gets to the intake as notifications ([`relay`]), so redeliver
//! delivers events like any other (signed, retried, dead-lettered), the
//! commands' events included.
//!
//! The publish is confirmed before [`Emitter::emit`] returns: a caller
//! that acks a delivery only after its event (the worker does) never loses
//! one, and a crash before the ack publishes it again, with the same `id`.
//! What an event says is `crate::message::event`; which outcome gets one
//! is the worker's (`worker/notify.rs`).
//!
//! No loops: a notification that is itself an event delivery (its AMQP
//! header [`H_EVENT`], or its URL is the events URL) produces no events,
//! and an endpoint event about the events URL's own endpoint goes to the
//! exchange only.

pub mod lease;
pub mod relay;

use std::sync::Arc;

use lapin::types::FieldTable;
use lapin::BasicProperties;
use url::Url;

use crate::config::EventSettings;
use crate::message::event::Event;
use crate::publish::{notification_properties, PublishError, Publisher};
use crate::topology::Topology;

/// The AMQP header that marks a notification carrying an event to the
/// events URL; its value is the event's type.
pub const H_EVENT: &str = "redeliver-event";

/// Publishes events for one connection's publisher.
#[derive(Clone)]
pub struct Emitter {
    publisher: Publisher,
    topology: Topology,
    settings: Arc<EventSettings>,
}

impl Emitter {
    pub fn new(publisher: &Publisher, topology: &Topology, settings: &EventSettings) -> Emitter {
        Emitter {
            publisher: publisher.clone(),
            topology: topology.clone(),
            settings: Arc::new(settings.clone()),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.topology.prefix
    }

    pub fn settings(&self) -> &EventSettings {
        &self.settings
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether a delivery to `url` with these AMQP headers carries an
    /// event: then it produces none of its own.
    pub fn is_event_delivery(&self, url: Option<&Url>, headers: Option<&FieldTable>) -> bool {
        let marked = headers.is_some_and(|h| h.inner().contains_key(H_EVENT));
        marked || url.is_some_and(|u| self.settings.url.as_ref() == Some(u))
    }

    /// Publishes `e` to the exchange and waits for its confirm.
    pub async fn emit(&self, e: &Event) -> Result<(), PublishError> {
        self.publisher
            .confirmed(
                &self.topology.events,
                e.kind.as_str(),
                // Not mandatory: an exchange nobody bound to drops the
                // event, which is what "no consumer" means.
                false,
                &e.to_json(),
                properties(&e.id, e.kind.as_str(), FieldTable::default()),
            )
            .await
    }
}

/// Persistent JSON, with the event's id as the message id and its type as
/// the AMQP `type`.
pub(crate) fn properties(id: &str, kind: &str, headers: FieldTable) -> BasicProperties {
    notification_properties(id)
        .with_type(kind.into())
        .with_headers(headers)
}
