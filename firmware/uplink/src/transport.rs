//! The seam between the uplink and the wire: a [`Transport`] carries readings to the cloud and
//! says, per reading, what came back; the uplink's loop, the wary runner, the outbox and the
//! ledger never see which protocol did it.
//!
//! A transport has a connection's life and a batch size:
//!
//! - [`Transport::open`] makes (or keeps) the connection or session an exchange needs; it is
//!   called at the start of every attempt, so a transport reuses what it has open (an HTTP
//!   keep-alive connection, an MQTT session) and opens again only after a close or a failure.
//! - [`Transport::send`] is one exchange: up to [`Transport::BATCH`] messages, each with its
//!   own idempotency key, each answered ([`Answer`]) in order. Exactly one request per
//!   message: a transport never retries, the runner decides.
//! - [`Transport::close`] ends it: the uplink calls it at the end of every round.
//!
//! Every transport fills the same table: a reply the server sent is an [`Answer`] of `Ok`
//! ([`Reply`]: a status and the server's Retry-After values and `Date`, classified by the
//! core under the policy's Retry-After rules in the uplink's loop, one place for the device);
//! a failed exchange is a wary [`Failure`] named by whether the message may have reached the
//! server.
//!
//! [`Http`] is HTTP per reading: one HTTP/1.1 `POST` per message through an `embassy-net`
//! stack, whatever link is under the stack (Ethernet, PPP over a cellular modem, Wi-Fi), over
//! one connection kept across attempts and readings (see [`Http`] for when it ends and how a
//! write onto a connection the server closed is classified), plain or inside a TLS session,
//! one message per exchange unless batches are on (below). A failed exchange maps
//! ([`failure`]) by what it says about whether the request may have reached the server:
//!
//! | exchange result | answer | why |
//! |---|---|---|
//! | any status | `Ok(reply)`: 2xx lands; the core's table decides the rest, with `Retry-After` read against the reply's `Date` | the server answered |
//! | no network, no route, refused | `Refused` | never sent: safe to send again |
//! | connect or TLS handshake timed out | `ConnectTimeout` | never sent |
//! | connection broke during the TLS handshake | `Refused` | never sent: the request waits for the handshake |
//! | TLS handshake refused (server not authenticated by the pinned CA) | `Tls` | the same every time: the call fails |
//! | broke before the whole request was handed to TCP | `Refused` | the server holds at most a prefix it cannot act on |
//! | reset, closed, cut short, garbage, header block too big | `Reset` | may have landed: resent only with its key |
//! | no reply in time | `ResponseTimeout` | may have landed |
//! | the request cannot be encoded | `BadBody` | our own bug: no resend can fix it, so the call fails |
//!
//! **Batches** (off by default; [`Http::batches`], over plain HTTP as over TLS): up to
//! [`MAX_BATCH`] messages in one `POST` to the receiver's batch endpoint, a JSON array of
//! `[key, body]` pairs, answered by one status per message, in order (docs/batches.md). Each
//! message's answer is read from its place in that array exactly as the status of a request of
//! its own would be:
//!
//! | batch exchange result | each message's answer |
//! |---|---|
//! | 200 with one entry per message | `Ok(reply)` with that entry's status (and its Retry-After, seconds) |
//! | 200 whose body is not such an array, or has another count | `Reset`: the items may have landed |
//! | 400, 404, 405, 413, 415 or 501 (the receiver does not take this batch or batches at all) | `Refused`: nothing was applied; the transport sends one message per request from then on |
//! | any other status (401, 403, 429, 503, …) | `Ok(reply)`: that status for every message, as a single request would have got it |
//! | the exchange failed | the failure, by the table above, for every message |
//!
//! firmware/README.md sketches how an MQTT or CoAP transport fills the same table.

use core::net::SocketAddrV4;

use embassy_net::Stack;
use embassy_net::tcp::{State, TcpSocket};
use embassy_time::Instant;
use embedded_io_async::{Read, Write};
use wary::{
    Duration, Failure, Outcome,
    retry_after::{Reading, Rules},
};

use crate::http::{self, Buffers, HttpError, Post, Response};
use crate::identity::Credential;

/// The most messages a transport puts in one batch.
pub const MAX_BATCH: usize = 16;

/// The largest batch answer kept: sixteen `[503,86400]` entries fit.
pub(crate) const ANSWER_LEN: usize = 256;

/// A batch's body, written piece by piece from the messages (no copy of it is held):
/// `[["<key>",<body>],…]`.
pub(crate) struct BatchBody<'m, 'b>(pub(crate) &'m [Message<'b>]);

