//! TLS 1.3 with the server's certificate chain checked against a pinned CA, and one `POST`
//! through it.
//!
//! embedded-tls runs the handshake over the embassy-net socket directly: reqwless's own TLS
//! wrapper would fold connect, handshake and reply failures together (the phase decides
//! whether a write may have landed) and seeds a fresh generator from the same 64-bit value on
//! every connection, so each handshake would repeat its key share. Here one ChaCha20 generator,
//! seeded once with 256 bits, serves every handshake in turn.
//!
//! **What is verified** (embedded-tls's `rustpki` verifier, wrapped in `Verifier`): each
//! certificate the server sends is signed by the one above it, up to the pinned CA; a DNS name
//! of the leaf (or its common name) matches the name the device asked for (sent as SNI); the
//! server's `CertificateVerify` is signed with the leaf's key over this handshake, after the
//! certificate and before `Finished`. **What is not**: validity dates (the device has no
//! trusted time at boot: `NoClock`), the CA flag and key usage of the certificates in between.
//! With a private CA that issues only the cloud's own certificates that is enough; a public CA
//! is not something to pin this way.
//!
//! Only `TLS_AES_128_GCM_SHA256` with a P-256 key share, and P-256 ECDSA certificates
//! (embedded-tls's `p384`, `ed25519` and `rsa` features are left off: the first two cost about
//! 130 KiB of flash, RSA needs `alloc`).
//!
//! ```ignore
//! let pinned = Pinned { ca: PINNED_CA_DER, server_name: "cloud.wary.test" };
//! let records = Records { read: &mut read_buf[..], write: &mut write_buf[..], max_fragment: None };
//! let (result, timing) = tls::post_tls(stack, server, &post, limit, buffers, records, &pinned, &mut rng).await;
//! ```

use core::net::SocketAddrV4;

use embassy_net::Stack;
use embassy_net::tcp::TcpSocket;
use embassy_time::{Duration, Instant, with_deadline};
use embedded_tls::pki::CertVerifier;
use embedded_tls::{
    Aes128GcmSha256, Certificate, CertificateRef, CertificateVerifyRef, CryptoProvider, CryptoRngCore,
    MaxFragmentLength, NoClock, TlsCipherSuite, TlsConfig, TlsConnection, TlsContext, TlsError, TlsVerifier,
};
use rand_chacha::ChaCha20Rng;

use crate::ProbeError;
use crate::exchange::{self, Post, Reply, ReplyError, SocketBuffers, Timing};

/// The largest TLS 1.3 record body a server may send (2^14 bytes of plaintext, a content-type
/// byte, up to 255 bytes of padding and tag): a read buffer this size takes any server's
/// records. The 5-byte record header is read separately.
pub const MAX_RECORD: usize = 16_384 + 256;
/// Bytes of the server's certificate list kept from the `Certificate` message until its
/// `CertificateVerify` is checked: a leaf and one intermediate of a typical cloud fit.
pub const CERT_CHAIN: usize = 4096;

/// The one cipher suite offered.
pub type Suite = Aes128GcmSha256;

/// Who the device will talk to.
#[derive(Clone, Copy, Debug)]
pub struct Pinned<'a> {
    /// The CA certificate (DER) every server chain must lead to.
    pub ca: &'a [u8],
    /// The server's name: sent as SNI, and its certificate's common name must equal it.
    pub server_name: &'a str,
}

/// The TLS record buffers of one connection.
pub struct Records<'a> {
    /// Holds one whole record from the server: [`MAX_RECORD`] bytes take any record; less
    /// works only with a server that keeps its records that small.
    pub read: &'a mut [u8],
    /// Holds one record to the server; writes larger than it go out as several records.
    pub write: &'a mut [u8],
    /// Asks the server for smaller records (the max fragment length extension); servers may
    /// ignore it.
    pub max_fragment: Option<MaxFragmentLength>,
}

/// The generator and the verifier embedded-tls asks for during one handshake.
struct Provider<'r, 'a> {
    rng: &'r mut ChaCha20Rng,
    verifier: Verifier<'a>,
}

/// embedded-tls's chain verifier, plus the order it does not enforce itself.
///
/// embedded-tls 0.19 takes the server's encrypted handshake messages in any order and ends
/// the handshake at the server's `Finished` whether or not a `Certificate` and a
/// `CertificateVerify` came before it; and its verifier panics on a `CertificateVerify` that
/// precedes any `Certificate`. Anyone on the path can complete the key exchange, so both would
/// be theirs to use: a handshake without a certificate would pass, a reordered one would crash
/// the device. This wrapper refuses the reordering and records whether both checks passed,
/// which [`post_tls`] demands once the handshake has ended.
struct Verifier<'a> {
    chain: CertVerifier<'a, Suite, NoClock, CERT_CHAIN>,
    /// The last `Certificate` verified up to the pinned CA and matched the name.
    certificate: bool,
    /// A `CertificateVerify` after it was made with that certificate's key.
    signature: bool,
}

impl<'a> Verifier<'a> {
    fn new(ca: &'a [u8]) -> Self {
        Self { chain: CertVerifier::new(Certificate::X509(ca)), certificate: false, signature: false }
    }

