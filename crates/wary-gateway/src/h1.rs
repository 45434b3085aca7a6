//! A small HTTP/1.1 server connection for the device listener (and the metrics listener).
//!
//! Why not hyper's server connection: it allocates an 8 KiB write buffer when a connection
//! opens and reserves 8 KiB to read the first request into, keeps both for the connection's
//! life, and has no server-side setting that shrinks them. A device's request is a few hundred
//! bytes, and its connection stays open while the reading waits upstream for its verdict: with
//! 10,000 readings in flight those two buffers were 16 of the 17 KB each reading held. This
//! connection reads into a buffer that grows from [`FIRST_READ`] only as far as the head needs
//! (at most [`MAX_BUF`]), frees it while the handler waits, and writes each answer from one
//! buffer sized for it. Parsing is `httparse`'s (the parser hyper itself uses), the `Date`
//! header `httpdate`'s; what is left here is framing:
//!
//! - a head ends at its empty line, found by scanning each byte once (a head trickling in one
//!   byte at a time costs no re-parsing); more than [`MAX_BUF`] bytes without one is answered
//!   431 and the connection closed;
//! - an HTTP/1.1 head without a `Host` field, or with two, is answered 400 and the connection
//!   closed (RFC 9112 §3.2);
//! - a body is framed by `Content-Length` (equal values only) or `Transfer-Encoding: chunked`
//!   (the only coding taken: others 501); both at once, or a malformed length, is 400 and the
//!   connection closed (RFC 9112 §6.3: no request smuggling);
//! - `Expect: 100-continue` is answered `100 Continue` when the handler starts reading the body,
//!   so a request refused on its head never sends its body;
//! - keep-alive unless the request says `Connection: close` or is HTTP/1.0; a body the handler
//!   did not read is skipped when it is already in the buffer, and the connection is closed
//!   otherwise; pipelined requests are answered in order;
//! - every head (the first and each one after an answer) must arrive within the head timeout:
//!   a connection that trickles or idles past it is closed without an answer;
//! - every answer must be taken within the same time: a client that sends requests and stops
//!   reading the answers is closed once the socket's buffers are full and a write waits past it,
//!   instead of holding its connection and task until it goes.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most bytes a connection buffers while it waits for a head's end (hyper's default too).
pub const MAX_BUF: usize = 64 * 1024;
/// The buffer a connection first reads into: a device's head and reading fit.
pub const FIRST_READ: usize = 512;
/// Most header fields in a head (hyper's default).
pub const MAX_HEADERS: usize = 100;

/// Why a body could not be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit the reader was given.
    TooLarge,
    /// The connection ended or failed inside the body, or its chunked framing is malformed.
    Broken,
}

/// A request body that is read whole, within a limit.
pub trait ReadWhole {
    /// The whole body, if it is at most `max` bytes.
    fn read_whole(self, max: usize) -> impl Future<Output = Result<Bytes, BodyError>> + Send;
}

/// How the body still to be read is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Nothing left to read.
    Done,
    /// This many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// A read started and did not finish (cancelled or failed): the stream's position is lost.
    Lost,
}

/// One connection: the stream and the bytes read from it that no request has taken yet.
struct Conn<S> {
    io: S,
    buf: BytesMut,
    /// How far `buf` has been searched for a head's end.
    scanned: usize,
    body: Framing,
    /// `Expect: 100-continue` on the current request, not answered yet.
    expect_continue: bool,
    /// How long an answer may take to be written: a client that stops reading is closed after
    /// it rather than holding its connection and task for ever.
    write_timeout: Duration,
}

/// The body of a request on a [`serve`] connection, read from the connection itself.
pub struct Body<'a, S> {
    conn: &'a mut Conn<S>,
}

impl<S> std::fmt::Debug for Body<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body").field("framing", &self.conn.body).finish()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> ReadWhole for Body<'_, S> {
    async fn read_whole(self, max: usize) -> Result<Bytes, BodyError> {
        self.conn.read_body(max).await
    }
}

/// Why a head was refused; the answer is sent and the connection closed.
enum HeadError {
    /// The stream ended or failed: nothing to answer.
    Gone,
    /// Not an HTTP/1.x request head, or framing that cannot be trusted.
    Malformed,
    /// Past [`MAX_BUF`] or [`MAX_HEADERS`].
    TooLarge,
    /// A transfer coding other than `chunked`.
    Coding,
}

