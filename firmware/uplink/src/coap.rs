//! CoAP (RFC 7252) as a [`Transport`]: each attempt is one transmission of a confirmable `POST`
//! over `embassy-net` UDP, and the wary runner's plan under [`POLICY`] (the core's
//! [`Preset::Coap`]) is the retransmission schedule. Nothing retransmits underneath.
//!
//! - **One message ID per exchange.** A transmission of a key whose last transmission went
//!   unanswered, within EXCHANGE_LIFETIME of the exchange's first, is a retransmission: the same
//!   message ID and token, byte for byte. Any answer (a response, a Reset) ends the exchange, and
//!   the key's next attempt (after a 5.03, say) is a new request with a new message ID and token.
//! - **Unique across resets.** The token is the boot counter and a count of exchanges in the
//!   boot (8 bytes: boot, then count, big-endian), so no two exchanges of a device share one. The
//!   message ID's top 4 bits are the boot counter's low 4 bits and its low 12 bits the count: a
//!   boot does not reuse a message ID of the one before it, and a boot reuses its own only after
//!   4,096 exchanges (RFC 7252 asks for no reuse within EXCHANGE_LIFETIME, 247 s: 16 exchanges a
//!   second).
//! - **The key is in the path**, `/<prefix>/<32 hex digits>`: each reading is a resource of its
//!   own, so a server that keeps the last body per path (libcoap's `coap-server -d`) holds each
//!   reading once however often it was sent, a proxy in the sense of RFC 8075 maps it to an HTTP
//!   URI, and the key needs no option a server may not know (docs/coap.md).
//! - **An attempt listens for its limit** (the uplink's attempt limit). An answer that arrives
//!   later, during the runner's wait, is taken at the start of the next attempt, which then sends
//!   nothing: the transmissions are spaced by the policy's waits plus the listening.
//! - **Separate responses** (an empty ACK first): the attempt goes on listening for the
//!   response, and acknowledges a confirmable one.
//!
//! Answers, by the seam's table (the codes become HTTP statuses as `wary::coap::status` maps
//! them; the core's `coap::TABLE` then decides):
//!
//! | what came back | answer | a keyed write |
//! |---|---|---|
//! | 2.xx | `Ok(reply)`, status 2xx | landed |
//! | 4.29 or 5.03 with Max-Age | `Ok(reply)`, 429/503 with the Max-Age as its Retry-After | retried after it (a longer one than the call may wait holds the outbox) |
//! | 4.29 or 5.03 without Max-Age | `Ok(reply)`, 429/503 | retried on the backoff |
//! | any other 4.xx | `Ok(reply)`, its status | failed |
//! | Reset | `Refused` | retried: not processed |
//! | no ACK within the limit (or an empty ACK and no response) | `ResponseTimeout` | may have landed: retransmitted, same message ID |
//! | no network, send refused | `Refused` | never sent |
//! | the request does not fit the buffer | `BadBody` | failed: our own bug |
//!
//! The codec is chrysn's `coap-message-implementations` (options and payload written and read
//! in place in this transport's buffer, no allocator; `coap-lite` needs one and the firmware has
//! none) with the option numbers of `coap-numbers`. The 4-byte header and the token, which
//! those crates leave to the transport (RFC 7252 section 3), are written here.
//!
//! There is no DTLS: no maintained `no_std` DTLS 1.2/1.3 crate fits (docs/coap.md), so the
//! credential is not sent over CoAP and a deployment puts the device behind a network it trusts
//! or a gateway that authenticates it otherwise.

use core::net::SocketAddrV4;

use coap_message::{MessageOption, MinimalWritableMessage, ReadableMessage};
use coap_message_implementations::inmemory::Message as ReadMessage;
use coap_message_implementations::inmemory::MessageMut;
use embassy_net::udp::{PacketMetadata, UdpSocket};
use embassy_net::{IpAddress, IpEndpoint, Stack};
use embassy_time::Instant;
use wary::{Duration, Failure, Policy, Preset};

use crate::http::{RETRY_AFTER_LEN, Response};
use crate::transport::{Answer, Counts, Message, Transport};

/// The uplink's policy over CoAP: the core's [`Preset::Coap`] as it is (RFC 7252 section 4.8:
/// the first timeout drawn once in 2 to 3 s and doubled, five transmissions, 45 s of waits).
pub static POLICY: Policy = match Policy::builder(Preset::Coap).build() {
    Ok(p) => p,
    Err(_) => panic!("CoAP policy refused"),
};

