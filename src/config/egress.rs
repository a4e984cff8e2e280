//! `--proxy`: where deliveries leave through. Off by default, and the
//! standard `HTTPS_PROXY`/`NO_PROXY` variables count only with `--proxy env`,
//! so an environment that happens to set them changes nothing silently.

use std::fmt;
use std::str::FromStr;

use crate::message::redact::redact_url;

#[derive(Clone, Default, PartialEq, Eq)]
pub enum ProxySetting {
    /// Straight to each receiver (the default).
    #[default]
    Direct,
    /// Through the proxies of `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`,
    /// except for the hosts of `NO_PROXY`.
    Env,
    /// Through this proxy: `http://`, `https://` (CONNECT for https
    /// receivers), `socks5://` (names resolved here) or `socks5h://`
    /// (names resolved by the proxy). It may carry `user:password@`.
    Url(url::Url),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadProxy {
    #[error("--proxy: not a URL ({0}); give http://host:port, socks5://host:port or `env`")]
    NotUrl(String),
    #[error("--proxy: the scheme must be http, https, socks5 or socks5h, not {0}")]
    Scheme(String),
    #[error("--proxy: the URL has no host")]
    NoHost,
}

impl FromStr for ProxySetting {
    type Err = BadProxy;

    /// The error never repeats the URL: it may hold a password.
    fn from_str(s: &str) -> Result<Self, BadProxy> {
        match s.trim() {
            "" | "off" | "none" => return Ok(ProxySetting::Direct),
            "env" => return Ok(ProxySetting::Env),
            _ => {}
        }
        let u = url::Url::parse(s.trim()).map_err(|e| BadProxy::NotUrl(e.to_string()))?;
        if !["http", "https", "socks5", "socks5h"].contains(&u.scheme()) {
            return Err(BadProxy::Scheme(u.scheme().to_string()));
        }
        if u.host_str().is_none_or(str::is_empty) {
            return Err(BadProxy::NoHost);
        }
        Ok(ProxySetting::Url(u))
    }
}

/// Shows the proxy without its password.
impl fmt::Display for ProxySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxySetting::Direct => f.write_str("off"),
            ProxySetting::Env => f.write_str("env"),
            ProxySetting::Url(u) => f.write_str(&redact_url(u.as_str())),
        }
    }
}

impl fmt::Debug for ProxySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxySetting({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_parse_and_never_show_a_password() {
        assert_eq!("env".parse(), Ok(ProxySetting::Env));
        assert_eq!("off".parse(), Ok(ProxySetting::Direct));
        let p: ProxySetting = "http://u:hunter2@proxy.internal:3128".parse().unwrap();
        assert!(!p.to_string().contains("hunter2"), "{p}");
        assert!(!format!("{p:?}").contains("hunter2"));
        assert!("socks5h://127.0.0.1:1080".parse::<ProxySetting>().is_ok());
        assert_eq!(
            "ftp://x:1".parse::<ProxySetting>(),
            Err(BadProxy::Scheme("ftp".into()))
        );
        let bad = "proxy:hunter2".parse::<ProxySetting>().unwrap_err();
        assert!(!bad.to_string().contains("hunter2"), "{bad}");
    }
}
