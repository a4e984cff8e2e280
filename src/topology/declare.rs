//! The one way this crate declares an exchange, used by the intake's
//! declare (`mod.rs`) and the lanes' (`lay.rs`): durable, and a refusal
//! named after the exchange.

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, ExchangeKind};

use super::error::{classify, TopologyError};

/// Declares exchange `name` of `kind` with `args`, durable: it survives a
/// broker restart, like the queues bound to it.
pub(super) async fn declare_exchange(
    ch: &Channel,
    name: &str,
    kind: ExchangeKind,
    args: FieldTable,
) -> Result<(), TopologyError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(name.into(), kind, durable, args)
        .await
        .map_err(|e| classify("exchange", name, e))
}
