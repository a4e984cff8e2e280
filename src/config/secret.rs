//! Signing secrets as settings: parsed from `whsec_…` text, held in
//! `secrecy` so no `Debug` or log line shows them. Signing with them is
//! `crate::deliver::signing`'s.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use secrecy::{ExposeSecret, SecretSlice};
use sha2::{Digest, Sha256};

/// The spec's prefix of a secret; what follows is the key in base64.
const PREFIX: &str = "whsec_";

/// One signing key, and when it stops signing (`whsec_…@2026-12-01T00:00:00Z`:
/// the rotation's grace period ends). Its `Debug` never shows the key.
#[derive(Clone)]
pub struct SigningSecret {
    key: SecretSlice<u8>,
    expires: Option<SystemTime>,
    /// Whether its expiry was logged, shared by the clones: it is said once.
    told: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("a signing secret must start with `whsec_` (Standard Webhooks format)")]
    Prefix,
    #[error("the part after `whsec_` is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; Standard Webhooks asks for 24 to 64")]
    Length(usize),
    #[error("the expiry after `@` must be an RFC 3339 time in UTC, like 2026-12-01T00:00:00Z")]
    Expiry,
}

impl FromStr for SigningSecret {
    type Err = SecretError;

    /// The error never repeats the secret: it may end up in a log.
    fn from_str(s: &str) -> Result<Self, SecretError> {
        // Base64 has no `@`, so one marks the expiry.
        let (secret, expires) = match s.trim().split_once('@') {
            Some((secret, at)) => {
                let at = humantime::parse_rfc3339(at.trim()).map_err(|_| SecretError::Expiry)?;
                (secret, Some(at))
            }
            None => (s.trim(), None),
        };
        let b64 = secret.strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let key = BASE64.decode(b64).map_err(|_| SecretError::Base64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(SigningSecret {
            key: key.into(),
            expires,
            told: Arc::default(),
        })
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningSecret(whsec_*** {})", self.fingerprint())?;
        match self.expires {
            Some(at) => write!(f, " expires {})", humantime::format_rfc3339(at)),
            None => f.write_str(")"),
        }
    }
}

impl SigningSecret {
    /// The key's bytes, for the HMAC; never for output.
    pub(crate) fn key(&self) -> &[u8] {
        self.key.expose_secret()
    }

    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }

    /// Whether it still signs at `now`.
    pub fn in_use(&self, now: SystemTime) -> bool {
        self.expires.is_none_or(|at| now < at)
    }

    /// True the first time it is asked after the secret expired (at
    /// `now`), so the log says it once, whichever request noticed.
    pub fn newly_expired(&self, now: SystemTime) -> bool {
        !self.in_use(now) && !self.told.swap(true, Ordering::Relaxed)
    }

    /// Names the secret in logs and `config check` without revealing it:
    /// `sha256:` and the first 8 hex digits of the key's SHA-256.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.key());
        let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

/// A `config check` or start-up warning about a secret's expiry, if any:
/// expired, or expiring within 24 hours of `now`.
pub fn expiry_warning(s: &SigningSecret, now: SystemTime) -> Option<String> {
    let at = s.expires?;
    let when = humantime::format_rfc3339(at);
    let fp = s.fingerprint();
    match at.duration_since(now) {
        Err(_) => Some(format!(
            "signing secret {fp} expired at {when}: it no longer signs; remove it"
        )),
        Ok(left) if left <= Duration::from_secs(24 * 3600) => Some(format!(
            "signing secret {fp} expires at {when} (in {}): receivers must accept its successor by then",
            humantime::format_duration(Duration::from_secs(left.as_secs()))
        )),
        Ok(_) => None,
    }
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