impl BatchBody<'_, '_> {
    /// Every key is visible ASCII with no `"` or `\`, so it stands in a JSON string as it is.
    pub(crate) fn valid(&self) -> bool {
        !self.0.is_empty()
            && self.0.iter().all(|m| {
                !m.key.is_empty() && m.key.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            })
    }

    pub(crate) fn content_length(&self) -> usize {
        let items: usize =
            self.0.iter().map(|m| m.key.len().saturating_add(m.body.len()).saturating_add(5)).sum();
        items.saturating_add(2).saturating_add(self.0.len().saturating_sub(1))
    }
}

impl reqwless::request::RequestBody for BatchBody<'_, '_> {
    fn len(&self) -> Option<usize> {
        Some(self.content_length())
    }

    async fn write<W: embedded_io_async::Write>(&self, w: &mut W) -> Result<(), W::Error> {
        w.write_all(b"[").await?;
        for (n, m) in self.0.iter().enumerate() {
            if n > 0 {
                w.write_all(b",").await?;
            }
            w.write_all(b"[\"").await?;
            w.write_all(m.key.as_bytes()).await?;
            w.write_all(b"\",").await?;
            w.write_all(m.body).await?;
            w.write_all(b"]").await?;
        }
        w.write_all(b"]").await
    }
}

/// Reads a batch answer, `[201,[503,2],…]`, into `answers` (one entry each, in order): each a
/// reply with the entry's status and, for a pair, its Retry-After in seconds. `false` if the
/// body is not such an array or its count differs.
pub fn read_batch_answer(body: &[u8], answers: &mut [Answer]) -> bool {
    let mut at = 0usize;
    let mut filled = 0usize;
    let skip_ws = |at: &mut usize| {
        while body.get(*at).is_some_and(u8::is_ascii_whitespace) {
            *at = at.saturating_add(1);
        }
    };
    let number = |at: &mut usize| -> Option<(u32, usize, usize)> {
        let start = *at;
        let mut n = 0u32;
        while let Some(d) = body.get(*at).filter(|b| b.is_ascii_digit()) {
            n = n.checked_mul(10)?.checked_add(u32::from(d.saturating_sub(b'0')))?;
            *at = at.saturating_add(1);
        }
        (*at > start).then_some((n, start, *at))
    };
    let expect = |at: &mut usize, byte: u8| -> bool {
        if body.get(*at) == Some(&byte) {
            *at = at.saturating_add(1);
            true
        } else {
            false
        }
    };
    skip_ws(&mut at);
    if !expect(&mut at, b'[') {
        return false;
    }
    loop {
        skip_ws(&mut at);
        if filled == 0 && expect(&mut at, b']') {
            break;
        }
        let pair = expect(&mut at, b'[');
        skip_ws(&mut at);
        let Some((status, _, _)) = number(&mut at) else { return false };
        let mut reply = Response {
            status: u16::try_from(status).unwrap_or(0),
            retry_after: heapless::Vec::new(),
            retry_after_dropped: 0,
            date: None,
            date_dropped: false,
            body_complete: true,
        };
        if pair {
            skip_ws(&mut at);
            if !expect(&mut at, b',') {
                return false;
            }
            skip_ws(&mut at);
            let Some((_, from, to)) = number(&mut at) else { return false };
            let digits = body.get(from..to).unwrap_or(&[]);
            if heapless::Vec::from_slice(digits).ok().and_then(|v| reply.retry_after.push(v).ok()).is_none() {
                reply.retry_after_dropped = 1;
            }
            skip_ws(&mut at);
            if !expect(&mut at, b']') {
                return false;
            }
        }
        if !(200..=999).contains(&reply.status) {
            return false;
        }
        let Some(slot) = answers.get_mut(filled) else { return false };
        *slot = Ok(reply);
        filled = filled.saturating_add(1);
        skip_ws(&mut at);
        if expect(&mut at, b']') {
            break;
        }
        if !expect(&mut at, b',') {
            return false;
        }
    }
    skip_ws(&mut at);
    at == body.len() && filled == answers.len()
}

/// Whether a whole batch's status says the receiver does not take it (the endpoint is missing,
/// the batch too large, its format not understood), before any item was applied.
const fn batch_refused(status: u16) -> bool {
    matches!(status, 400 | 404 | 405 | 413 | 415 | 501)
}

/// One reading as a transport sends it.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    /// The idempotency key, 32 lowercase hex digits, the same on every attempt of the reading.
    pub key: &'a str,
    /// The reading's JSON body.
    pub body: &'a [u8],
}

/// What the server answered to one message: its status and its Retry-After values and
/// `Date`, raw. A transport other than HTTP writes its protocol's answer in these terms.
pub type Reply = Response;

