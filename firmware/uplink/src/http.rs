//! One HTTP/1.1 `POST` through an `embassy-net` [`Stack`], with a failure typed by what it
//! means for whether the request may have reached the server.
//!
//! [`post`] makes exactly one attempt (retrying is the wary policy's job, one layer up): it
//! connects to an IPv4 address and port, sends `POST <path>` with `Host`, `Content-Type:
//! application/json`, `Content-Length`, `Idempotency-Key`, `Authorization: Bearer <token>` when
//! the device has a credential, and `Connection: close`, and reads the
//! status line and header block into a caller-owned buffer. reqwless encodes the request and
//! parses the reply; the exchange drives the TCP socket itself so it knows which phase a
//! failure hit (reqwless's own client folds connect, send and receive errors together, and
//! embassy-net's `TcpClient` reports every failed connect as a reset).
//!
//! **The phase decides the classification** ([`HttpError::phase`]): a failure before the last
//! byte of the request was handed to TCP cannot have reached the server whole, so the request
//! never landed; any failure after it may have (the server may have acted and the reply been
//! lost). [`HttpError::may_have_landed`] is exactly "the reply phase was reached".
//!
//! **Bounded**: one time limit covers connecting, sending, the reply and closing; a server that
//! stalls or trickles bytes cannot hold the exchange past it. The header block must fit the
//! buffer ([`HttpError::HeadersTooLarge`]); at most [`BODY_LIMIT`] bytes of body are read, for
//! at most [`BODY_GRACE`], only to see whether it ended cleanly ([`Response::body_complete`]).
//! The status line proves the server answered, so a body cut short still returns the status.
//!
//! **Kept connections**: [`encode_head_for`] leaves `Connection: close` out, and
//! [`send_and_read_framed`] says whether the reply leaves the connection at a known byte
//! ([`reusable`]); `transport::HttpTransport` keeps its connection on that.
//!
//! **One exchange for every connection**: [`send_and_read`] sends an encoded request and reads
//! the reply over any `embedded-io-async` connection: plain TCP ([`Handed`]) here, TLS in
//! `tls::post_tls`. [`encode_head`], [`connect`] and [`finish`] are the other steps, public so a
//! measuring tool (the TLS probe) times the code the device ships rather than a copy.
//!
//! **Logs** carry phases, counts and lengths, never payload bytes, header text or the
//! credential.
//!
//! ```ignore
//! static BUFFERS: ConstStaticCell<http::Buffers<1024, 1024, 1024>> =
//!     ConstStaticCell::new(http::Buffers::new());
//! let post = http::Post {
//!     path: "/readings",
//!     idempotency_key: &key_hex,
//!     body: payload.as_bytes(),
//!     credential: Some(&CREDENTIAL),
//!     dead_letters: None,
//! };
//! match http::post(stack, server, &post, time_left, BUFFERS.take()).await {
//!     Ok(reply) => { /* reply.status, reply.retry_after, reply.date */ }
//!     Err(err) if err.may_have_landed() => { /* a keyed write may be resent with its key */ }
//!     Err(err) => { /* never reached the server: safe to send again */ }
//! }
//! ```

use core::fmt::Write as _;
use core::net::SocketAddrV4;

use embassy_net::tcp::{ConnectError, State, TcpSocket};
use embassy_net::{IpAddress, Stack};
use embassy_time::{Duration, Instant, with_deadline};
use embedded_io_async::{ErrorType, Read, Write};
use heapless::Vec;
use reqwless::headers::ContentType;
use reqwless::request::{Method, Request, RequestBody, RequestBuilder};
use reqwless::response::{BodyReader, Response as RawResponse};

use crate::identity::Credential;

