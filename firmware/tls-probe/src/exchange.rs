//! One HTTP/1.1 `POST` over an open connection, plain or TLS, with failures typed by phase.
//!
//! The shape follows the uplink's own exchange (`wary_uplink::http`): reqwless encodes the
//! head and parses the reply, the caller drives the socket so every failure knows its phase,
//! one deadline bounds everything, and the body is read only to see whether it ended.
//! It is generic over the connection so the TLS probe and its plain twin run the same code.
//!
//! ```ignore
//! let post = Post { path: "/readings", host: "cloud.wary.test", idempotency_key: &key, body };
//! let (result, timing) = exchange::post_plain(stack, server, &post, limit, buffers).await;
//! ```

use core::net::SocketAddrV4;

use embassy_net::tcp::{ConnectError, TcpSocket};
use embassy_net::{IpAddress, Stack};
use embassy_time::{Duration, Instant, with_deadline, with_timeout};
use embedded_io_async::{ErrorType, Read, Write};
use reqwless::headers::ContentType;
use reqwless::request::{Method, Request, RequestBuilder};
use reqwless::response::{BodyReader, Response};

use crate::ProbeError;

/// Body bytes read after the header block before giving up on seeing its end.
pub const BODY_LIMIT: usize = 4096;
/// How long the body may take after the header block, within the exchange's limit.
pub const BODY_GRACE: Duration = Duration::from_millis(500);
/// How long, within the limit, closing may wait for our last bytes to leave.
const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// The request: `POST <path>` with a JSON body and an idempotency key.
#[derive(Clone, Copy, Debug)]
pub struct Post<'a> {
    /// Absolute path, such as `/readings`: visible ASCII.
    pub path: &'a str,
    /// The `Host` value: the server's name (over TLS, the name its certificate carries).
    pub host: &'a str,
    /// The `Idempotency-Key` value, the same on every attempt of a call: visible ASCII.
    pub idempotency_key: &'a str,
    /// The JSON body, sent as is.
    pub body: &'a [u8],
}

/// The server's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body ended as its framing said, within [`BODY_LIMIT`] and [`BODY_GRACE`].
    pub body_complete: bool,
}

/// Where an exchange's time went, in microseconds of guest time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, defmt::Format)]
pub struct Timing {
    /// Opening the TCP connection.
    pub connect_us: u64,
    /// The TLS handshake (0 in plain HTTP, or when it was never reached).
    pub handshake_us: u64,
    /// Sending the request and reading the reply.
    pub request_us: u64,
}

/// The TCP socket's buffers and the head buffer (encoded request head, then the reply's
/// status line and header block), 1 KiB each: the uplink's own, as its network test uses them.
pub type SocketBuffers = wary_uplink::http::Buffers<1024, 1024, 1024>;

/// How a connection's read error reads once the whole request was sent, given how many
/// reply bytes had arrived.
pub trait ReplyError: Copy {
    /// The failure it stands for.
    fn after_request(self, reply_bytes: usize) -> ProbeError;
}

impl ReplyError for embassy_net::tcp::Error {
    fn after_request(self, _: usize) -> ProbeError {
        ProbeError::Reset
    }
}

/// `POST`s once over plain HTTP and reads the reply, within `limit` overall.
pub async fn post_plain(
    stack: Stack<'_>,
    server: SocketAddrV4,
    post: &Post<'_>,
    limit: Duration,
    buffers: &mut SocketBuffers,
) -> (Result<Reply, ProbeError>, Timing) {
    let deadline = Instant::now().checked_add(limit).unwrap_or(Instant::MAX);
    let mut timing = Timing::default();
    let (rx, tx, head) = buffers.parts();
    let head_len = match ready(stack, post, head).await {
        Ok(len) => len,
        Err(err) => return (Err(err), timing),
    };
    let mut socket = TcpSocket::new(stack, rx, tx);
    let started = Instant::now();
    let result = match connect(&mut socket, server, deadline).await {
        Ok(()) => {
            timing.connect_us = started.elapsed().as_micros();
            let sent_at = Instant::now();
            let reply = request(&mut socket, head_len, post.body, head, deadline).await;
            timing.request_us = sent_at.elapsed().as_micros();
            reply
        }
        Err(err) => Err(err),
    };
    finish(&mut socket, result.is_ok(), deadline).await;
    (result, timing)
}

/// Checks the network and encodes the head into `head`; its length.
pub(crate) async fn ready(stack: Stack<'_>, post: &Post<'_>, head: &mut [u8]) -> Result<usize, ProbeError> {
    if !stack.is_link_up() || stack.config_v4().is_none() {
        return Err(ProbeError::NoNetwork);
    }
    encode_head(post, head).await
}

/// Opens the TCP connection; failures name the connect phase.
pub(crate) async fn connect(
    socket: &mut TcpSocket<'_>,
    server: SocketAddrV4,
    deadline: Instant,
) -> Result<(), ProbeError> {
    // The request goes out in two writes (head, body); Nagle would hold the second for an ACK.
    socket.set_nagle_enabled(false);
    let endpoint = (IpAddress::Ipv4(*server.ip()), server.port());
    match with_deadline(deadline, socket.connect(endpoint)).await {
        Err(_) | Ok(Err(ConnectError::TimedOut)) => Err(ProbeError::ConnectTimeout),
        // A reset in answer to our SYN is the server's refusal.
        Ok(Err(ConnectError::ConnectionReset | ConnectError::NoRoute | ConnectError::InvalidState)) => {
            Err(ProbeError::Refused)
        }
        Ok(Ok(())) => Ok(()),
    }
}

