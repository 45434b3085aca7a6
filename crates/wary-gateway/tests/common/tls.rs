//! Test certificates made at test time, and an HTTP/1.1 client over TLS that pins one CA.

// Each test file uses its own part of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, ServerName};

/// A CA and a leaf for `localhost` it signed, as PEM files in `dir`; the CA's DER.
pub fn issue(
    dir: &std::path::Path,
    tag: &str,
) -> (CertificateDer<'static>, std::path::PathBuf, std::path::PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
    let (cert_path, key_path) = (dir.join(format!("{tag}.crt")), dir.join(format!("{tag}.key")));
    std::fs::write(&cert_path, leaf.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (ca.der().clone(), cert_path, key_path)
}

/// A client certificate naming `device` (`urn:wary:device:<16 hex>`), issued by a new CA: the
/// CA's PEM file in `dir`, and the certificate chain and key for the client.
pub fn device_certificate(
    dir: &std::path::Path,
    tag: &str,
    device: u64,
) -> (std::path::PathBuf, (Vec<CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>)) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let ca_file = dir.join(format!("{tag}-ca.crt"));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    (ca_file, device_certificate_from(&ca, device))
}

/// A client certificate naming `device`, issued by `ca`.
pub fn device_certificate_from(
    ca: &CertifiedIssuer<'static, KeyPair>,
    device: u64,
) -> (Vec<CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    let uri = format!("urn:wary:device:{device:016x}");
    params.subject_alt_names = vec![SanType::URI(uri.as_str().try_into().unwrap())];
    let cert = params.signed_by(&key, ca).unwrap();
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    (vec![cert.der().clone()], der.into())
}

/// An HTTP/1.1 connection over TLS to `addr`, trusting only `ca`.
pub async fn connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    connect_as(addr, ca, None).await
}

/// [`connect`], presenting a client certificate if given.
pub async fn connect_as(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    client: Option<(Vec<CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>)>,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((chain, key)) => config.with_client_auth_cert(chain, key).unwrap(),
        None => config.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Sends one request on an open connection: its status and body. A request without `Host` gets
/// one from its URI, as every HTTP/1.1 client sends it (hyper's connection-level sender adds
/// none, and the gateway refuses a request without it).
pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    mut req: Request<Full<Bytes>>,
) -> (StatusCode, Bytes) {
    if let Some(authority) = req.uri().authority().map(|a| a.as_str().to_owned()) {
        let host = http::HeaderValue::from_str(&authority).unwrap();
        req.headers_mut().entry(http::header::HOST).or_insert(host);
    }
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// A fresh directory for this test process.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wary-gw-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
