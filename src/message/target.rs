//! Where notifications go, as an operator names it: an endpoint's ORIGIN
//! (`https://hooks.example.com`: scheme, host and port, the isolation key)
//! or a URL prefix (`https://hooks.example.com/m/123/`), since one host
//! often serves many tenants, one path each. Both are one [`Target`]: an
//! origin is the prefix whose path is `/`. Parsed by the URL parser the
//! notifications' own URLs go through, so the two always compare alike
//! (default ports, case, percent-encoding).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

/// An origin or URL prefix, canonical: scheme, host, port (always
/// explicit) and a path prefix (`/` for an origin).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    scheme: String,
    host: String,
    port: u16,
    path: String,
}

/// Why a text is not an ORIGIN or URL prefix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadTarget {
    #[error("{0:?} is not a URL: {1} (give an origin such as https://hooks.example.com, or a URL prefix such as https://hooks.example.com/m/123/)")]
    NotUrl(String, String),
    #[error("{0:?}: the scheme must be http or https")]
    Scheme(String),
    #[error("{0:?} has no host")]
    NoHost(String),
    #[error("{0:?} carries credentials; name the endpoint without them")]
    Credentials(String),
    #[error("{0:?} has a query or fragment; a prefix is matched on the path only")]
    Query(String),
}

impl Target {
    /// Reads an ORIGIN or a URL prefix.
    pub fn parse(text: &str) -> Result<Target, BadTarget> {
        let t = text.trim();
        let url = Url::parse(t).map_err(|e| BadTarget::NotUrl(t.into(), e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(BadTarget::Scheme(t.into()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(BadTarget::Credentials(t.into()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(BadTarget::Query(t.into()));
        }
        let mut target = Target::origin_of(&url).ok_or_else(|| BadTarget::NoHost(t.into()))?;
        target.path = url.path().to_string();
        Ok(target)
    }

    /// The origin a URL goes to (path `/`); `None` without a host.
    pub fn origin_of(url: &Url) -> Option<Target> {
        Some(Target {
            scheme: url.scheme().to_string(),
            host: url.host_str().filter(|h| !h.is_empty())?.to_string(),
            port: url.port_or_known_default()?,
            path: "/".into(),
        })
    }

    /// Whether a notification to `url` falls under it.
    pub fn matches(&self, url: &Url) -> bool {
        url.host_str() == Some(self.host.as_str())
            && self.matches_in_host(url.scheme(), url.port_or_known_default(), url.path())
    }

    /// [`Target::matches`] once the host is known to be this one's.
    pub fn matches_in_host(&self, scheme: &str, port: Option<u16>, path: &str) -> bool {
        scheme == self.scheme && port == Some(self.port) && path.starts_with(&self.path)
    }

    /// Whether every URL under `other` is under this one too.
    pub fn covers(&self, other: &Target) -> bool {
        self.scheme == other.scheme
            && self.host == other.host
            && self.port == other.port
            && other.path.starts_with(&self.path)
    }

    pub fn is_origin(&self) -> bool {
        self.path == "/"
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path prefix (`/` for an origin).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How specific it is: the longest match wins.
    pub fn path_len(&self) -> usize {
        self.path.len()
    }

    /// `scheme://host:port`: the isolation key of its origin.
    pub fn origin_key(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// An origin as `https://host:443`, a prefix as `https://host:443/m/123/`.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin_key())?;
        if !self.is_origin() {
            f.write_str(&self.path)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Target {
    type Err = BadTarget;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Target::parse(s)
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Target::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        Target::parse(s).unwrap()
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn an_origin_and_a_prefix_are_canonical() {
        assert_eq!(
            t("https://Hooks.Example.com").to_string(),
            "https://hooks.example.com:443"
        );
        assert_eq!(
            t("https://hooks.example.com/").to_string(),
            "https://hooks.example.com:443"
        );
        assert_eq!(
            t("https://hooks.example.com:443"),
            t("https://hooks.example.com")
        );
        assert_eq!(
            t("http://127.0.0.1:4000").origin_key(),
            "http://127.0.0.1:4000"
        );
        let p = t("https://hooks.example.com/m/123/");
        assert_eq!(p.to_string(), "https://hooks.example.com:443/m/123/");
        assert!(!p.is_origin());
        assert_eq!(t(&p.to_string()), p, "its text reads back");
    }

    #[test]
    fn a_prefix_matches_urls_that_start_with_it_on_its_origin() {
        let p = t("https://h.example/m/123/");
        assert!(p.matches(&url("https://h.example/m/123/pay?x=1")));
        assert!(p.matches(&url("https://h.example:443/m/123/")));
        assert!(!p.matches(&url("https://h.example/m/1234/")));
        assert!(
            !p.matches(&url("http://h.example/m/123/")),
            "another scheme"
        );
        assert!(
            !p.matches(&url("https://h.example:8443/m/123/")),
            "another port"
        );
        let o = t("https://h.example");
        assert!(o.matches(&url("https://h.example/anything")));
        assert!(o.covers(&p) && !p.covers(&o));
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        assert!(matches!(
            Target::parse("hooks.example.com"),
            Err(BadTarget::NotUrl(..))
        ));
        assert!(matches!(
            Target::parse("ftp://h.example"),
            Err(BadTarget::Scheme(_))
        ));
        assert!(matches!(
            Target::parse("https://u:p@h.example"),
            Err(BadTarget::Credentials(_))
        ));
        assert!(matches!(
            Target::parse("https://h.example/?a=1"),
            Err(BadTarget::Query(_))
        ));
        let e = Target::parse("nope").unwrap_err().to_string();
        assert!(e.contains("https://hooks.example.com"), "{e}");
    }
}
