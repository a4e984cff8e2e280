//! Per-URL-prefix overrides (the config file's `[[route]]` tables): one
//! receiver needs its own secret, another a WeChat-style schedule or a
//! longer timeout. The longest matching prefix wins; a notification's own
//! fields (max attempts, schedule, success body) win over any route.

use std::time::Duration;

use crate::config::{RouteTls, SigningSecret};
use crate::policy::{Overrides, Rate};

#[derive(Clone, Debug, Default)]
pub struct Route {
    /// Matched by scheme, host, port and path prefix (see [`Routes::find`]).
    pub url_prefix: String,
    /// Replaces the worker's signing secrets for these URLs.
    pub secrets: Option<Vec<SigningSecret>>,
    pub schedule: Option<Vec<Duration>>,
    pub max_attempts: Option<u32>,
    /// Replaces `--timeout` for one HTTP attempt.
    pub timeout: Option<Duration>,
    pub success_body: Option<String>,
    /// A hard ceiling on attempts in flight to these URLs, under which their
    /// adaptive limit moves (`--endpoint-concurrency`).
    pub concurrency: Option<usize>,
    /// Most attempts per interval to these URLs (`--endpoint-rate`).
    pub rate: Option<Rate>,
    /// `--breaker-failures` for these URLs; 0 turns their breaker off.
    pub breaker_failures: Option<u32>,
    /// `--max-age` for these URLs.
    pub max_age: Option<Duration>,
    /// A client certificate (mTLS) and extra CA roots for these URLs.
    pub tls: RouteTls,
}

impl Route {
    /// The route's layer of the retry policy ([`crate::policy::EffectivePolicy`]).
    pub fn overrides(&self) -> Overrides<'_> {
        Overrides {
            max_attempts: self.max_attempts,
            schedule: self.schedule.as_deref(),
            success_body: self.success_body.as_deref(),
            max_age: self.max_age,
        }
    }
}

/// The routes, longest prefix first, so the first match is the most
/// specific; each with its prefix parsed once, since `find` runs on every
/// delivery (`None`: a prefix that does not parse, which matches nothing).
#[derive(Clone, Debug, Default)]
pub struct Routes(Vec<(Route, Option<url::Url>)>);

impl Routes {
    pub fn new(mut routes: Vec<Route>) -> Self {
        routes.sort_by_key(|r| std::cmp::Reverse(r.url_prefix.len()));
        let parsed = routes.into_iter().map(|r| {
            let p = url::Url::parse(&r.url_prefix).ok();
            (r, p)
        });
        Routes(parsed.collect())
    }

    /// The route of the longest prefix matching `url`: the same scheme,
    /// host and port (as parsed, so `HTTPS://Pay.example.com:443` is
    /// `https://pay.example.com`), and a path that starts with the
    /// prefix's. A prefix never matches another host that merely starts
    /// with its text (`pay.example.com.evil.net`).
    pub fn find(&self, url: &url::Url) -> Option<&Route> {
        self.0
            .iter()
            .find(|(_, p)| p.as_ref().is_some_and(|p| matches(p, url)))
            .map(|(r, _)| r)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.0.iter().map(|(r, _)| r)
    }
}

fn matches(p: &url::Url, url: &url::Url) -> bool {
    p.scheme() == url.scheme()
        && p.host_str() == url.host_str()
        && p.port_or_known_default() == url.port_or_known_default()
        && url.path().starts_with(p.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: &str, attempts: u32) -> Route {
        Route {
            url_prefix: prefix.into(),
            max_attempts: Some(attempts),
            ..Route::default()
        }
    }

    #[test]
    fn the_longest_matching_prefix_wins() {
        let r = Routes::new(vec![
            route("https://pay.example.com/", 1),
            route("https://pay.example.com/wechat/", 2),
            route("https://other.example.com/", 3),
        ]);
        let hit = |u: &str| r.find(&u.parse().unwrap()).and_then(|r| r.max_attempts);
        assert_eq!(hit("https://pay.example.com/wechat/notify"), Some(2));
        assert_eq!(hit("https://pay.example.com/alipay"), Some(1));
        assert_eq!(hit("https://PAY.example.com:443/alipay"), Some(1));
        assert_eq!(hit("https://pay.example.org/"), None);
        assert_eq!(hit("http://pay.example.com/"), None);
        assert_eq!(hit("https://pay.example.com:8443/"), None);
    }

    #[test]
    fn a_prefix_without_a_path_does_not_match_a_longer_host() {
        let r = Routes::new(vec![route("https://pay.example.com", 1)]);
        let hit = |u: &str| r.find(&u.parse().unwrap()).is_some();
        assert!(hit("https://pay.example.com/x"));
        assert!(!hit("https://pay.example.com.evil.net/x"));
        assert!(!hit("https://pay.example.community/x"));
    }
}
