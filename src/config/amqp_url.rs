//! The broker's address: one AMQP URL, or a comma-separated list of the
//! URLs of one cluster's nodes. It never prints a password.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use tracing::warn;

use crate::message::redact::redact_url;

/// How long one URL may take to accept a connection before the next one
/// is tried. A node that is down refuses at once; this bounds one whose
/// host does not answer at all (a partition, a dead machine), which would
/// otherwise hold the connect for the OS's TCP timeout of minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a URL may take when another is left to try. A node answers a
/// handshake in milliseconds, or seconds when it is very busy; one that
/// takes longer is as good as gone while the cluster's others can serve.
/// Without it, a producer that first picked a node cut off by a partition
/// waited the full [`CONNECT_TIMEOUT`] before trying a live one (seen from
/// outside: 100 publishes confirmed only after 10 s).
pub const FAILOVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The time the URL tried `left` from the end may take: the last one gets
/// the full [`CONNECT_TIMEOUT`], so a lone URL or a slow cluster still
/// connects.
pub fn connect_timeout(left: usize) -> Duration {
    match left {
        0 => CONNECT_TIMEOUT,
        _ => FAILOVER_CONNECT_TIMEOUT,
    }
}

/// One or more AMQP URLs (`amqp://` or `amqps://`) of one cluster, given
/// comma-separated. `Debug` and `Display` hide every password.
///
/// Every [`connect`](AmqpUrl::connect) tries the URLs in a random order,
/// the one the previous connect reached last ([`connect_order`]): a fleet
/// of workers spreads over the nodes, and the workers whose node died
/// spread over the others instead of all moving to the same neighbour.
/// Clones share the last URL reached.
#[derive(Clone)]
pub struct AmqpUrl {
    urls: Arc<[String]>,
    /// The index of the URL the last connect reached; [`NONE`] before.
    last: Arc<AtomicUsize>,
}

/// No URL reached yet.
const NONE: usize = usize::MAX;

/// The order to try `n` URLs in: a random permutation, with `last` (the
/// URL reached the time before, whose connection was just lost or closed)
/// moved to the end.
///
/// Why random and not "the next one": the next one is the same for every
/// worker that was on a node, so when that node went, all of them moved
/// to its neighbour; a later cut between the workers and that neighbour
/// then stopped every delivery at once (seen on a 3-node cluster in
/// network namespaces: 0 deliveries for the 15 s of the cut).
pub fn connect_order(n: usize, last: Option<usize>, rng: &mut impl rand::Rng) -> Vec<usize> {
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..n).filter(|&i| Some(i) != last).collect();
    order.shuffle(rng);
    order.extend(last.filter(|&l| l < n));
    order
}

/// A URL of the list that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad AMQP URL {url}: {reason}")]
pub struct BadUrl {
    /// The URL, redacted.
    pub url: String,
    pub reason: String,
}

impl AmqpUrl {
    /// Splits `urls` on commas (a comma inside a password must be written
    /// `%2C`); blanks around the commas are ignored.
    pub fn new(urls: impl Into<String>) -> Self {
        let text: String = urls.into();
        let mut list: Vec<String> = text
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_string)
            .collect();
        if list.is_empty() {
            // Kept, so that connecting reports the empty URL as bad.
            list.push(String::new());
        }
        AmqpUrl {
            urls: list.into(),
            last: Arc::new(AtomicUsize::new(NONE)),
        }
    }

    /// The URLs as given, for connecting or for handing to a child process
    /// only: never print it.
    pub fn expose(&self) -> String {
        self.urls.join(",")
    }

    /// The URLs, with their passwords.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The list with every password replaced by `***`.
    pub fn redacted(&self) -> String {
        self.urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks that every URL of the list parses, so that a typo does not
    /// look like a broker that is down.
    pub fn validate(&self) -> Result<(), BadUrl> {
        for u in self.urls.iter() {
            if let Err(reason) = u.parse::<lapin::uri::AMQPUri>() {
                let url = if u.is_empty() {
                    "(empty)".into()
                } else {
                    redact_url(u)
                };
                // lapin's message can quote the whole URL, password and all.
                let reason = match u.is_empty() {
                    true => reason,
                    false => reason.replace(u.as_str(), &url),
                };
                return Err(BadUrl { url, reason });
            }
        }
        Ok(())
    }

    /// Connects to the first URL that accepts, in [`connect_order`]: a
    /// random one first, the one that answered last only when no other
    /// does. The error is the last URL's.
    pub async fn connect(&self, name: &str) -> Result<Connection, lapin::Error> {
        self.connect_to(name).await.map(|(conn, _)| conn)
    }

    /// [`connect`](AmqpUrl::connect), also saying which URL (redacted) answered.
    pub async fn connect_to(&self, name: &str) -> Result<(Connection, String), lapin::Error> {
        let n = self.urls.len();
        let reached = Some(self.last.load(Ordering::Relaxed)).filter(|&l| l != NONE);
        let order = connect_order(n, reached, &mut rand::rng());
        let mut last = None;
        for (k, &i) in order.iter().enumerate() {
            let timeout = connect_timeout(order.len() - 1 - k);
            match connect_one(&self.urls[i], name, timeout).await {
                Ok(conn) => {
                    self.last.store(i, Ordering::Relaxed);
                    return Ok((conn, redact_url(&self.urls[i])));
                }
                Err(e) => {
                    if n > 1 {
                        let url = redact_url(&self.urls[i]);
                        warn!(%url, error = %e, "broker URL did not accept a connection; trying the next");
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| timed_out("no AMQP URL given")))
    }
}

/// The AMQP heartbeat asked for when a URL does not set `heartbeat=`.
/// lapin gives a connection up after two heartbeats without a frame from
/// the broker; RabbitMQ's default of 60 s would leave a worker cut off
/// from its node by a partition (its packets silently dropped) idle for
/// two minutes, while the rest of the cluster could serve it. RabbitMQ
/// advises 5 to 20 s; below 5 s a busy node risks false positives.
pub const DEFAULT_HEARTBEAT_SECS: u16 = 10;

async fn connect_one(url: &str, name: &str, timeout: Duration) -> Result<Connection, lapin::Error> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let mut uri: lapin::uri::AMQPUri = url
        .parse()
        // Not lapin's message: it can quote the URL, password and all.
        .map_err(|_: String| {
            lapin::Error::from(std::io::Error::other("the AMQP URL does not parse"))
        })?;
    uri.query.heartbeat.get_or_insert(DEFAULT_HEARTBEAT_SECS);
    match tokio::time::timeout(timeout, Connection::connect_uri(uri, props)).await {
        Ok(result) => result,
        Err(_) => Err(timed_out("no answer within the connect timeout")),
    }
}

fn timed_out(what: &str) -> lapin::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string()).into()
}

