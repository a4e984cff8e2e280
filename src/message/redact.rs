//! Redaction: what output shows in place of a secret. Dead-letter listings
//! and exports, `config show` and every logged URL go through here, so a
//! password, signing secret or Authorization header never reaches a log.

/// Written where a secret header's value was.
pub const REDACTED: &str = "***redacted***";

/// Request headers whose values are credentials.
pub fn is_secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie" | "x-api-key" | "api-key"
    ) || n.ends_with("-token")
        || n.ends_with("-secret")
        || n.contains("password")
        || n.contains("signature")
}

/// Replaces the password in `scheme://user:password@host` with `***`.
/// A URL without one comes back exactly as it was. One with no `//` but an
/// `@` (`amqp:user:pw@host`) parses with no password, yet may carry one:
/// it is not shown at all.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) if u.cannot_be_a_base() && url.contains('@') => "<unparsable url>".to_string(),
        Ok(_) => url.to_string(),
        Err(_) => "<unparsable url>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_never_survives_redaction() {
        assert_eq!(
            redact_url("amqp://u:pw@h:5672/%2f"),
            "amqp://u:***@h:5672/%2f"
        );
        assert_eq!(redact_url("amqp://h:5672/%2f"), "amqp://h:5672/%2f");
        assert_eq!(redact_url("amqp:u:pw@h"), "<unparsable url>");
        assert_eq!(redact_url("not a url"), "<unparsable url>");
    }
}
