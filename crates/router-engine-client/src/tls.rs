//! TLS to engines (`https://` worker URLs): rustls with the ring provider, trusting the
//! system's roots plus the PEM bundle of `server.engine_ca_file` (a private CA, or an engine's
//! self-signed certificate). Certificates are always verified; there is no switch to turn that
//! off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tracing::{debug, warn};

/// Why the engine TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The CA file cannot be read or holds a malformed PEM section.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// `server.engine_ca_file`.
        path: PathBuf,
        /// The PEM error.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The crypto provider refused the protocol versions (a build problem, not a setting).
    #[error("TLS provider: {0}")]
    Provider(#[source] rustls::Error),
    /// The CA file holds no usable certificate.
    #[error("{} holds no usable CA certificate", path.display())]
    NoCertificate {
        /// `server.engine_ca_file`.
        path: PathBuf,
    },
}

/// The client configuration for engines: system roots and `ca_file`'s certificates.
pub fn engine_client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        debug!(%error, "a system CA certificate could not be loaded");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    debug!(added, ignored, "system CA certificates");
    if let Some(path) = ca_file {
        let certificates = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|source| TlsConfigError::Read { path: path.to_owned(), source })?;
        let (added, _) = roots.add_parsable_certificates(certificates);
        if added == 0 {
            return Err(TlsConfigError::NoCertificate { path: path.to_owned() });
        }
    }
    if roots.is_empty() {
        warn!("no CA certificates: https engines cannot be verified (set server.engine_ca_file)");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Provider)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;
