//! What is in force, arranged for the one question every delivery asks:
//! may a notification to this URL be attempted? Hash lookups on the URL's
//! host and port, then on its path's prefixes of the lengths that host's
//! targets have, longest first. No allocation, no broker round trip; with
//! nothing paused or disabled, not even that ([`super::Control::gate`]).

use std::collections::HashMap;

use url::Url;

use super::book::{Book, Mode};
use crate::message::target::Target;

/// The answer for one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Nothing in force: attempt it.
    Go,
    /// Paused by `target` (its pause ends at `until_ms`, if set): park it.
    /// `breaker_since`: when a worker paused it for its long-open breaker
    /// (so this worker's breaker may still let a delivery through as its
    /// probe); `None` for an operator's pause.
    Paused {
        target: Target,
        until_ms: Option<u64>,
        breaker_since: Option<u64>,
    },
    /// Disabled by `target`: dead-letter it as `endpoint-disabled`.
    Disabled { target: Target },
}

/// The paused and disabled targets, by host, then port and path prefix.
#[derive(Clone, Debug, Default)]
pub struct Table {
    by_host: HashMap<String, OnHost>,
    len: usize,
}

/// One host's targets. A lookup tries each distinct prefix length once,
/// longest first: a host with ten thousand paused tenants costs a few hash
/// lookups, not a scan.
#[derive(Clone, Debug, Default)]
struct OnHost {
    /// The lengths of its targets' paths, longest first.
    lengths: Vec<usize>,
    by_port: HashMap<u16, HashMap<String, Vec<(Target, Mode)>>>,
}

impl Table {
    /// The targets paused or disabled at `now_ms` (and pauses that end
    /// later: the lookup checks their time).
    pub fn build(book: &Book, now_ms: u64) -> Table {
        let mut t = Table::default();
        for k in book.keys().filter(|k| k.control.in_force(now_ms)) {
            t.len += 1;
            let host = t.by_host.entry(k.target.host().to_string()).or_default();
            let path = k.target.path().to_string();
            if !host.lengths.contains(&path.len()) {
                host.lengths.push(path.len());
            }
            let on_port = host.by_port.entry(k.target.port()).or_default();
            on_port
                .entry(path)
                .or_default()
                .push((k.target.clone(), k.control.clone()));
        }
        for h in t.by_host.values_mut() {
            h.lengths.sort_unstable_by(|a, b| b.cmp(a));
        }
        t
    }

