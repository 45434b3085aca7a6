//! HTTPS: the same one `POST` per attempt over TLS 1.3, with the server's certificate chain
//! checked against a CA pinned in the firmware (feature `tls`).
//!
//! embedded-tls runs the handshake over the embassy-net socket directly, so every failure keeps
//! its phase: a failure in the handshake happened before any byte of the request left the
//! device (never sent), one after the last record of the request was handed to TCP may have
//! landed. One ChaCha20 generator, seeded once with 256 bits, serves every handshake in turn.
//!
//! **One handshake per connection, not per reading**: [`TlsTransport`] keeps its TLS session
//! across attempts and readings under the same rules as the plain transport's kept connection:
//! it is the same transport ([`Http`]) on another [`Carrier`] ([`Secure`]).
//!
//! **No resumption across reconnects**: a new connection pays a full handshake, because
//! embedded-tls 0.19 reads a server's `NewSessionTicket` and throws it away (it keeps neither
//! the ticket nor a resumption secret), and its only PSK is an external one
//! (`TlsConfig::with_psk`, binder label `ext binder`), which a rustls server does not offer (it
//! accepts only its own tickets, bound with `res binder`). firmware/README.md gives what a
//! reconnect costs.
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

use core::marker::PhantomData;
use core::net::SocketAddrV4;
use core::ptr::NonNull;

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
#[cfg(feature = "mqtt")]
use wary::Failure;

use crate::http::{self, Buffers, Handed, HttpError, Post, Response, Timing};
#[cfg(feature = "mqtt")]
use crate::transport::failure;
use crate::transport::{Carrier, Http, quiet};

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

/// Runs the handshake on `tls` (an open TCP connection under it) against `pinned` by
/// `deadline`, asking for `max_fragment` records when given: every failure is before the
/// request was sent. Returns embedded-tls's own error beside ours when one ended it.
async fn handshake<S: Read + Write>(
    tls: &mut TlsConnection<'_, S, Suite>,
    pinned: &Pinned<'_>,
    max_fragment: Option<MaxFragmentLength>,
    rng: &mut ChaCha20Rng,
    deadline: Instant,
) -> (Result<(), HttpError>, Option<TlsError>) {
    let mut config = TlsConfig::new().with_server_name(pinned.server_name);
    if let Some(max) = max_fragment {
        config = config.with_max_fragment_length(max);
    }
    let mut provider = Provider::new(rng, pinned.ca);
    match with_deadline(deadline, tls.open(TlsContext::new(&config, &mut provider))).await {
        Err(_) => (Err(HttpError::HandshakeTimeout), None),
        Ok(Err(err)) => (Err(handshake_failure(err)), Some(err)),
        // Finished without a verified certificate and signature: nobody was authenticated.
        Ok(Ok(())) if !provider.authenticated() => (Err(HttpError::Tls), Some(TlsError::InvalidCertificate)),
        Ok(Ok(())) => (Ok(()), None),
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
    let mut handed = Handed(&mut socket);
    let mut tls: TlsConnection<'_, _, Suite> = TlsConnection::new(&mut handed, records.read, records.write);
    let handshake_at = Instant::now();
    let (opened, tls_error) = handshake(&mut tls, pinned, records.max_fragment, rng, deadline).await;
    trace.timing.handshake_us = handshake_at.elapsed().as_micros();
    trace.tls_error = tls_error;
    let result = match opened {
        Err(err) => Err(err),
        Ok(()) => {
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

/// The TCP connection under a kept TLS session: the transport's socket, which embedded-tls
/// reads and writes through this while the transport checks and closes it between exchanges.
/// `flush` returns at once, as [`Handed`]'s does: bytes count as sent once TCP holds them.
///
/// It holds a pointer rather than a `&mut` because the socket has two users: the session
/// ([`TlsConnection`] owns its delegate and lends it to nobody) and the transport (which must
/// see the server's FIN, RST or unread bytes before writing on a kept connection, and send its
/// own FIN or RST). Both go through `Link`, which hands out the socket only through
/// `&mut Link`: while a TLS future runs it borrows `Link::tls`, so the transport cannot reach
/// the socket at the same time.
pub struct Tcp<'a, 's> {
    socket: NonNull<TcpSocket<'s>>,
    _borrow: PhantomData<&'a mut TcpSocket<'s>>,
}

impl ErrorType for Tcp<'_, '_> {
    type Error = embassy_net::tcp::Error;
}

impl Read for Tcp<'_, '_> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        // SAFETY: the pointer comes from the `&'a mut TcpSocket` the transport was built with,
        // which outlives this; the only other user is `Link::socket`, which needs `&mut Link`
        // and so cannot run while the session (inside `Link`) is being read or written.
        let socket = unsafe { self.socket.as_mut() };
        socket.read(buf).await
    }
}

impl Write for Tcp<'_, '_> {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        // SAFETY: as in `read`.
        let socket = unsafe { self.socket.as_mut() };
        socket.write(buf).await
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// A buffer lent to one TLS session after another: embedded-tls keeps a session's record
/// buffers for the session's whole life (`&'a mut`) and gives them back to nobody, so a
/// transport that opens a new session after the last one ended lends the same memory again.
struct Lent<'a> {
    buf: NonNull<[u8]>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Lent<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Lent { buf: NonNull::from(buf), _borrow: PhantomData }
    }

    /// The buffer, for a new session.
    ///
    /// # Safety
    ///
    /// Nothing may still hold a slice an earlier call returned (the session that had it was
    /// dropped).
    unsafe fn lend(&mut self) -> &'a mut [u8] {
        // SAFETY: the caller's promise: this is the only live reference to the buffer, which
        // the transport borrowed for `'a`.
        unsafe { &mut *self.buf.as_ptr() }
    }
}

