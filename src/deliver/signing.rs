//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): every
//! request carries `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! so a receiver can tell a genuine delivery from a forged one and refuse a
//! replayed old one.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::SystemTime;
use tracing::{error, warn};

use crate::config::SigningSecret;

/// `v1,<base64 signature>` of one message.
fn sign(secret: &SigningSecret, content: &[u8]) -> String {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.key()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(content);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// The secrets that still sign at `now`. A secret past its expiry is
/// left out, and the log says so once (with its fingerprint, never the
/// key), so a rotation's old secret stops without a restart.
pub fn live(secrets: &[SigningSecret], now: SystemTime) -> Vec<&SigningSecret> {
    let live: Vec<&SigningSecret> = secrets.iter().filter(|s| s.in_use(now)).collect();
    for s in secrets.iter().filter(|s| s.newly_expired(now)) {
        let at = s.expires().map(humantime::format_rfc3339);
        let at = at.map(|t| t.to_string()).unwrap_or_default();
        let fingerprint = s.fingerprint();
        if live.is_empty() {
            error!(%fingerprint, expired_at = %at, "a signing secret expired and no other is left: requests go unsigned until a new secret is given");
        } else {
            warn!(%fingerprint, expired_at = %at, still_signing = live.len(), "a signing secret expired: it no longer signs");
        }
    }
    live
}

/// The `webhook-signature` value: one `v1,` signature per secret,
/// space-separated, so a receiver can rotate keys: it accepts the request
/// if any signature verifies with a key it knows.
pub fn signature_header(
    secrets: &[&SigningSecret],
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> String {
    let mut content = Vec::with_capacity(id.len() + body.len() + 24);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.to_string().as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    let sigs: Vec<String> = secrets.iter().map(|s| sign(s, &content)).collect();
    sigs.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretError;

    /// The Standard Webhooks spec's published example (also in its
    /// reference libraries' tests).
    #[test]
    fn matches_the_spec_test_vector() {
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = signature_header(&[&secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn bad_secrets_are_refused_without_echoing_them() {
        assert_eq!(
            "abc".parse::<SigningSecret>().unwrap_err(),
            SecretError::Prefix
        );
        assert_eq!(
            "whsec_!!!".parse::<SigningSecret>().unwrap_err(),
            SecretError::Base64
        );
        assert_eq!(
            "whsec_YWJj".parse::<SigningSecret>().unwrap_err(),
            SecretError::Length(3)
        );
        let s: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        assert!(!format!("{s:?}").contains("MfKQ"));
    }

    #[test]
    fn several_secrets_give_space_separated_signatures() {
        let a: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let b: SigningSecret = format!("whsec_{}", BASE64.encode([7u8; 32]))
            .parse()
            .unwrap();
        let both = signature_header(&[&a, &b], "id", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature_header(&[&a], "id", 1, b"{}"));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn an_expired_secret_stops_signing_and_is_told_once() {
        let key = BASE64.encode([9u8; 32]);
        let old: SigningSecret = format!("whsec_{key}@2026-12-01T00:00:00Z").parse().unwrap();
        let new: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let at = humantime::parse_rfc3339("2026-12-01T00:00:00Z").unwrap();
        let before = at - std::time::Duration::from_secs(1);
        let both = [old.clone(), new];
        assert_eq!(live(&both, before).len(), 2);
        assert!(!old.newly_expired(before), "not yet");
        assert_eq!(live(&both, at).len(), 1, "at its expiry it stops");
        // `live` told it; a clone shares that.
        assert!(!old.newly_expired(at));
        assert!(!format!("{old:?}").contains(&key));
        for bad in ["@2026-12-01", "@tomorrow", "@2026-12-01T00:00:00+08:00"] {
            let s = format!("whsec_{key}{bad}");
            assert_eq!(s.parse::<SigningSecret>().unwrap_err(), SecretError::Expiry);
        }
    }
}