/// How many `Retry-After` values a [`Response`] keeps; more are counted in
/// [`Response::retry_after_dropped`]. Two already mean the server contradicts itself.
pub const RETRY_AFTER_MAX: usize = 4;
/// The longest `Retry-After` value kept: an HTTP-date is 29 bytes, delta-seconds fewer.
pub const RETRY_AFTER_LEN: usize = 64;
/// The longest `Date` value kept (an HTTP-date is 29 bytes).
pub const DATE_LEN: usize = 40;
/// Body bytes read after the header block before giving up on seeing its end.
pub const BODY_LIMIT: usize = 4096;
/// How long the body may take after the header block (within the exchange's limit): the
/// status is known by then, so a slow body must not eat the caller's deadline.
pub const BODY_GRACE: Duration = Duration::from_millis(500);
/// How long, within the exchange's limit, closing may wait for our FIN or RST to leave.
pub const CLOSE_GRACE: Duration = Duration::from_millis(200);
/// The longest `Host` value: `255.255.255.255:65535`.
const HOST_LEN: usize = 21;

/// The request: `POST <path>` with a JSON body, an idempotency key and, when the device has
/// one, its credential.
#[derive(Clone, Copy, Debug)]
pub struct Post<'a> {
    /// Absolute path (origin form), such as `/readings`: visible ASCII, no spaces.
    pub path: &'a str,
    /// The `Idempotency-Key` value, the same on every attempt of a call: visible ASCII.
    pub idempotency_key: &'a str,
    /// The JSON body, sent as is with its `Content-Length`.
    pub body: &'a [u8],
    /// The device's credential, sent as `Authorization: Bearer <token>`; `None` sends no
    /// `Authorization` header. Its `Debug` shows no part of the token.
    pub credential: Option<&'a Credential>,
    /// The [`DEAD_LETTERS`] header's value (`held=<n>, dropped=<n>`), sent while the device has
    /// dead letters to report; `None` sends no such header.
    pub dead_letters: Option<&'a str>,
}

/// The header a device reports its dead letters in while it has any: an RFC 8941 dictionary
/// of two integers, `held` (letters on its flash now) and `dropped` (letters dropped over its
/// life to make room), such as `Wary-Dead-Letters: held=2, dropped=0`. A wary gateway exports
/// it per device (docs/deployment.md); any other server ignores a header it does not know
/// (RFC 9110, 5.1).
pub const DEAD_LETTERS: &str = "Wary-Dead-Letters";

/// The [`DEAD_LETTERS`] value for `held` letters and `dropped` ones.
pub fn dead_letters_value(held: u32, dropped: u32) -> heapless::String<40> {
    let mut value = heapless::String::new();
    // 2 × 10 digits and 17 bytes of names: always fits.
    let _ = core::fmt::Write::write_fmt(&mut value, format_args!("held={held}, dropped={dropped}"));
    value
}

/// The memory of one exchange: the TCP socket's receive and send buffers, and `HEAD` bytes
/// that hold the encoded request head and then the reply's status line and header block.
///
/// ```
/// # use wary_uplink::http::Buffers;
/// // 1 KiB each: a header block up to 1 KiB is accepted.
/// let buffers = Buffers::<1024, 1024, 1024>::new();
/// ```
pub struct Buffers<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> {
    socket_rx: [u8; SOCKET_RX],
    socket_tx: [u8; SOCKET_TX],
    head: [u8; HEAD],
}

impl<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> Default
    for Buffers<SOCKET_RX, SOCKET_TX, HEAD>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> Buffers<SOCKET_RX, SOCKET_TX, HEAD> {
    /// Zeroed buffers; `const`, so they can live in a static.
    pub const fn new() -> Self {
        Self { socket_rx: [0; SOCKET_RX], socket_tx: [0; SOCKET_TX], head: [0; HEAD] }
    }

    /// The socket's receive and send buffers and the head buffer, apart.
    pub fn parts(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        (&mut self.socket_rx, &mut self.socket_tx, &mut self.head)
    }
}

