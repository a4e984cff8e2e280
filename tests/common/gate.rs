//! A door in front of the shared test node, on a port of its own: closed,
//! a connection to that port is refused, as it is by a broker that is down;
//! open, every connection is forwarded byte for byte to the node. A test of
//! riding out an outage needs no node of its own to stop and boot again
//! (tens of seconds of CPU each on a busy machine, and a boot slower than
//! the client's whole retry budget there).
#![allow(dead_code)]

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::task::JoinHandle;

/// Copies bytes both ways between `client` and a new connection to
/// `upstream` until either side closes (the gate's forwarding, and the
/// https front's once its handshake is done).
pub async fn forward<S, A>(mut client: S, upstream: A)
where
    S: AsyncRead + AsyncWrite + Unpin,
    A: ToSocketAddrs,
{
    if let Ok(mut back) = TcpStream::connect(upstream).await {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut back).await;
    }
}

pub struct Gate {
    addr: SocketAddr,
    upstream: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Gate {
    /// A closed door to the node at `upstream_url` (`amqp://…@host:port/…`).
    /// Its port was free a moment ago and nothing listens on it now.
    pub async fn closed(upstream_url: &str) -> Gate {
        let uri: lapin::uri::AMQPUri = upstream_url.parse().expect("an AMQP URL");
        let hostport = (uri.authority.host.as_str(), uri.authority.port);
        let upstream = tokio::net::lookup_host(hostport)
            .await
            .unwrap()
            .next()
            .expect("the node's address");
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        Gate {
            addr,
            upstream,
            task: None,
        }
    }

    /// `upstream_url` with the door's port in place of the node's.
    pub fn url(&self, upstream_url: &str) -> String {
        let url = upstream_url.replacen(
            &format!(":{}", self.upstream.port()),
            &format!(":{}", self.addr.port()),
            1,
        );
        assert_ne!(url, upstream_url, "the node's port in {upstream_url}");
        url
    }

    /// Opens the door: connections from now on reach the node.
    pub async fn open(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        let upstream = self.upstream;
        self.task = Some(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, upstream));
            }
        }));
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