    /// Targets in the table (paused or disabled when it was built).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The longest target in force at `now_ms` that `url` falls under.
    pub fn gate(&self, url: &Url, now_ms: u64) -> Gate {
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Gate::Go;
        };
        match self.find(host, url.scheme(), port, url.path(), now_ms) {
            None => Gate::Go,
            Some((
                t,
                Mode::Paused {
                    until_ms,
                    id,
                    since_ms,
                    ..
                },
            )) => Gate::Paused {
                target: t.clone(),
                until_ms: *until_ms,
                breaker_since: id
                    .starts_with(super::book::BREAKER_PAUSE)
                    .then_some(*since_ms),
            },
            Some((t, _)) => Gate::Disabled { target: t.clone() },
        }
    }

    /// The target in force that covers `target` (itself included), if any.
    pub fn covering(&self, target: &Target, now_ms: u64) -> Option<(&Target, &Mode)> {
        let (scheme, port, path) = (target.scheme(), target.port(), target.path());
        self.find(target.host(), scheme, port, path, now_ms)
    }

    /// The longest target in force whose path `path` starts with.
    fn find(
        &self,
        host: &str,
        scheme: &str,
        port: u16,
        path: &str,
        now_ms: u64,
    ) -> Option<(&Target, &Mode)> {
        let on_host = self.by_host.get(host)?;
        let on_port = on_host.by_port.get(&port)?;
        on_host
            .lengths
            .iter()
            .filter_map(|&n| path.get(..n))
            .filter_map(|prefix| on_port.get(prefix))
            .flatten()
            .find(|(t, m)| t.scheme() == scheme && m.in_force(now_ms))
            .map(|(t, m)| (t, m))
    }

    /// Every target in the table with its control, in no order.
    pub fn entries(&self) -> impl Iterator<Item = &(Target, Mode)> {
        self.by_host
            .values()
            .flat_map(|h| h.by_port.values())
            .flat_map(|p| p.values())
            .flatten()
    }

    /// How many targets are paused and how many disabled at `now_ms`.
    pub fn counts(&self, now_ms: u64) -> (usize, usize) {
        let all = self
            .by_host
            .values()
            .flat_map(|h| h.by_port.values())
            .flat_map(|p| p.values())
            .flatten();
        let (mut paused, mut disabled) = (0, 0);
        for (_, m) in all.filter(|(_, m)| m.in_force(now_ms)) {
            match m {
                Mode::Disabled { .. } => disabled += 1,
                _ => paused += 1,
            }
        }
        (paused, disabled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::record::{Change, Record};

    fn t(s: &str) -> Target {
        Target::parse(s).unwrap()
    }

    fn table(changes: Vec<Change>) -> Table {
        let mut b = Book::default();
        for (i, c) in changes.into_iter().enumerate() {
            b.apply(i as u64, Record::new(1, "test", c));
        }
        b.settle();
        Table::build(&b, 10)
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn the_longest_target_in_force_wins() {
        let tab = table(vec![
            Change::Disable {
                target: t("https://h.example"),
                reason: None,
                failing_since_ms: None,
            },
            Change::Pause {
                target: t("https://h.example/m/123/"),
                reason: None,
                until_ms: None,
            },
        ]);
        assert!(matches!(
            tab.gate(&url("https://h.example/m/123/x"), 10),
            Gate::Paused { .. }
        ));
        assert!(matches!(
            tab.gate(&url("https://h.example/m/9/"), 10),
            Gate::Disabled { .. }
        ));
        assert_eq!(tab.gate(&url("https://other.example/m/123/"), 10), Gate::Go);
        assert_eq!(
            tab.gate(&url("http://h.example/m/123/"), 10),
            Gate::Go,
            "another origin"
        );
        assert_eq!(tab.counts(10), (1, 1));
        let p = t("https://h.example/m/123/sub/");
        assert_eq!(
            tab.covering(&p, 10).unwrap().0,
            &t("https://h.example/m/123/")
        );
    }

    #[test]
    fn an_expired_pause_lets_the_shorter_target_decide() {
        let tab = table(vec![
            Change::Pause {
                target: t("https://h.example"),
                reason: None,
                until_ms: None,
            },
            Change::Pause {
                target: t("https://h.example/m/1/"),
                reason: None,
                until_ms: Some(20),
            },
        ]);
        let u = url("https://h.example/m/1/");
        let Gate::Paused { target, .. } = tab.gate(&u, 15) else {
            panic!()
        };
        assert_eq!(target, t("https://h.example/m/1/"));
        let Gate::Paused { target, .. } = tab.gate(&u, 25) else {
            panic!()
        };
        assert_eq!(target, t("https://h.example"));
        assert_eq!(table(vec![]).gate(&u, 1), Gate::Go);
    }

    /// Thousands of tenants paused on one host: the right one answers,
    /// and a neighbour with a longer number is not caught by a shorter one.
    #[test]
    fn many_prefixes_on_one_host_each_answer_for_their_own() {
        let changes = (0..5_000)
            .map(|i| Change::Pause {
                target: t(&format!("https://saas.example/m/{i}/")),
                reason: None,
                until_ms: None,
            })
            .collect();
        let tab = table(changes);
        assert_eq!(tab.len(), 5_000);
        let Gate::Paused { target, .. } = tab.gate(&url("https://saas.example/m/4321/pay"), 10)
        else {
            panic!()
        };
        assert_eq!(target, t("https://saas.example/m/4321/"));
        assert_eq!(
            tab.gate(&url("https://saas.example/m/5000/pay"), 10),
            Gate::Go
        );
        assert_eq!(
            tab.gate(&url("https://saas.example:444/m/1/"), 10),
            Gate::Go
        );
    }
}
