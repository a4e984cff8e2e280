//! Per-URL-prefix overrides (the config file's `[[route]]` tables): one
//! receiver needs its own secret, another a WeChat-style schedule or a
//! longer timeout. The longest matching prefix wins; a notification's own
//! fields (max attempts, schedule, success body) win over any route.

use std::time::Duration;

use crate::signing::SigningSecret;

#[derive(Clone, Debug, Default)]
pub struct Route {
    /// Matched against the start of the notification's URL, as text.
    pub url_prefix: String,
    /// Replaces the worker's signing secrets for these URLs.
    pub secrets: Option<Vec<SigningSecret>>,
    pub schedule: Option<Vec<Duration>>,
    pub max_attempts: Option<u32>,
    /// Replaces `--timeout` for one HTTP attempt.
    pub timeout: Option<Duration>,
    pub success_body: Option<String>,
}

/// The routes, longest prefix first, so the first match is the most specific.
#[derive(Clone, Debug, Default)]
pub struct Routes(Vec<Route>);

impl Routes {
    pub fn new(mut routes: Vec<Route>) -> Self {
        routes.sort_by_key(|r| std::cmp::Reverse(r.url_prefix.len()));
        Routes(routes)
    }

    pub fn find(&self, url: &str) -> Option<&Route> {
        self.0.iter().find(|r| url.starts_with(&r.url_prefix))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.0.iter()
    }
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
        let hit = |u: &str| r.find(u).and_then(|r| r.max_attempts);
        assert_eq!(hit("https://pay.example.com/wechat/notify"), Some(2));
        assert_eq!(hit("https://pay.example.com/alipay"), Some(1));
        assert_eq!(hit("https://pay.example.org/"), None);
        assert_eq!(hit("http://pay.example.com/"), None);
    }
}
