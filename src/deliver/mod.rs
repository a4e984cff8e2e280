//! HTTP delivery: one attempt of one notification, turned into an
//! [`AttemptResult`]. No retry logic here.

mod egress;
mod guard;
mod signing;

pub use egress::{Egress, EgressError};
pub use guard::AddressPolicy;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};

use crate::config::Routes;
use crate::config::SigningSecret;
use crate::deliver::egress::{Base, Clients};
use crate::deliver::guard::{blocked_cause, literal_ip};
use crate::deliver::signing::signature_header;
use crate::message::trace::{TraceContext, H_TRACEPARENT, H_TRACESTATE};
use crate::message::Notification;
use crate::policy::AttemptResult;

/// Response bodies are read up to this size (for the success-body rule).
const MAX_RESPONSE_BODY: usize = 64 * 1024;
pub const USER_AGENT_VALUE: &str = concat!("redeliver/", env!("CARGO_PKG_VERSION"));
/// The attempt-number request header (1 on the first delivery).
pub const ATTEMPT_HEADER: &str = "redeliver-attempt";

/// Delivers a notification. Implement this to embed the worker with your
/// own transport instead of HTTP.
pub trait DeliveryHandler: Send + Sync + 'static {
    /// `attempt` is 1-based and counts every delivery of this notification.
    fn deliver(&self, n: &Notification, attempt: u32)
        -> impl Future<Output = AttemptResult> + Send;
}

/// The HTTP handler: pooled connections, no redirects, a per-attempt timeout.
#[derive(Clone, Debug)]
pub struct HttpDeliverer {
    clients: Arc<Clients>,
    base: Base,
    policy: Arc<AddressPolicy>,
    signing: Arc<Signing>,
}

/// What signs a request and how long it may take, per URL.
#[derive(Debug, Default)]
struct Signing {
    secrets: Vec<SigningSecret>,
    routes: Routes,
}

impl HttpDeliverer {
    /// With the default address policy (link-local and metadata refused).
    pub fn new(timeout: Duration, concurrency: usize) -> Result<Self, EgressError> {
        Self::with_policy(timeout, concurrency, AddressPolicy::default())
    }

    pub fn with_policy(
        timeout: Duration,
        concurrency: usize,
        policy: AddressPolicy,
    ) -> Result<Self, EgressError> {
        let base = Base {
            timeout,
            concurrency,
        };
        let clients = Clients::build(&policy, &base, &Egress::default(), &Routes::default())?;
        Ok(HttpDeliverer {
            clients: Arc::new(clients),
            base,
            policy: Arc::new(policy),
            signing: Arc::default(),
        })
    }

    /// Signs every request with these secrets (Standard Webhooks), and
    /// applies the routes' secrets and timeouts to their URLs.
    pub fn with_signing(mut self, secrets: Vec<SigningSecret>, routes: Routes) -> Self {
        self.signing = Arc::new(Signing { secrets, routes });
        self
    }

    /// Sends through `egress`'s proxy, and gives each route with TLS
    /// material (loaded: [`crate::config::RouteTls::load`]) a client of
    /// its own. Call it after [`HttpDeliverer::with_signing`], which sets
    /// the routes.
    pub fn with_egress(mut self, egress: &Egress) -> Result<Self, EgressError> {
        let routes = &self.signing.routes;
        self.clients = Arc::new(Clients::build(&self.policy, &self.base, egress, routes)?);
        Ok(self)
    }

    fn headers(n: &Notification, attempt: u32, secrets: &[SigningSecret]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in &n.headers {
            // Validated when decoded; anything odd is skipped, not a panic.
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                h.insert(k, v);
            }
        }
        if n.body.is_some() && !h.contains_key(CONTENT_TYPE) {
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let ours = [
            ("webhook-id", n.id.clone()),
            ("webhook-timestamp", now.as_secs().to_string()),
            (ATTEMPT_HEADER, attempt.to_string()),
        ];
        for (k, v) in ours {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(HeaderName::from_static(k), v);
            }
        }
        trace_headers(&mut h, n.trace.as_ref());
        let live = signing::live(secrets, SystemTime::UNIX_EPOCH + now);
        if !live.is_empty() {
            // Over the exact bytes sent: the body is sent as stored.
            let body = n.body.as_ref().map_or("", |b| b.get()).as_bytes();
            let sig = signature_header(&live, &n.id, now.as_secs(), body);
            if let Ok(v) = HeaderValue::from_str(&sig) {
                h.insert(HeaderName::from_static("webhook-signature"), v);
            }
        }
        h.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        h
    }
}