/// The socket, the TLS session on it (when one is open), and the session's record buffers.
struct Link<'a, 's> {
    socket: NonNull<TcpSocket<'s>>,
    tls: Option<TlsConnection<'a, Tcp<'a, 's>, Suite>>,
    read: Lent<'a>,
    write: Lent<'a>,
    _borrow: PhantomData<&'a mut TcpSocket<'s>>,
}

impl<'a, 's> Link<'a, 's> {
    /// `socket` with no session yet, and the record buffers each session is lent.
    fn new(socket: &'a mut TcpSocket<'s>, read: &'a mut [u8], write: &'a mut [u8]) -> Self {
        Link {
            socket: NonNull::from(socket),
            tls: None,
            read: Lent::new(read),
            write: Lent::new(write),
            _borrow: PhantomData,
        }
    }

    /// The socket, for connecting, checking and closing: never while a session's future runs
    /// (it borrows `self.tls`, this borrows all of `self`).
    fn socket(&mut self) -> &mut TcpSocket<'s> {
        // SAFETY: see `Tcp`: the session's delegate is the pointer's only other user, and it
        // runs only inside a future that borrows `self.tls`, which `&mut self` excludes.
        unsafe { self.socket.as_mut() }
    }

    /// A new session on the connected socket, in place of any old one.
    fn new_session(&mut self) -> &mut TlsConnection<'a, Tcp<'a, 's>, Suite> {
        // The old session (and its hold on the buffers) ends before they are lent again.
        self.tls = None;
        // SAFETY: the only holder of the buffers, the old session, was just dropped.
        let (read, write) = unsafe { (self.read.lend(), self.write.lend()) };
        let delegate = Tcp { socket: self.socket, _borrow: PhantomData };
        self.tls.insert(TlsConnection::new(delegate, read, write))
    }

    /// Ends the session and the connection: after a clean answer, the session's
    /// `close_notify` and a FIN; otherwise an RST. Waits at most until `deadline`.
    async fn end(&mut self, clean: bool, deadline: Instant) {
        if let Some(tls) = self.tls.take()
            && clean
        {
            // close_notify, so the server sees a clean end rather than a truncation.
            let _ = with_deadline(deadline, tls.close()).await;
        }
        http::finish(self.socket(), clean, deadline).await;
    }
}

/// Keyed writes as HTTPS `POST`s to one server, authenticated by a pinned CA, over one TLS
/// session kept across attempts and readings: [`Http`] on [`Secure`].
///
/// The session lives exactly as long as its TCP connection, under the rules of [`Http`]'s kept
/// connection: it is opened (TCP, then a full handshake) by
/// [`Transport::open`](crate::Transport::open) when none is open, and ends when the server's
/// reply says so, an exchange failed, the server's FIN or RST or any unread bytes were seen
/// before a request (a `close_notify` alert from the server is such bytes: the server is
/// closing), it idled past the limit ([`IDLE_LIMIT`](crate::transport::IDLE_LIMIT) by
/// default), or the uplink closed it. A write on a connection the server had closed is
/// classified and counted ([`Counts`](crate::transport::Counts)) as over plain HTTP. The
/// server's `NewSessionTicket` messages, sent after the handshake, are read (and dropped) with
/// the first reply. Batches, when turned on ([`Http::batches`]), go as over plain HTTP, inside
/// the session.
pub type TlsTransport<'a, 's> = Http<'a, 's, Secure<'a, 's>>;

/// A TLS 1.3 session on the socket, the server authenticated by the pinned CA ([`Pinned`]):
/// the [`Carrier`] of [`TlsTransport`]. Each connection runs a full handshake; the session
/// ends with its connection (a `close_notify` before a clean FIN).
pub struct Secure<'a, 's> {
    link: Link<'a, 's>,
    pinned: Pinned<'a>,
    rng: ChaCha20Rng,
}

impl<'a, 's> Carrier for Secure<'a, 's> {
    const SCHEME: &'static str = "https";
    type Stream<'x>
        = &'x mut TlsConnection<'a, Tcp<'a, 's>, Suite>
    where
        Self: 'x;

    fn quiet(&mut self) -> bool {
        quiet(self.link.socket())
    }