    /// The server proved it holds the key of a certificate the pinned CA vouches for.
    fn authenticated(&self) -> bool {
        self.certificate && self.signature
    }
}

impl TlsVerifier<Suite> for Verifier<'_> {
    fn set_hostname_verification(&mut self, hostname: &str) -> Result<(), TlsError> {
        self.chain.set_hostname_verification(hostname)
    }

    fn verify_certificate(
        &mut self,
        transcript: &<Suite as TlsCipherSuite>::Hash,
        cert: CertificateRef<'_>,
    ) -> Result<(), TlsError> {
        // A second certificate starts over: its own signature must follow.
        self.certificate = false;
        self.signature = false;
        self.chain.verify_certificate(transcript, cert)?;
        self.certificate = true;
        Ok(())
    }

    fn verify_signature(&mut self, verify: CertificateVerifyRef<'_>) -> Result<(), TlsError> {
        if !self.certificate || self.signature {
            return Err(TlsError::InvalidHandshake);
        }
        self.chain.verify_signature(verify)?;
        self.signature = true;
        Ok(())
    }
}

impl CryptoProvider for Provider<'_, '_> {
    type CipherSuite = Suite;
    // No client certificate is offered, so nothing is ever signed with this type.
    type Signature = [u8; 0];

    fn rng(&mut self) -> impl CryptoRngCore {
        &mut *self.rng
    }

    fn verifier(&mut self) -> Result<&mut impl TlsVerifier<Self::CipherSuite>, TlsError> {
        Ok(&mut self.verifier)
    }
}

impl ReplyError for TlsError {
    fn after_request(self, reply_bytes: usize) -> ProbeError {
        match self {
            TlsError::Io(_) => ProbeError::Reset,
            // The peer's close_notify, or its TCP close in the middle of a record.
            TlsError::ConnectionClosed | TlsError::IoError if reply_bytes == 0 => ProbeError::Closed,
            TlsError::ConnectionClosed | TlsError::IoError => ProbeError::Truncated,
            other => ProbeError::Record(other),
        }
    }
}

/// What a failed handshake means: the network's failure, or TLS's own.
fn handshake_failure(err: TlsError) -> ProbeError {
    match err {
        // The socket failed or the peer closed it without an alert.
        TlsError::Io(_) | TlsError::IoError => ProbeError::HandshakeBroken,
        other => ProbeError::Tls(other),
    }
}

/// Connects, runs the handshake against `pinned`, `POST`s once and reads the reply, within
/// `limit` overall. Random bytes for the handshake come from `rng`.
#[allow(clippy::too_many_arguments)]
pub async fn post_tls(
    stack: Stack<'_>,
    server: SocketAddrV4,
    post: &Post<'_>,
    limit: Duration,
    buffers: &mut SocketBuffers,
    records: Records<'_>,
    pinned: &Pinned<'_>,
    rng: &mut ChaCha20Rng,
) -> (Result<Reply, ProbeError>, Timing) {
    let deadline = Instant::now().checked_add(limit).unwrap_or(Instant::MAX);
    let mut timing = Timing::default();
    let head_len = match exchange::ready(stack, post, &mut buffers.head).await {
        Ok(len) => len,
        Err(err) => return (Err(err), timing),
    };
    let mut socket = TcpSocket::new(stack, &mut buffers.rx, &mut buffers.tx);
    let started = Instant::now();
    if let Err(err) = exchange::connect(&mut socket, server, deadline).await {
        exchange::finish(&mut socket, false, deadline).await;
        return (Err(err), timing);
    }
    timing.connect_us = started.elapsed().as_micros();

    let mut config = TlsConfig::new().with_server_name(pinned.server_name);
    if let Some(max) = records.max_fragment {
        config = config.with_max_fragment_length(max);
    }
    let mut tls: TlsConnection<'_, _, Suite> = TlsConnection::new(&mut socket, records.read, records.write);
    let mut provider = Provider { rng, verifier: Verifier::new(pinned.ca) };
    let handshake_at = Instant::now();
    let opened = with_deadline(deadline, tls.open(TlsContext::new(&config, &mut provider))).await;
    timing.handshake_us = handshake_at.elapsed().as_micros();
    let result = match opened {
        Err(_) => Err(ProbeError::HandshakeTimeout),
        Ok(Err(err)) => Err(handshake_failure(err)),
        // Finished without a verified certificate and signature: nobody was authenticated.
        Ok(Ok(())) if !provider.verifier.authenticated() => {
            Err(ProbeError::Tls(TlsError::InvalidCertificate))
        }
        Ok(Ok(())) => {
            let sent_at = Instant::now();
            let reply = exchange::request(&mut tls, head_len, post.body, &mut buffers.head, deadline).await;
            timing.request_us = sent_at.elapsed().as_micros();
            reply
        }
    };
    if result.is_ok() {
        // close_notify, so the server sees a clean end rather than a truncation.
        let _ = with_deadline(deadline, tls.close()).await;
    }
    exchange::finish(&mut socket, result.is_ok(), deadline).await;
    (result, timing)
}