impl DeliveryHandler for HttpDeliverer {
    async fn deliver(&self, n: &Notification, attempt: u32) -> AttemptResult {
        if let Some(Err(b)) = literal_ip(&n.url).map(|ip| self.policy.check(ip)) {
            return AttemptResult::Refused {
                error: b.to_string(),
            };
        }
        let route = self.signing.routes.find(&n.url);
        let secrets = route
            .and_then(|r| r.secrets.as_deref())
            .unwrap_or(&self.signing.secrets);
        let timeout = route.and_then(|r| r.timeout).unwrap_or(self.base.timeout);
        if self.clients.proxied {
            if let Err(b) = self.policy.check_target(&n.url).await {
                return AttemptResult::Refused {
                    error: b.to_string(),
                };
            }
        }
        let mut req = (self.clients.get(route))
            .request(n.method.clone(), n.url.clone())
            .timeout(timeout)
            .headers(Self::headers(n, attempt, secrets));
        if let Some(body) = &n.body {
            req = req.body(body.get().to_owned());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return failed(&e, timeout),
        };
        let status = resp.status().as_u16();
        if !resp.status().is_success() && asks_to_abort(resp.headers()) {
            return AttemptResult::Aborted { status };
        }
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match read_capped(resp).await {
            Ok(b) => b,
            Err(e) => {
                return AttemptResult::Failed {
                    error: describe(&e, timeout),
                }
            }
        };
        AttemptResult::Response {
            status,
            body,
            retry_after,
            content_type,
        }
    }
}

/// The response header by which a receiver stops a notification's retries
/// (Svix's delivery control): `webhook-delivery: abort-message`.
pub const DELIVERY_CONTROL_HEADER: &str = "webhook-delivery";

/// Whether a (failed) response carries `webhook-delivery: abort-message`.
/// On a 2xx it means nothing: the notification was delivered.
fn asks_to_abort(headers: &HeaderMap) -> bool {
    headers
        .get_all(DELIVERY_CONTROL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("abort-message"))
}

/// A blocked address is a refusal for good; anything else may pass.
fn failed(e: &reqwest::Error, timeout: Duration) -> AttemptResult {
    match blocked_cause(e) {
        Some(b) => AttemptResult::Refused {
            error: b.to_string(),
        },
        None => AttemptResult::Failed {
            error: describe(e, timeout),
        },
    }
}

async fn read_capped(mut resp: reqwest::Response) -> Result<String, reqwest::Error> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = MAX_RESPONSE_BODY - buf.len();
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= MAX_RESPONSE_BODY {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A short error without the URL (it may carry credentials or tokens):
/// what failed, and the innermost cause ("connection refused").
fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {}", humantime::format_duration(timeout));
    }
    let kind = if is_tls(e) {
        // A handshake refused either way: an untrusted certificate, or a
        // receiver that wants a client certificate it did not get.
        "TLS failed"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    };
    let mut root: &dyn std::error::Error = e;
    while let Some(cause) = root.source() {
        root = cause;
    }
    let mut s = format!("{kind}: {root}");
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<url>");
    }
    s
}

/// Whether a TLS error is among the causes (rustls' errors travel inside
/// `io::Error`s, whose `source` skips them).
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let io = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if err.is::<rustls::Error>() || io.is_some_and(|inner| inner.is::<rustls::Error>()) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// `Retry-After` is either delay-seconds or an HTTP date.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

/// The attempt's W3C trace context, which wins over a `traceparent` in
/// the notification's own headers: the receiver's span is then a child of
/// this attempt's.
fn trace_headers(h: &mut HeaderMap, trace: Option<&TraceContext>) {
    let Some(t) = trace else { return };
    if let Ok(v) = HeaderValue::from_str(t.traceparent()) {
        h.insert(HeaderName::from_static(H_TRACEPARENT), v);
    }
    h.remove(H_TRACESTATE);
    if let Some(Ok(v)) = t.tracestate().map(HeaderValue::from_str) {
        h.insert(HeaderName::from_static(H_TRACESTATE), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_message_is_read_case_blind_and_in_lists() {
        let mut h = HeaderMap::new();
        assert!(!asks_to_abort(&h));
        h.insert(
            DELIVERY_CONTROL_HEADER,
            HeaderValue::from_static("Abort-Message"),
        );
        assert!(asks_to_abort(&h));
        h.insert(
            DELIVERY_CONTROL_HEADER,
            HeaderValue::from_static("x, abort-message"),
        );
        assert!(asks_to_abort(&h));
        h.insert(DELIVERY_CONTROL_HEADER, HeaderValue::from_static("retry"));
        assert!(!asks_to_abort(&h));
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(100));
        let d = parse_retry_after(&later).unwrap();
        assert!(d > Duration::from_secs(95) && d <= Duration::from_secs(100));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