/// The server's answer: a status line and header block were read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code (200..=999; interim 1xx answers are refused as
    /// [`HttpError::Malformed`]).
    pub status: u16,
    /// Every `Retry-After` value, raw, in order (names compared without regard to case), at most
    /// [`RETRY_AFTER_MAX`] of at most [`RETRY_AFTER_LEN`] bytes each.
    pub retry_after: Vec<Vec<u8, RETRY_AFTER_LEN>, RETRY_AFTER_MAX>,
    /// `Retry-After` values not kept: longer than [`RETRY_AFTER_LEN`] or beyond
    /// [`RETRY_AFTER_MAX`] (saturating). Non-zero means the server's wish is not fully known.
    pub retry_after_dropped: u8,
    /// The first `Date` value, raw, if it fits [`DATE_LEN`].
    pub date: Option<Vec<u8, DATE_LEN>>,
    /// A `Date` header was not kept: longer than [`DATE_LEN`], or a second one.
    pub date_dropped: bool,
    /// The body ended as its framing said (length, chunks or close) within [`BODY_LIMIT`] and
    /// [`BODY_GRACE`]. `false` never changes the status: the server answered.
    pub body_complete: bool,
}

// By hand: header values are server text and stay out of logs; their counts do not.
impl defmt::Format for Response {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "Response {{ status: {=u16}, retry_after: {=usize} kept {=u8} dropped, date: {=bool} ({=bool} dropped), body_complete: {=bool} }}",
            self.status,
            self.retry_after.len(),
            self.retry_after_dropped,
            self.date.is_some(),
            self.date_dropped,
            self.body_complete
        );
    }
}

/// How far an exchange got before it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
pub enum Phase {
    /// Nothing was attempted: no network, or the request could not be encoded.
    Setup,
    /// Opening the TCP connection.
    Connect,
    /// The TLS handshake (HTTPS only): nothing of the request has been sent yet.
    Handshake,
    /// Handing the request to TCP; not all of it was when the failure came.
    Send,
    /// The whole request was handed to TCP; waiting for or reading the reply.
    Reply,
}

/// Why an exchange gave no [`Response`], named by what it means for the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, defmt::Format)]
#[non_exhaustive]
pub enum HttpError {
    /// Never sent: the link is down or the stack has no IPv4 address (no DHCP lease yet).
    #[error("no network: link down or no IPv4 address")]
    NoNetwork,
    /// Never sent: the request cannot be encoded (a path or key that is not visible ASCII, or a
    /// head longer than the buffer): a bug on our side, not the network's.
    #[error("the request cannot be encoded")]
    BadRequest,
    /// Never sent: the stack has no route to the server.
    #[error("no route to the server")]
    NoRoute,
    /// Never sent: the server refused the connection.
    #[error("connection refused")]
    Refused,
    /// Never sent: no connection within the time limit.
    #[error("connect timed out")]
    ConnectTimeout,
    /// Never sent: the TLS handshake did not finish within the time limit.
    #[error("TLS handshake timed out")]
    HandshakeTimeout,
    /// Never sent: the connection broke during the TLS handshake (no alert from the server).
    #[error("the connection broke during the TLS handshake")]
    HandshakeBroken,
    /// Never sent: the TLS handshake was refused: the server's certificate is not vouched for
    /// by the pinned CA or not for this name, or its handshake is not valid TLS 1.3. The same
    /// every time: fails the call at once.
    #[error("TLS handshake refused: the server was not authenticated")]
    Tls,
    /// Never landed: the connection broke or stalled before the whole request was handed to
    /// it, so the server holds at most a prefix, which it cannot act on.
    #[error("the connection failed before the whole request was sent")]
    SendFailed,
    /// May have landed: the connection was reset after the request went out.
    #[error("connection reset after the request was sent")]
    Reset,
    /// May have landed: the server closed the connection after the request without a byte of
    /// reply.
    #[error("connection closed after the request was sent, with no reply")]
    Closed,
    /// May have landed: no complete header block before the time limit (stalled or trickling).
    #[error("no complete reply within the time limit")]
    ResponseTimeout,
    /// May have landed: the reply was cut short inside its status line or header block.
    #[error("reply cut short in its header block")]
    Truncated,
    /// May have landed: the reply is not HTTP/1.x (a garbage status line, unparseable or too
    /// many headers, or an interim 1xx answer).
    #[error("the reply is not a readable HTTP/1.x response")]
    Malformed,
    /// May have landed: the reply's header block is larger than the buffer.
    #[error("the reply's header block is larger than the buffer")]
    HeadersTooLarge,
}

