//! Signing secrets as settings: parsed from `whsec_…` text, held in
//! `secrecy` so no `Debug` or log line shows them. Signing with them is
//! `crate::deliver::signing`'s.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use secrecy::{ExposeSecret, SecretSlice};

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
    /// The key's bytes, for the HMAC; never for output.
    pub(crate) fn key(&self) -> &[u8] {
        self.0.expose_secret()
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
