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
//! [`HttpTransport`] is HTTP per reading: one HTTP/1.1 `POST` per message and per connection
//! through an `embassy-net` stack ([`crate::http::post`]), whatever link is under the stack
//! (Ethernet, PPP over a cellular modem, Wi-Fi); `BATCH` is 1 and `open`/`close` have nothing
//! to keep. A failed exchange maps ([`failure`]) by what it says about whether the request may
//! have reached the server:
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
//! firmware/README.md sketches how an MQTT or CoAP transport fills the same table.

use core::net::SocketAddrV4;

use embassy_net::Stack;
use wary::{
    Duration, Failure, Outcome,
    retry_after::{Reading, Rules},
};

use crate::http::{self, Buffers, HttpError, Post, Response};
use crate::identity::Credential;

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
}

impl<T: Transport + ?Sized> Transport for &mut T {
    const BATCH: usize = T::BATCH;

    async fn open(&mut self, limit: Duration) -> Result<(), Failure> {
        (**self).open(limit).await
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        (**self).send(messages, answers, limit).await;
    }

    async fn close(&mut self) {
        (**self).close().await;
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

/// Keyed writes as HTTP/1.1 `POST`s to one server through an `embassy-net` stack.
pub struct HttpTransport<'a, 's, const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> {
    stack: Stack<'s>,
    server: SocketAddrV4,
    path: &'a str,
    buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    credential: Option<&'a Credential>,
    counts: Counts,
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
}

impl<'a, 's, const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize>
    HttpTransport<'a, 's, SOCKET_RX, SOCKET_TX, HEAD>
{
    /// Posts to `path` on `server` through `stack`.
    pub fn new(
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    ) -> Self {
        HttpTransport { stack, server, path, buffers, credential: None, counts: Counts::default() }
    }

    /// Sends `credential` as `Authorization: Bearer <token>` on every attempt (without this,
    /// no `Authorization` header).
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
    for HttpTransport<'_, '_, SOCKET_RX, SOCKET_TX, HEAD>
{
    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        // One connection per message: a second message would wait for the first's close.
        let deadline = embassy_time::Instant::now().saturating_add(limit.into());
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            let request = Post {
                path: self.path,
                idempotency_key: message.key,
                body: message.body,
                credential: self.credential,
            };
            let left = deadline.saturating_duration_since(embassy_time::Instant::now());
            let result = http::post(self.stack, self.server, &request, left, self.buffers).await;
            self.counts.record(&result);
            *slot = answer(result);
        }
    }
}
