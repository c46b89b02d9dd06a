//! HTTPS for the engine's HTTP port (`--tls-cert`, `--tls-key`): a rustls server with the ring
//! provider, a PEM certificate chain and a PEM private key, offering `h2` and `http/1.1` by ALPN.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::ring;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The protocols offered by ALPN, preferred first.
const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why the TLS certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate file could not be read or holds a malformed PEM section.
    #[error("cannot read the certificate chain {}", path.display())]
    Certificates {
        /// The `--tls-cert` file.
        path: PathBuf,
        /// The PEM error.
        #[source]
        source: pem::Error,
    },
    /// The certificate file holds no `CERTIFICATE` section.
    #[error("no certificate in {}", path.display())]
    NoCertificate {
        /// The `--tls-cert` file.
        path: PathBuf,
    },
    /// The key file could not be read or holds no private key.
    #[error("cannot read the private key {}", path.display())]
    PrivateKey {
        /// The `--tls-key` file.
        path: PathBuf,
        /// The PEM error.
        #[source]
        source: pem::Error,
    },
    /// rustls refused the pair (for example a key that does not match the certificate).
    #[error("unusable certificate {} with key {}", cert.display(), key.display())]
    Config {
        /// The `--tls-cert` file.
        cert: PathBuf,
        /// The `--tls-key` file.
        key: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
}

/// The acceptor serving `cert` (a PEM chain, leaf first) with `key` (a PEM private key).
pub(crate) fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = read_chain(cert)?;
    let private_key = read_key(key)?;
    let config = server_config(chain, private_key).map_err(|source| TlsError::Config {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |source| TlsError::Certificates { path: path.to_owned(), source };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(failed)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|source| TlsError::PrivateKey { path: path.to_owned(), source })
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key, as PEM files in a fresh temporary directory.
    fn pem_files(name: &str) -> (PathBuf, PathBuf) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .expect("certificate generated");
        let dir =
            std::env::temp_dir().join(format!("router-sim-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, certified.cert.pem()).expect("cert written");
        std::fs::write(&key, certified.signing_key.serialize_pem()).expect("key written");
        (cert, key)
    }

    #[test]
    fn a_matching_pair_offers_h2_then_http1() {
        let (cert, key) = pem_files("pair");
        let config = server_config(read_chain(&cert).expect("chain"), read_key(&key).expect("key"))
            .expect("usable pair");
        assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(acceptor(&cert, &key).is_ok());
        let _ = std::fs::remove_dir_all(cert.parent().expect("dir"));
    }

    #[test]
    fn files_without_the_expected_sections_are_named() {
        let (cert, key) = pem_files("swapped");
        match acceptor(&key, &cert) {
            Err(TlsError::NoCertificate { path }) => assert_eq!(path, key),
            other => panic!("expected NoCertificate, got {:?}", other.err()),
        }
        match acceptor(&cert, &cert) {
            Err(TlsError::PrivateKey { path, .. }) => assert_eq!(path, cert),
            other => panic!("expected PrivateKey, got {:?}", other.err()),
        }
        let missing = cert.with_file_name("missing.pem");
        assert!(matches!(acceptor(&missing, &key), Err(TlsError::Certificates { .. })));
        let _ = std::fs::remove_dir_all(cert.parent().expect("dir"));
    }
}
