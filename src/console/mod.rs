//! `redeliver console`: follows the `<prefix>.history` stream into an
//! index of its own (SQLite in `--data`) and answers the history API over
//! HTTP. The stream is the source of truth: several consoles may run side
//! by side, each with its own index, and a fresh one rebuilds from the
//! stream. The history's pure parts (record, query) are in
//! [`crate::history`]; this room is the effectful side: the stream reader
//! (`follow`), the database (`index`), the server (`api`) and the CLI's
//! client (`client`).

mod actions;
mod api;
mod app;
pub mod auth;
pub mod client;
mod error;
mod follow;
pub mod index;
mod jobs;
pub mod live;
pub mod rollup;
mod web;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use secrecy::SecretString;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::BrokerSettings;
use crate::history::{self, HistorySettings};
pub use error::{ConsoleError, Db};
pub use follow::MARKER;

/// What `redeliver console` runs with.
#[derive(Clone, Debug)]
pub struct ConsoleSettings {
    pub listen: SocketAddr,
    pub data: PathBuf,
    /// The operator's token: every request must carry it (or a session
    /// opened with it); required off loopback.
    pub token: Option<SecretString>,
    /// A read-only token: sees everything, changes nothing.
    pub read_token: Option<SecretString>,
    /// The stream's retention, as the workers declare it: the index prunes
    /// to its age.
    pub history: HistorySettings,
}

/// How often the index is pruned to the retention.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Runs the console until `shutdown`: the API from the start (answering
/// 503 on `/readyz` until caught up), the follower reconnecting after a
/// lost connection.
pub async fn run(
    broker: &BrokerSettings,
    s: ConsoleSettings,
    shutdown: CancellationToken,
) -> Result<(), ConsoleError> {
    Console::bind(s).await?.serve(broker, shutdown).await
}

/// A console whose index is open and whose port is bound, not yet serving:
/// an embedder (or a test) learns the port first.
pub struct Console {
    s: ConsoleSettings,
    listener: tokio::net::TcpListener,
    db: Db,
    reader: Db,
}

impl Console {
    /// Refuses a non-loopback address without a token, opens the index
    /// and binds the port.
    pub async fn bind(s: ConsoleSettings) -> Result<Console, ConsoleError> {
        if s.token.is_none() && !s.listen.ip().is_loopback() {
            return Err(ConsoleError::NoToken(s.listen));
        }
        let db: Db = Arc::new(Mutex::new(index::open(&s.data)?));
        // Its own connection: reads go on while the follower writes (WAL).
        let reader: Db = Arc::new(Mutex::new(index::open(&s.data)?));
        let listener = tokio::net::TcpListener::bind(s.listen)
            .await
            .map_err(|source| ConsoleError::Listen {
                addr: s.listen,
                source,
            })?;
        Ok(Console {
            s,
            listener,
            db,
            reader,
        })
    }

    /// Where the API listens (the port chosen for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.s.listen)
    }

    /// Serves the API and follows the stream until `shutdown`, or until
    /// the follower meets an error it cannot retry.
    pub async fn serve(
        self,
        broker: &BrokerSettings,
        shutdown: CancellationToken,
    ) -> Result<(), ConsoleError> {
        let ready = Arc::new(AtomicBool::new(false));
        let s = &self.s;
        info!(listen = %self.local_addr(), data = %s.data.display(), "console listening");
        let live = live::Live::new(broker.clone());
        let app = Arc::new(app::App {
            db: self.reader.clone(),
            tokens: auth::Tokens {
                operator: s.token.clone(),
                viewer: s.read_token.clone(),
            },
            sessions: auth::Sessions::default(),
            ready: ready.clone(),
            live: live.clone(),
            jobs: jobs::Jobs::default(),
            tasks: tokio_util::task::TaskTracker::new(),
            stop: shutdown.clone(),
        });
        let tasks = app.tasks.clone();
        let server = api::serve(self.listener, app, shutdown.clone());
        let reading = live.run(shutdown.clone());
        let follow = async {
            let r = follow_loop(broker, s, self.db, &ready, &shutdown).await;
            // A follower that cannot go on stops the server too.
            shutdown.cancel();
            r
        };
        let prune = prune_loop(self.reader, s.history.max_age, &shutdown);
        let (served, followed, (), ()) = tokio::join!(server, follow, prune, reading);
        // Replays still running settle their batch and stop.
        tasks.close();
        tasks.wait().await;
        followed.and(served)
    }
}

/// Follows the stream, reconnecting with a capped backoff; a fatal error
/// (the stream refused) ends the console.
async fn follow_loop(
    broker: &BrokerSettings,
    s: &ConsoleSettings,
    db: Db,
    ready: &AtomicBool,
    shutdown: &CancellationToken,
) -> Result<(), ConsoleError> {
    let name = history::stream_name(&broker.prefix);
    let mut pause = Duration::from_millis(200);
    loop {
        let started = Instant::now();
        let e = match follow_once(broker, &name, s, &db, ready, shutdown).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if matches!(&e, ConsoleError::History(h) if h.is_fatal()) {
            return Err(e);
        }
        if started.elapsed() > Duration::from_secs(30) {
            pause = Duration::from_millis(200);
        }
        warn!(error = %e, retry_in = ?pause, "history stream not followed; reconnecting");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// One connection's follow, until `shutdown` (`Ok`) or an error.
async fn follow_once(
    broker: &BrokerSettings,
    name: &str,
    s: &ConsoleSettings,
    db: &Db,
    ready: &AtomicBool,
    shutdown: &CancellationToken,
) -> Result<(), ConsoleError> {
    let from = {
        let c = db.lock().map_err(|_| ConsoleError::Poisoned)?;
        index::next_offset(&c)?
    };
    let (conn, _) = broker.url.connect_to("redeliver console").await?;
    let result = async {
        history::declare(&conn, name, &s.history).await?;
        let follower = follow::Follower::open(&conn, name, from).await?;
        info!(stream = name, from = ?from, "following the history stream");
        follower.run(db, ready, shutdown).await
    }
    .await;
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        conn.close(200, "console stopping".into()),
    )
    .await;
    result
}

/// Prunes the index to the retention every [`PRUNE_EVERY`].
async fn prune_loop(db: Db, max_age: Duration, shutdown: &CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PRUNE_EVERY) => {}
        }
        let db = db.clone();
        let pruned = tokio::task::spawn_blocking(move || {
            let before = SystemTime::now() - max_age;
            let c = db.lock().map_err(|_| "poisoned".to_string())?;
            index::prune(&c, before).map_err(|e| e.to_string())
        })
        .await;
        match pruned {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => info!(records = n, "pruned the index to the retention"),
            Ok(Err(e)) => warn!(error = %e, "pruning the index failed"),
            Err(e) => warn!(error = %e, "pruning the index failed"),
        }
    }
}
