//! TLS on the device side (rustls): a certificate chain and a private key from PEM files,
//! swapped for new ones on reload without touching open connections.
//!
//! Mutual TLS, optional: with a client CA, a device may present a certificate that CA issued,
//! naming the device in a URI subject alternative name `urn:wary:device:<16 hex digits>`. That
//! certificate proves the device as a bearer token does ([`device_of_certificate`]); devices
//! without one still present their token.
//!
//! Each new connection takes the configuration current when it is accepted; connections
//! already open keep theirs. A reload that fails (a missing file, a key that does not match)
//! keeps the old configuration and says why; a file's content never reaches the message.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Why a certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate file has no PEM certificate that could be read.
    #[error("{0}: no readable PEM certificate")]
    Certificate(PathBuf),
    /// The key file has no PEM private key that could be read.
    #[error("{0}: no readable PEM private key")]
    Key(PathBuf),
    /// The client CA file has no PEM certificate rustls accepts as a root.
    #[error("{0}: no readable PEM client CA certificate")]
    ClientCa(PathBuf),
    /// The CA file for a server the gateway connects to has no PEM certificate rustls accepts
    /// as a root.
    #[error("{0}: no readable PEM CA certificate")]
    Ca(PathBuf),
    /// rustls refused the pair (a key that does not match, an unsupported algorithm).
    #[error("certificate and key refused: {0}")]
    Refused(rustls::Error),
}

/// The URI prefix naming a device in a client certificate.
pub const DEVICE_URI: &str = "urn:wary:device:";

/// The device a (verified) client certificate names: its URI subject alternative name
/// `urn:wary:device:<16 hex digits>`, if it has exactly one such name.
pub fn device_of_certificate(der: &CertificateDer<'_>) -> Option<u64> {
    let cert = webpki::EndEntityCert::try_from(der).ok()?;
    let mut ids = cert.valid_uri_names().filter_map(|u| u.strip_prefix(DEVICE_URI)).map(|hex| {
        (hex.len() == crate::credentials::DEVICE_HEX)
            .then(|| crate::credentials::device_of_key(hex.as_bytes()))
            .flatten()
    });
    let first = ids.next()??;
    ids.next().is_none().then_some(first)
}

/// The server configuration for `cert` (PEM chain, leaf first) and `key` (PEM private key),
/// without client certificates.
pub fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    server_config_with(cert, key, None)
}

/// The server configuration for `cert` and `key`; with `client_ca`, client certificates it
/// issued are asked for and verified (a client without one is still let in: its bearer token
/// decides).
pub fn server_config_with(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|_| TlsError::Certificate(cert.to_owned()))?
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Certificate(cert.to_owned()))?;
    if chain.is_empty() {
        return Err(TlsError::Certificate(cert.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|_| TlsError::Key(key.to_owned()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Refused)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let bad = || TlsError::ClientCa(ca.to_owned());
            let roots = roots(ca).ok_or_else(bad)?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|_| bad())?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(TlsError::Refused)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The client configuration for a server the gateway connects to (the MQTT broker): TLS 1.2 or
/// 1.3, the server's chain checked against the CA certificates in `ca` (PEM) and its name
/// against the one the gateway dials. No client certificate.
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    let roots = roots(ca).ok_or_else(|| TlsError::Ca(ca.to_owned()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Refused)?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The CA certificates in the PEM file at `path`, if it holds at least one and rustls takes
/// every one as a root.
fn roots(path: &Path) -> Option<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).ok()? {
        roots.add(c.ok()?).ok()?;
    }
    (!roots.is_empty()).then_some(roots)
}

/// The current TLS configuration, and where it is reloaded from.
#[derive(Debug)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Loads `cert` and `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        Self::load_with(cert, key, None)
    }

    /// Loads `cert` and `key`, and with `client_ca` asks devices for certificates it issued.
    pub fn load_with(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Tls, TlsError> {
        let config = server_config_with(cert, key, client_ca)?;
        Ok(Tls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: client_ca.map(Path::to_owned),
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again; on an error the configuration in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(server_config_with(&self.cert, &self.key, self.client_ca.as_deref())?);
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = config;
        Ok(())
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn pair(dir: &Path, tag: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&key).unwrap();
        let (c, k) = (dir.join(format!("{tag}.crt")), dir.join(format!("{tag}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn bad_files_are_refused_and_a_failed_reload_keeps_the_old_configuration() {
        let dir = std::env::temp_dir().join(format!("wary-gw-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = pair(&dir, "a");
        let (_, other_key) = pair(&dir, "b");
        let missing = dir.join("missing.pem");
        assert!(matches!(server_config(&missing, &key), Err(TlsError::Certificate(_))));
        assert!(matches!(server_config(&cert, &cert), Err(TlsError::Key(_))));
        // A key that is not the certificate's.
        assert!(matches!(server_config(&cert, &other_key), Err(TlsError::Refused(_))));
        let tls = Tls::load(&cert, &key).unwrap();
        let before = Arc::as_ptr(&tls.current.read().unwrap());
        std::fs::write(&cert, "garbage").unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(Arc::as_ptr(&tls.current.read().unwrap()), before, "the old configuration stays");
        let (c2, k2) = pair(&dir, "c");
        std::fs::rename(c2, &cert).unwrap();
        std::fs::rename(k2, &key).unwrap();
        tls.reload().unwrap();
        assert_ne!(Arc::as_ptr(&tls.current.read().unwrap()), before);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