impl HttpError {
    /// The phase the exchange had reached when it failed.
    pub const fn phase(self) -> Phase {
        match self {
            Self::NoNetwork | Self::BadRequest => Phase::Setup,
            Self::NoRoute | Self::Refused | Self::ConnectTimeout => Phase::Connect,
            Self::HandshakeTimeout | Self::HandshakeBroken | Self::Tls => Phase::Handshake,
            Self::SendFailed => Phase::Send,
            Self::Reset
            | Self::Closed
            | Self::ResponseTimeout
            | Self::Truncated
            | Self::Malformed
            | Self::HeadersTooLarge => Phase::Reply,
        }
    }

    /// Whether the server may have received the whole request and acted on it: only once the
    /// reply phase was reached. A write that may have landed is resent only with its key.
    pub const fn may_have_landed(self) -> bool {
        matches!(self.phase(), Phase::Reply)
    }
}

/// Where one exchange's time went, in microseconds of the device's clock: what a measuring tool
/// reports phase by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, defmt::Format)]
pub struct Timing {
    /// Opening the TCP connection (0 when it was not opened).
    pub connect_us: u64,
    /// The TLS handshake (0 in plain HTTP, or when it was never reached).
    pub handshake_us: u64,
    /// Sending the request and reading the reply.
    pub request_us: u64,
}

/// Sends `request` to `server` once and reads the reply's status and headers, within `limit`
/// overall (connecting, sending, reading and closing). `Host` is the server's address.
///
/// The connection is closed with a FIN after an answer and an RST after a failure, each only
/// if time is left: an exchange that ran into its limit drops the socket at once.
///
/// # Errors
///
/// An [`HttpError`] whose [`phase`](HttpError::phase) says how far the exchange got.
///
/// # Panics
///
/// Only if the stack has no free socket slot (embassy-net's socket set panics when full):
/// size its `StackResources` for one socket per concurrent exchange plus DHCP's. Nothing a
/// server sends can make it panic.
pub async fn post<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>(
    stack: Stack<'_>,
    server: SocketAddrV4,
    request: &Post<'_>,
    limit: Duration,
    buffers: &mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
) -> Result<Response, HttpError> {
    let mut host = heapless::String::<HOST_LEN>::new();
    if write!(host, "{server}").is_err() {
        return Err(HttpError::BadRequest);
    }
    post_timed(stack, server, &host, request, limit, buffers).await.0
}

/// [`post`] with `host` as the `Host` header (a server's name rather than its address), and
/// the time each phase took.
///
/// # Panics
///
/// As [`post`].
pub async fn post_timed<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>(
    stack: Stack<'_>,
    server: SocketAddrV4,
    host: &str,
    request: &Post<'_>,
    limit: Duration,
    buffers: &mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
) -> (Result<Response, HttpError>, Timing) {
    let deadline = Instant::now().checked_add(limit).unwrap_or(Instant::MAX);
    let mut timing = Timing::default();
    if !stack.is_link_up() || stack.config_v4().is_none() {
        return (Err(HttpError::NoNetwork), timing);
    }
    let head_len = match encode_head(request, host, &mut buffers.head).await {
        Ok(len) => len,
        Err(err) => return (Err(err), timing),
    };
    defmt::debug!("http: POST, head {=usize} B, body {=usize} B", head_len, request.body.len());

    let (socket_rx, socket_tx, head) = buffers.parts();
    let mut socket = TcpSocket::new(stack, socket_rx, socket_tx);
    let started = Instant::now();
    let result = match connect(&mut socket, server, deadline).await {
        Ok(()) => {
            timing.connect_us = started.elapsed().as_micros();
            let sent_at = Instant::now();
            let reply = send_and_read(&mut Handed(&mut socket), head_len, request.body, head, deadline).await;
            timing.request_us = sent_at.elapsed().as_micros();
            reply
        }
        Err(err) => Err(err),
    };
    finish(&mut socket, result.is_ok(), deadline).await;
    match &result {
        Ok(reply) => defmt::debug!("http: {}", reply),
        Err(err) => defmt::debug!("http: {} in phase {}", err, err.phase()),
    }
    (result, timing)
}

