//! The TLS probe's servers: a throwaway certificate chain for the run (a root CA, an
//! intermediate, the cloud's leaf for [`SERVER_NAME`]; a second, unrelated CA; a leaf for
//! another name) and one TLS 1.3 server (rustls, ring) per probe case, plus a plain-HTTP server
//! for the probe's plain twin. [`check_tls`] and [`check_plain`] check what they saw.
//!
//! The private keys live in this process's memory only and die with it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::request::{Expect, Served, read_request};
use crate::server::{HANDLER_LIFETIME, Server, linger_until_closed};

/// The cloud's name in the test chain: a reserved test domain. Must match `SERVER_NAME` in
/// the `tls-probe` firmware.
pub const SERVER_NAME: &str = "cloud.wary.test";
/// A name the pinned CA also vouches for, but not the one the device asks for.
pub const OTHER_NAME: &str = "other.wary.test";
/// Records of the small-record server, header and tag included: the probe's small read
/// buffer (`SMALL_READ`, 1280 bytes) holds one.
pub const SMALL_RECORDS: usize = 1024;
/// The big server's reply body, sent in one record: larger than the small read buffer.
pub const BIG_BODY: usize = 4000;
/// What one server must have seen by the end of the run: connections, completed handshakes,
/// requests. Must agree with `CASES` in the `tls-probe` firmware, and its two cases through the uplink's
/// own `TlsTransport` (one more on `good` and on `rogue`).
pub const EXPECTED: &[(&str, Seen)] = &[
    ("good", Seen { connections: 2, handshakes: 2, requests: 2 }),
    // Refused by the device after the server's certificate: no handshake completes, nothing is sent.
    ("rogue", Seen { connections: 2, handshakes: 0, requests: 0 }),
    ("wrongname", Seen { connections: 1, handshakes: 0, requests: 0 }),
    ("small", Seen { connections: 1, handshakes: 1, requests: 1 }),
    // The small-buffer case's request lands before its reply record overflows the buffer.
    ("big", Seen { connections: 2, handshakes: 2, requests: 2 }),
];

/// Counts one server keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Connections accepted.
    pub connections: usize,
    /// Handshakes completed.
    pub handshakes: usize,
    /// Requests read.
    pub requests: usize,
}

/// The run's certificates and keys.
pub struct TestChain {
    /// The pinned root CA: the firmware embeds its certificate.
    pub root: CertifiedIssuer<'static, KeyPair>,
    /// Issues the good and wrong-name leaves; the servers send it after their leaf.
    pub intermediate: CertifiedIssuer<'static, KeyPair>,
    /// A CA with the root's name and shape but another key: no path to the pinned root.
    pub rogue: CertifiedIssuer<'static, KeyPair>,
}

impl TestChain {
    /// A fresh chain; its keys live in this process only.
    pub fn new() -> Result<Self> {
        let root = CertifiedIssuer::self_signed(ca_params("wary test root CA")?, KeyPair::generate()?)?;
        let intermediate =
            CertifiedIssuer::signed_by(ca_params("wary test intermediate CA")?, KeyPair::generate()?, &root)?;
        // Same shape, same names, but no path to the pinned root.
        let rogue = CertifiedIssuer::self_signed(ca_params("wary test root CA")?, KeyPair::generate()?)?;
        Ok(Self { root, intermediate, rogue })
    }