/// How one message fared in an exchange: the server's reply, or the failure of the exchange.
pub type Answer = Result<Reply, Failure>;

/// Carries readings to the cloud; see the module docs for the life of its connection.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// The most messages one [`send`](Transport::send) carries (at least 1).
    const BATCH: usize = 1;

    /// How many messages the next [`send`](Transport::send) should carry in one exchange now,
    /// 1..=[`BATCH`](Transport::BATCH): a transport whose batches are off, or whose receiver
    /// refused one, says 1.
    fn batch_limit(&self) -> usize {
        Self::BATCH
    }

    /// Makes the connection or session an exchange needs, or keeps the one open. Called at the
    /// start of every attempt, with the attempt's `limit`, which the following
    /// [`send`](Transport::send) gets too: a transport that spends time here takes it off the
    /// exchange's. A transport that connects per exchange has nothing to do here.
    ///
    /// # Errors
    ///
    /// The attempt's failure, by the table in the module docs (nothing was sent).
    async fn open(&mut self, limit: Duration) -> Result<(), Failure> {
        let _ = limit;
        Ok(())
    }

    /// One exchange: sends each of `messages` (at most [`BATCH`](Transport::BATCH)) once and
    /// writes how each fared into the same place of `answers`, within `limit` overall.
    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration);

    /// Ends the connection or session: after every round, and whenever the transport itself
    /// finds it unusable.
    async fn close(&mut self) {}

    /// The device holds `held` dead letters and has dropped `dropped` over its life: a transport
    /// that can carry the count sends it on every exchange from now on while either is above
    /// zero (HTTP: the [`http::DEAD_LETTERS`] header). The others ignore it.
    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        let _ = (held, dropped);
    }
}

impl<T: Transport + ?Sized> Transport for &mut T {
    const BATCH: usize = T::BATCH;

    fn batch_limit(&self) -> usize {
        (**self).batch_limit()
    }

    async fn open(&mut self, limit: Duration) -> Result<(), Failure> {
        (**self).open(limit).await
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        (**self).send(messages, answers, limit).await;
    }

    async fn close(&mut self) {
        (**self).close().await;
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        (**self).report_dead_letters(held, dropped);
    }
}

/// The outcome of one message's answer, a reply read by [`Outcome::from_response`] with the
/// policy's Retry-After `rules`, and the [`Reading`] of its Retry-After values (default for a
/// failed exchange).
///
/// A reply's `Retry-After` is measured against its own `Date` header (a device has no wall
/// clock): a date the server gave in the past means "now". A value that cannot be read under
/// `rules` is ignored (and counted in the reading) and the backoff alone decides.
pub fn outcome(answer: &Answer, rules: &Rules) -> (Outcome, Reading) {
    match answer {
        Ok(reply) => {
            let values = reply.retry_after.iter().map(|v| v.as_slice());
            Outcome::from_response(reply.status, values, reply.date.as_deref(), None, rules)
        }
        Err(failure) => ((*failure).into(), Reading::default()),
    }
}

/// What a failed exchange means for the request; see the table in the module docs.
pub const fn failure(err: HttpError) -> Failure {
    match err {
        HttpError::NoNetwork | HttpError::NoRoute | HttpError::Refused | HttpError::SendFailed => {
            Failure::Refused
        }
        HttpError::ConnectTimeout | HttpError::HandshakeTimeout => Failure::ConnectTimeout,
        HttpError::HandshakeBroken => Failure::Refused,
        HttpError::Tls => Failure::Tls,
        HttpError::BadRequest => Failure::BadBody,
        HttpError::ResponseTimeout => Failure::ResponseTimeout,
        HttpError::Reset
        | HttpError::Closed
        | HttpError::Truncated
        | HttpError::Malformed
        | HttpError::HeadersTooLarge => Failure::Reset,
    }
}

/// The answer of one HTTP exchange: the reply as it came, or its failure by [`failure`].
pub fn answer(result: Result<Response, HttpError>) -> Answer {
    result.map_err(failure)
}

/// How long a kept connection may idle before the transport closes it and opens a new one for
/// the next request: 4 s, under the idle timeouts of common servers (Node's 5 s, nginx's 75 s,
/// Apache's 5 s), so the device does not write onto a connection the server is about to close.
pub const IDLE_LIMIT: embassy_time::Duration = embassy_time::Duration::from_secs(4);

