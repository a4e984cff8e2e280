//! A test OTLP/HTTP collector on 127.0.0.1:0: it decodes each
//! `POST /v1/traces` with the official OpenTelemetry protobuf definitions
//! (`opentelemetry-proto`) and keeps the spans.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// One span as received, with its service's name.
#[derive(Clone, Debug)]
pub struct Got {
    pub service: String,
    pub span: Span,
}

impl Got {
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    /// An attribute as text (strings as they are, integers in decimal).
    pub fn attr(&self, key: &str) -> Option<String> {
        let kv = self.span.attributes.iter().find(|kv| kv.key == key)?;
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            other => Some(format!("{other:?}")),
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub struct Collector {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Got>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector {
            endpoint,
            spans,
            _server: server,
        }
    }

    pub fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Got>>>>, body: Bytes) -> StatusCode {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut got = spans.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                got.push(Got {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    StatusCode::OK
}