    /// A leaf for `name` issued by `issuer`, with the chain a server sends (leaf first) and
    /// its key.
    pub fn leaf(
        name: &str,
        issuer: &CertifiedIssuer<'static, KeyPair>,
        above: Option<&CertifiedIssuer<'static, KeyPair>>,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let (cert, key) = Self::leaf_cert(name, issuer)?;
        let mut chain = vec![cert.der().clone()];
        chain.extend(above.map(|ca| ca.der().clone()));
        Ok((chain, PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))))
    }

    /// A leaf for `name` issued by the intermediate, as a server that reads its files wants it
    /// (the gateway's `--tls-cert` and `--tls-key`): the chain it sends as PEM (leaf, then the
    /// intermediate) and its private key as PEM (PKCS#8). A device pinning [`TestChain::root`]
    /// accepts it for `name`.
    pub fn leaf_pem(&self, name: &str) -> Result<(String, String)> {
        let (cert, key) = Self::leaf_cert(name, &self.intermediate)?;
        Ok((format!("{}{}", cert.pem(), self.intermediate.pem()), key.serialize_pem()))
    }

    /// A leaf for `name` issued by the rogue CA, as PEM (certificate, key): the same name and
    /// shape as [`TestChain::leaf_pem`]'s, but no path to the pinned root.
    pub fn rogue_leaf_pem(&self, name: &str) -> Result<(String, String)> {
        let (cert, key) = Self::leaf_cert(name, &self.rogue)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn leaf_cert(name: &str, issuer: &CertifiedIssuer<'static, KeyPair>) -> Result<(Certificate, KeyPair)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, issuer)?;
        Ok((cert, key))
    }

    /// The cloud's TLS 1.3 configuration: its leaf for [`SERVER_NAME`], sent with the
    /// intermediate, which a device pinning [`TestChain::root`] accepts.
    pub fn cloud_config(&self) -> Result<ServerConfig> {
        tls13(&Self::leaf(SERVER_NAME, &self.intermediate, Some(&self.intermediate))?)
    }

    /// One server configuration per case: name (the probe's command-line key), TLS config,
    /// reply body size.
    pub fn server_configs(&self) -> Result<Vec<(&'static str, ServerConfig, usize)>> {
        let good = Self::leaf(SERVER_NAME, &self.intermediate, Some(&self.intermediate))?;
        let rogue = Self::leaf(SERVER_NAME, &self.rogue, None)?;
        let wrong_name = Self::leaf(OTHER_NAME, &self.intermediate, Some(&self.intermediate))?;
        let mut small = tls13(&good)?;
        small.max_fragment_size = Some(SMALL_RECORDS);
        Ok(vec![
            ("good", tls13(&good)?, 0),
            ("rogue", tls13(&rogue)?, 0),
            ("wrongname", tls13(&wrong_name)?, 0),
            ("small", small, 0),
            ("big", tls13(&good)?, BIG_BODY),
        ])
    }
}

/// A throwaway CA certificate (DER), for a build that pins a CA but never connects: its key is
/// dropped at once.
pub fn throwaway_ca_der() -> Result<Vec<u8>> {
    let ca = CertifiedIssuer::self_signed(ca_params("wary build-check CA")?, KeyPair::generate()?)?;
    Ok(ca.der().to_vec())
}

fn ca_params(name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

/// A TLS 1.3-only server configuration (ring's primitives) for `chain` and its key.
fn tls13((chain, key): &(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)) -> Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key.clone_key())?)
}

/// What a server saw on one connection.
#[derive(Debug, Default)]
pub struct Conn {
    /// The negotiated version and cipher suite, or why the handshake failed.
    pub handshake: Option<Result<String, String>>,
    /// The request read, if one was.
    pub request: Option<Served>,
}

/// Starts a server on 127.0.0.1: TLS with `config`, or plain HTTP without; each answers one
/// request with 201 and `body` bytes of JSON (a small object when 0).
pub fn start(config: Option<Arc<ServerConfig>>, body: usize) -> Result<Server<Conn>> {
    Ok(Server::start(move |stream, done: &AtomicBool| serve(stream, config.clone(), body, done))?)
}