/// The path's first segment before the key: `/r/<key>`.
pub const PREFIX: &str = "r";

/// The largest datagram sent or read: a reading's request is under 200 bytes, and RFC 7252
/// section 4.6 keeps messages under 1,152 bytes.
pub const DATAGRAM: usize = 512;

/// Datagrams the socket queues each way.
const QUEUE: usize = 4;

/// CoAP version 1, and the message types (RFC 7252 section 3).
const VERSION: u8 = 1;
const CON: u8 = 0;
const NON: u8 = 1;
const ACK: u8 = 2;
const RST: u8 = 3;
/// The token's length: the boot counter and the exchange count.
pub const TOKEN_LEN: usize = 8;
/// The header before the token.
const HEADER: usize = 4;
/// Content-Format 50, `application/json` (RFC 7252 section 12.3).
const JSON: u8 = 50;

/// The socket's buffers and the transport's datagram buffer, owned by the caller (a static).
pub struct Buffers {
    rx_meta: [PacketMetadata; QUEUE],
    rx: [u8; DATAGRAM * 2],
    tx_meta: [PacketMetadata; QUEUE],
    tx: [u8; DATAGRAM * 2],
    datagram: [u8; DATAGRAM],
}

impl Buffers {
    /// Zeroed buffers, for a `static`.
    pub const fn new() -> Self {
        Buffers {
            rx_meta: [PacketMetadata::EMPTY; QUEUE],
            rx: [0; DATAGRAM * 2],
            tx_meta: [PacketMetadata::EMPTY; QUEUE],
            tx: [0; DATAGRAM * 2],
            datagram: [0; DATAGRAM],
        }
    }
}

impl Default for Buffers {
    fn default() -> Self {
        Self::new()
    }
}

/// What the CoAP transport saw beyond the seam's counts: message counts only, never payloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, defmt::Format)]
pub struct CoapCounts {
    /// Datagrams sent carrying a request (first transmissions and retransmissions).
    pub transmissions: u32,
    /// Of those, retransmissions (the same message ID again).
    pub retransmissions: u32,
    /// Answers that arrived after their attempt stopped listening, taken by the next attempt
    /// (which then sent nothing).
    pub late: u32,
    /// Empty ACKs (a separate response to follow).
    pub empty_acks: u32,
    /// Confirmable responses this transport acknowledged.
    pub acked: u32,
    /// Resets received.
    pub resets: u32,
    /// Datagrams that answered no open exchange (duplicates, answers to an ended exchange,
    /// strangers) or could not be read: dropped.
    pub ignored: u32,
}

impl CoapCounts {
    /// Logs the `COAP` line the host-side scenarios read.
    pub fn log(&self) {
        defmt::info!(
            "COAP transmissions={=u32} retransmissions={=u32} late={=u32} empty_acks={=u32} acked={=u32} resets={=u32} ignored={=u32}",
            self.transmissions,
            self.retransmissions,
            self.late,
            self.empty_acks,
            self.acked,
            self.resets,
            self.ignored
        );
    }
}

/// The open exchange: the key it carries, its message ID and token, since when.
#[derive(Clone, Copy)]
struct Exchange {
    key: [u8; 32],
    id: u16,
    token: [u8; TOKEN_LEN],
    started: Instant,
    /// An empty ACK came: the server has the request; only the response is awaited.
    acked: bool,
}

/// Message IDs and tokens from the boot counter and a count of exchanges in the boot (see the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    boot: u32,
    count: u32,
}

impl Ids {
    /// The ids of boot `boot` (the outbox's persistent boot counter), from its first exchange.
    pub const fn new(boot: u32) -> Self {
        Ids { boot, count: 0 }
    }

    /// The next exchange's message ID and token.
    pub fn next_exchange(&mut self) -> (u16, [u8; TOKEN_LEN]) {
        let count = self.count;
        self.count = self.count.wrapping_add(1);
        let id = (((self.boot & 0xf) << 12) | (count & 0x0fff)) as u16;
        let mut token = [0u8; TOKEN_LEN];
        let (high, low) = token.split_at_mut(4);
        high.copy_from_slice(&self.boot.to_be_bytes());
        low.copy_from_slice(&count.to_be_bytes());
        (id, token)
    }
}