/// Keyed writes as HTTP/1.1 `POST`s to one server through an `embassy-net` stack, over one
/// connection kept across attempts and readings (HTTP/1.1 persistent connections), or one
/// connection per request ([`Http::connection_per_request`]). What carries the connection is
/// `C` ([`Carrier`]): the socket alone ([`HttpTransport`]) or a TLS session on it
/// (`tls::TlsTransport`, whose session lives exactly as long as its connection). Everything
/// below holds for both.
///
/// The connection is opened by [`Transport::open`] when there is none, and ends (and the next
/// `open` makes a new one) when: the server's reply says so (`Connection: close`, HTTP/1.0, or
/// a body that runs to the connection's end), the reply's body was not read to its framed end,
/// an exchange failed, the server's FIN or RST was seen, unread bytes wait on it, it idled past
/// the limit ([`IDLE_LIMIT`] by default), or the uplink closed it ([`Transport::close`]).
///
/// **A request written on a kept connection the server had already closed** (the
/// reused-connection race) is classified by what left:
///
/// | what the device saw | counted as | answer | a keyed write | an unkeyed write |
/// |---|---|---|---|---|
/// | the server's FIN or RST before writing | [`Counts::stale_before_write`] | none: a new connection carries the request in the same attempt | sent once, on the new connection | the same |
/// | the write failed (RST) before the whole request was handed to TCP | [`Counts::stale_unsent`] | `Refused` | resent: never sent whole | resent |
/// | the request left, then FIN or RST with no byte of reply | [`Counts::stale_maybe_landed`] | `Reset` | resent with its key: may have landed | ends `unknown`: may have landed |
///
/// The device does not try to prove that the server closed before reading (an ACK of the FIN
/// that does not cover the request would prove it, but embassy-net does not expose it), so the
/// third row stays "may have landed", as RFC 9112 9.3.1 requires for a request that is not
/// idempotent.
pub struct Http<'a, 's, C> {
    carrier: C,
    stack: Stack<'s>,
    server: SocketAddrV4,
    path: &'a str,
    head: &'a mut [u8],
    credential: Option<&'a Credential>,
    /// The dead letters' report, sent on every request while the device has any.
    dead_letters: Option<heapless::String<40>>,
    counts: Counts,
    /// The kept connection's bookkeeping.
    keep: KeepAlive,
    /// The end of the attempt `open` was called for, which `send` shares.
    deadline: Option<Instant>,
    /// The batch endpoint and the most messages a batch carries, when batches are on.
    batch: Option<(&'a str, usize)>,
    /// The start of the last batch answer's body.
    answer: [u8; ANSWER_LEN],
}

/// Plain HTTP/1.1: [`Http`] on the socket alone.
pub type HttpTransport<'a, 's> = Http<'a, 's, Plain<'a>>;

/// What carries [`Http`]'s requests over its TCP socket: the socket alone ([`Plain`]) or a TLS
/// session on it (`tls::Secure`). [`Http`] decides when a connection opens, carries a request
/// and ends, and counts it; a carrier does what differs between them.
#[allow(async_fn_in_trait)]
pub trait Carrier {
    /// The scheme, for the log.
    const SCHEME: &'static str;
    /// What a request is written to and its reply read from.
    type Stream<'x>: Read + Write
    where
        Self: 'x;

    /// Whether the open connection can carry a request: established, no FIN or RST from the
    /// server seen, no bytes waiting that nobody asked for.
    fn quiet(&mut self) -> bool;

    /// Opens a connection to `server` by `deadline`, with whatever runs on it before a request
    /// (a TLS handshake). Nothing of a request is sent; on failure nothing is left open.
    ///
    /// # Errors
    ///
    /// Why it could not be opened, by its phase (every one before the request).
    async fn connect(&mut self, server: SocketAddrV4, deadline: Instant) -> Result<(), HttpError>;

    /// The open connection's stream; `None` when none is open.
    fn stream(&mut self) -> Option<Self::Stream<'_>>;

    /// Ends the connection by `deadline` at the latest: cleanly (a FIN, after TLS's
    /// `close_notify`) after a clean answer, with an RST otherwise.
    async fn end(&mut self, clean: bool, deadline: Instant);

    /// The `Host` header's value: the server's address, or the name TLS authenticated.
    fn host(&self) -> &str;
}

/// The socket alone: plain HTTP/1.1 ([`HttpTransport`]).
pub struct Plain<'a> {
    socket: TcpSocket<'a>,
    /// The server's address as `Host` gives it: `255.255.255.255:65535` is 21 bytes.
    host: heapless::String<21>,
}

impl<'a> Carrier for Plain<'a> {
    const SCHEME: &'static str = "http";
    type Stream<'x>
        = http::Handed<'x, 'a>
    where
        Self: 'x;