fn serve(stream: TcpStream, config: Option<Arc<ServerConfig>>, body: usize, done: &AtomicBool) -> Conn {
    let mut conn = Conn::default();
    let Some(config) = config else {
        let mut stream = stream;
        conn.request = answer(&mut stream, body, done);
        return conn;
    };
    let server = match ServerConnection::new(config) {
        Ok(server) => server,
        Err(err) => {
            conn.handshake = Some(Err(format!("server setup: {err}")));
            return conn;
        }
    };
    let mut tls = StreamOwned::new(server, stream);
    while tls.conn.is_handshaking() {
        if let Err(err) = tls.conn.complete_io(&mut tls.sock) {
            conn.handshake = Some(Err(err.to_string()));
            return conn;
        }
    }
    let version = tls.conn.protocol_version().map_or("?".into(), |v| format!("{v:?}"));
    let suite = tls.conn.negotiated_cipher_suite().map_or("?".into(), |s| format!("{:?}", s.suite()));
    conn.handshake = Some(Ok(format!("{version} {suite}")));
    conn.request = answer(&mut tls, body, done);
    tls.conn.send_close_notify();
    let _ = tls.flush();
    conn
}

/// Reads one request, checks it, answers 201 (with `body` bytes of JSON when non-zero), and
/// waits for the device to close.
fn answer<S: Read + Write>(stream: &mut S, body: usize, done: &AtomicBool) -> Option<Served> {
    let request = match read_request(stream) {
        Ok(request) => request,
        Err(_) => return None,
    };
    let expect = Expect { path: Some("/readings"), host: SERVER_NAME };
    let served =
        Served { path: request.path.clone(), key: request.key(), problems: request.problems(expect, true) };
    let json = if body == 0 {
        r#"{"id":1}"#.to_owned()
    } else {
        let pad = body.saturating_sub(r#"{"id":1,"pad":""}"#.len());
        format!(r#"{{"id":1,"pad":"{}"}}"#, "a".repeat(pad))
    };
    let reply = format!(
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    );
    // One write: over TLS the whole reply goes out in one record (up to 16 KiB).
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.flush();
    linger_until_closed(stream, done);
    Some(served)
}

/// The plain server saw one well-formed request.
pub fn check_plain(conns: &[Conn]) -> Result<()> {
    let requests: Vec<&Served> = conns.iter().filter_map(|c| c.request.as_ref()).collect();
    if requests.len() != 1 {
        bail!("plain server: {} requests, expected 1", requests.len());
    }
    if let Some(served) = requests.first()
        && !served.problems.is_empty()
    {
        bail!("plain server: {}", served.problems.join("; "));
    }
    Ok(())
}

/// Every TLS server saw what its case implies, every handshake that completed was TLS 1.3
/// with AES-128-GCM, every request well-formed, every key distinct.
pub fn check_tls(seen: &[(&str, Vec<Conn>)]) -> Result<String> {
    let mut errors = vec![];
    let mut keys = vec![];
    for (name, expected) in EXPECTED {
        let Some((_, conns)) = seen.iter().find(|(n, _)| n == name) else {
            errors.push(format!("{name}: no such server"));
            continue;
        };
        let got = Seen {
            connections: conns.len(),
            handshakes: conns.iter().filter(|c| matches!(c.handshake, Some(Ok(_)))).count(),
            requests: conns.iter().filter(|c| c.request.is_some()).count(),
        };
        if got != *expected {
            errors.push(format!("{name}: saw {got:?}, expected {expected:?}"));
        }
        for conn in conns {
            if let Some(Ok(negotiated)) = &conn.handshake
                && negotiated != "TLSv1_3 TLS13_AES_128_GCM_SHA256"
            {
                errors.push(format!("{name}: negotiated {negotiated}"));
            }
            if let Some(served) = &conn.request {
                errors.extend(served.problems.iter().map(|p| format!("{name}: {p}")));
                keys.push(served.key.clone());
            }
        }
    }
    let total = keys.len();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() != total {
        errors.push("two requests carried the same Idempotency-Key".into());
    }
    if !errors.is_empty() {
        bail!("TLS servers: {}", errors.join("; "));
    }
    let refused: Vec<String> = seen
        .iter()
        .flat_map(|(name, conns)| {
            conns.iter().filter_map(move |c| match &c.handshake {
                Some(Err(err)) => Some(format!("{name}: {err}")),
                _ => None,
            })
        })
        .collect();
    Ok(format!(
        "{total} requests over TLS 1.3 (TLS13_AES_128_GCM_SHA256), each well-formed, keys distinct; \
         handshakes the device broke off: [{}]",
        refused.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier;

    use super::*;

    fn conn(handshake: Option<Result<&str, &str>>, key: Option<&str>) -> Conn {
        Conn {
            handshake: handshake.map(|h| h.map(str::to_owned).map_err(str::to_owned)),
            request: key.map(|k| Served { path: "/readings".into(), key: k.into(), problems: vec![] }),
        }
    }

    const OK: Option<Result<&str, &str>> = Some(Ok("TLSv1_3 TLS13_AES_128_GCM_SHA256"));
    const BROKEN: Option<Result<&str, &str>> = Some(Err("unexpected end of file"));

    fn a_clean_run() -> Vec<(&'static str, Vec<Conn>)> {
        vec![
            // The probe's own case, then the uplink's TlsTransport on the same server.
            (
                "good",
                vec![
                    conn(OK, Some("0a386001000000000000000000000000")),
                    conn(OK, Some("0a386001000000000000000000000006")),
                ],
            ),
            ("rogue", vec![conn(BROKEN, None), conn(BROKEN, None)]),
            ("wrongname", vec![conn(BROKEN, None)]),
            ("small", vec![conn(OK, Some("0a386001000000000000000000000003"))]),
            (
                "big",
                vec![
                    conn(OK, Some("0a386001000000000000000000000004")),
                    conn(OK, Some("0a386001000000000000000000000005")),
                ],
            ),
        ]
    }

    #[test]
    fn a_clean_run_passes() {
        assert!(check_tls(&a_clean_run()).is_ok());
    }

    #[test]
    fn a_rogue_server_that_got_a_request_fails() {
        let mut run = a_clean_run();
        run[1].1 = vec![conn(OK, Some("0a3860010000000000000000000000ff"))];
        let err = check_tls(&run).unwrap_err().to_string();
        assert!(err.contains("rogue"), "{err}");
    }

    #[test]
    fn another_version_a_repeated_key_or_a_bad_request_fails() {
        let mut run = a_clean_run();
        run[0].1[0].handshake = Some(Ok("TLSv1_2 TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()));
        assert!(check_tls(&run).is_err());
        let mut run = a_clean_run();
        run[3].1[0].request = Some(Served {
            path: "/readings".into(),
            key: "0a386001000000000000000000000000".into(),
            problems: vec![],
        });
        assert!(check_tls(&run).is_err());
        let mut run = a_clean_run();
        run[4].1[0].request.as_mut().unwrap().problems.push("host: None".into());
        assert!(check_tls(&run).is_err());
    }

    /// A leaf of the run's chain verifies up to its root with a real verifier, and the rogue
    /// and wrong-name leaves do not: what the firmware must also conclude.
    #[test]
    fn the_test_chain_has_the_shape_the_cases_need() {
        let chain = TestChain::new().unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(chain.root.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let verify = |(certs, _): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)| {
            verifier.verify_server_cert(&certs[0], &certs[1..], &name, &[], now).is_ok()
        };
        assert!(verify(
            TestChain::leaf(SERVER_NAME, &chain.intermediate, Some(&chain.intermediate)).unwrap()
        ));
        assert!(!verify(TestChain::leaf(SERVER_NAME, &chain.rogue, None).unwrap()));
        assert!(!verify(
            TestChain::leaf(OTHER_NAME, &chain.intermediate, Some(&chain.intermediate)).unwrap()
        ));
    }

    /// The PEM files a server reads hold a chain (leaf, intermediate) that verifies up to the
    /// root for its name, and a key that matches the leaf.
    #[test]
    fn the_pem_files_hold_a_chain_to_the_root_and_its_key() {
        use rustls::pki_types::pem::PemObject;
        let chain = TestChain::new().unwrap();
        let (certs, key) = chain.leaf_pem(SERVER_NAME).unwrap();
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(certs.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(&certs[1], chain.intermediate.der());
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        // rustls refuses a key that does not belong to the leaf.
        tls13(&(certs.clone(), key)).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(chain.root.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let named = |n: &'static str| rustls::pki_types::ServerName::try_from(n).unwrap();
        assert!(verifier.verify_server_cert(&certs[0], &certs[1..], &named(SERVER_NAME), &[], now).is_ok());
        assert!(verifier.verify_server_cert(&certs[0], &certs[1..], &named(OTHER_NAME), &[], now).is_err());
    }
}

/// What the TLS terminator saw on one device connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// The handshake completed.
    pub handshake: bool,
    /// Bytes from the device to the upstream.
    pub up: usize,
    /// Bytes from the upstream to the device.
    pub down: usize,
    /// The upstream closed first: the device got the session's `close_notify` and a FIN.
    pub closed_by_upstream: bool,
    /// The upstream reset or refused: the device's connection was dropped with no
    /// `close_notify`.
    pub upstream_failed: bool,
}

/// How long each side is waited on before the relay looks at the other.
const RELAY_POLL: Duration = Duration::from_millis(2);

/// Starts a TLS 1.3 terminator on 127.0.0.1: each device connection gets a handshake with
/// `config`, then one plain TCP connection to 127.0.0.1:`upstream`, and bytes are relayed both
/// ways. The upstream's close becomes the session's close (a `close_notify`, then a FIN), its
/// reset or refusal a dropped connection; the device's close closes the upstream. So a plain
/// server's connection faults (the test cloud's idle closes, racing the next request) reach
/// the device over TLS.
pub fn terminate(config: Arc<ServerConfig>, upstream: u16) -> Result<Server<Relayed>> {
    Ok(Server::start(move |stream, done: &AtomicBool| relay(stream, config.clone(), upstream, done))?)
}

fn relay(stream: TcpStream, config: Arc<ServerConfig>, upstream: u16, done: &AtomicBool) -> Relayed {
    let mut seen = Relayed::default();
    let Ok(server) = ServerConnection::new(config) else { return seen };
    let mut tls = StreamOwned::new(server, stream);
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            return seen;
        }
    }
    seen.handshake = true;
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else {
        seen.upstream_failed = true;
        return seen;
    };
    if tls.sock.set_read_timeout(Some(RELAY_POLL)).is_err() || up.set_read_timeout(Some(RELAY_POLL)).is_err()
    {
        return seen;
    }
    let _ = up.set_nodelay(true);
    let _ = tls.sock.set_nodelay(true);
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let idle = |err: &std::io::Error| matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    while !done.load(Ordering::SeqCst) && started.elapsed() < HANDLER_LIFETIME {
        match tls.read(&mut buf) {
            // The device closed (close_notify or FIN): so does the upstream connection.
            Ok(0) => break,
            Ok(n) => {
                seen.up += n;
                if up.write_all(buf.get(..n).unwrap_or_default()).is_err() {
                    seen.upstream_failed = true;
                    return seen;
                }
            }
            Err(err) if idle(&err) => {}
            Err(_) => break,
        }
        match up.read(&mut buf) {
            Ok(0) => {
                seen.closed_by_upstream = true;
                tls.conn.send_close_notify();
                let _ = tls.flush();
                break;
            }
            Ok(n) => {
                seen.down += n;
                if tls.write_all(buf.get(..n).unwrap_or_default()).and_then(|()| tls.flush()).is_err() {
                    break;
                }
            }
            Err(err) if idle(&err) => {}
            // Reset by the upstream: the device's connection is dropped without a close_notify.
            Err(_) => {
                seen.upstream_failed = true;
                return seen;
            }
        }
    }
    seen
}