/// Closes the socket: a FIN after an answer, an RST otherwise, waiting only as long as the
/// limit allows.
pub(crate) async fn finish(socket: &mut TcpSocket<'_>, answered: bool, deadline: Instant) {
    if answered {
        socket.close();
    } else {
        socket.abort();
    }
    let grace = deadline.saturating_duration_since(Instant::now()).min(CLOSE_GRACE);
    let _ = with_timeout(grace, socket.flush()).await;
}

async fn encode_head(post: &Post<'_>, buf: &mut [u8]) -> Result<usize, ProbeError> {
    // reqwless writes header text as given: a CR or LF would let a value inject headers.
    if !post.path.starts_with('/')
        || !visible_ascii(post.path)
        || !visible_ascii(post.host)
        || !visible_ascii(post.idempotency_key)
    {
        return Err(ProbeError::BadRequest);
    }
    let headers = [("Idempotency-Key", post.idempotency_key), ("Connection", "close")];
    let head = Request::post(post.path)
        .host(post.host)
        .content_type(ContentType::ApplicationJson)
        .headers(&headers)
        .body(post.body)
        .build();
    let capacity = buf.len();
    let mut rest: &mut [u8] = buf;
    head.write_header(&mut rest).await.map_err(|_| ProbeError::BadRequest)?;
    Ok(capacity.saturating_sub(rest.len()))
}

fn visible_ascii(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Sends the encoded head and the body over an open connection and reads the reply.
pub(crate) async fn request<C>(
    conn: &mut C,
    head_len: usize,
    body: &[u8],
    head: &mut [u8],
    deadline: Instant,
) -> Result<Reply, ProbeError>
where
    C: Read + Write,
    C::Error: ReplyError,
{
    let request_head = head.get(..head_len).ok_or(ProbeError::BadRequest)?;
    let sent = with_deadline(deadline, async {
        conn.write_all(request_head).await?;
        conn.write_all(body).await?;
        // Over TLS this seals the last record and hands it to TCP.
        conn.flush().await
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        return Err(ProbeError::SendFailed);
    }

    // From here on the server may hold the whole request.
    let mut counted = Counted { conn, bytes: 0, error: None };
    let reply = match with_deadline(deadline, Response::read(&mut counted, Method::POST, head)).await {
        Err(_) => return Err(ProbeError::ResponseTimeout),
        Ok(Err(err)) => return Err(reply_failure(&err, counted.bytes, counted.error)),
        Ok(Ok(reply)) => reply,
    };
    let status = reply.status.0;
    if status < 200 {
        return Err(ProbeError::Malformed);
    }
    let body_deadline = Instant::now().checked_add(BODY_GRACE).unwrap_or(Instant::MAX).min(deadline);
    let body_complete = drain(reply.body().reader(), body_deadline).await;
    Ok(Reply { status, body_complete })
}

/// A failure while reading the reply's head: every one may have landed.
fn reply_failure<E: ReplyError>(err: &reqwless::Error, bytes: usize, cause: Option<E>) -> ProbeError {
    if let Some(cause) = cause {
        return cause.after_request(bytes);
    }
    match err {
        reqwless::Error::BufferTooSmall => ProbeError::HeadersTooLarge,
        reqwless::Error::ConnectionAborted if bytes == 0 => ProbeError::Closed,
        reqwless::Error::ConnectionAborted => ProbeError::Truncated,
        reqwless::Error::Network(_) => ProbeError::Reset,
        _ => ProbeError::Malformed,
    }
}

/// Reads and discards the body until its framing says it ended; `false` if it did not by
/// `deadline` or within [`BODY_LIMIT`] bytes, or broke off.
async fn drain<R: Read>(mut body: BodyReader<R>, deadline: Instant) -> bool {
    let mut scratch = [0u8; 128];
    let mut total = 0usize;
    while total <= BODY_LIMIT {
        // reqwless counts down what a fixed-length body has left: never ask for more.
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
            Ok(Ok(n)) => total = total.saturating_add(n),
            Ok(Err(_)) | Err(_) => return false,
        }
    }
    false
}

/// Counts reply bytes and keeps the connection's own error, which reqwless reduces to a kind.
struct Counted<'c, C: ErrorType> {
    conn: &'c mut C,
    bytes: usize,
    error: Option<C::Error>,
}

impl<C: Read> ErrorType for Counted<'_, C> {
    type Error = C::Error;
}

impl<C: Read> Read for Counted<'_, C>
where
    C::Error: Copy,
{
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        match self.conn.read(buf).await {
            Ok(n) => {
                self.bytes = self.bytes.saturating_add(n);
                Ok(n)
            }
            Err(err) => {
                self.error = Some(err);
                Err(err)
            }
        }
    }
}