    async fn connect(&mut self, server: SocketAddrV4, deadline: Instant) -> Result<(), HttpError> {
        self.link.tls = None;
        http::reconnect(self.link.socket(), server, deadline).await?;
        let tls = self.link.new_session();
        let (opened, tls_error) = handshake(tls, &self.pinned, None, &mut self.rng, deadline).await;
        if let Err(err) = opened {
            defmt::info!("the TLS handshake failed: {} ({})", err, tls_error);
            self.link.end(false, deadline).await;
        }
        opened
    }

    fn stream(&mut self) -> Option<Self::Stream<'_>> {
        self.link.tls.as_mut()
    }

    async fn end(&mut self, clean: bool, deadline: Instant) {
        self.link.end(clean, deadline).await;
    }

    fn host(&self) -> &str {
        self.pinned.server_name
    }
}

impl<'a, 's> TlsTransport<'a, 's> {
    /// Posts to `path` on `server` (authenticated as `pinned`) through `stack` on `socket` (the
    /// transport's for its whole life; it connects it again after each close), with `head` for
    /// the request head and the reply's header block, TLS record buffers `read` ([`MAX_RECORD`]
    /// bytes take any server) and `write`, and handshake randomness from `rng` (seed it from a
    /// hardware RNG, never a constant). Keeps a session for at most
    /// [`IDLE_LIMIT`](crate::transport::IDLE_LIMIT) between requests.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        pinned: Pinned<'a>,
        socket: &'a mut TcpSocket<'s>,
        head: &'a mut [u8],
        read: &'a mut [u8],
        write: &'a mut [u8],
        rng: ChaCha20Rng,
    ) -> Self {
        let link = Link::new(socket, read, write);
        Http::with_carrier(Secure { link, pinned, rng }, stack, server, path, head)
    }
}

/// MQTT over TLS (features `tls` and `mqtt`): the socket and the TLS session on it, for
/// [`MqttTransport`](crate::mqtt::MqttTransport). Each connect opens TCP and runs a full
/// handshake against the pinned CA (the same checks as [`TlsTransport`]'s); the session lives
/// exactly as long as its MQTT connection, and ends with a `close_notify` after a clean
/// `DISCONNECT`, with an RST after a failure.
#[cfg(feature = "mqtt")]
pub struct TlsPipe<'a> {
    state: embassy_sync::mutex::Mutex<embassy_sync::blocking_mutex::raw::NoopRawMutex, Secure<'a, 'a>>,
}

#[cfg(feature = "mqtt")]
impl<'a> TlsPipe<'a> {
    /// Sessions with a server authenticated as `pinned`, on `socket` (kept for the pipe's whole
    /// life and connected again after each close), with TLS record buffers `read`
    /// ([`MAX_RECORD`] bytes take any server) and `write`, and handshake randomness from `rng`
    /// (seed it from a hardware RNG, never a constant).
    pub fn new(
        pinned: Pinned<'a>,
        socket: &'a mut TcpSocket<'a>,
        read: &'a mut [u8],
        write: &'a mut [u8],
        rng: ChaCha20Rng,
    ) -> Self {
        let link = Link::new(socket, read, write);
        TlsPipe { state: embassy_sync::mutex::Mutex::new(Secure { link, pinned, rng }) }
    }
}

/// The MQTT client's handle on a [`TlsPipe`]'s session: reads and writes go through the
/// session while one is open; with none (the transport ended it) they fail as a closed
/// connection.
#[cfg(feature = "mqtt")]
pub struct TlsStream<'a>(
    &'a embassy_sync::mutex::Mutex<embassy_sync::blocking_mutex::raw::NoopRawMutex, Secure<'a, 'a>>,
);

#[cfg(feature = "mqtt")]
impl ErrorType for TlsStream<'_> {
    type Error = TlsError;
}

#[cfg(feature = "mqtt")]
impl Read for TlsStream<'_> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        match self.0.lock().await.link.tls.as_mut() {
            Some(tls) => tls.read(buf).await,
            None => Err(TlsError::ConnectionClosed),
        }
    }
}

#[cfg(feature = "mqtt")]
impl Write for TlsStream<'_> {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        match self.0.lock().await.link.tls.as_mut() {
            Some(tls) => tls.write(buf).await,
            None => Err(TlsError::ConnectionClosed),
        }
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        match self.0.lock().await.link.tls.as_mut() {
            Some(tls) => tls.flush().await,
            None => Err(TlsError::ConnectionClosed),
        }
    }
}

#[cfg(feature = "mqtt")]
impl<'a> crate::mqtt::Pipe<'a> for TlsPipe<'a> {
    type Stream = TlsStream<'a>;

    fn stream(&'a self) -> TlsStream<'a> {
        TlsStream(&self.state)
    }

    async fn connect(&self, server: SocketAddrV4, deadline: Instant) -> Result<(), Failure> {
        self.state.lock().await.connect(server, deadline).await.map_err(failure)
    }

    async fn state(&self) -> (bool, bool) {
        let mut state = self.state.lock().await;
        let socket = state.link.socket();
        (socket.state() == embassy_net::tcp::State::Established && socket.may_send(), socket.can_recv())
    }

    async fn finish(&self, clean: bool, deadline: Instant) {
        self.state.lock().await.link.end(clean, deadline).await;
    }
}