/// Connects `socket` to `server` by `deadline`, after closing what a last connection left on it
/// (FIN sent, TIME-WAIT); on failure the socket is reset and left closed.
pub(crate) async fn reconnect(
    socket: &mut TcpSocket<'_>,
    server: SocketAddrV4,
    deadline: Instant,
) -> Result<(), HttpError> {
    if socket.state() != State::Closed {
        socket.abort();
        let grace = deadline.saturating_duration_since(Instant::now()).min(CLOSE_GRACE);
        let _ = embassy_time::with_timeout(grace, socket.flush()).await;
    }
    match connect(socket, server, deadline).await {
        Ok(()) => Ok(()),
        Err(err) => {
            finish(socket, false, deadline).await;
            Err(err)
        }
    }
}

/// Closes the socket: a clean FIN after an answer, an RST otherwise (a half-read reply must
/// not linger), waiting for it to leave only as long as the limit allows.
pub async fn finish(socket: &mut TcpSocket<'_>, answered: bool, deadline: Instant) {
    if answered {
        socket.close();
    } else {
        socket.abort();
    }
    let grace = deadline.saturating_duration_since(Instant::now()).min(CLOSE_GRACE);
    let _ = embassy_time::with_timeout(grace, socket.flush()).await;
}

/// Writes the request head, with `host` as its `Host`, into `buf` and returns its length; the
/// body is sent from the caller's slice. Every exchange, plain or TLS, sends the head this
/// writes, once per attempt: the `Authorization` header of [`Post::credential`] is in each.
///
/// # Errors
///
/// [`HttpError::BadRequest`] for a path, key or host that is not visible ASCII, or a head
/// longer than `buf`.
pub async fn encode_head(request: &Post<'_>, host: &str, buf: &mut [u8]) -> Result<usize, HttpError> {
    encode_head_for(request, host, true, buf).await
}

/// [`encode_head`] for a connection that is kept (`close` false: no `Connection` header, so
/// HTTP/1.1's persistent connection applies) or ends with this exchange (`close` true:
/// `Connection: close`).
///
/// # Errors
///
/// As [`encode_head`].
pub async fn encode_head_for(
    request: &Post<'_>,
    host: &str,
    close: bool,
    buf: &mut [u8],
) -> Result<usize, HttpError> {
    // reqwless writes header text as given: a CR or LF here would let a path or key inject
    // headers, and a space would break the request line.
    if !request.path.starts_with('/')
        || !visible_ascii(request.path)
        || !visible_ascii(request.idempotency_key)
        || !visible_ascii(host)
    {
        return Err(HttpError::BadRequest);
    }
    let headers =
        extra_headers(request.credential, Some(request.idempotency_key), request.dead_letters, close)?;
    let head = Request::post(request.path)
        .host(host)
        .content_type(ContentType::ApplicationJson)
        .headers(&headers)
        .body(request.body)
        .build();
    let capacity = buf.len();
    let mut rest: &mut [u8] = buf;
    head.write_header(&mut rest).await.map_err(|_| HttpError::BadRequest)?;
    Ok(capacity.saturating_sub(rest.len()))
}

/// Writes the head of a batch (`POST <path>`, no `Idempotency-Key`: each item carries its own)
/// whose body is `content_length` bytes of JSON, with the credential if there is one, for a
/// kept connection or, with `close`, one that ends with this exchange.
///
/// # Errors
///
/// As [`encode_head`].
pub async fn encode_batch_head(
    path: &str,
    credential: Option<&Credential>,
    dead_letters: Option<&str>,
    host: &str,
    content_length: usize,
    close: bool,
    buf: &mut [u8],
) -> Result<usize, HttpError> {
    if !path.starts_with('/') || !visible_ascii(path) || !visible_ascii(host) {
        return Err(HttpError::BadRequest);
    }
    let headers = extra_headers(credential, None, dead_letters, close)?;
    let head = Request::post(path)
        .host(host)
        .content_type(ContentType::ApplicationJson)
        .headers(&headers)
        .body(Length(content_length))
        .build();
    let capacity = buf.len();
    let mut rest: &mut [u8] = buf;
    head.write_header(&mut rest).await.map_err(|_| HttpError::BadRequest)?;
    Ok(capacity.saturating_sub(rest.len()))
}