    fn quiet(&mut self) -> bool {
        quiet(&self.socket)
    }

    async fn connect(&mut self, server: SocketAddrV4, deadline: Instant) -> Result<(), HttpError> {
        http::reconnect(&mut self.socket, server, deadline).await
    }

    fn stream(&mut self) -> Option<Self::Stream<'_>> {
        Some(http::Handed(&mut self.socket))
    }

    async fn end(&mut self, clean: bool, deadline: Instant) {
        http::finish(&mut self.socket, clean, deadline).await;
    }

    fn host(&self) -> &str {
        &self.host
    }
}

/// Whether a connection on `socket` is quiet: established, the server's FIN (close-wait) or
/// RST (closed) not seen, and no bytes waiting that nobody asked for.
pub(crate) fn quiet(socket: &TcpSocket<'_>) -> bool {
    socket.state() == State::Established && socket.may_send() && !socket.can_recv()
}

/// The life of a kept connection, the same for every carrier (plain HTTP, HTTPS): whether one
/// is open, when its last reply ended, how many requests it carried, and whether it may carry
/// the next one. The transport owns the connection and does the closing; this says when.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeepAlive {
    /// `None`: one connection per request (`Connection: close`).
    idle_limit: Option<embassy_time::Duration>,
    /// The kept connection: when its last reply ended, and how many requests it carried.
    kept: Option<Kept>,
}

#[derive(Clone, Copy, Debug)]
struct Kept {
    last_reply: Instant,
    requests: u32,
}

/// What [`KeepAlive::check`] found about the kept connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// No connection is open: the next request needs a new one.
    None,
    /// The kept connection can carry the next request.
    Usable,
    /// The server closed it (FIN or RST seen) or sent bytes nobody asked for: end it with an
    /// RST (counted as [`Counts::stale_before_write`]).
    Stale,
    /// It idled past the limit, or it carried its one request: end it cleanly (counted as
    /// [`Counts::idle_closed`] when idle).
    Idle,
}

impl KeepAlive {
    /// Keeps connections for at most `idle_limit` between requests; `None`: one connection per
    /// request.
    pub(crate) const fn new(idle_limit: Option<embassy_time::Duration>) -> Self {
        KeepAlive { idle_limit, kept: None }
    }

    /// Whether requests leave the connection open (no `Connection: close`).
    pub(crate) const fn keeps(&self) -> bool {
        self.idle_limit.is_some()
    }

    /// Whether a connection is open.
    pub(crate) const fn is_open(&self) -> bool {
        self.kept.is_some()
    }

    /// Whether the open connection carried a request before.
    pub(crate) fn is_reused(&self) -> bool {
        self.kept.is_some_and(|kept| kept.requests > 0)
    }

    /// Whether the kept connection, `quiet` or not ([`Carrier::quiet`]), can carry a request
    /// now, counting what ends it; the connection is forgotten unless it is [`Check::Usable`]
    /// (the caller ends it).
    pub(crate) fn check(&mut self, quiet: bool, counts: &mut Counts) -> Check {
        let Some(kept) = self.kept else { return Check::None };
        // One connection per request: a connection that carried one is not reused (it was
        // ended after its reply); a fresh one is the request's own.
        let idle_past = match self.idle_limit {
            Some(limit) => kept.last_reply.elapsed() > limit,
            None => kept.requests > 0,
        };
        // Anything but a clean, quiet, established connection: the server's FIN (close-wait),
        // its RST (closed), or bytes nobody asked for.
        if !quiet {
            counts.stale_before_write = counts.stale_before_write.saturating_add(1);
            self.kept = None;
            Check::Stale
        } else if idle_past {
            counts.idle_closed = counts.idle_closed.saturating_add(1);
            self.kept = None;
            Check::Idle
        } else {
            Check::Usable
        }
    }

    /// A new connection is open (counted by the caller when it connects).
    pub(crate) fn opened(&mut self) {
        self.kept = Some(Kept { last_reply: Instant::now(), requests: 0 });
    }

    /// The open connection carried a request whose reply left it `reusable` (false after any
    /// failure): it is kept, or forgotten (and the caller ends it). Returns whether it is kept.
    pub(crate) fn replied(&mut self, reusable: bool) -> bool {
        match self.kept.as_mut() {
            Some(kept) if self.idle_limit.is_some() && reusable => {
                kept.last_reply = Instant::now();
                kept.requests = kept.requests.saturating_add(1);
                true
            }
            _ => {
                self.kept = None;
                false
            }
        }
    }

    /// The connection ends (closed by the caller).
    pub(crate) fn forget(&mut self) {
        self.kept = None;
    }
}

