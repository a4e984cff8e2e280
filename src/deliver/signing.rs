//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): every
//! request carries `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! so a receiver can tell a genuine delivery from a forged one and refuse a
//! replayed old one.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;

/// The spec's prefix of a secret; what follows is the key in base64.
const PREFIX: &str = "whsec_";

/// One signing key. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct SigningSecret(SecretSlice<u8>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("a signing secret must start with `whsec_` (Standard Webhooks format)")]
    Prefix,
    #[error("the part after `whsec_` is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; Standard Webhooks asks for 24 to 64")]
    Length(usize),
}

impl FromStr for SigningSecret {
    type Err = SecretError;

    /// The error never repeats the secret: it may end up in a log.
    fn from_str(s: &str) -> Result<Self, SecretError> {
        let b64 = s.trim().strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let key = BASE64.decode(b64).map_err(|_| SecretError::Base64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(SigningSecret(key.into()))
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(whsec_***)")
    }
}

impl SigningSecret {
    /// `v1,<base64 signature>` of one message.
    fn sign(&self, content: &[u8]) -> String {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = match Hmac::<Sha256>::new_from_slice(self.0.expose_secret()) {
            Ok(m) => m,
            Err(_) => return String::new(),
        };
        mac.update(content);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` value: one `v1,` signature per secret,
/// space-separated, so a receiver can rotate keys: it accepts the request
/// if any signature verifies with a key it knows.
pub fn signature_header(
    secrets: &[SigningSecret],
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
    let sigs: Vec<String> = secrets.iter().map(|s| s.sign(&content)).collect();
    sigs.join(" ")
}

/// Parses `--signing-secret` values; an error says which one, never its
/// value.
pub fn parse_secrets(raw: &[String]) -> Result<Vec<SigningSecret>, BadSecret> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse().map_err(|error| BadSecret {
                n: i + 1,
                of: raw.len(),
                error,
            })
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
#[error("--signing-secret (secret {n} of {of}): {error}")]
pub struct BadSecret {
    n: usize,
    of: usize,
    error: SecretError,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks spec's published example (also in its
    /// reference libraries' tests).
    #[test]
    fn matches_the_spec_test_vector() {
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = signature_header(&[secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
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
        let both = signature_header(&[a.clone(), b], "id", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature_header(&[a], "id", 1, b"{}"));
        assert_ne!(parts[0], parts[1]);
    }
}
