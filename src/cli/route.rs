//! A config file's `[[route]]` table, checked key by key with its line.

use std::path::Path;

use toml_edit::Table;

use crate::cli::toml::{line_of, values};
use crate::config::Route;
use crate::config::SigningSecret;
use crate::policy::{check_max_attempts, parse_duration, parse_schedule, BadRate, MAX_DELAY};

const KEYS: &str = "url-prefix, signing-secret, schedule, max-attempts, timeout, success-body, \
concurrency, rate, breaker-failures, max-age, client-cert, client-key, ca-roots";

/// The route of one table; an error carries the offending line, if known.
/// Its TLS files are read now, relative to `base` (the config's folder).
pub fn route(t: &Table, text: &str, base: &Path) -> Result<Route, (Option<usize>, String)> {
    let mut r = Route::default();
    for (key, item) in t.iter() {
        let line = item.span().map(|s| line_of(text, s.start));
        let err = |m: String| (line, format!("[[route]] `{key}`: {m}"));
        let values = values(item)
            .unwrap_or_else(|| Err("expected a value".into()))
            .map_err(err)?;
        let one = || match values.as_slice() {
            [v] => Ok(v.clone()),
            _ => Err(err("expected one value".into())),
        };
        match key {
            "url-prefix" => r.url_prefix = url_prefix(&one()?).map_err(err)?,
            "signing-secret" => {
                let secrets = values.iter().map(|v| v.parse::<SigningSecret>());
                let secrets = secrets.collect::<Result<Vec<_>, _>>();
                r.secrets = Some(secrets.map_err(|e| err(e.to_string()))?);
            }
            "schedule" => {
                let s = parse_schedule(&one()?).map_err(|e| err(e.to_string()))?;
                if s.iter().any(|d| *d > MAX_DELAY) {
                    return Err(err(
                        "a delay is beyond the delayed exchange's limit (49 days)".into(),
                    ));
                }
                r.schedule = Some(s);
            }
            "max-attempts" => {
                let n = one()?.parse::<u64>().map_err(|e| err(e.to_string()))?;
                r.max_attempts = Some(check_max_attempts(n).map_err(|e| err(e.to_string()))?);
            }
            "timeout" => r.timeout = Some(parse_duration(&one()?).map_err(|e| err(e.to_string()))?),
            "success-body" => r.success_body = Some(one()?),
            "concurrency" => r.concurrency = Some(positive(&one()?).map_err(err)?),
            "rate" => r.rate = Some(one()?.parse().map_err(|e: BadRate| err(e.to_string()))?),
            "breaker-failures" => {
                r.breaker_failures = Some(one()?.parse().map_err(|e| err(format!("{e}")))?)
            }
            "max-age" => r.max_age = Some(parse_duration(&one()?).map_err(|e| err(e.to_string()))?),
            "client-cert" | "client-key" | "ca-roots" => tls_file(&mut r, key, one()?),
            "client_cert" | "client_key" | "ca_roots" => tls_file(&mut r, key, one()?),
            _ => {
                return Err((
                    line,
                    format!("[[route]]: unknown setting `{key}` (known: {KEYS})"),
                ))
            }
        }
    }
    let line = t.span().map(|s| line_of(text, s.start));
    if r.url_prefix.is_empty() {
        return Err((line, "[[route]] needs a `url-prefix`".into()));
    }
    if let Err(e) = r.tls.load(base) {
        return Err((line, format!("[[route]] {}: {e}", r.url_prefix)));
    }
    Ok(r)
}

/// Sets a route's TLS file (`client-cert`, `client-key` or `ca-roots`; the
/// spelling with `_` is accepted too); read later, once the table is whole.
fn tls_file(r: &mut Route, key: &str, path: String) {
    let slot = match key.replace('_', "-").as_str() {
        "client-cert" => &mut r.tls.client_cert,
        "client-key" => &mut r.tls.client_key,
        _ => &mut r.tls.ca_roots,
    };
    *slot = Some(path.into());
}

/// A whole number from 1 to 65535 (a concurrency).
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<u16>() {
        Ok(n) if n > 0 => Ok(usize::from(n)),
        _ => Err(format!("`{s}` must be a whole number from 1 to 65535")),
    }
}

/// An http(s) URL with a host, so a typo does not silently match nothing.
/// Kept normalised (lower-case host, no default port) for `config show`.
fn url_prefix(s: &str) -> Result<String, String> {
    if !(s.starts_with("http://") || s.starts_with("https://")) {
        return Err(format!("`{s}` must start with http:// or https://"));
    }
    let u = url::Url::parse(s).map_err(|e| format!("`{s}`: {e}"))?;
    if u.host_str().is_none() || u.query().is_some() || u.fragment().is_some() {
        return Err(format!("`{s}` must be scheme://host[:port][/path]"));
    }
    Ok(u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Route, (Option<usize>, String)> {
        let text = format!("[[route]]\nurl-prefix = \"https://a.example/\"\n{body}");
        let doc = toml_edit::Document::parse(text.clone()).unwrap();
        let tables = doc["route"].as_array_of_tables().unwrap();
        route(tables.get(0).unwrap(), &text, Path::new("."))
    }

    #[test]
    fn per_endpoint_keys_parse_and_bad_values_name_their_line() {
        let r =
            parse("concurrency = 4\nrate = \"600/min\"\nbreaker-failures = 0\nmax-age = \"12h\"\n")
                .unwrap();
        assert_eq!(r.concurrency, Some(4));
        assert_eq!(r.rate.map(|r| r.to_string()).as_deref(), Some("600/min"));
        assert_eq!(r.breaker_failures, Some(0));
        assert_eq!(r.max_age, Some(std::time::Duration::from_secs(12 * 3600)));
        for (bad, needle) in [
            ("concurrency = 0", "concurrency"),
            ("concurrency = \"many\"", "concurrency"),
            ("rate = \"50\"", "invalid rate"),
            ("breaker-failures = -1", "breaker-failures"),
            ("max-age = \"soon\"", "max-age"),
        ] {
            let (line, msg) = parse(bad).unwrap_err();
            assert_eq!(line, Some(3), "{bad}");
            assert!(msg.contains(needle), "{bad}: {msg}");
        }
    }
}