impl HeadError {
    fn status(&self) -> Option<StatusCode> {
        match self {
            HeadError::Gone => None,
            HeadError::Malformed => Some(StatusCode::BAD_REQUEST),
            HeadError::TooLarge => Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
            HeadError::Coding => Some(StatusCode::NOT_IMPLEMENTED),
        }
    }
}

/// A parsed head and what it says about the connection.
struct Head {
    request: Request<()>,
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
}

/// Where the first empty line (`\n\n` or `\n\r\n`) of `buf` that ends past `from` ends (one
/// that began before `from` and ends after it is found too).
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(2);
    let mut i = start;
    while let Some(at) = buf.get(i..).and_then(|b| b.iter().position(|&c| c == b'\n')) {
        let nl = i.saturating_add(at);
        let rest = buf.get(nl.saturating_add(1)..).unwrap_or_default();
        let end = if rest.first() == Some(&b'\n') {
            Some(nl.saturating_add(2))
        } else if rest.starts_with(b"\r\n") {
            Some(nl.saturating_add(3))
        } else {
            None
        };
        if let Some(end) = end.filter(|&e| e > from) {
            return Some(end);
        }
        if rest.is_empty() || rest == b"\r" {
            return None;
        }
        i = nl.saturating_add(1);
    }
    None
}

