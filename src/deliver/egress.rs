//! The HTTP clients: one for most receivers, and one per route that brings
//! its own TLS material (a client certificate, extra CA roots); all leave
//! through the same proxy setting, and all resolve through the SSRF guard.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Certificate, Client, ClientBuilder, Identity, NoProxy, Proxy};

use super::guard::AddressPolicy;
use crate::config::{ProxySetting, Route, Routes};

/// The proxy environment variables `--proxy env` reads (reqwest's).
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// What every client shares.
#[derive(Clone, Debug)]
pub(super) struct Base {
    pub timeout: Duration,
    pub concurrency: usize,
}

/// Where requests leave through.
#[derive(Clone, Debug, Default)]
pub struct Egress {
    pub proxy: ProxySetting,
    /// Hosts that bypass `--proxy URL` (the `NO_PROXY` syntax).
    pub no_proxy: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("building the HTTP client: {0}")]
    Client(String),
    #[error("route {prefix}: {why}")]
    Route { prefix: String, why: String },
}

#[derive(Clone, Debug)]
pub(super) struct Clients {
    default: Client,
    /// By route prefix (unique in a config).
    by_route: HashMap<String, Client>,
    /// Whether a request may leave through a proxy, which resolves the
    /// target itself: the guard then checks the target before sending.
    pub proxied: bool,
}

impl Clients {
    pub fn build(
        policy: &AddressPolicy,
        base: &Base,
        egress: &Egress,
        routes: &Routes,
    ) -> Result<Clients, EgressError> {
        let hosts = proxy_hosts(&egress.proxy);
        let policy = Arc::new(policy.exempting(hosts));
        let client = |r: Option<&Route>| builder(&policy, base, egress, r)?.build();
        let default = client(None).map_err(|e| EgressError::Client(root(&e)))?;
        let mut by_route = HashMap::new();
        for r in routes.iter().filter(|r| !r.tls.is_empty()) {
            let built = client(Some(r)).map_err(|e| EgressError::Route {
                prefix: r.url_prefix.clone(),
                why: root(&e),
            })?;
            by_route.insert(r.url_prefix.clone(), built);
        }
        Ok(Clients {
            default,
            by_route,
            proxied: egress.proxy != ProxySetting::Direct,
        })
    }

    pub fn get(&self, route: Option<&Route>) -> &Client {
        route
            .and_then(|r| self.by_route.get(&r.url_prefix))
            .unwrap_or(&self.default)
    }
}

fn builder(
    policy: &Arc<AddressPolicy>,
    base: &Base,
    egress: &Egress,
    route: Option<&Route>,
) -> Result<ClientBuilder, reqwest::Error> {
    let mut b = Client::builder()
        // Every hostname is resolved through the SSRF policy.
        .dns_resolver(policy.resolver())
        // A receiver's redirect is its answer, not an instruction to
        // deliver the payload somewhere else.
        .redirect(reqwest::redirect::Policy::none())
        .timeout(base.timeout)
        .pool_max_idle_per_host(base.concurrency);
    b = match &egress.proxy {
        // reqwest reads the proxy variables unless told not to.
        ProxySetting::Direct => b.no_proxy(),
        ProxySetting::Env => b,
        ProxySetting::Url(u) => {
            let bypass = egress.no_proxy.as_deref().and_then(NoProxy::from_string);
            b.proxy(Proxy::all(u.as_str())?.no_proxy(bypass))
        }
    };
    let Some(tls) = route.map(|r| &r.tls) else {
        return Ok(b);
    };
    if let Some(pem) = tls.identity_pem() {
        b = b.identity(Identity::from_pem(pem)?);
    }
    if let Some(pem) = tls.ca_pem() {
        for cert in Certificate::from_pem_bundle(pem)? {
            b = b.add_root_certificate(cert);
        }
    }
    Ok(b)
}

/// The proxies' host names, which the guard lets through.
fn proxy_hosts(p: &ProxySetting) -> Vec<String> {
    let urls: Vec<url::Url> = match p {
        ProxySetting::Direct => vec![],
        ProxySetting::Url(u) => vec![u.clone()],
        ProxySetting::Env => PROXY_VARS
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .filter_map(|v| url::Url::parse(&v).ok())
            .collect(),
    };
    urls.iter()
        .filter_map(|u| u.host_str().map(str::to_string))
        .collect()
}

/// The innermost cause: reqwest's own text is only "builder error".
fn root(e: &(dyn std::error::Error + 'static)) -> String {
    let mut root = e;
    while let Some(cause) = root.source() {
        root = cause;
    }
    root.to_string()
}