/// A CoAP message as read from a datagram: the header's fields, and where the options begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The type: CON 0, NON 1, ACK 2, RST 3.
    pub kind: u8,
    /// The code byte (`class << 5 | detail`).
    pub code: u8,
    /// The message ID.
    pub id: u16,
    /// The token's length (at most 8).
    pub token_len: usize,
}

/// Reads the header of `datagram` (RFC 7252 section 3), or `None` if it is not a CoAP version 1
/// message with a token of at most 8 bytes.
pub fn header(datagram: &[u8]) -> Option<Header> {
    let (&first, rest) = datagram.split_first()?;
    let (&code, rest) = rest.split_first()?;
    let id = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
    let token_len = usize::from(first & 0x0f);
    if first >> 6 != VERSION || token_len > TOKEN_LEN || datagram.len() < HEADER + token_len {
        return None;
    }
    Some(Header { kind: (first >> 4) & 0x03, code, id, token_len })
}

/// Writes a confirmable `POST` of `body` to `/<prefix>/<key>` (Content-Format JSON) with
/// message ID `id` and `token` into `out`: its length, or `None` if it does not fit.
pub fn encode_post(
    out: &mut [u8],
    id: u16,
    token: &[u8; TOKEN_LEN],
    prefix: &str,
    key: &str,
    body: &[u8],
) -> Option<usize> {
    let (head, tail) = out.split_at_mut_checked(HEADER + TOKEN_LEN)?;
    let mut code = coap_numbers::code::POST;
    let mut message = MessageMut::new_in_slice(&mut code, tail);
    message.add_option(coap_numbers::option::URI_PATH, prefix.as_bytes()).ok()?;
    message.add_option(coap_numbers::option::URI_PATH, key.as_bytes()).ok()?;
    message.add_option(coap_numbers::option::CONTENT_FORMAT, &[JSON]).ok()?;
    message.set_payload(body).ok()?;
    let (len, _) = message.finish();
    let [first, code_byte, id_high, id_low, token_bytes @ ..] = head else { return None };
    *first = (VERSION << 6) | (CON << 4) | TOKEN_LEN as u8;
    *code_byte = code;
    [*id_high, *id_low] = id.to_be_bytes();
    token_bytes.copy_from_slice(token);
    len.checked_add(HEADER + TOKEN_LEN)
}

/// Writes an empty ACK of message `id` into `out`: its length (4), or `None` if `out` is shorter.
pub fn encode_empty_ack(out: &mut [u8], id: u16) -> Option<usize> {
    let head = out.get_mut(..HEADER)?;
    let [high, low] = id.to_be_bytes();
    head.copy_from_slice(&[(VERSION << 6) | (ACK << 4), 0, high, low]);
    Some(HEADER)
}

/// The reply of a response with code byte `code` and Max-Age `max_age` in the seam's terms: the
/// status RFC 8075 maps the code to, and for 5.03 and 4.29 the Max-Age as a Retry-After of
/// delta-seconds (on any other code Max-Age is a cache lifetime: not kept).
pub fn reply(code: u8, max_age: Option<u32>) -> Response {
    let status = wary::coap::status(code);
    let mut retry_after = heapless::Vec::new();
    let mut dropped = 0;
    if let (503 | 429, Some(secs)) = (status, max_age) {
        let mut value = heapless::Vec::<u8, RETRY_AFTER_LEN>::new();
        let mut digits = [0u8; 10];
        let mut n = secs;
        let mut len = 0;
        for slot in digits.iter_mut().rev() {
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
            len += 1;
            if n == 0 {
                break;
            }
        }
        let start = digits.len().saturating_sub(len);
        if value.extend_from_slice(digits.get(start..).unwrap_or(&[])).is_err()
            || retry_after.push(value).is_err()
        {
            dropped = 1;
        }
    }
    Response {
        status,
        retry_after,
        retry_after_dropped: dropped,
        date: None,
        date_dropped: false,
        body_complete: true,
    }
}

/// The Max-Age option of a message whose options and payload are `rest` (after the token), if
/// it has one that reads as a number of seconds.
fn max_age(code: u8, rest: &[u8]) -> Option<u32> {
    let message = ReadMessage::new_from_slice(code, rest);
    message
        .options()
        .find(|o| o.number() == coap_numbers::option::MAX_AGE)
        .and_then(|o| o.value_uint::<u32>())
}

/// How a received datagram bears on the open exchange.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// The exchange's answer: a response (code and Max-Age) or a Reset.
    Answer(Answer),
    /// An empty ACK of the exchange: the response follows.
    EmptyAck,
    /// A confirmable response of the exchange; to acknowledge with this message ID.
    Confirmable(Answer, u16),
    /// Not this exchange's.
    Other,
}