/// What the transport saw, for the summary: counts only, never header text or payloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, defmt::Format)]
pub struct Counts {
    /// Exchanges started.
    pub exchanges: u32,
    /// Exchanges that got a status line and header block.
    pub replies: u32,
    /// Failures that may have landed (reply phase).
    pub maybe_landed: u32,
    /// Failures before the request was sent whole.
    pub never_sent: u32,
    /// Replies whose body did not end cleanly (the status still counts).
    pub bodies_cut: u32,
    /// Replies with `Retry-After` values too long or too many to keep.
    pub retry_after_dropped: u32,
    /// TCP connections opened (SYNs that got an answer or not).
    pub connects: u32,
    /// Requests sent on a connection that had carried one before.
    pub reused: u32,
    /// Kept connections closed by the device for idling past the limit.
    pub idle_closed: u32,
    /// Kept connections the server had closed, seen before a request was written on them.
    pub stale_before_write: u32,
    /// Requests on a kept connection whose write failed before the whole request left.
    pub stale_unsent: u32,
    /// Requests that left on a kept connection that then closed with no byte of reply.
    pub stale_maybe_landed: u32,
    /// Batch exchanges started (each also counts once in `exchanges`).
    pub batches: u32,
    /// Messages those batches carried.
    pub batch_items: u32,
}

impl Counts {
    /// Counts one exchange's result.
    pub fn record(&mut self, result: &Result<Response, HttpError>) {
        self.exchanges = self.exchanges.saturating_add(1);
        match result {
            Ok(reply) => {
                self.replies = self.replies.saturating_add(1);
                if !reply.body_complete {
                    self.bodies_cut = self.bodies_cut.saturating_add(1);
                }
                if reply.retry_after_dropped > 0 {
                    self.retry_after_dropped = self.retry_after_dropped.saturating_add(1);
                }
            }
            Err(err) if err.may_have_landed() => self.maybe_landed = self.maybe_landed.saturating_add(1),
            Err(_) => self.never_sent = self.never_sent.saturating_add(1),
        }
    }

    /// Counts a batch of `items` messages about to go as one exchange.
    pub fn record_batch(&mut self, items: usize) {
        self.batches = self.batches.saturating_add(1);
        self.batch_items = self.batch_items.saturating_add(u32::try_from(items).unwrap_or(u32::MAX));
    }

    /// Counts a request written on a kept connection that failed with `err`, by the
    /// reused-connection table of [`Http`]. Other failures are not the race.
    pub fn record_stale(&mut self, err: HttpError) {
        match err {
            HttpError::SendFailed => self.stale_unsent = self.stale_unsent.saturating_add(1),
            HttpError::Closed | HttpError::Reset => {
                self.stale_maybe_landed = self.stale_maybe_landed.saturating_add(1);
            }
            _ => {}
        }
    }

    /// Logs the `HTTP` line the host-side scenarios read: connection counts only.
    pub fn log(&self) {
        defmt::info!(
            "HTTP connects={=u32} exchanges={=u32} reused={=u32} idle_closed={=u32} stale_before_write={=u32} stale_unsent={=u32} stale_maybe_landed={=u32} batches={=u32} batch_items={=u32}",
            self.connects,
            self.exchanges,
            self.reused,
            self.idle_closed,
            self.stale_before_write,
            self.stale_unsent,
            self.stale_maybe_landed,
            self.batches,
            self.batch_items
        );
    }
}

impl<'a, 's: 'a> HttpTransport<'a, 's> {
    /// Posts to `path` on `server` through `stack`, keeping the connection for at most
    /// [`IDLE_LIMIT`] between requests. The transport holds one of the stack's sockets for its
    /// whole life.
    pub fn new<const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>(
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    ) -> Self {
        let (rx, tx, head) = buffers.parts();
        let mut host = heapless::String::new();
        // Every IPv4 address and port fit (see `Plain::host`).
        let _ = core::fmt::Write::write_fmt(&mut host, format_args!("{server}"));
        let carrier = Plain { socket: TcpSocket::new(stack, rx, tx), host };
        Http::with_carrier(carrier, stack, server, path, head)
    }
}

impl<'a, 's, C: Carrier> Http<'a, 's, C> {
    /// Posts to `path` on `server` through `stack` over `carrier`, with `head` for the request
    /// head and the reply's header block, keeping the connection for at most [`IDLE_LIMIT`]
    /// between requests.
    pub(crate) fn with_carrier(
        carrier: C,
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        head: &'a mut [u8],
    ) -> Self {
        Http {
            carrier,
            stack,
            server,
            path,
            head,
            credential: None,
            dead_letters: None,
            counts: Counts::default(),
            keep: KeepAlive::new(Some(IDLE_LIMIT)),
            deadline: None,
            batch: None,
            answer: [0; ANSWER_LEN],
        }
    }

