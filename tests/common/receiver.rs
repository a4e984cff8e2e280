//! A real HTTP receiver on 127.0.0.1:0 that records every request and
//! answers as the test tells it to.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;

#[derive(Clone, Debug)]
pub struct Recorded {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// 1-based count of requests seen so far with this webhook-id.
    pub nth: usize,
    /// The status the behaviour chose (sent unless the client went away).
    pub reply: u16,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
    pub fn id(&self) -> String {
        self.header("webhook-id").unwrap_or_default()
    }
}

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Reply {
            status,
            body: String::new(),
            delay: Duration::ZERO,
            headers: vec![],
        }
    }
    pub fn body(mut self, b: &str) -> Self {
        self.body = b.to_string();
        self
    }
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
}

type Behavior = Box<dyn Fn(&Recorded) -> Reply + Send + Sync>;

struct Shared {
    requests: Mutex<Vec<Recorded>>,
    per_id: Mutex<HashMap<String, usize>>,
    in_flight: Mutex<Vec<(u64, Conn)>>,
    next_request: AtomicU64,
    max_in_flight: AtomicUsize,
    behavior: Behavior,
}

/// The receiver's own handle on a request's connection (a duplicate of its
/// socket), to tell whether the client still waits for the answer.
///
/// A client that gives up on a request (its timeout, a worker's hard stop
/// or `kill -9`) closes the connection; the server drops the handler only
/// once its connection task has read that close, which may come after the
/// client's next request on another connection was taken in. Counted by
/// handlers alone, that moment showed one request too many in flight (49
/// of 48). The client closed first, so its FIN is already in this socket
/// when that next request arrives: [`Shared::enter`] looks.
#[derive(Clone)]
struct Conn(Arc<std::net::TcpStream>);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Conn {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        let fd = stream.io().as_fd().try_clone_to_owned();
        Conn(Arc::new(std::net::TcpStream::from(
            fd.expect("duplicate the connection's socket"),
        )))
    }
}

impl Conn {
    /// Whether the client closed its end: a peek reads end of stream (or
    /// the reset). The duplicate shares the socket's non-blocking mode, so
    /// an open, quiet connection answers `WouldBlock` at once.
    fn closed_by_client(&self) -> bool {
        match self.0.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

impl Shared {
    /// Counts a request in flight until the returned guard drops, and
    /// records the peak: the requests whose clients still wait, this one
    /// included.
    fn enter(self: &Arc<Self>, conn: Conn) -> InFlight {
        let id = self.next_request.fetch_add(1, Ordering::SeqCst);
        let mut open = self.in_flight.lock().unwrap();
        open.retain(|(_, c)| !c.closed_by_client());
        open.push((id, conn));
        self.max_in_flight.fetch_max(open.len(), Ordering::SeqCst);
        InFlight(self.clone(), id)
    }
}

#[derive(Clone)]
pub struct Receiver {
    pub base: String,
    shared: Arc<Shared>,
    server: Arc<Mutex<Option<Server>>>,
}

/// The running listener, so a test can take the receiver down and bring it
/// back on the same port.
struct Server {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start(behavior: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Receiver {
        Self::start_on("127.0.0.1:0", behavior).await
    }

    /// [`start`](Receiver::start) on another address (the partition
    /// harness's bridge, which workers in their namespaces can reach).
    pub async fn start_on(
        addr: &str,
        behavior: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let shared = Arc::new(Shared {
            requests: Mutex::new(vec![]),
            per_id: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(vec![]),
            next_request: AtomicU64::new(0),
            max_in_flight: AtomicUsize::new(0),
            behavior: Box::new(behavior),
        });
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("receiver address");
        let server = serve(listener, shared.clone());
        Receiver {
            base: format!("http://{addr}"),
            shared,
            server: Arc::new(Mutex::new(Some(server))),
        }
    }

    /// Stops listening: new connections are refused, and open ones close
    /// once their current request is answered.
    pub async fn down(&self) {
        let server = self.server.lock().unwrap().take();
        if let Some(s) = server {
            s.stop.cancel();
            let _ = s.task.await;
        }
    }

    /// Listens again on the same address.
    pub async fn up(&self) {
        let addr = self.base.trim_start_matches("http://");
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("rebind receiver");
        let server = serve(listener, self.shared.clone());
        *self.server.lock().unwrap() = Some(server);
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    /// `n` notifications to this receiver's `/`, ids `TAG-0`, `TAG-1`, ...
    pub fn notifications(&self, tag: &str, n: usize) -> Vec<serde_json::Value> {
        (0..n)
            .map(|i| serde_json::json!({"url": self.url("/"), "id": format!("{tag}-{i}")}))
            .collect()
    }
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }
    pub fn count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }
    /// Requests seen per webhook-id.
    #[allow(dead_code)]
    pub fn count_by_id(&self) -> std::collections::HashMap<String, usize> {
        self.shared.per_id.lock().unwrap().clone()
    }
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.lock().unwrap().len()
    }
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) -> Server {
    let app = axum::Router::new().fallback(handle).with_state(shared);
    let app = app.into_make_service_with_connect_info::<Conn>();
    let stop = tokio_util::sync::CancellationToken::new();
    let signal = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await;
    });
    Server { stop, task }
}

struct InFlight(Arc<Shared>, u64);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut open = self.0.in_flight.lock().unwrap();
        open.retain(|(id, _)| *id != self.1);
    }
}

async fn handle(
    State(s): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<Conn>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let nth = {
        let mut m = s.per_id.lock().unwrap();
        let n = m.entry(id).or_insert(0);
        *n += 1;
        *n
    };
    let rec = Recorded {
        at: Instant::now(),
        method,
        path: uri.path().to_string(),
        headers,
        body,
        nth,
        reply: 0,
    };
    let reply = (s.behavior)(&rec);
    let mut rec = rec;
    rec.reply = reply.status;
    s.requests.lock().unwrap().push(rec);
    // Ended on drop too: a client that gives up (timeout, killed worker)
    // makes the server drop this future mid-sleep.
    let _in_flight = s.enter(conn);
    tokio::time::sleep(reply.delay).await;
    let mut resp = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (k, v) in reply.headers {
        resp.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&v).unwrap(),
        );
    }
    resp
}