/// The tokens of every `name` field, comma-separated, trimmed, lowercased.
fn tokens(headers: &HeaderMap, name: HeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_head(bytes: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let n = match req.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed),
    };
    let method =
        Method::from_bytes(req.method.unwrap_or_default().as_bytes()).map_err(|_| HeadError::Malformed)?;
    let uri: Uri = req.path.unwrap_or_default().parse().map_err(|_| HeadError::Malformed)?;
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(HeadError::Malformed),
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| HeadError::Malformed)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| HeadError::Malformed)?;
        headers.append(name, value);
    }
    // RFC 9112 §3.2: an HTTP/1.1 request carries exactly one Host field; a server answers 400
    // to one without it or with two.
    if version == Version::HTTP_11 && headers.get_all(HOST).iter().count() != 1 {
        return Err(HeadError::Malformed);
    }
    let codings = tokens(&headers, TRANSFER_ENCODING);
    let lengths = headers.get_all(CONTENT_LENGTH).iter().flat_map(|v| v.as_bytes().split(|&b| b == b','));
    let mut length: Option<u64> = None;
    for l in lengths {
        let l = l.trim_ascii();
        let ok = !l.is_empty() && l.len() <= 19 && l.iter().all(u8::is_ascii_digit);
        let v = std::str::from_utf8(l).ok().filter(|_| ok).and_then(|s| s.parse::<u64>().ok());
        match (v, length) {
            (None, _) => return Err(HeadError::Malformed),
            (Some(v), Some(prev)) if v != prev => return Err(HeadError::Malformed),
            (Some(v), _) => length = Some(v),
        }
    }
    let has_te = headers.contains_key(TRANSFER_ENCODING);
    let framing = match (has_te, length) {
        (true, Some(_)) => return Err(HeadError::Malformed),
        (true, None) if version == Version::HTTP_10 => return Err(HeadError::Malformed),
        (true, None) if codings == ["chunked"] => Framing::Chunked,
        (true, None) => return Err(HeadError::Coding),
        (false, Some(0) | None) => Framing::Done,
        (false, Some(n)) => Framing::Length(n),
    };
    let connection = tokens(&headers, CONNECTION);
    let keep_alive = version == Version::HTTP_11 && !connection.iter().any(|t| t == "close");
    let expect_continue = version == Version::HTTP_11
        && headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok(Some((Head { request, framing, keep_alive, expect_continue }, n)))
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Reads more into the buffer (growing it, at most to [`MAX_BUF`]); `false` at the end of
    /// the stream or on an error.
    async fn fill(&mut self) -> bool {
        if self.buf.capacity().saturating_sub(self.buf.len()) < 64 {
            let grow = self.buf.capacity().clamp(FIRST_READ, MAX_BUF);
            self.buf.reserve(grow);
        }
        matches!(self.io.read_buf(&mut self.buf).await, Ok(n) if n > 0)
    }

    /// The next request's head, or `Ok(None)` when the client closed between requests.
    async fn read_head(&mut self) -> Result<Option<Head>, HeadError> {
        loop {
            if let Some(end) = head_end(&self.buf, self.scanned) {
                match parse_head(self.buf.get(..end).unwrap_or_default())? {
                    Some((head, n)) => {
                        self.buf.advance(n);
                        self.scanned = 0;
                        return Ok(Some(head));
                    }
                    // Empty lines before the request line: look past them.
                    None => {
                        self.scanned = end;
                        continue;
                    }
                }
            }
            self.scanned = self.buf.len();
            if self.buf.len() >= MAX_BUF {
                return Err(HeadError::TooLarge);
            }
            if !self.fill().await {
                return if self.buf.iter().all(u8::is_ascii_whitespace) {
                    Ok(None)
                } else {
                    Err(HeadError::Gone)
                };
            }
        }
    }

    async fn read_body(&mut self, max: usize) -> Result<Bytes, BodyError> {
        if self.body == Framing::Done {
            return Ok(Bytes::new());
        }
        if let Framing::Length(n) = self.body
            && n > max as u64
        {
            return Err(BodyError::TooLarge);
        }
        if self.expect_continue {
            self.expect_continue = false;
            if self.buf.is_empty() {
                let sent = self.io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_ok();
                if !sent || self.io.flush().await.is_err() {
                    self.body = Framing::Lost;
                    return Err(BodyError::Broken);
                }
            }
        }
        let framing = std::mem::replace(&mut self.body, Framing::Lost);
        let body = match framing {
            Framing::Length(n) => self.take(usize::try_from(n).unwrap_or(usize::MAX)).await?,
            Framing::Chunked => self.read_chunked(max).await?,
            Framing::Done | Framing::Lost => return Err(BodyError::Broken),
        };
        self.body = Framing::Done;
        if self.buf.is_empty() {
            // Nothing held while the handler waits with the body it read.
            self.buf = BytesMut::new();
        }
        Ok(body)
    }

    /// The next `n` bytes of the stream.
    async fn take(&mut self, n: usize) -> Result<Bytes, BodyError> {
        if self.buf.len() >= n {
            let b = Bytes::copy_from_slice(self.buf.get(..n).unwrap_or_default());
            self.buf.advance(n);
            return Ok(b);
        }
        let mut out = Vec::with_capacity(n);
        out.extend_from_slice(&self.buf);
        self.buf.clear();
        while out.len() < n {
            let mut limited = (&mut self.io).take((n.saturating_sub(out.len())) as u64);
            match limited.read_buf(&mut out).await {
                Ok(got) if got > 0 => {}
                _ => return Err(BodyError::Broken),
            }
        }
        Ok(Bytes::from(out))
    }

    /// The next line (through its `\n`), at most [`MAX_BUF`] bytes.
    async fn line(&mut self) -> Result<BytesMut, BodyError> {
        let mut from = 0;
        loop {
            if let Some(at) = self.buf.get(from..).and_then(|b| b.iter().position(|&c| c == b'\n')) {
                return Ok(self.buf.split_to(from.saturating_add(at).saturating_add(1)));
            }
            from = self.buf.len();
            if from >= MAX_BUF || !self.fill().await {
                return Err(BodyError::Broken);
            }
        }
    }

    async fn read_chunked(&mut self, max: usize) -> Result<Bytes, BodyError> {
        let mut out = Vec::new();
        loop {
            let line = self.line().await?;
            let size = match httparse::parse_chunk_size(&line) {
                Ok(httparse::Status::Complete((_, size))) => size,
                _ => return Err(BodyError::Broken),
            };
            if size == 0 {
                // Trailer fields, ignored, up to the empty line.
                loop {
                    let l = self.line().await?;
                    if l.as_ref() == b"\r\n" || l.as_ref() == b"\n" {
                        return Ok(Bytes::from(out));
                    }
                }
            }
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if size > max.saturating_sub(out.len()) {
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&self.take(size).await?);
            let end = self.line().await?;
            if end.as_ref() != b"\r\n" && end.as_ref() != b"\n" {
                return Err(BodyError::Broken);
            }
        }
    }

    /// Skips a body the handler did not read if it is all in the buffer already; `false` if
    /// the connection cannot be reused.
    fn skip_unread_body(&mut self) -> bool {
        match self.body {
            Framing::Done => true,
            Framing::Length(n) if (self.buf.len() as u64) >= n => {
                self.buf.advance(usize::try_from(n).unwrap_or(usize::MAX));
                self.body = Framing::Done;
                true
            }
            _ => false,
        }
    }

    /// Writes `bytes` whole within the write timeout; `false` if the connection cannot be used
    /// any more.
    async fn write(&mut self, bytes: &[u8]) -> bool {
        let io = &mut self.io;
        let whole = async move { io.write_all(bytes).await.is_ok() && io.flush().await.is_ok() };
        matches!(tokio::time::timeout(self.write_timeout, whole).await, Ok(true))
    }
}

