//! An https front for the recording receiver: terminates TLS on
//! 127.0.0.1:0 with the test node's server certificate and forwards the
//! bytes to a plain receiver (the TLS and mTLS tests).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;

/// The server certificate chain and key that `tests/broker/ctl` made in `tls`.
pub fn server_cert(tls: &Path) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let certs = CertificateDer::pem_file_iter(tls.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(tls.join("server.key")).unwrap();
    (certs, key)
}

/// Serves `config` on 127.0.0.1:0, forwarding each connection that passes
/// the handshake to `plain` (`http://host:port`); returns the https base.
pub async fn https_front(config: ServerConfig, plain: &str) -> String {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plain = plain.trim_start_matches("http://").to_string();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, plain) = (acceptor.clone(), plain.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    super::gate::forward(tls, plain).await;
                }
            });
        }
    });
    format!("https://127.0.0.1:{}", addr.port())
}
