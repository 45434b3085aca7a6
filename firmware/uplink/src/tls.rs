//! HTTPS: the same one `POST` per attempt over TLS 1.3, with the server's certificate chain
//! checked against a CA pinned in the firmware (feature `tls`).
//!
//! embedded-tls runs the handshake over the embassy-net socket directly, so every failure keeps
//! its phase: a failure in the handshake happened before any byte of the request left the
//! device (never sent), one after the last record of the request was handed to TCP may have
//! landed. One ChaCha20 generator, seeded once with 256 bits, serves every handshake in turn.
//!
//! **What is verified** (embedded-tls's `rustpki` verifier, wrapped in [`Verifier`]): each
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

use core::net::SocketAddrV4;

use embassy_net::Stack;
use embassy_net::tcp::TcpSocket;
use embassy_time::{Duration, Instant, with_deadline};
use embedded_io_async::{ErrorType, Read, Write};
use embedded_tls::pki::CertVerifier;
use embedded_tls::{
    Aes128GcmSha256, Certificate, CertificateRef, CertificateVerifyRef, CryptoProvider, CryptoRngCore,
    MaxFragmentLength, NoClock, TlsCipherSuite, TlsConfig, TlsConnection, TlsContext, TlsError, TlsVerifier,
};
use rand_chacha::ChaCha20Rng;

use crate::http::{self, Buffers, Handed, HttpError, Post, Response, Timing};
use crate::identity::Credential;
use crate::transport::{Answer, Counts, Message, Transport, answer};

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
    /// The server's name: sent as SNI and as `Host`, and its certificate must carry it.
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
pub struct Provider<'r, 'a> {
    rng: &'r mut ChaCha20Rng,
    verifier: Verifier<'a>,
}

impl<'r, 'a> Provider<'r, 'a> {
    /// Random bytes from `rng`, server chains checked against `ca`.
    pub fn new(rng: &'r mut ChaCha20Rng, ca: &'a [u8]) -> Self {
        Provider { rng, verifier: Verifier::new(ca) }
    }

    /// Whether the handshake authenticated the server (see [`Verifier::authenticated`]).
    pub fn authenticated(&self) -> bool {
        self.verifier.authenticated()
    }
}

/// embedded-tls's chain verifier, plus the order it does not enforce itself.
///
/// embedded-tls 0.19 takes the server's encrypted handshake messages in any order and ends
/// the handshake at the server's `Finished` whether or not a `Certificate` and a
/// `CertificateVerify` came before it; and its verifier panics on a `CertificateVerify` that
/// precedes any `Certificate`. Anyone on the path can complete the key exchange, so both would
/// be theirs to use: a handshake without a certificate would pass, a reordered one would crash
/// the device. This wrapper refuses the reordering and records whether both checks passed,
/// which the exchange demands once the handshake has ended.
pub struct Verifier<'a> {
    chain: CertVerifier<'a, Suite, NoClock, CERT_CHAIN>,
    /// The last `Certificate` verified up to the pinned CA and matched the name.
    certificate: bool,
    /// A `CertificateVerify` after it was made with that certificate's key.
    signature: bool,
}

impl<'a> Verifier<'a> {
    /// Chains must lead to `ca` (DER).
    pub fn new(ca: &'a [u8]) -> Self {
        Self { chain: CertVerifier::new(Certificate::X509(ca)), certificate: false, signature: false }
    }