    /// Sends up to `most` messages (at most [`MAX_BATCH`]) in one `POST` to `path`, the
    /// receiver's batch endpoint (docs/batches.md), whenever the uplink has that many due. Off
    /// by default: a receiver must take batches. Should it refuse one whole (the table in the
    /// module docs), the transport goes back to one message per request.
    #[must_use]
    pub fn batches(mut self, path: &'a str, most: usize) -> Self {
        self.batch = (most > 1).then_some((path, most.min(MAX_BATCH)));
        self
    }

    /// Sends `credential` as `Authorization: Bearer <token>` on every attempt (without this,
    /// no `Authorization` header); over TLS, inside the session.
    #[must_use]
    pub fn with_credential(mut self, credential: Option<&'a Credential>) -> Self {
        self.credential = credential;
        self
    }

    /// Keeps a connection for at most `limit` between requests (keep it under the server's
    /// own idle timeout).
    #[must_use]
    pub fn idle_limit(mut self, limit: embassy_time::Duration) -> Self {
        self.keep = KeepAlive::new(Some(limit));
        self
    }

    /// One connection per request (over TLS, a handshake per request), each with
    /// `Connection: close` (no keep-alive).
    #[must_use]
    pub fn connection_per_request(mut self) -> Self {
        self.keep = KeepAlive::new(None);
        self
    }

    /// What the transport saw so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Whether the kept connection can carry a request now; ends it (counted) when it cannot.
    async fn check_kept(&mut self) {
        let quiet = self.keep.is_open() && self.carrier.quiet();
        match self.keep.check(quiet, &mut self.counts) {
            Check::None | Check::Usable => {}
            Check::Stale => {
                defmt::info!("{=str}: the kept connection was closed by the server; a new one", C::SCHEME);
                self.end(false).await;
            }
            Check::Idle => self.end(true).await,
        }
    }

    /// Ends the connection: a FIN after a clean answer, an RST otherwise.
    async fn end(&mut self, clean: bool) {
        self.keep.forget();
        let deadline = Instant::now().saturating_add(http::CLOSE_GRACE);
        self.carrier.end(clean, deadline).await;
    }

    /// Makes sure a connection is open by `deadline`.
    async fn ensure_open(&mut self, deadline: Instant) -> Result<(), HttpError> {
        self.check_kept().await;
        if self.keep.is_open() {
            return Ok(());
        }
        if !self.stack.is_link_up() || self.stack.config_v4().is_none() {
            return Err(HttpError::NoNetwork);
        }
        self.counts.connects = self.counts.connects.saturating_add(1);
        self.carrier.connect(self.server, deadline).await?;
        self.keep.opened();
        Ok(())
    }

    /// One request on the open connection (opening one if there is none).
    async fn exchange(&mut self, message: &Message<'_>, deadline: Instant) -> Result<Response, HttpError> {
        self.ensure_open(deadline).await?;
        let request = Post {
            path: self.path,
            idempotency_key: message.key,
            body: message.body,
            credential: self.credential,
            dead_letters: self.dead_letters.as_deref(),
        };
        let host = self.carrier.host();
        // Nothing was written if encoding fails: the connection stays as it was.
        let head_len = http::encode_head_for(&request, host, !self.keep.keeps(), self.head).await?;
        self.round_trip(head_len, &message.body, false, deadline).await.map(|(reply, _)| reply)
    }