/// What `datagram` is to the exchange with message ID `id` and `token`: its answer (a piggybacked
/// response with both, a Reset of `id`), an empty ACK of `id`, a confirmable separate response
/// with `token`, or nothing of it (a duplicate of an ended exchange's answer, a stranger).
pub fn judge(datagram: &[u8], id: u16, token: &[u8; TOKEN_LEN]) -> Seen {
    let Some(h) = header(datagram) else { return Seen::Other };
    // `header` checked that the token is there.
    let Some((received, rest)) = datagram.get(HEADER..).and_then(|tail| tail.split_at_checked(h.token_len))
    else {
        return Seen::Other;
    };
    match h.kind {
        RST if h.id == id => Seen::Answer(Err(Failure::Refused)),
        ACK if h.id == id && h.code == 0 => Seen::EmptyAck,
        ACK | CON | NON if received == token.as_slice() && h.code >> 5 >= 2 => {
            // A piggybacked response must carry the request's message ID; a separate one its own.
            if h.kind == ACK && h.id != id {
                return Seen::Other;
            }
            let answer = Ok(reply(h.code, max_age(h.code, rest)));
            if h.kind == CON { Seen::Confirmable(answer, h.id) } else { Seen::Answer(answer) }
        }
        _ => Seen::Other,
    }
}

/// Keyed writes as confirmable CoAP `POST`s to one server through an `embassy-net` stack; see
/// the module docs.
pub struct CoapTransport<'a, 's> {
    stack: Stack<'s>,
    server: IpEndpoint,
    prefix: &'a str,
    socket: UdpSocket<'a>,
    datagram: &'a mut [u8; DATAGRAM],
    bound: bool,
    ids: Ids,
    exchange: Option<Exchange>,
    counts: Counts,
    coap: CoapCounts,
}

