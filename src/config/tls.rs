//! A route's TLS material: a client certificate and key for receivers that
//! require mTLS, and extra CA roots for receivers with a private CA. Read
//! and checked at start (`run`, `config check`), so a missing file, an
//! unreadable one or a key that does not match its certificate stops the
//! start with a clear error, not every delivery later.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use secrecy::{ExposeSecret, SecretSlice};

/// The files as configured (relative paths are resolved against the
/// config file's folder) and, once [`RouteTls::load`]ed, their contents.
#[derive(Clone, Debug, Default)]
pub struct RouteTls {
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub ca_roots: Option<PathBuf>,
    /// The certificate chain and the key, as one PEM (what the HTTP client
    /// takes). Secret: never in a log or `Debug`.
    identity: Option<SecretSlice<u8>>,
    ca_pem: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("client-cert and client-key go together: give both")]
    Half,
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM {expected}")]
    NoPem {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("client-key {key} does not match client-cert {cert}: {why}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        why: rustls::Error,
    },
}

impl RouteTls {
    pub fn is_empty(&self) -> bool {
        self.client_cert.is_none() && self.client_key.is_none() && self.ca_roots.is_none()
    }

    /// Reads and checks the files; relative paths are taken from `base`.
    pub fn load(&mut self, base: &Path) -> Result<(), TlsFileError> {
        let at = |p: &Option<PathBuf>| p.as_ref().map(|p| base.join(p));
        let (cert, key, ca) = (
            at(&self.client_cert),
            at(&self.client_key),
            at(&self.ca_roots),
        );
        match (cert, key) {
            (Some(cert), Some(key)) => {
                self.identity = Some(identity(&cert, &key)?.into());
                (self.client_cert, self.client_key) = (Some(cert), Some(key));
            }
            (None, None) => {}
            _ => return Err(TlsFileError::Half),
        }
        if let Some(ca) = ca {
            let pem = read("ca-roots", &ca)?;
            certs("ca-roots", &ca, &pem)?;
            self.ca_pem = Some(pem);
            self.ca_roots = Some(ca);
        }
        Ok(())
    }

    /// The certificate chain and key as one PEM, once loaded.
    pub fn identity_pem(&self) -> Option<&[u8]> {
        self.identity.as_ref().map(|s| s.expose_secret())
    }

    /// The extra CA roots (one or more PEM certificates), once loaded.
    pub fn ca_pem(&self) -> Option<&[u8]> {
        self.ca_pem.as_deref()
    }
}

/// The chain and the key in one PEM, after checking that the key is the
/// certificate's (the SubjectPublicKeyInfo of both agree).
fn identity(cert: &Path, key: &Path) -> Result<Vec<u8>, TlsFileError> {
    let cert_pem = read("client-cert", cert)?;
    let chain = certs("client-cert", cert, &cert_pem)?;
    let key_pem = read("client-key", key)?;
    let no_key = || TlsFileError::NoPem {
        what: "client-key",
        path: key.to_owned(),
        expected: "private key",
    };
    let der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| no_key())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mismatch = |why| TlsFileError::Mismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        why,
    };
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(mismatch)?;
    match CertifiedKey::new(chain, signing).keys_match() {
        // A key type whose public half cannot be derived: TLS will tell.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => return Err(mismatch(e)),
    }
    let mut pem = cert_pem;
    pem.push(b'\n');
    pem.extend_from_slice(&key_pem);
    Ok(pem)
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The certificates in `pem`; at least one.
fn certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsFileError::NoPem {
            what,
            path: path.to_owned(),
            expected: "certificate",
        });
    }
    Ok(certs)
}
