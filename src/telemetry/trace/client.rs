//! The OTLP exporter's HTTP client: the reqwest the worker already uses
//! (rustls, the system's roots), so exporting adds no second TLS stack and
//! an `https://` collector works.

use std::time::Duration;

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// OTLP's default export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, in ms).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A collector's answer is a few bytes; more is not read.
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug)]
pub(super) struct Client(reqwest::Client);

impl Client {
    /// Bounded by the export timeout the environment asks for: the client
    /// must enforce it, the exporter does not.
    pub fn new() -> Result<Client, reqwest::Error> {
        let timeout = [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let client = reqwest::Client::builder()
            // A redirect would carry OTEL_EXPORTER_OTLP_HEADERS (an API
            // key, say) to another host: the collector's answer is final.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()?;
        Ok(Client(client))
    }
}

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (k, v) in &parts.headers {
            req = req.header(k, v);
        }
        let mut answer = req.send().await?;
        let status = answer.status();
        let headers = answer.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await? {
            let room = MAX_ANSWER.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if room <= chunk.len() {
                break;
            }
        }
        let mut out = Response::builder().status(status).body(Bytes::from(body))?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}