    /// One batch request to `path` on the open connection (opening one if there is none): the
    /// reply and how many bytes of its body the transport's `answer` holds.
    async fn exchange_batch(
        &mut self,
        path: &str,
        messages: &[Message<'_>],
        deadline: Instant,
    ) -> Result<(Response, usize), HttpError> {
        let body = BatchBody(messages);
        if !body.valid() {
            return Err(HttpError::BadRequest);
        }
        self.ensure_open(deadline).await?;
        let host = self.carrier.host();
        let close = !self.keep.keeps();
        let head_len = http::encode_batch_head(
            path,
            self.credential,
            self.dead_letters.as_deref(),
            host,
            body.content_length(),
            close,
            self.head,
        )
        .await?;
        self.round_trip(head_len, &body, true, deadline).await
    }

    /// Sends the encoded head and `body` on the open connection and reads the reply (keeping the
    /// start of its body when `keep_answer`), then keeps or ends the connection by the reply.
    async fn round_trip<B: reqwless::request::RequestBody>(
        &mut self,
        head_len: usize,
        body: &B,
        keep_answer: bool,
        deadline: Instant,
    ) -> Result<(Response, usize), HttpError> {
        let reused = self.keep.is_reused();
        if reused {
            self.counts.reused = self.counts.reused.saturating_add(1);
        }
        let answer: &mut [u8] = if keep_answer { &mut self.answer } else { &mut [] };
        let (result, reusable) = match self.carrier.stream() {
            Some(mut stream) => {
                http::send_and_read_keeping(&mut stream, head_len, body, self.head, answer, deadline).await
            }
            // `ensure_open` left a connection open; without one nothing was sent.
            None => (Err(HttpError::SendFailed), false),
        };
        if let (Err(err), true) = (&result, reused) {
            self.counts.record_stale(*err);
        }
        if !self.keep.replied(result.is_ok() && reusable) {
            self.carrier.end(result.is_ok(), deadline).await;
        }
        match &result {
            Ok((reply, _)) => defmt::debug!("{=str}: {} ({=bool} reused)", C::SCHEME, reply, reused),
            Err(err) => {
                defmt::debug!("{=str}: {} in phase {} ({=bool} reused)", C::SCHEME, err, err.phase(), reused);
            }
        }
        result
    }

    /// One batch exchange for `messages`, each answered by its place (the table in the module
    /// docs).
    async fn send_batch(
        &mut self,
        path: &str,
        messages: &[Message<'_>],
        answers: &mut [Answer],
        deadline: Instant,
    ) {
        self.counts.record_batch(messages.len());
        let result = self.exchange_batch(path, messages, deadline).await;
        if !settle_batch(
            &mut self.counts,
            result,
            &self.answer,
            answers.get_mut(..messages.len()).unwrap_or(&mut []),
        ) {
            self.batch = None;
        }
    }
}

/// Each message's answer from a batch exchange's `result` (the reply and how many bytes of its
/// body `kept` holds), by the batch table in the module docs, the exchange counted in `counts`.
/// Returns `false` when the receiver refused the batch whole (it takes no batches, or not this
/// one): the transport sends one message per request from then on.
pub(crate) fn settle_batch(
    counts: &mut Counts,
    result: Result<(Response, usize), HttpError>,
    kept: &[u8],
    answers: &mut [Answer],
) -> bool {
    counts.record(&result.as_ref().map(|(reply, _)| reply.clone()).map_err(|err| *err));
    let each = match result {
        Err(err) => Err(failure(err)),
        Ok((reply, len)) if reply.status == 200 => {
            let body = kept.get(..len).unwrap_or(&[]);
            if reply.body_complete && read_batch_answer(body, answers) {
                return true;
            }
            // Landed or not, item by item, is unknown: each may have.
            defmt::warn!("batch: an answer that does not answer each item");
            Err(Failure::Reset)
        }
        Ok((reply, _)) if batch_refused(reply.status) => {
            defmt::warn!(
                "batch: the receiver refused a batch ({=u16}): one reading per request from now on",
                reply.status
            );
            for slot in answers.iter_mut() {
                *slot = Err(Failure::Refused);
            }
            return false;
        }
        Ok((reply, _)) => Ok(reply),
    };
    for slot in answers.iter_mut() {
        *slot = each.clone();
    }
    true
}

impl<C: Carrier> Transport for Http<'_, '_, C> {
    const BATCH: usize = MAX_BATCH;

    fn batch_limit(&self) -> usize {
        self.batch.map_or(1, |(_, most)| most)
    }

    async fn open(&mut self, limit: Duration) -> Result<(), Failure> {
        let deadline = Instant::now().saturating_add(limit.into());
        self.deadline = Some(deadline);
        match self.ensure_open(deadline).await {
            Ok(()) => Ok(()),
            Err(err) => {
                let result = Err(err);
                self.counts.record(&result);
                defmt::debug!("{=str}: {} in phase {}", C::SCHEME, err, err.phase());
                Err(failure(err))
            }
        }
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        let by_limit = Instant::now().saturating_add(limit.into());
        let deadline = self.deadline.take().map_or(by_limit, |open| open.min(by_limit));
        if let (Some((path, _)), true) = (self.batch, messages.len() > 1) {
            self.send_batch(path, messages, answers, deadline).await;
            return;
        }
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            let result = self.exchange(message, deadline).await;
            self.counts.record(&result);
            *slot = answer(result);
        }
    }

    async fn close(&mut self) {
        if self.keep.is_open() {
            self.end(true).await;
        }
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        self.dead_letters = (held > 0 || dropped > 0).then(|| http::dead_letters_value(held, dropped));
    }
}
