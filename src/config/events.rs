//! Where operational events go and which (`--events-url`,
//! `--events-types`, `--failing-after`); the events themselves are
//! `crate::message::event`, their publishing `crate::events`.

use url::Url;

use crate::message::event::Kind;

/// `--failing-after` by default: Svix sends `message.attempt.failing` on
/// the 4th failed attempt.
pub const DEFAULT_FAILING_AFTER: u32 = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct EventSettings {
    /// Every event (of `types`) is also delivered here, as a notification
    /// of its own; `None`: only to the `<prefix>.events` exchange.
    pub url: Option<Url>,
    /// Which types go to `url`: names or `family.*` patterns; empty: all.
    pub types: Vec<String>,
    /// `notification.failing` after this many failed attempts of one
    /// notification; 0: never.
    pub failing_after: u32,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            url: None,
            types: vec![],
            failing_after: DEFAULT_FAILING_AFTER,
        }
    }
}

impl EventSettings {
    /// Whether an event of `kind` is delivered to the events URL.
    pub fn to_url(&self, kind: Kind) -> bool {
        self.name_to_url(kind.as_str())
    }

    /// [`EventSettings::to_url`] by the type's name (a newer build's too).
    pub fn name_to_url(&self, name: &str) -> bool {
        let picked = self.types.is_empty() || self.types.iter().any(|p| type_matches(name, p));
        self.url.is_some() && picked
    }
}

/// Whether `pattern` names the type `name`: the type itself, `family.*`
/// (`notification.*`, `endpoint.*`, `delay-backend.*`) or `*`.
pub fn type_matches(name: &str, pattern: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(family) => family.ends_with('.') && name.starts_with(family),
        None => name == pattern,
    }
}

/// Checks one `--events-types` entry: a type, `family.*` or `*`.
pub fn parse_type_pattern(text: &str) -> Result<String, String> {
    let t = text.trim();
    if Kind::ALL.iter().any(|k| type_matches(k.as_str(), t)) {
        return Ok(t.to_string());
    }
    let names: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    Err(format!(
        "{t:?} is no event type; give one of {}, or a family such as notification.*",
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_pick_what_goes_to_the_url() {
        let mut s = EventSettings::default();
        assert!(!s.to_url(Kind::Exhausted), "no url, nothing");
        s.url = Some(Url::parse("http://127.0.0.1:9/events").unwrap());
        assert!(
            s.to_url(Kind::Exhausted) && s.to_url(Kind::Paused),
            "all by default"
        );
        s.types = vec!["notification.exhausted".into(), "endpoint.*".into()];
        assert!(s.to_url(Kind::Exhausted) && s.to_url(Kind::Disabled));
        assert!(!s.to_url(Kind::Failing) && !s.to_url(Kind::DelayStalled));
    }

    #[test]
    fn patterns_name_a_type_a_family_or_all() {
        assert!(type_matches(
            "notification.exhausted",
            "notification.exhausted"
        ));
        assert!(type_matches("notification.exhausted", "notification.*"));
        assert!(type_matches("notification.exhausted", "*"));
        assert!(!type_matches("notification.exhausted", "endpoint.*"));
        assert!(!type_matches("notification.exhausted", "notification"));
        assert!(!type_matches("notification.exhausted", "notif*"));
        assert!(type_matches("delay-backend.stalled", "delay-backend.*"));
    }

    #[test]
    fn a_pattern_must_name_something() {
        assert!(parse_type_pattern("endpoint.*").is_ok());
        assert!(parse_type_pattern("notification.exhausted").is_ok());
        let e = parse_type_pattern("notification.exhaust").unwrap_err();
        assert!(e.contains("notification.failing"), "{e}");
        assert!(parse_type_pattern("nope.*").is_err());
    }
}