/// The headers after `Host`, `Content-Type` and `Content-Length`: the credential's, the key,
/// the dead letters' report, and `Connection: close` when `close`.
fn extra_headers<'h>(
    credential: Option<&'h Credential>,
    key: Option<&'h str>,
    dead_letters: Option<&'h str>,
    close: bool,
) -> Result<heapless::Vec<(&'h str, &'h str), 4>, HttpError> {
    let mut headers = heapless::Vec::new();
    let all = [
        credential.map(|c| ("Authorization", c.header_value())),
        key.map(|k| ("Idempotency-Key", k)),
        // A field value may hold spaces, never a control byte (RFC 9110, 5.5).
        dead_letters.filter(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b))).map(|v| (DEAD_LETTERS, v)),
        close.then_some(("Connection", "close")),
    ];
    for header in all.into_iter().flatten() {
        headers.push(header).map_err(|_| HttpError::BadRequest)?;
    }
    Ok(headers)
}

/// A body known by its length only, for writing a head.
struct Length(usize);

impl RequestBody for Length {
    fn len(&self) -> Option<usize> {
        Some(self.0)
    }

    async fn write<W: Write>(&self, _writer: &mut W) -> Result<(), W::Error> {
        Ok(())
    }
}

fn visible_ascii(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Opens the TCP connection; its failures name the connect phase.
///
/// # Errors
///
/// [`HttpError::ConnectTimeout`], [`HttpError::Refused`] or [`HttpError::NoRoute`].
pub async fn connect(
    socket: &mut TcpSocket<'_>,
    server: SocketAddrV4,
    deadline: Instant,
) -> Result<(), HttpError> {
    // The request goes out in two writes (head, body); Nagle would hold the second for an ACK.
    socket.set_nagle_enabled(false);
    // smoltcp's own inactivity timeout is left off: when it fires the socket reads as reset,
    // which would misname a stalled reply. The deadline bounds every wait instead.
    let endpoint = (IpAddress::Ipv4(*server.ip()), server.port());
    match with_deadline(deadline, socket.connect(endpoint)).await {
        Err(_) | Ok(Err(ConnectError::TimedOut)) => Err(HttpError::ConnectTimeout),
        // A reset in answer to our SYN is the server's refusal.
        Ok(Err(ConnectError::ConnectionReset)) => Err(HttpError::Refused),
        // A fresh socket is never in an invalid state; should it be, nothing was sent either.
        Ok(Err(ConnectError::NoRoute | ConnectError::InvalidState)) => Err(HttpError::NoRoute),
        Ok(Ok(())) => Ok(()),
    }
}

/// The exchange itself, over any open connection: sends the encoded head (the first
/// `head_len` bytes of `head`) and the body, then reads the reply's status line and header
/// block into `head` and drains the body, all by `deadline`.
///
/// The connection is plain TCP through [`Handed`], or TLS over it. `flush` means "handed to
/// TCP": over TLS it seals the last record and writes it to the socket, and [`Handed`] returns
/// at once, so a failure after it is in the reply phase, where the request may have landed.
///
/// # Errors
///
/// [`HttpError::SendFailed`] before the whole request was handed over; a reply-phase error
/// after.
pub async fn send_and_read<C: Read + Write>(
    conn: &mut C,
    head_len: usize,
    body: &[u8],
    head: &mut [u8],
    deadline: Instant,
) -> Result<Response, HttpError> {
    send_and_read_framed(conn, head_len, body, head, deadline).await.0
}

/// [`send_and_read`], and whether the connection may carry another request after this reply
/// ([`reusable`]): `false` after any failure.
///
/// # Errors
///
/// As [`send_and_read`].
pub async fn send_and_read_framed<C: Read + Write>(
    conn: &mut C,
    head_len: usize,
    body: &[u8],
    head: &mut [u8],
    deadline: Instant,
) -> (Result<Response, HttpError>, bool) {
    let (result, keep) = send_and_read_keeping(conn, head_len, &body, head, &mut [], deadline).await;
    (result.map(|(response, _)| response), keep)
}

/// [`send_and_read_framed`] for any request body (a batch's, written piece by piece), keeping
/// the first bytes of the reply's body in `keep`: the reply, how many bytes `keep` holds, and
/// whether the connection may carry another request.
///
/// # Errors
///
/// As [`send_and_read`].
pub async fn send_and_read_keeping<C: Read + Write, B: RequestBody>(
    conn: &mut C,
    head_len: usize,
    body: &B,
    head: &mut [u8],
    keep: &mut [u8],
    deadline: Instant,
) -> (Result<(Response, usize), HttpError>, bool) {
    let result = exchange(conn, head_len, body, head, keep, deadline).await;
    match result {
        Ok((response, framed, close, kept)) => {
            let reuse = reusable(framed, close, response.body_complete);
            (Ok((response, kept)), reuse)
        }
        Err(err) => (Err(err), false),
    }
}

/// Whether a reply leaves the connection able to carry the next request (RFC 9112 9.3 and
/// 6.3): the reply is HTTP/1.1, has no `Connection: close`, its body was framed by
/// `Content-Length` or chunks (or had none by its status) and was read to its end, so the
/// next reply starts at the next byte. A body that runs to the connection's end, an HTTP/1.0
/// reply, a body cut short or not read in time, and every failure end the connection.
pub const fn reusable(framed_http11: bool, close: bool, body_complete: bool) -> bool {
    framed_http11 && !close && body_complete
}

async fn exchange<C: Read + Write, B: RequestBody>(
    conn: &mut C,
    head_len: usize,
    body: &B,
    head: &mut [u8],
    keep: &mut [u8],
    deadline: Instant,
) -> Result<(Response, bool, bool, usize), HttpError> {
    let request_head = head.get(..head_len).ok_or(HttpError::BadRequest)?;
    let sent = with_deadline(deadline, async {
        conn.write_all(request_head).await?;
        body.write(conn).await?;
        conn.flush().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        return Err(HttpError::SendFailed);
    }

    // From here on the server may hold the whole request.
    let mut counted = Counted { conn, bytes: 0, first: [0; VERSION.len()] };
    let reply = match with_deadline(deadline, RawResponse::read(&mut counted, Method::POST, head)).await {
        Err(_) => return Err(HttpError::ResponseTimeout),
        Ok(Err(err)) => return Err(reply_failure(&err, counted.bytes)),
        Ok(Ok(reply)) => reply,
    };
    let status = reply.status.0;
    if status < 200 {
        return Err(HttpError::Malformed);
    }
    let mut response = collect_headers(status, reply.headers());
    let close = reply.headers().any(|(name, value)| name.eq_ignore_ascii_case("connection") && closes(value));
    let body_deadline = Instant::now().checked_add(BODY_GRACE).unwrap_or(Instant::MAX).min(deadline);
    let reader = reply.body().reader();
    let framed = !matches!(reader, BodyReader::ToEnd(_));
    let (complete, kept) = drain(reader, body_deadline, keep).await;
    response.body_complete = complete;
    Ok((response, framed && counted.first == *VERSION, close, kept))
}

/// Whether a `Connection` value lists `close` (a comma-separated list of tokens, any case).
pub fn closes(value: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// A failure while reading the reply's head: every one may have landed.
fn reply_failure(err: &reqwless::Error, bytes: usize) -> HttpError {
    match err {
        reqwless::Error::BufferTooSmall => HttpError::HeadersTooLarge,
        reqwless::Error::ConnectionAborted if bytes == 0 => HttpError::Closed,
        reqwless::Error::ConnectionAborted => HttpError::Truncated,
        reqwless::Error::Network(_) => HttpError::Reset,
        // Codec: the status line or a header did not parse.
        _ => HttpError::Malformed,
    }
}

/// Picks `Retry-After` and `Date` out of the header block. reqwless pads its header list
/// with empty names, which never match.
fn collect_headers<'a>(status: u16, headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Response {
    let mut response = Response {
        status,
        retry_after: Vec::new(),
        retry_after_dropped: 0,
        date: None,
        date_dropped: false,
        body_complete: false,
    };
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("retry-after") {
            let kept = Vec::from_slice(value).ok().and_then(|v| response.retry_after.push(v).ok());
            if kept.is_none() {
                response.retry_after_dropped = response.retry_after_dropped.saturating_add(1);
            }
        } else if name.eq_ignore_ascii_case("date") {
            match (&response.date, Vec::from_slice(value)) {
                (None, Ok(date)) => response.date = Some(date),
                _ => response.date_dropped = true,
            }
        }
    }
    response
}

/// Reads the body until its framing says it ended, keeping its first bytes in `keep` and
/// discarding the rest: whether it ended (`false` if it did not by `deadline` or within
/// [`BODY_LIMIT`] bytes, or broke off), and how many bytes `keep` holds.
async fn drain<R: Read>(body: BodyReader<R>, deadline: Instant, keep: &mut [u8]) -> (bool, usize) {
    let mut kept = 0usize;
    let complete = drain_into(body, deadline, |bytes| {
        for byte in bytes {
            if let Some(slot) = keep.get_mut(kept) {
                *slot = *byte;
                kept = kept.saturating_add(1);
            }
        }
    })
    .await;
    (complete, kept)
}

async fn drain_into<R: Read>(
    mut body: BodyReader<R>,
    deadline: Instant,
    mut seen: impl FnMut(&[u8]),
) -> bool {
    let mut scratch = [0u8; 128];
    let mut total = 0usize;
    while total <= BODY_LIMIT {
        // reqwless subtracts what a read returns from the bytes a fixed-length body has left:
        // never ask for more than that.
        let want = match &body {
            BodyReader::Empty => return true,
            BodyReader::FixedLength(fixed) if fixed.remaining == 0 => return true,
            BodyReader::FixedLength(fixed) => fixed.remaining.min(scratch.len()),
            BodyReader::Chunked(chunked) if chunked.is_done() => return true,
            BodyReader::Chunked(_) | BodyReader::ToEnd(_) => scratch.len(),
        };
        let Some(into) = scratch.get_mut(..want) else { return false };
        match with_deadline(deadline, body.read(into)).await {
            Ok(Ok(0)) => {
                return match &body {
                    BodyReader::Empty | BodyReader::ToEnd(_) => true,
                    BodyReader::FixedLength(fixed) => fixed.remaining == 0,
                    BodyReader::Chunked(chunked) => chunked.is_done(),
                };
            }
            Ok(Ok(n)) => {
                seen(scratch.get(..n).unwrap_or(&[]));
                total = total.saturating_add(n);
            }
            Ok(Err(_)) | Err(_) => return false,
        }
    }
    false
}

/// The connection, counting the reply bytes read, so a reply cut short can be told from none,
/// and keeping the first bytes of the reply (its protocol version: reqwless moves the body over
/// the status line once the header block is read).
struct Counted<'c, C> {
    conn: &'c mut C,
    bytes: usize,
    first: [u8; VERSION.len()],
}

/// The status line's start that lets a connection persist (RFC 9112 9.3).
const VERSION: &[u8; 9] = b"HTTP/1.1 ";

impl<C: ErrorType> ErrorType for Counted<'_, C> {
    type Error = C::Error;
}

impl<C: Read> Read for Counted<'_, C> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        let n = self.conn.read(buf).await?;
        let read = buf.get(..n).unwrap_or(&[]);
        for (slot, byte) in self.first.iter_mut().skip(self.bytes).zip(read) {
            *slot = *byte;
        }
        self.bytes = self.bytes.saturating_add(n);
        Ok(n)
    }
}

/// A TCP socket whose `flush` returns at once: written bytes count as sent once TCP holds them.
/// embassy-net's own `flush` waits for the peer's ACK, and a failure while waiting would read
/// as "never sent" for a request the server may already have acted on.
pub struct Handed<'s, 'a>(pub &'s mut TcpSocket<'a>);

impl ErrorType for Handed<'_, '_> {
    type Error = embassy_net::tcp::Error;
}

impl Read for Handed<'_, '_> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        self.0.read(buf).await
    }
}

impl Write for Handed<'_, '_> {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        self.0.write(buf).await
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
