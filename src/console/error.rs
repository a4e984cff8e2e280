//! What stops a console, and the index connection its parts share.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use super::index;
use crate::history;

/// A connection to the index, used from blocking tasks.
pub type Db = Arc<Mutex<rusqlite::Connection>>;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("--listen {0} is not a loopback address: give --token (or REDELIVER_CONSOLE_TOKEN) so that the API is not open to the network")]
    NoToken(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Index(#[from] index::IndexError),
    #[error(transparent)]
    History(#[from] history::HistoryError),
    #[error("AMQP error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the history stream {0} does not exist")]
    NoStream(String),
    #[error("the history stream's consumer ended (was the stream deleted?)")]
    StreamEnded,
    #[error("the index's lock was poisoned by a panic")]
    Poisoned,
    #[error("an index task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}