impl<'a, 's: 'a> CoapTransport<'a, 's> {
    /// Posts to `/<prefix>/<key>` on `server` through `stack`, with message IDs and tokens of boot
    /// `boot` (the outbox's persistent boot counter). Holds one UDP socket of the stack.
    pub fn new(
        stack: Stack<'s>,
        server: SocketAddrV4,
        prefix: &'a str,
        boot: u32,
        buffers: &'a mut Buffers,
    ) -> Self {
        let Buffers { rx_meta, rx, tx_meta, tx, datagram } = buffers;
        CoapTransport {
            stack,
            server: IpEndpoint::new(IpAddress::Ipv4(*server.ip()), server.port()),
            prefix,
            socket: UdpSocket::new(stack, rx_meta, rx, tx_meta, tx),
            datagram,
            bound: false,
            ids: Ids::new(boot),
            exchange: None,
            counts: Counts::default(),
            coap: CoapCounts::default(),
        }
    }

    /// The seam's counts (exchanges are transmissions here).
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The CoAP counts.
    pub fn coap_counts(&self) -> CoapCounts {
        self.coap
    }

    /// Takes the open exchange for `key`, or starts a new one.
    fn exchange_for(&mut self, key: &str) -> Exchange {
        let lifetime: embassy_time::Duration = wary::coap::Parameters::RFC7252.exchange_lifetime().into();
        if let Some(open) = self.exchange
            && open.key.as_slice() == key.as_bytes()
            && open.started.elapsed() < lifetime
        {
            return open;
        }
        let (id, token) = self.ids.next_exchange();
        let mut bytes = [0u8; 32];
        let n = key.len().min(bytes.len());
        if let (Some(dst), Some(src)) = (bytes.get_mut(..n), key.as_bytes().get(..n)) {
            dst.copy_from_slice(src);
        }
        Exchange { key: bytes, id, token, started: Instant::now(), acked: false }
    }

    /// Reads what waits on the socket, or what arrives before `until` (`None`: only what waits),
    /// until the exchange's answer: `None` if none came.
    async fn listen(&mut self, exchange: &mut Exchange, until: Option<Instant>) -> Option<Answer> {
        loop {
            let received = match until {
                None if !self.socket.may_recv() => return None,
                None => Ok(self.socket.recv_from(self.datagram).await),
                Some(until) => embassy_time::with_deadline(until, self.socket.recv_from(self.datagram)).await,
            };
            let (n, meta) = match received {
                Err(_) => return None,
                Ok(Err(_)) => {
                    // Larger than the buffer: not an answer this transport can read.
                    self.coap.ignored = self.coap.ignored.saturating_add(1);
                    continue;
                }
                Ok(Ok(got)) => got,
            };
            let datagram = self.datagram.get(..n).unwrap_or(&[]);
            if meta.endpoint != self.server {
                self.coap.ignored = self.coap.ignored.saturating_add(1);
                continue;
            }
            match judge(datagram, exchange.id, &exchange.token) {
                Seen::Answer(answer) => {
                    if answer.is_err() {
                        self.coap.resets = self.coap.resets.saturating_add(1);
                    }
                    return Some(answer);
                }
                Seen::EmptyAck => {
                    self.coap.empty_acks = self.coap.empty_acks.saturating_add(1);
                    exchange.acked = true;
                }
                Seen::Confirmable(answer, id) => {
                    if let Some(len) = encode_empty_ack(self.datagram, id)
                        && self
                            .socket
                            .send_to(self.datagram.get(..len).unwrap_or(&[]), self.server)
                            .await
                            .is_ok()
                    {
                        self.coap.acked = self.coap.acked.saturating_add(1);
                    }
                    return Some(answer);
                }
                Seen::Other => self.coap.ignored = self.coap.ignored.saturating_add(1),
            }
        }
    }

    /// One attempt for `message`: a late answer of its open exchange, or a transmission and what
    /// came back before `deadline`.
    async fn attempt(&mut self, message: &Message<'_>, deadline: Instant) -> Answer {
        if !self.stack.is_link_up() || self.stack.config_v4().is_none() {
            self.counts.never_sent = self.counts.never_sent.saturating_add(1);
            return Err(Failure::Refused);
        }
        if !self.bound {
            if self.socket.bind(0).is_err() {
                self.counts.never_sent = self.counts.never_sent.saturating_add(1);
                return Err(Failure::Refused);
            }
            self.bound = true;
        }
        let mut exchange = self.exchange_for(message.key);
        let retransmission = self.exchange.is_some_and(|open| open.id == exchange.id);
        if retransmission && let Some(answer) = self.listen(&mut exchange, None).await {
            self.coap.late = self.coap.late.saturating_add(1);
            self.exchange = None;
            return self.answered(answer);
        }
        // Nothing that waits now can answer this exchange any more.
        if !retransmission {
            while self.socket.may_recv() {
                let _ = self.socket.recv_from(self.datagram).await;
                self.coap.ignored = self.coap.ignored.saturating_add(1);
            }
        }
        let Some(len) =
            encode_post(self.datagram, exchange.id, &exchange.token, self.prefix, message.key, message.body)
        else {
            self.counts.never_sent = self.counts.never_sent.saturating_add(1);
            return Err(Failure::BadBody);
        };
        let sent = self.socket.send_to(self.datagram.get(..len).unwrap_or(&[]), self.server).await;
        if sent.is_err() {
            self.counts.never_sent = self.counts.never_sent.saturating_add(1);
            return Err(Failure::Refused);
        }
        self.counts.exchanges = self.counts.exchanges.saturating_add(1);
        self.coap.transmissions = self.coap.transmissions.saturating_add(1);
        if retransmission {
            self.coap.retransmissions = self.coap.retransmissions.saturating_add(1);
        }
        defmt::debug!(
            "coap: CON POST mid={=u16:04x} ({=bool} retransmission, {=usize} bytes)",
            exchange.id,
            retransmission,
            len
        );
        match self.listen(&mut exchange, Some(deadline)).await {
            Some(answer) => {
                self.exchange = None;
                self.answered(answer)
            }
            None => {
                // Unanswered: the next attempt for this key retransmits it.
                self.exchange = Some(exchange);
                self.counts.maybe_landed = self.counts.maybe_landed.saturating_add(1);
                Err(Failure::ResponseTimeout)
            }
        }
    }

    fn answered(&mut self, answer: Answer) -> Answer {
        match &answer {
            Ok(reply) => {
                self.counts.replies = self.counts.replies.saturating_add(1);
                defmt::debug!("coap: answered {=u16}", reply.status);
            }
            Err(_) => self.counts.never_sent = self.counts.never_sent.saturating_add(1),
        }
        answer
    }
}

impl<'a, 's: 'a> Transport for CoapTransport<'a, 's> {
    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        let deadline = Instant::now().saturating_add(limit.into());
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            *slot = self.attempt(message, deadline).await;
        }
    }
}