impl PartialEq for AmqpUrl {
    fn eq(&self, other: &Self) -> bool {
        self.urls == other.urls
    }
}

impl Eq for AmqpUrl {}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmqpUrl({})", self.redacted())
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        let u = AmqpUrl::new("amqp://user:s3cret@host:5672/%2f");
        assert!(!format!("{u} {u:?}").contains("s3cret"));
        assert!(u.redacted().contains("user:***@host"));
        assert_eq!(redact_url("not a url"), "<unparsable url>");
    }

    #[test]
    fn a_list_splits_on_commas_and_hides_every_password() {
        let u = AmqpUrl::new(" amqp://a:pw1@h1:5672/%2f, amqp://a:pw2@h2:5673/%2f ,,amqps://h3/v ");
        assert_eq!(u.urls().len(), 3);
        assert_eq!(u.urls()[1], "amqp://a:pw2@h2:5673/%2f");
        let shown = format!("{u} {u:?}");
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        assert_eq!(
            u.redacted(),
            "amqp://a:***@h1:5672/%2f,amqp://a:***@h2:5673/%2f,amqps://h3/v"
        );
        assert_eq!(
            u.expose(),
            "amqp://a:pw1@h1:5672/%2f,amqp://a:pw2@h2:5673/%2f,amqps://h3/v"
        );
    }

    #[test]
    fn a_malformed_url_is_reported_without_its_password() {
        let e = AmqpUrl::new("amqp:u:s3cret@h1").validate().unwrap_err();
        assert!(!format!("{e} {e:?}").contains("s3cret"), "{e}");
    }

    #[test]
    fn validate_names_the_bad_url_without_its_password() {
        assert!(AmqpUrl::new("amqp://h1,amqp://h2:5673").validate().is_ok());
        let e = AmqpUrl::new("amqp://u:pw@h1,nope://u:pw@h2")
            .validate()
            .unwrap_err();
        assert!(e.url.contains("h2") && !e.url.contains("pw"), "{e}");
        assert_eq!(AmqpUrl::new(" , ").validate().unwrap_err().url, "(empty)");
    }

    #[tokio::test]
    async fn a_refusing_url_is_skipped_and_both_are_tried() {
        // Two ports nothing listens on: both refuse at once, so the error
        // comes back without waiting for the connect timeout.
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = (free(), free());
        let urls = format!(
            "amqp://127.0.0.1:{}/%2f,amqp://127.0.0.1:{}/%2f",
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port()
        );
        drop((a, b));
        let u = AmqpUrl::new(urls);
        let t = std::time::Instant::now();
        assert!(u.connect("test").await.is_err());
        assert!(t.elapsed() < CONNECT_TIMEOUT, "refusals do not wait");
        assert_eq!(u.clone().last.load(Ordering::Relaxed), NONE, "none reached");
    }

    /// A node that accepts TCP and never speaks AMQP stands for one cut off
    /// by a partition: with a live node left to try, it is given up after
    /// [`FAILOVER_CONNECT_TIMEOUT`], not [`CONNECT_TIMEOUT`].
    #[tokio::test]
    async fn a_silent_node_is_given_up_quickly_when_another_is_left() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                open.push(socket);
            }
        });
        let live = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let u = AmqpUrl::new(format!("amqp://127.0.0.1:{port}/%2f,{live}"));
        let first = u.connect("test").await.expect("the live node");
        // The live node reached is tried last now: the silent one first.
        let t = std::time::Instant::now();
        let second = u.connect("test").await.expect("the live node again");
        let took = t.elapsed();
        assert!(
            took >= FAILOVER_CONNECT_TIMEOUT,
            "the silent one was tried first: {took:?}"
        );
        assert!(took < CONNECT_TIMEOUT, "given up after {took:?}");
        for c in [first, second] {
            let _ = c.close(200, "".into()).await;
        }
        held.abort();
        assert_eq!(connect_timeout(0), CONNECT_TIMEOUT, "the last gets it all");
    }

    #[test]
    fn the_workers_of_a_lost_node_spread_over_the_others() {
        let mut rng = rand::rng();
        let mut first = [0u32; 3];
        for _ in 0..3_000 {
            let order = connect_order(3, Some(0), &mut rng);
            assert_eq!(order.len(), 3);
            assert_eq!(order[2], 0, "the lost node last");
            first[order[0]] += 1;
        }
        assert_eq!(first[0], 0);
        // Each of the two others first about half the time, not always one.
        assert!((1_200..=1_800).contains(&first[1]), "{first:?}");
        let fresh = connect_order(3, None, &mut rng);
        let mut sorted = fresh.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2]);
        assert_eq!(connect_order(1, Some(0), &mut rng), [0]);
    }
}
