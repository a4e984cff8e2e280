//! The delay seam: how a message is made to wait before it reaches the
//! work queue again. Everything else in redeliver only asks this module for
//! "publish here, with these headers"; a plugin-free backend slots in here.

pub mod cascade;
pub mod hold;

use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::message::state::H_DELAY;
use crate::topology::{classify, Topology, TopologyError};

/// Where a delayed message is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayedRoute {
    pub exchange: String,
    pub routing_key: String,
    /// Whether to publish `mandatory`: an unroutable copy is then an error,
    /// not a silent drop. The plugin cannot use it (see [`DelayBackend::route`]).
    pub mandatory: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DelayBackend {
    /// The `x-delayed-message` exchange type (rabbitmq_delayed_message_exchange).
    #[default]
    Plugin,
    /// A cascade of TTL quorum queues, delays of 1 s or less held by the
    /// `run` workers: no plugin, for RabbitMQ 4.3+ and managed brokers.
    // See `crate::delay::cascade` and `crate::delay::hold`.
    Cascade,
}

impl DelayBackend {
    pub(crate) async fn declare(self, ch: &Channel, t: &Topology) -> Result<(), TopologyError> {
        match self {
            DelayBackend::Plugin => {
                let mut args = FieldTable::default();
                // x-delayed-type: direct; the exchange routes like a direct
                // exchange once the delay is over (key = work queue name).
                args.insert(
                    "x-delayed-type".into(),
                    AMQPValue::LongString("direct".into()),
                );
                let opts = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                ch.exchange_declare(
                    t.retry.as_str().into(),
                    ExchangeKind::Custom("x-delayed-message".into()),
                    opts,
                    args,
                )
                .await
                .map_err(|e| classify("exchange", &t.retry, e))?;
                // Due messages route to the work queue by its name.
                t.bind(ch, &t.retry, &t.work).await
            }
            DelayBackend::Cascade => crate::delay::cascade::declare(ch, t).await,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DelayBackend::Plugin => "plugin",
            DelayBackend::Cascade => "cascade",
        }
    }

    /// Sets the delay on `headers` and says where to publish, and whether
    /// `mandatory` may be set (the plugin returns every delayed message as
    /// unroutable at publish time, so not there). The route reaches the
    /// work queue only, never other queues bound to the intake.
    pub fn route(self, t: &Topology, delay_ms: u32, headers: &mut FieldTable) -> DelayedRoute {
        // x-delay: milliseconds to hold the message, as an integer. The
        // cascade reads its digit headers instead, but sets it too, so a
        // copy reads the same whichever backend carried it.
        headers.insert(H_DELAY.into(), AMQPValue::LongLongInt(delay_ms.into()));
        match self {
            DelayBackend::Plugin => DelayedRoute {
                exchange: t.retry.clone(),
                routing_key: t.work.clone(),
                mandatory: false,
            },
            // Short delays go to the hold queue (default exchange, its
            // name as the key), where the workers time them.
            DelayBackend::Cascade if crate::delay::cascade::is_held(delay_ms) => {
                crate::delay::cascade::hold_entry(delay_ms, now_us(), headers);
                DelayedRoute {
                    exchange: String::new(),
                    routing_key: crate::delay::cascade::hold(t),
                    mandatory: true,
                }
            }
            DelayBackend::Cascade => DelayedRoute {
                exchange: crate::delay::cascade::entry(t, delay_ms, headers),
                routing_key: String::new(),
                mandatory: true,
            },
        }
    }
}

/// This host's clock in microseconds since the Unix epoch (0 for a clock
/// set before 1970, which [`crate::delay::cascade::hold_entry`] does not trust).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
