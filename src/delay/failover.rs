//! `--delay-failover cascade`: while the plugin backend is stalled (its
//! probes do not come back, [`crate::delay::probe`]), new delays go
//! through the cascade. The switch is flipped by the probe; the publisher
//! reads it on every delay through [`Router`], so nothing else changes:
//! a copy is confirmed wherever it went before its original is acked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lapin::types::{AMQPValue, FieldTable};

use crate::delay::cascade;
use crate::delay::DelayBackend;
use crate::message::state::H_DELAY;
use crate::publish::{DelayRouter, DelayedRoute};
use crate::topology::Topology;

/// On: new delays go through the cascade. Shared by a worker's sessions,
/// so a reconnect does not forget a stall.
#[derive(Clone, Debug, Default)]
pub struct Switch(Arc<AtomicBool>);

impl Switch {
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Turned on only once the cascade's topology is declared.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Release);
    }
}

/// The worker's delay route: its own backend, or the cascade's stages
/// while the switch is on.
pub struct Router {
    pub primary: DelayBackend,
    pub switch: Switch,
}

impl DelayRouter for Router {
    fn route(
        &self,
        t: &Topology,
        delay_ms: u32,
        key: &str,
        headers: &mut FieldTable,
    ) -> DelayedRoute {
        if self.switch.is_on() {
            stages(t, delay_ms, key, headers)
        } else {
            self.primary.route(t, delay_ms, key, headers)
        }
    }
}

/// The cascade's stages for every delay, short ones included: a plugin
/// worker runs no holder for the hold queue, and a few milliseconds of
/// lateness per hop is nothing next to a wedged plugin.
fn stages(t: &Topology, delay_ms: u32, key: &str, headers: &mut FieldTable) -> DelayedRoute {
    // x-delay: set too, so a copy reads the same whichever way it went.
    headers.insert(H_DELAY.into(), AMQPValue::LongLongInt(delay_ms.into()));
    DelayedRoute {
        exchange: cascade::entry(t, delay_ms, headers),
        // Dead-lettering keeps it, so the exit routes it to its lane.
        routing_key: key.to_string(),
        // The cascade is all ordinary queues: unroutable is an error.
        mandatory: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_sends_every_delay_through_the_stages() {
        let t = Topology::new("p");
        let router = Router {
            primary: DelayBackend::Plugin,
            switch: Switch::default(),
        };
        let mut h = FieldTable::default();
        assert_eq!(
            router.route(&t, 500, "bucket.1", &mut h).exchange,
            "p.retry"
        );
        router.switch.set(true);
        let mut h = FieldTable::default();
        let r = router.route(&t, 500, "bucket.1", &mut h);
        assert_eq!((r.exchange.as_str(), r.mandatory), ("p.cascade.2", true));
        assert_eq!(h.inner().get(H_DELAY), Some(&AMQPValue::LongLongInt(500)));
        router.switch.set(false);
        assert_eq!(
            router.route(&t, 500, "bucket.1", &mut h).exchange,
            "p.retry"
        );
    }
}
