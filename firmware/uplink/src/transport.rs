//! One attempt of a keyed write, as the wary runner sees it: a [`Transport`] sends exactly one
//! request and returns `Ok(())` or how it failed, a wary [`Failure`].
//!
//! [`HttpTransport`] is the real one: one HTTP/1.1 `POST` through an `embassy-net` stack
//! ([`crate::http::post`]), whatever link is under the stack (Ethernet, PPP over a cellular
//! modem, Wi-Fi). A reply becomes an outcome through the core's one constructor,
//! [`Outcome::from_response`] ([`outcome`]); a failed exchange maps ([`failure`]) by what it
//! says about whether the request may have reached the server:
//!
//! | exchange result | outcome | why |
//! |---|---|---|
//! | 2xx | `Ok` | the server accepted it; no assumption about the body |
//! | other status | `Status` with `Retry-After` (read under the policy's rules, against the reply's `Date`) | the core's table decides |
//! | no network, no route, refused | `Refused` | never sent: safe to send again |
//! | connect or TLS handshake timed out | `ConnectTimeout` | never sent |
//! | connection broke during the TLS handshake | `Refused` | never sent: the request waits for the handshake |
//! | TLS handshake refused (server not authenticated by the pinned CA) | `Tls` | the same every time: the call fails |
//! | broke before the whole request was handed to TCP | `Refused` | the server holds at most a prefix it cannot act on |
//! | reset, closed, cut short, garbage, header block too big | `Reset` | may have landed: resent only with its key |
//! | no reply in time | `ResponseTimeout` | may have landed |
//! | the request cannot be encoded | `BadBody` | our own bug: no resend can fix it, so the call fails |
//!
//! The transport never retries: retrying is the policy's job, one layer up, so a request is
//! never multiplied by two layers.

use core::net::SocketAddrV4;

use embassy_net::Stack;
use wary::{
    Duration, Failure, Outcome,
    retry_after::{Reading, Rules},
};

use crate::http::{self, Buffers, HttpError, Post, Response};
use crate::identity::Credential;

/// Sends one attempt of a keyed write. Implementations make exactly one request.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// Sends `body` once with `key` as its `Idempotency-Key`, within `limit` (connecting,
    /// sending and reading the reply): `Ok(())` if it landed, else how it failed.
    async fn post(&mut self, key: &str, body: &[u8], limit: Duration) -> Result<(), Failure>;
}

impl<T: Transport + ?Sized> Transport for &mut T {
    async fn post(&mut self, key: &str, body: &[u8], limit: Duration) -> Result<(), Failure> {
        (**self).post(key, body, limit).await
    }
}

/// The outcome of one exchange, a reply read by [`Outcome::from_response`] with the policy's
/// Retry-After `rules`, and the [`Reading`] of its Retry-After values (default for a failed
/// exchange).
///
/// A reply's `Retry-After` is measured against its own `Date` header (a device has no wall
/// clock): a date the server gave in the past means "now". A value that cannot be read under
/// `rules` is ignored (and counted in the reading) and the backoff alone decides.
pub fn outcome(result: &Result<Response, HttpError>, rules: &Rules) -> (Outcome, Reading) {
    match result {
        Ok(reply) => {
            let values = reply.retry_after.iter().map(|v| v.as_slice());
            Outcome::from_response(reply.status, values, reply.date.as_deref(), None, rules)
        }
        Err(err) => (failure(*err).into(), Reading::default()),
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

/// Keyed writes as HTTP/1.1 `POST`s to one server through an `embassy-net` stack.
pub struct HttpTransport<'a, 's, const SOCKET_RX: usize, const SOCKET_TX: usize, const HEAD: usize> {
    stack: Stack<'s>,
    server: SocketAddrV4,
    path: &'a str,
    rules: Rules,
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
    /// Replies with a `Retry-After` value that could not be read at all (neither a number nor
    /// an HTTP-date).
    pub retry_after_unreadable: u32,
}

impl Counts {
    /// Counts one exchange's result, with the reading of its Retry-After values.
    pub fn record(&mut self, result: &Result<Response, HttpError>, reading: &Reading) {
        if reading.unreadable > 0 {
            self.retry_after_unreadable = self.retry_after_unreadable.saturating_add(1);
        }
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
    /// Posts to `path` on `server` through `stack`, reading Retry-After with `rules` (the
    /// policy's, [`wary::Policy::retry_after_rules`]).
    pub fn new(
        stack: Stack<'s>,
        server: SocketAddrV4,
        path: &'a str,
        rules: Rules,
        buffers: &'a mut Buffers<SOCKET_RX, SOCKET_TX, HEAD>,
    ) -> Self {
        HttpTransport { stack, server, path, rules, buffers, credential: None, counts: Counts::default() }
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
    async fn post(&mut self, key: &str, body: &[u8], limit: Duration) -> Result<(), Failure> {
        let request = Post { path: self.path, idempotency_key: key, body, credential: self.credential };
        let result = http::post(self.stack, self.server, &request, limit.into(), self.buffers).await;
        let (outcome, reading) = outcome(&result, &self.rules);
        self.counts.record(&result, &reading);
        outcome.into_result()
    }
}
