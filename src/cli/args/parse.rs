//! Parsers for flag values that clap has no type for.

use std::time::Duration;

/// Below a second, a slow broker's confirm would routinely "time out" after
/// the copy was already published, and every copy would start a retry chain.
pub(super) fn confirm_timeout(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(d)
}

pub(super) fn duration(s: &str) -> Result<Duration, String> {
    crate::policy::parse_duration(s).map_err(|e| e.to_string())
}

/// `on` or `off`.
pub(super) fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected `on` or `off`, not `{other}`")),
    }
}

/// A duration above zero (`--for 0s` would pause nothing).
pub(super) fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be more than 0s".into()),
        d => Ok(d),
    }
}

/// A duration, or `off` (`None`), as `--disable-after` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrOff(pub Option<Duration>);

pub(super) fn duration_or_off(s: &str) -> Result<OrOff, String> {
    match s {
        "off" => Ok(OrOff(None)),
        _ => positive_duration(s).map(|d| OrOff(Some(d))),
    }
}

/// An http(s) URL with a host, as a notification's `url` must be.
pub fn http_url(s: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(s.trim()).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(format!("{s:?}: give an http or https URL with a host"));
    }
    Ok(u)
}
