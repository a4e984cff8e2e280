//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): every
//! request carries `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! so a receiver can tell a genuine delivery from a forged one and refuse a
//! replayed old one.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

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
