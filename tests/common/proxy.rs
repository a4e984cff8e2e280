//! A real forward proxy on 127.0.0.1:0 for the egress tests: HTTP
//! (absolute-form requests and CONNECT tunnels) and SOCKS5, counting what
//! went through it.
#![allow(dead_code)]

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const MAX_HEAD: usize = 64 * 1024;
const REFUSED: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const BAD_GATEWAY: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n";
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

type Targets = Arc<Mutex<Vec<String>>>;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Http,
    Socks5,
    Refusing,
}

/// A running proxy; dropping it stops accepting connections.
pub struct Proxy {
    /// `http://127.0.0.1:PORT` or `socks5://127.0.0.1:PORT`.
    pub url: String,
    targets: Targets,
    task: JoinHandle<()>,
}

impl Proxy {
    /// An HTTP proxy: absolute-form requests and CONNECT tunnels.
    pub async fn http() -> Proxy {
        Self::start(Kind::Http).await
    }

    /// A SOCKS5 proxy without authentication.
    pub async fn socks5() -> Proxy {
        Self::start(Kind::Socks5).await
    }

    /// An HTTP proxy that answers every request with 403 and closes.
    pub async fn refusing() -> Proxy {
        Self::start(Kind::Refusing).await
    }

    /// An HTTP proxy on another loopback address (`127.0.0.2`), which
    /// `--deny-private` refuses as a target.
    pub async fn http_on(ip: &str) -> Proxy {
        Self::start_on(Kind::Http, ip).await
    }

    /// How many requests or tunnels it has taken (forwarded or refused).
    pub fn count(&self) -> usize {
        self.targets().len()
    }

    /// The `host:port` of each request or tunnel, in order.
    pub fn targets(&self) -> Vec<String> {
        lock(&self.targets).clone()
    }

    async fn start(kind: Kind) -> Proxy {
        Self::start_on(kind, "127.0.0.1").await
    }

    async fn start_on(kind: Kind, ip: &str) -> Proxy {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let scheme = match kind {
            Kind::Socks5 => "socks5",
            Kind::Http | Kind::Refusing => "http",
        };
        let targets = Targets::default();
        let seen = targets.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let _ = match kind {
                        Kind::Socks5 => socks5(client, seen).await,
                        _ => http(client, seen, kind == Kind::Refusing).await,
                    };
                });
            }
        });
        Proxy {
            url: format!("{scheme}://{addr}"),
            targets,
            task,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(targets: &Targets) -> MutexGuard<'_, Vec<String>> {
    targets.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One HTTP proxy connection: a single CONNECT tunnel or absolute-form request.
async fn http(mut client: TcpStream, seen: Targets, refuse: bool) -> io::Result<()> {
    let (head, rest) = read_head(&mut client).await?;
    let mut lines = head.split("\r\n");
    let mut parts = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(uri), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(io::ErrorKind::InvalidData.into());
    };
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (target, path) = match split_absolute(uri) {
        _ if connect => (uri.to_string(), String::new()),
        Some(split) => split,
        None if refuse => (uri.to_string(), String::new()),
        None => return Err(io::ErrorKind::InvalidData.into()),
    };
    lock(&seen).push(target.clone());
    if refuse {
        return reply_and_close(client, REFUSED).await;
    }
    let Ok(mut upstream) = TcpStream::connect(target.as_str()).await else {
        return reply_and_close(client, BAD_GATEWAY).await;
    };
    if connect {
        client.write_all(ESTABLISHED).await?;
        upstream.write_all(&rest).await?;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        let _ = client.shutdown().await;
        return upstream.shutdown().await;
    }
    let hop = ["connection", "proxy-connection", "proxy-authorization"];
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if !hop.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&rest).await?;
    // The rest of the body goes up while the response comes back; once the
    // upstream closes after its response, the client connection is closed too.
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut upstream_rx, mut upstream_tx) = upstream.into_split();
    let mut up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rx, &mut upstream_tx).await;
        let _ = upstream_tx.shutdown().await;
    });
    let _ = tokio::io::copy(&mut upstream_rx, &mut client_tx).await;
    let _ = client_tx.shutdown().await;
    if tokio::time::timeout(Duration::from_secs(2), &mut up)
        .await
        .is_err()
    {
        up.abort();
    }
    Ok(())
}

/// Reads up to the blank line; returns the head (without it) and any bytes after.
async fn read_head(client: &mut TcpStream) -> io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::<u8>::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            let head = String::from_utf8(buf).map_err(|_| io::ErrorKind::InvalidData)?;
            return Ok((head, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::ErrorKind::InvalidData.into());
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `http://authority/path?query` -> (`host:port`, `/path?query`).
fn split_absolute(uri: &str) -> Option<(String, String)> {
    let rest = uri
        .get(7..)
        .filter(|_| uri[..7].eq_ignore_ascii_case("http://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest[..end].rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = authority
        .rfind(':')
        .is_some_and(|i| !authority[i..].contains(']'));
    let target = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let path = match rest[end..].split('#').next().unwrap_or_default() {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    Some((target, path))
}

/// Writes a final response, then drains the client briefly so closing with
/// unread bytes does not reset the connection before it reads the answer.
async fn reply_and_close(mut client: TcpStream, response: &[u8]) -> io::Result<()> {
    client.write_all(response).await?;
    client.shutdown().await?;
    let mut sink = tokio::io::sink();
    let drain = tokio::io::copy(&mut client, &mut sink);
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    Ok(())
}

/// One SOCKS5 (RFC 1928) connection, no authentication, CONNECT only.
async fn socks5(mut client: TcpStream, seen: Targets) -> io::Result<()> {
    let mut greeting = [0u8; 2];
    client.read_exact(&mut greeting).await?;
    let mut methods = vec![0u8; greeting[1] as usize];
    client.read_exact(&mut methods).await?;
    if greeting[0] != 5 {
        return Err(io::ErrorKind::InvalidData.into());
    }
    client.write_all(&[5, 0]).await?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    if request[..3] != [5, 1, 0] {
        return Err(io::ErrorKind::InvalidData.into());
    }
    let host = match request[3] {
        1 => {
            let mut ip = [0u8; 4];
            client.read_exact(&mut ip).await?;
            Ipv4Addr::from(ip).to_string()
        }
        3 => {
            let mut name = vec![0u8; client.read_u8().await? as usize];
            client.read_exact(&mut name).await?;
            String::from_utf8(name).map_err(|_| io::ErrorKind::InvalidData)?
        }
        4 => {
            let mut ip = [0u8; 16];
            client.read_exact(&mut ip).await?;
            format!("[{}]", Ipv6Addr::from(ip))
        }
        _ => return Err(io::ErrorKind::InvalidData.into()),
    };
    let target = format!("{host}:{}", client.read_u16().await?);
    lock(&seen).push(target.clone());
    let Ok(mut upstream) = TcpStream::connect(target.as_str()).await else {
        client.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return client.shutdown().await;
    };
    client.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    let _ = client.shutdown().await;
    upstream.shutdown().await
}