    /// The server proved it holds the key of a certificate the pinned CA vouches for.
    pub fn authenticated(&self) -> bool {
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

/// What a failed handshake means: the network's failure, or TLS's own refusal.
fn handshake_failure(err: TlsError) -> HttpError {
    match err {
        // The socket failed or the peer closed it without an alert.
        TlsError::Io(_) | TlsError::IoError => HttpError::HandshakeBroken,
        _ => HttpError::Tls,
    }
}

/// What a TLS exchange adds to its result for a measuring tool: the time of each phase, and
/// embedded-tls's own error where one ended the exchange (the handshake's refusal, or a
/// record after the request that could not be read), which [`HttpError`] names only by phase.
#[derive(Clone, Copy, Debug, Default, defmt::Format)]
pub struct Trace {
    /// Where the time went.
    pub timing: Timing,
    /// embedded-tls's error, if one ended the exchange.
    pub tls_error: Option<TlsError>,
}

/// Connects to `server`, runs the handshake against `pinned`, `POST`s `request` once and
/// reads the reply's status and headers, within `limit` overall. Random bytes for the
/// handshake come from `rng`.
///
/// Returns the result with its [`Trace`]; an error is an [`HttpError`] whose phase says how far
/// the exchange got (every handshake failure is before the request was sent).
#[allow(clippy::too_many_arguments)]
pub async fn post_tls<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>(
    stack: Stack<'_>,
    server: SocketAddrV4,
    request: &Post<'_>,
    limit: Duration,
    buffers: &mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    records: Records<'_>,
    pinned: &Pinned<'_>,
    rng: &mut ChaCha20Rng,
) -> (Result<Response, HttpError>, Trace) {
    let deadline = Instant::now().checked_add(limit).unwrap_or(Instant::MAX);
    let mut trace = Trace::default();
    if !stack.is_link_up() || stack.config_v4().is_none() {
        return (Err(HttpError::NoNetwork), trace);
    }
    let (socket_rx, socket_tx, head) = buffers.parts();
    let head_len = match http::encode_head(request, pinned.server_name, head).await {
        Ok(len) => len,
        Err(err) => return (Err(err), trace),
    };
    let mut socket = TcpSocket::new(stack, socket_rx, socket_tx);
    let started = Instant::now();
    if let Err(err) = http::connect(&mut socket, server, deadline).await {
        http::finish(&mut socket, false, deadline).await;
        return (Err(err), trace);
    }
    trace.timing.connect_us = started.elapsed().as_micros();
    let mut config = TlsConfig::new().with_server_name(pinned.server_name);
    if let Some(max) = records.max_fragment {
        config = config.with_max_fragment_length(max);
    }
    let mut handed = Handed(&mut socket);
    let mut tls: TlsConnection<'_, _, Suite> = TlsConnection::new(&mut handed, records.read, records.write);
    let mut provider = Provider::new(rng, pinned.ca);
    let handshake_at = Instant::now();
    let opened = with_deadline(deadline, tls.open(TlsContext::new(&config, &mut provider))).await;
    trace.timing.handshake_us = handshake_at.elapsed().as_micros();
    let result = match opened {
        Err(_) => Err(HttpError::HandshakeTimeout),
        Ok(Err(err)) => {
            trace.tls_error = Some(err);
            Err(handshake_failure(err))
        }
        // Finished without a verified certificate and signature: nobody was authenticated.
        Ok(Ok(())) if !provider.authenticated() => {
            trace.tls_error = Some(TlsError::InvalidCertificate);
            Err(HttpError::Tls)
        }
        Ok(Ok(())) => {
            let sent_at = Instant::now();
            let mut watched = Watched { conn: &mut tls, error: None };
            let reply = http::send_and_read(&mut watched, head_len, request.body, head, deadline).await;
            trace.timing.request_us = sent_at.elapsed().as_micros();
            trace.tls_error = watched.error;
            reply
        }
    };
    if result.is_ok() {
        // close_notify, so the server sees a clean end rather than a truncation.
        let _ = with_deadline(deadline, tls.close()).await;
    }
    http::finish(&mut socket, result.is_ok(), deadline).await;
    match &result {
        Ok(reply) => defmt::debug!("https: {}", reply),
        Err(err) => defmt::debug!("https: {} in phase {}", err, err.phase()),
    }
    (result, trace)
}

/// A connection that keeps the last error it returned: reqwless reduces a read error to its
/// kind, and a tool measuring TLS wants embedded-tls's own.
struct Watched<'c, C: ErrorType> {
    conn: &'c mut C,
    error: Option<C::Error>,
}

impl<C: ErrorType> ErrorType for Watched<'_, C> {
    type Error = C::Error;
}

impl<C: ErrorType> Watched<'_, C>
where
    C::Error: Copy,
{
    /// `result`, its error kept.
    fn keep<T>(&mut self, result: Result<T, C::Error>) -> Result<T, C::Error> {
        result.inspect_err(|err| self.error = Some(*err))
    }
}

impl<C: Read> Read for Watched<'_, C>
where
    C::Error: Copy,
{
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        let result = self.conn.read(buf).await;
        self.keep(result)
    }
}

impl<C: Write> Write for Watched<'_, C>
where
    C::Error: Copy,
{
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        let result = self.conn.write(buf).await;
        self.keep(result)
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        let result = self.conn.flush().await;
        self.keep(result)
    }
}

/// Keyed writes as HTTPS `POST`s to one server, authenticated by a pinned CA.
pub struct TlsTransport<'a, 's, const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> {
    stack: Stack<'s>,
    server: SocketAddrV4,
    path: &'a str,
    pinned: Pinned<'a>,
    buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    read: &'a mut [u8],
    write: &'a mut [u8],
    rng: ChaCha20Rng,
    credential: Option<&'a Credential>,
    counts: Counts,
}

impl<'a, 's, const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>
    TlsTransport<'a, 's, SOCKET_RX, SOCKET_TX, HEAD>
{
    /// Posts to `path` on `server` (authenticated as `pinned`) through `stack`, with TLS record
    /// buffers `read` ([`MAX_RECORD`] bytes take any server) and `write`, and handshake
    /// randomness from `rng` (seed it from a hardware RNG, never a constant).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        pinned: Pinned<'a>,
        buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
        read: &'a mut [u8],
        write: &'a mut [u8],
        rng: ChaCha20Rng,
    ) -> Self {
        TlsTransport {
            stack,
            server,
            path,
            pinned,
            buffers,
            read,
            write,
            rng,
            credential: None,
            counts: Counts::default(),
        }
    }

    /// Sends `credential` as `Authorization: Bearer <token>` on every attempt, inside the TLS
    /// session (without this, no `Authorization` header).
    #[must_use]
    pub fn with_credential(mut self, credential: Option<&'a Credential>) -> Self {
        self.credential = credential;
        self
    }

    /// What the transport saw so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }
}

impl<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> Transport
    for TlsTransport<'_, '_, SOCKET_RX, SOCKET_TX, HEAD>
{
    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: wary::Duration) {
        // One connection and handshake per message, as over plain HTTP.
        let deadline = Instant::now().saturating_add(limit.into());
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            let request = Post {
                path: self.path,
                idempotency_key: message.key,
                body: message.body,
                credential: self.credential,
            };
            let records = Records { read: &mut *self.read, write: &mut *self.write, max_fragment: None };
            let left = deadline.saturating_duration_since(Instant::now());
            let (result, _) = post_tls(
                self.stack,
                self.server,
                &request,
                left,
                self.buffers,
                records,
                &self.pinned,
                &mut self.rng,
            )
            .await;
            self.counts.record(&result);
            *slot = answer(result);
        }
    }
}