/// The answer's bytes: status line, the response's fields, `content-length`, `date`, and
/// `connection: close` when the connection ends after it; no body for `HEAD`.
fn encode(response: &Response<Bytes>, head_only: bool, close: bool) -> Vec<u8> {
    let status = response.status();
    let body = response.body();
    let mut out = Vec::with_capacity(128usize.saturating_add(body.len()));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in response.headers() {
        if name == CONTENT_LENGTH || name == http::header::DATE || (name == CONNECTION && close) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // 1xx, 204 and 304 carry no body, and 1xx and 204 no length either (RFC 9110 §8.6).
    let bodiless =
        status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    if !bodiless {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only && !bodiless {
        out.extend_from_slice(body);
    }
    out
}

fn refusal(status: StatusCode) -> Response<Bytes> {
    let mut r = Response::new(Bytes::new());
    *r.status_mut() = status;
    r
}

/// What answers each request of a [`serve`] connection.
pub trait Handler<S>: Sync {
    /// The answer to `req`; it may read the body ([`ReadWhole`]) or leave it.
    fn call<'a>(&'a self, req: Request<Body<'a, S>>) -> impl Future<Output = Response<Bytes>> + Send + 'a;
}

/// Serves requests on `io` until the client closes, a head fails or idles past `head_timeout`,
/// an answer is not taken within `head_timeout` (a client that stops reading), or an answer
/// says `Connection: close`.
pub async fn serve<S, H>(io: S, head_timeout: Duration, handler: H)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    H: Handler<S>,
{
    let mut conn = Conn {
        io,
        buf: BytesMut::new(),
        scanned: 0,
        body: Framing::Done,
        expect_continue: false,
        write_timeout: head_timeout,
    };
    loop {
        let head = match tokio::time::timeout(head_timeout, conn.read_head()).await {
            Ok(Ok(Some(head))) => head,
            Ok(Ok(None)) | Err(_) => return,
            Ok(Err(e)) => {
                if let Some(status) = e.status() {
                    let _ = conn.write(&encode(&refusal(status), false, true)).await;
                }
                return;
            }
        };
        conn.body = head.framing;
        conn.expect_continue = head.expect_continue;
        let head_only = head.request.method() == Method::HEAD;
        let (parts, ()) = head.request.into_parts();
        if conn.buf.is_empty() {
            // Nothing held while the handler waits.
            conn.buf = BytesMut::new();
        }
        let response = handler.call(Request::from_parts(parts, Body { conn: &mut conn })).await;
        let asked_close = tokens(response.headers(), CONNECTION).iter().any(|t| t == "close");
        let close = !head.keep_alive || asked_close || !conn.skip_unread_body();
        if !conn.write(&encode(&response, head_only, close)).await || close {
            return;
        }
        if conn.buf.is_empty() {
            conn.buf = BytesMut::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_its_first_empty_line_whatever_the_line_endings() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", 0), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nrest", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r", 0), None);
        // Found again when the search resumes just before the blank line came in.
        let whole = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for from in 0..whole.len() {
            assert_eq!(head_end(whole, from), Some(whole.len()), "from {from}");
        }
        // Not found again once searched past.
        assert_eq!(head_end(b"\n\nGET", 2), None);
        assert_eq!(head_end(b"\n\n\nGET", 2), Some(3));
    }

    #[test]
    fn framing_follows_rfc_9112_and_refuses_smuggling() {
        let framing = |h: &str| {
            parse_head(format!("POST /r HTTP/1.1\r\nHost: a\r\n{h}\r\n").as_bytes())
                .map(|r| r.unwrap().0.framing)
        };
        assert_eq!(framing("Content-Length: 12\r\n").ok(), Some(Framing::Length(12)));
        assert_eq!(framing("Content-Length: 12\r\nContent-Length: 12\r\n").ok(), Some(Framing::Length(12)));
        assert_eq!(framing("").ok(), Some(Framing::Done));
        assert_eq!(framing("Transfer-Encoding: Chunked\r\n").ok(), Some(Framing::Chunked));
        assert!(matches!(framing("Content-Length: 12\r\nContent-Length: 13\r\n"), Err(HeadError::Malformed)));
        assert!(matches!(framing("Content-Length: -1\r\n"), Err(HeadError::Malformed)));
        assert!(matches!(framing("Content-Length: +1\r\n"), Err(HeadError::Malformed)));
        assert!(matches!(framing("Content-Length: 99999999999999999999\r\n"), Err(HeadError::Malformed)));
        assert!(matches!(
            framing("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"),
            Err(HeadError::Malformed)
        ));
        assert!(matches!(framing("Transfer-Encoding: gzip, chunked\r\n"), Err(HeadError::Coding)));
        assert!(matches!(framing("Transfer-Encoding: chunked, gzip\r\n"), Err(HeadError::Coding)));
        let http10 = parse_head(b"POST /r HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(http10, Err(HeadError::Malformed)));
    }

    /// Reads the body within 64 bytes and answers with the method, the path and the body (or why
    /// it could not be read); `/close` answers with `Connection: close`.
    struct Echo;

    impl<S: AsyncRead + AsyncWrite + Unpin + Send> Handler<S> for Echo {
        async fn call<'a>(&'a self, req: Request<Body<'a, S>>) -> Response<Bytes> {
            let (parts, body) = req.into_parts();
            let text = match body.read_whole(64).await {
                Ok(b) => format!("{} {} {:?}", parts.method, parts.uri.path(), String::from_utf8_lossy(&b)),
                Err(e) => format!("{e:?}"),
            };
            let mut r = Response::new(Bytes::from(text));
            if parts.uri.path() == "/close" {
                r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
    }

    /// Answers with the body as it was sent.
    struct Mirror;

    impl<S: AsyncRead + AsyncWrite + Unpin + Send> Handler<S> for Mirror {
        async fn call<'a>(&'a self, req: Request<Body<'a, S>>) -> Response<Bytes> {
            Response::new(req.into_body().read_whole(64).await.unwrap_or_default())
        }
    }

    /// Answers with the path, leaving the body unread.
    struct PathOnly;

    impl<S: Send> Handler<S> for PathOnly {
        async fn call<'a>(&'a self, req: Request<Body<'a, S>>) -> Response<Bytes> {
            Response::new(Bytes::from(req.uri().path().to_owned()))
        }
    }

    /// Runs `serve` over an in-memory stream with `input` written then shut, returns the output.
    async fn exchange(input: &[u8]) -> String {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let conn = tokio::spawn(serve(server, Duration::from_secs(2), Echo));
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        conn.await.unwrap();
        String::from_utf8(out).unwrap()
    }

    fn bodies(out: &str) -> Vec<&str> {
        out.split("HTTP/1.1 ").skip(1).map(|a| a.split("\r\n\r\n").nth(1).unwrap_or_default()).collect()
    }

    #[test]
    fn an_answer_carries_its_length_and_date_and_a_204_neither_length_nor_body() {
        let mut r = Response::new(Bytes::from_static(b"{}"));
        r.headers_mut().insert("wary-verdict", HeaderValue::from_static("ok"));
        let text = String::from_utf8(encode(&r, false, false)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\nwary-verdict: ok\r\ncontent-length: 2\r\ndate: "),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n{}"), "{text}");
        let head = String::from_utf8(encode(&r, true, true)).unwrap();
        assert!(
            head.contains("content-length: 2\r\n") && head.ends_with("connection: close\r\n\r\n"),
            "{head}"
        );
        *r.status_mut() = StatusCode::NO_CONTENT;
        let text = String::from_utf8(encode(&r, false, false)).unwrap();
        assert!(!text.contains("content-length") && text.ends_with("GMT\r\n\r\n"), "{text}");
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_with_their_bodies() {
        let out = exchange(
            b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nonePOST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\ntw\r\n1;ext=1\r\no\r\n0\r\nTrailer: x\r\n\r\nGET /c HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await;
        assert_eq!(bodies(&out), ["POST /a \"one\"", "POST /b \"two\"", "GET /c \"\""], "{out}");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert_eq!(out.matches("\r\ndate: ").count(), 3, "{out}");
        assert_eq!(out.matches("connection: close").count(), 0, "{out}");
    }

    #[tokio::test]
    async fn close_http_1_0_and_a_malformed_head_end_the_connection() {
        let out =
            exchange(b"GET /close HTTP/1.1\r\nHost: a\r\n\r\nGET /never HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(bodies(&out), ["GET /close \"\""], "{out}");
        assert!(out.contains("connection: close\r\n"), "{out}");
        let out = exchange(b"GET /a HTTP/1.0\r\n\r\nGET /never HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(bodies(&out).len(), 1, "{out}");
        let out = exchange(
            b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\nGET /never HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await;
        assert_eq!(bodies(&out).len(), 1, "{out}");
        let out = exchange(
            b"GET /a HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\nGET /never HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
        assert_eq!(bodies(&out).len(), 1, "{out}");
        let out = exchange(b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 501 "), "{out}");
    }

    #[tokio::test]
    async fn an_http_1_1_head_without_one_host_is_400_and_the_connection_closed() {
        for head in ["GET /a HTTP/1.1\r\n", "GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n"] {
            let out = exchange(format!("{head}\r\nGET /never HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes()).await;
            assert!(out.starts_with("HTTP/1.1 400 ") && out.contains("connection: close\r\n"), "{out}");
            assert_eq!(bodies(&out).len(), 1, "{out}");
        }
        // HTTP/1.0 has no such rule.
        let out = exchange(b"GET /a HTTP/1.0\r\n\r\n").await;
        assert_eq!(bodies(&out), ["GET /a \"\""], "{out}");
    }

    #[tokio::test]
    async fn bodies_over_the_limit_or_cut_short_are_refused_and_the_connection_closed() {
        let out = exchange(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\n").await;
        assert_eq!(bodies(&out), ["TooLarge"], "{out}");
        assert!(out.contains("connection: close"), "{out}");
        let out = exchange(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nshort").await;
        assert_eq!(bodies(&out), ["Broken"], "{out}");
        let big = format!(
            "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n{}\r\n0\r\n\r\n",
            "x".repeat(65)
        );
        let out = exchange(big.as_bytes()).await;
        assert_eq!(bodies(&out), ["TooLarge"], "{out}");
        let out = exchange(b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").await;
        assert_eq!(bodies(&out), ["Broken"], "{out}");
    }

    #[tokio::test]
    async fn a_head_past_the_buffer_is_431_and_a_trickle_within_it_is_parsed_once() {
        let huge = format!("GET /a HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n", "p".repeat(MAX_BUF));
        let out = exchange(huge.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        // Empty lines before the request line are skipped (RFC 9112 §2.2).
        let out = exchange(b"\r\n\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(bodies(&out), ["GET /a \"\""], "{out}");
        let out = exchange(b"\n\n\nGET /a HTTP/1.1\nHost: a\n\n").await;
        assert_eq!(bodies(&out), ["GET /a \"\""], "{out}");
    }

    #[tokio::test]
    async fn once_the_head_and_body_are_read_the_connection_holds_no_buffer() {
        let (mut client, server) = tokio::io::duplex(4096);
        let mut conn = Conn {
            io: server,
            buf: BytesMut::new(),
            scanned: 0,
            body: Framing::Done,
            expect_continue: false,
            write_timeout: Duration::from_secs(2),
        };
        client.write_all(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody").await.unwrap();
        let head = conn.read_head().await.ok().flatten().unwrap();
        assert_eq!(conn.buf.as_ref(), b"body", "the body came in with the head");
        conn.body = head.framing;
        assert_eq!(conn.read_body(64).await, Ok(Bytes::from_static(b"body")));
        assert_eq!(conn.buf.capacity(), 0);
        // A pipelined request's bytes are kept.
        client.write_all(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbodyGET").await.unwrap();
        let head = conn.read_head().await.ok().flatten().unwrap();
        conn.body = head.framing;
        assert_eq!(conn.read_body(64).await, Ok(Bytes::from_static(b"body")));
        assert_eq!(conn.buf.as_ref(), b"GET");
    }

    #[tokio::test]
    async fn expect_100_continue_is_answered_when_the_body_is_read() {
        let (mut client, server) = tokio::io::duplex(4096);
        tokio::spawn(serve(server, Duration::from_secs(2), Mirror));
        client
            .write_all(b"POST /a HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
            .await
            .unwrap();
        let mut got = [0u8; 25];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"HTTP/1.1 100 Continue\r\n\r\n");
        client.write_all(b"hi").await.unwrap();
        let mut out = vec![0u8; 512];
        let n = client.read(&mut out).await.unwrap();
        let out = String::from_utf8_lossy(&out[..n]);
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\nhi"), "{out}");
    }

    #[tokio::test]
    async fn an_unread_body_in_the_buffer_is_skipped_and_the_connection_kept() {
        let (mut client, server) = tokio::io::duplex(4096);
        tokio::spawn(serve(server, Duration::from_secs(2), PathOnly));
        client
            .write_all(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let mut buf = [0u8; 512];
        while out.matches("HTTP/1.1").count() < 2 {
            let n = client.read(&mut buf).await.unwrap();
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert_eq!(bodies(&out), ["/a", "/b"], "{out}");
        // The second body was not in the buffer when /b was answered: that closed the connection.
        assert!(
            out.contains("connection: close") && !out.split("HTTP/1.1 ").nth(1).unwrap().contains("close"),
            "{out}"
        );
        let _ = client.write_all(b"hello").await;
        assert_eq!(client.read(&mut buf).await.unwrap_or(0), 0);
    }

    #[tokio::test]
    async fn a_head_that_trickles_or_idles_past_the_timeout_is_closed_without_an_answer() {
        let limit = Duration::from_millis(200);
        let (mut client, server) = tokio::io::duplex(4096);
        let conn = tokio::spawn(serve(server, limit, PathOnly));
        for b in b"GET /a HTTP/1.1\r\nHost: a\r\nX: " {
            let _ = client.write_all(&[*b]).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut buf = [0u8; 64];
        assert_eq!(client.read(&mut buf).await.unwrap(), 0, "no answer, closed");
        conn.await.unwrap();
        // Idle after an answer: closed once the next head does not come.
        let (mut client, server) = tokio::io::duplex(4096);
        let conn = tokio::spawn(serve(server, limit, PathOnly));
        client.write_all(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n") && out.ends_with(b"/a"), "{out:?}");
        conn.await.unwrap();
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_its_answers_is_closed_after_the_timeout() {
        // Room for a few answers only; the client pipelines many requests and reads nothing.
        let limit = Duration::from_millis(300);
        let (mut client, server) = tokio::io::duplex(256);
        let conn = tokio::spawn(serve(server, limit, PathOnly));
        let requests = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n".repeat(40);
        let writer = tokio::spawn(async move {
            let _ = client.write_all(&requests).await;
            client
        });
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(30), conn)
            .await
            .expect("the connection is still held by a client that does not read")
            .unwrap();
        let held = started.elapsed();
        assert!(held >= limit, "closed after {held:?}, before the timeout");
        // What the client can still read is whole answers, fewer than it asked for.
        let mut client = writer.await.unwrap();
        let mut out = Vec::new();
        let _ = client.read_to_end(&mut out).await;
        let answers = out.windows(17).filter(|w| w == b"HTTP/1.1 200 OK\r\n").count();
        assert!((1..40).contains(&answers), "{answers} answers");
    }
}
