//! The CoAP ingress: a CoAP-to-HTTP proxy in the sense of RFC 8075, limited to what a device
//! needs to deliver readings. A device sends a confirmable `POST` to `/r/<key>` (the key in the
//! path, `docs/coap.md` says why) with the reading's JSON as payload; the gateway sends it
//! upstream as one wary call, exactly as it sends a `POST /readings` (same queue, workers,
//! upstream client and key header), and answers the CON only after the verdict:
//!
//! - a verdict within [`CoapConfig::piggyback_wait`] goes back piggybacked on the ACK;
//! - a later one gets an empty ACK at that moment (so the device stops retransmitting) and the
//!   verdict follows as a separate confirmable response with the request's token (RFC 7252
//!   section 5.2.2), retransmitted on the RFC's schedule until the device acknowledges it.
//!
//! | verdict | CoAP response |
//! |---|---|
//! | landed, upstream 201 | 2.01 Created (the upstream's JSON body as payload, if it fits) |
//! | landed, other 2xx | 2.04 Changed |
//! | gave up | 5.03 Service Unavailable, Max-Age = the give-up's Retry-After |
//! | held (the upstream's answer is the endpoint's fault, not the reading's: [`crate::hold`]) | 5.03, Max-Age = the hold's Retry-After (the upstream breaker's remaining open time) |
//! | cancelled, queue full, no room for the exchange | 5.03, Max-Age 1 |
//! | failed (upstream 4xx) | the same 4.xx where CoAP has it (4.00, 4.03, 4.04, 4.05, 4.06, 4.09, 4.12, 4.13, 4.15, 4.22), else 4.00 |
//! | failed (no status, or a 5xx the policy does not retry) | 4.00: a resend cannot help, and every 4.xx but 4.29 is "do not resend" to a device |
//! | unknown (legacy upstreams) | 4.09 Conflict (the HTTP ingress's 409) |
//!
//! Requests the gateway refuses itself, never forwarded: a key that is not 32 lowercase hex
//! digits (4.00), a payload that is not JSON (4.00) or too large (4.13 with Size1), another
//! Content-Format than JSON (4.15), another path (4.04), another method (4.05), an unknown
//! critical option (4.02), a Proxy-Uri or Proxy-Scheme (5.05: this is no forward proxy).
//!
//! **Deduplication.** Each confirmable request is remembered by (peer, Message ID) for
//! EXCHANGE_LIFETIME (RFC 7252 section 4.5): a retransmission is answered from that memory
//! (the same piggybacked response; the empty ACK again while the verdict is pending; the empty
//! ACK and the same separate response once that was sent, for a device that stopped listening
//! before it came) and never makes a second upstream call. A resend with a new Message ID is a
//! new exchange; its key, unchanged, lets the upstream deduplicate it.
//!
//! **No authentication.** DTLS is blocked on the device (`docs/coap.md`), so nothing on the wire
//! proves who sent a datagram: the gateway starts this ingress only with `--insecure-no-auth`.
//! `docs/security.md` says what this leaves open and what would close it (DTLS, or OSCORE,
//! RFC 8613).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use coap_lite::option_value::OptionValueU16;
use coap_lite::{CoapOption, ContentFormat, MessageClass, MessageType, Packet, RequestType, ResponseType};
use http::HeaderValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::time::Instant;
use wary::Key;

use crate::gateway::{Answer, Gateway, GatewayError};
use crate::upstream::Forward;

/// Content-Format `application/json` (RFC 7252 section 12.3).
const JSON: usize = 50;
/// The largest datagram read; a reading is far smaller (the device's own buffers are).
const MAX_DATAGRAM: usize = 1500;
/// The largest response payload sent: RFC 7252 section 4.6's 1 KiB, so a response fits the
/// 1152-byte message size the RFC recommends. A larger upstream body is left out.
const MAX_PAYLOAD: usize = 1024;
/// Option numbers the gateway understands (RFC 7252 section 5.10): Uri-Host, Uri-Port,
/// Uri-Path, Content-Format, Max-Age, Accept, Size1. Any other critical (odd) option is 4.02.
const UNDERSTOOD: [u16; 7] = [3, 7, 11, 12, 14, 17, 60];
/// Proxy-Uri and Proxy-Scheme: a forward proxy's options, refused with 5.05.
const PROXY: [u16; 2] = [35, 39];

/// The CoAP ingress's settings.
#[derive(Debug, Clone)]
pub struct CoapConfig {
    /// How long a verdict may take and still go back piggybacked on the ACK. Below the device's
    /// first retransmission timeout (ACK_TIMEOUT, 2 s), so that a verdict that takes longer is
    /// acknowledged empty before the device sends again.
    pub piggyback_wait: Duration,
    /// How long a (peer, Message ID) is remembered: EXCHANGE_LIFETIME (247 s).
    pub exchange_lifetime: Duration,
    /// Exchanges remembered at once; a new one beyond it is answered 5.03 (Max-Age 1) and not
    /// forwarded, so memory stays bounded whatever the traffic.
    pub max_exchanges: usize,
    /// ACK_TIMEOUT for the gateway's own separate responses (drawn in `[1, 1.5]` times it,
    /// doubled each time).
    pub ack_timeout: Duration,
    /// MAX_RETRANSMIT for the gateway's own separate responses.
    pub max_retransmit: u32,
}

impl Default for CoapConfig {
    fn default() -> Self {
        let p = wary::coap::Parameters::RFC7252;
        CoapConfig {
            piggyback_wait: Duration::from_secs(1),
            exchange_lifetime: millis(p.exchange_lifetime()),
            max_exchanges: 65_536,
            ack_timeout: millis(p.ack_timeout),
            max_retransmit: p.max_retransmit,
        }
    }
}

fn millis(d: wary::Duration) -> Duration {
    Duration::from_millis(u64::from(d.as_millis()))
}

/// The ingress's counters.
#[derive(Debug, Default)]
pub struct CoapCounts {
    /// Confirmable requests taken as new exchanges.
    pub exchanges: AtomicU64,
    /// Retransmissions answered from memory.
    pub duplicates: AtomicU64,
    /// Verdicts sent piggybacked on the ACK.
    pub piggybacked: AtomicU64,
    /// Verdicts sent as separate responses.
    pub separate: AtomicU64,
    /// Separate responses the device never acknowledged (after MAX_RETRANSMIT).
    pub separate_unacknowledged: AtomicU64,
    /// Requests refused by the gateway itself (never forwarded).
    pub refused: AtomicU64,
    /// Datagrams rejected with a Reset (unparseable CONs, non-confirmable requests, pings).
    pub reset: AtomicU64,
}

impl CoapCounts {
    /// The counters as Prometheus text (`wary_gateway_coap_*`).
    pub fn prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let mut one = |name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(s, "# HELP wary_gateway_coap_{name} {help}");
            let _ = writeln!(s, "# TYPE wary_gateway_coap_{name} counter");
            let _ = writeln!(s, "wary_gateway_coap_{name} {}", v.load(Ordering::Relaxed));
        };
        one("exchanges_total", "Confirmable CoAP requests taken as new exchanges.", &self.exchanges);
        one("duplicates_total", "CoAP retransmissions answered from memory.", &self.duplicates);
        one("piggybacked_total", "CoAP verdicts sent piggybacked on the ACK.", &self.piggybacked);
        one("separate_total", "CoAP verdicts sent as separate responses.", &self.separate);
        one(
            "separate_unacknowledged_total",
            "Separate CoAP responses never acknowledged after MAX_RETRANSMIT.",
            &self.separate_unacknowledged,
        );
        one("refused_total", "CoAP requests the gateway refused itself (never forwarded).", &self.refused);
        one("reset_total", "CoAP messages rejected with a Reset.", &self.reset);
        s
    }
}

/// What the gateway remembers of one exchange.
enum Exchange {
    /// The verdict is not in yet; `empty_acked` once the empty ACK went out.
    Pending { empty_acked: bool },
    /// What a retransmission of the request is answered with: the piggybacked response, or the
    /// empty ACK and the separate response again.
    Done(Vec<Bytes>),
}

type Id = (SocketAddr, u16);

#[derive(Default)]
struct Memory {
    exchanges: HashMap<Id, Exchange>,
    /// When each exchange was first seen, oldest first: the expiry order.
    order: VecDeque<(Instant, Id)>,
    /// The gateway's separate responses waiting for their ACK, by (peer, the response's ID).
    awaiting: HashMap<Id, oneshot::Sender<()>>,
}

impl Memory {
    fn expire(&mut self, now: Instant, lifetime: Duration) {
        while let Some(&(at, id)) = self.order.front() {
            if now.saturating_duration_since(at) < lifetime {
                break;
            }
            self.order.pop_front();
            self.exchanges.remove(&id);
        }
    }
}

struct Shared {
    gw: Arc<Gateway>,
    socket: UdpSocket,
    config: CoapConfig,
    memory: Mutex<Memory>,
    counts: Arc<CoapCounts>,
    /// The next Message ID of the gateway's own confirmable messages.
    next_id: AtomicU16,
}

impl Shared {
    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn send(&self, bytes: &[u8], peer: SocketAddr) {
        if bytes.is_empty() {
            return;
        }
        // A lost datagram is CoAP's ordinary case: the device retransmits, or the gateway does.
        if let Err(e) = self.socket.send_to(bytes, peer).await {
            eprintln!("wary-gateway: coap: sending to {peer}: {}", e.kind());
        }
    }

    fn remember(&self, id: Id, exchange: Exchange) {
        if let Some(e) = self.memory().exchanges.get_mut(&id) {
            *e = exchange;
        }
    }
}

/// A running CoAP ingress.
pub struct Ingress {
    counts: Arc<CoapCounts>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Ingress {
    /// Serves CoAP on `socket` for `gw`.
    pub fn start(gw: Arc<Gateway>, socket: UdpSocket, config: CoapConfig) -> std::io::Result<Ingress> {
        let local = socket.local_addr()?;
        let counts = Arc::new(CoapCounts::default());
        gw.attach_coap(counts.clone());
        let shared = Arc::new(Shared {
            gw,
            socket,
            config,
            memory: Mutex::new(Memory::default()),
            counts: counts.clone(),
            next_id: AtomicU16::new(StdRng::from_os_rng().random()),
        });
        let task = tokio::spawn(serve(shared));
        Ok(Ingress { counts, local, task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Its counters.
    pub fn counts(&self) -> &CoapCounts {
        &self.counts
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = match shared.socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                // An ICMP error from an earlier send can surface here; the socket stays usable.
                eprintln!("wary-gateway: coap: receiving: {}", e.kind());
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(datagram) = buf.get(..n) else { continue };
        datagram_in(&shared, datagram, peer).await;
    }
}

/// A Reset of message `id`.
fn reset(id: u16) -> Bytes {
    let mut p = Packet::new();
    p.header.set_type(MessageType::Reset);
    p.header.code = MessageClass::Empty;
    p.header.message_id = id;
    Bytes::from(p.to_bytes().unwrap_or_default())
}

/// An empty ACK of message `id`.
fn empty_ack(id: u16) -> Bytes {
    let mut p = Packet::new();
    p.header.set_type(MessageType::Acknowledgement);
    p.header.code = MessageClass::Empty;
    p.header.message_id = id;
    Bytes::from(p.to_bytes().unwrap_or_default())
}

/// A response: its code, Max-Age and payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The response code.
    pub code: ResponseType,
    /// Max-Age, seconds (5.03: when to send again).
    pub max_age: Option<u32>,
    /// Size1 (4.13: the largest payload accepted).
    pub size1: Option<u32>,
    /// The payload and whether it is JSON (else a diagnostic text, RFC 7252 section 5.5.2).
    pub payload: Vec<u8>,
    /// True if the payload is JSON (Content-Format 50).
    pub json: bool,
}

impl Reply {
    fn refusal(code: ResponseType, why: &str) -> Reply {
        Reply { code, max_age: None, size1: None, payload: why.as_bytes().to_vec(), json: false }
    }

    fn busy(why: &str) -> Reply {
        Reply { max_age: Some(1), ..Reply::refusal(ResponseType::ServiceUnavailable, why) }
    }

    fn encode(&self, kind: MessageType, id: u16, token: &[u8]) -> Bytes {
        let mut p = Packet::new();
        p.header.set_type(kind);
        p.header.code = MessageClass::Response(self.code);
        p.header.message_id = id;
        p.set_token(token.to_vec());
        if let Some(age) = self.max_age {
            p.add_option(CoapOption::MaxAge, uint(age));
        }
        if let Some(size) = self.size1 {
            p.add_option(CoapOption::Size1, uint(size));
        }
        if self.json {
            p.set_content_format(ContentFormat::ApplicationJSON);
        }
        if self.payload.len() <= MAX_PAYLOAD {
            p.payload.clone_from(&self.payload);
        }
        Bytes::from(p.to_bytes().unwrap_or_default())
    }
}

/// A CoAP uint option value: big-endian, no leading zero bytes (RFC 7252 section 3.2).
fn uint(v: u32) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    bytes.iter().skip(skip).copied().collect()
}

/// The CoAP response for a verdict (the table in the module's documentation).
pub fn reply(answer: &Answer) -> Reply {
    match answer {
        Answer::Landed(d) => {
            let code = if d.status == http::StatusCode::CREATED {
                ResponseType::Created
            } else {
                ResponseType::Changed
            };
            let json = d
                .content_type
                .as_ref()
                .and_then(|c| c.to_str().ok())
                .is_some_and(|c| c.split(';').next().is_some_and(|m| m.trim() == "application/json"));
            let payload = if json && d.body.len() <= MAX_PAYLOAD { d.body.to_vec() } else { Vec::new() };
            Reply { code, max_age: None, size1: None, json: json && !payload.is_empty(), payload }
        }
        Answer::GaveUp { retry_after_secs, .. } => Reply {
            max_age: Some(u32::try_from(*retry_after_secs).unwrap_or(u32::MAX).max(1)),
            ..Reply::refusal(ResponseType::ServiceUnavailable, "gave up for now; same key later")
        },
        Answer::Held { retry_after_secs, .. } => Reply {
            max_age: Some(u32::try_from(*retry_after_secs).unwrap_or(u32::MAX).max(1)),
            ..Reply::refusal(
                ResponseType::ServiceUnavailable,
                "the upstream refused the gateway; same key later",
            )
        },
        Answer::Failed { upstream_status } => {
            let code = match upstream_status {
                Some(403) => ResponseType::Forbidden,
                Some(404) => ResponseType::NotFound,
                Some(405) => ResponseType::MethodNotAllowed,
                Some(406) => ResponseType::NotAcceptable,
                Some(409) => ResponseType::Conflict,
                Some(412) => ResponseType::PreconditionFailed,
                Some(413) => ResponseType::RequestEntityTooLarge,
                Some(415) => ResponseType::UnsupportedContentFormat,
                Some(422) => ResponseType::UnprocessableEntity,
                _ => ResponseType::BadRequest,
            };
            Reply::refusal(code, "the upstream refused it; a resend cannot help")
        }
        Answer::Unknown => Reply::refusal(ResponseType::Conflict, "may have landed; do not resend"),
        Answer::Cancelled => Reply::busy("cancelled; same key later"),
    }
}

async fn datagram_in(shared: &Arc<Shared>, datagram: &[u8], peer: SocketAddr) {
    let packet = match Packet::from_bytes(datagram) {
        Ok(p) => p,
        Err(_) => {
            // A malformed confirmable message is rejected with a Reset (RFC 7252 section 4.2);
            // anything else malformed is silently ignored.
            if let [first, _, hi, lo, ..] = *datagram
                && first >> 6 == 1
                && (first >> 4) & 3 == 0
            {
                shared.counts.reset.fetch_add(1, Ordering::Relaxed);
                shared.send(&reset(u16::from_be_bytes([hi, lo])), peer).await;
            }
            return;
        }
    };
    let id = packet.header.message_id;
    match (packet.header.get_type(), packet.header.code) {
        (MessageType::Acknowledgement | MessageType::Reset, _) => {
            // The device's ACK (or Reset) of a separate response.
            if let Some(tx) = shared.memory().awaiting.remove(&(peer, id)) {
                let _ = tx.send(());
            }
        }
        (MessageType::Confirmable, MessageClass::Request(method)) => {
            request(shared, &packet, method, peer).await
        }
        (MessageType::NonConfirmable, MessageClass::Request(_)) | (MessageType::Confirmable, _) => {
            // Non-confirmable requests could not be answered after their verdict; a CON that
            // is no request (an empty one is a "ping") gets a Reset too (section 4.3).
            shared.counts.reset.fetch_add(1, Ordering::Relaxed);
            shared.send(&reset(id), peer).await;
        }
        _ => {}
    }
}

async fn request(shared: &Arc<Shared>, packet: &Packet, method: RequestType, peer: SocketAddr) {
    let id = (peer, packet.header.message_id);
    let token = packet.get_token().to_vec();
    let reply_now = {
        let mut memory = shared.memory();
        memory.expire(Instant::now(), shared.config.exchange_lifetime);
        match memory.exchanges.get(&id) {
            Some(known) => {
                shared.counts.duplicates.fetch_add(1, Ordering::Relaxed);
                match known {
                    // The piggybacked answer is on its way.
                    Exchange::Pending { empty_acked: false } => Vec::new(),
                    Exchange::Pending { empty_acked: true } => vec![empty_ack(id.1)],
                    Exchange::Done(replies) => replies.clone(),
                }
            }
            None if memory.exchanges.len() >= shared.config.max_exchanges => {
                vec![Reply::busy("too many exchanges; same key later").encode(
                    MessageType::Acknowledgement,
                    id.1,
                    &token,
                )]
            }
            None => {
                memory.exchanges.insert(id, Exchange::Pending { empty_acked: false });
                memory.order.push_back((Instant::now(), id));
                shared.counts.exchanges.fetch_add(1, Ordering::Relaxed);
                drop(memory);
                match forward(shared, packet, method) {
                    Ok(rx) => {
                        tokio::spawn(exchange(shared.clone(), id, token, rx));
                        Vec::new()
                    }
                    Err(reply) => {
                        let bytes = reply.encode(MessageType::Acknowledgement, id.1, &token);
                        shared.remember(id, Exchange::Done(vec![bytes.clone()]));
                        vec![bytes]
                    }
                }
            }
        }
    };
    for bytes in reply_now {
        shared.send(&bytes, peer).await;
    }
}

/// The reading's key, from the path `/r/<key>`: 32 lowercase hex digits (a parts key).
fn key_of(packet: &Packet) -> Result<String, Reply> {
    let path: Vec<&[u8]> = packet
        .get_option(CoapOption::UriPath)
        .map(|segments| segments.iter().map(Vec::as_slice).collect())
        .unwrap_or_default();
    let [b"r", key] = path.as_slice() else {
        return Err(Reply::refusal(ResponseType::NotFound, "readings go to /r/<key>"));
    };
    let ok = key.len() == 32 && key.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let key = std::str::from_utf8(key).ok().filter(|_| ok);
    key.map(str::to_owned)
        .ok_or_else(|| Reply::refusal(ResponseType::BadRequest, "the key must be 32 lowercase hex digits"))
}

/// Checks a request and submits it: the verdict's receiver, or the gateway's own refusal.
fn forward(
    shared: &Shared,
    packet: &Packet,
    method: RequestType,
) -> Result<oneshot::Receiver<Answer>, Reply> {
    let gw = &shared.gw;
    let refuse = |what: &'static str, reply: Reply| {
        gw.count_refusal(what);
        shared.counts.refused.fetch_add(1, Ordering::Relaxed);
        reply
    };
    for (&number, _) in packet.options() {
        if PROXY.contains(&number) {
            return Err(refuse(
                "bad_request",
                Reply::refusal(ResponseType::ProxyingNotSupported, "not a forward proxy"),
            ));
        }
        if number % 2 == 1 && !UNDERSTOOD.contains(&number) {
            return Err(refuse(
                "bad_request",
                Reply::refusal(ResponseType::BadOption, "unknown critical option"),
            ));
        }
    }
    let key = key_of(packet).map_err(|r| refuse("bad_request", r))?;
    if method != RequestType::Post {
        return Err(refuse("bad_request", Reply::refusal(ResponseType::MethodNotAllowed, "POST only")));
    }
    let format = packet.get_first_option_as::<OptionValueU16>(CoapOption::ContentFormat);
    match format {
        None => {}
        Some(Ok(f)) if usize::from(f.0) == JSON => {}
        Some(_) => {
            return Err(refuse(
                "bad_request",
                Reply::refusal(ResponseType::UnsupportedContentFormat, "readings are application/json"),
            ));
        }
    }
    let max_body = gw.config().max_body;
    if packet.payload.len() > max_body {
        return Err(refuse(
            "bad_request",
            Reply {
                size1: Some(u32::try_from(max_body).unwrap_or(u32::MAX)),
                ..Reply::refusal(ResponseType::RequestEntityTooLarge, "payload too large")
            },
        ));
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(&packet.payload).is_err() {
        return Err(refuse(
            "bad_request",
            Reply::refusal(ResponseType::BadRequest, "the payload is not JSON"),
        ));
    }
    let header = HeaderValue::from_str(&key)
        .map_err(|_| refuse("bad_request", Reply::refusal(ResponseType::BadRequest, "bad key")))?;
    let wary_key = Key::from_hex(&key).unwrap_or_else(|| Key::from_payload(key.as_bytes()));
    if gw.was_surfaced(wary_key) {
        return Err(reply(&Answer::Unknown));
    }
    let reading = Forward {
        key: header,
        wary_key,
        body: Bytes::from(packet.payload.clone()),
        content_type: Some(HeaderValue::from_static("application/json")),
    };
    match gw.try_submit(reading) {
        Ok(rx) => Ok(rx),
        Err(GatewayError::Full) => {
            gw.count_refusal("full");
            shared.counts.refused.fetch_add(1, Ordering::Relaxed);
            Err(Reply::busy("queue full; same key later"))
        }
        Err(_) => Err(reply(&Answer::Cancelled)),
    }
}

/// One exchange after its request was submitted: the verdict piggybacked, or an empty ACK and
/// then the verdict as a separate confirmable response.
async fn exchange(shared: Arc<Shared>, id: Id, token: Vec<u8>, mut rx: oneshot::Receiver<Answer>) {
    let (peer, mid) = id;
    if let Ok(answer) = tokio::time::timeout(shared.config.piggyback_wait, &mut rx).await {
        let answer = answer.unwrap_or(Answer::Cancelled);
        let bytes = reply(&answer).encode(MessageType::Acknowledgement, mid, &token);
        shared.remember(id, Exchange::Done(vec![bytes.clone()]));
        shared.counts.piggybacked.fetch_add(1, Ordering::Relaxed);
        shared.send(&bytes, peer).await;
        return;
    }
    let ack = empty_ack(mid);
    shared.remember(id, Exchange::Pending { empty_acked: true });
    shared.send(&ack, peer).await;
    let answer = rx.await.unwrap_or(Answer::Cancelled);
    shared.counts.separate.fetch_add(1, Ordering::Relaxed);
    let own = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let bytes = reply(&answer).encode(MessageType::Confirmable, own, &token);
    // From now on a retransmission of the request (a device that stopped listening before the
    // response came, or lost it) gets the empty ACK and the response again, from memory.
    shared.remember(id, Exchange::Done(vec![ack, bytes.clone()]));
    let (tx, mut acked) = oneshot::channel();
    shared.memory().awaiting.insert((peer, own), tx);
    // The first timeout drawn once in [ACK_TIMEOUT, 1.5 × ACK_TIMEOUT], doubled each time.
    let base = u64::try_from(shared.config.ack_timeout.as_millis()).unwrap_or(u64::MAX);
    let extra = StdRng::from_os_rng().random_range(0..=base / 2);
    let mut timeout = Duration::from_millis(base.saturating_add(extra));
    let mut confirmed = false;
    for _ in 0..=shared.config.max_retransmit {
        shared.send(&bytes, peer).await;
        if tokio::time::timeout(timeout, &mut acked).await.is_ok() {
            confirmed = true;
            break;
        }
        timeout = timeout.saturating_mul(2);
    }
    shared.memory().awaiting.remove(&(peer, own));
    if !confirmed {
        shared.counts.separate_unacknowledged.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::upstream::Delivered;
    use wary::GiveUp;

    #[test]
    fn verdicts_map_to_the_documented_codes() {
        let landed = |status: u16| {
            reply(&Answer::Landed(Delivered {
                status: http::StatusCode::from_u16(status).unwrap(),
                content_type: Some(HeaderValue::from_static("application/json")),
                body: Bytes::from_static(b"{\"ok\":true}"),
                body_ok: true,
            }))
        };
        assert_eq!(landed(201).code, ResponseType::Created);
        assert!(landed(201).json);
        assert_eq!(landed(200).code, ResponseType::Changed);
        let gave_up = reply(&Answer::GaveUp { reason: GiveUp::Budget, retry_after_secs: 7 });
        assert_eq!((gave_up.code, gave_up.max_age), (ResponseType::ServiceUnavailable, Some(7)));
        // A hold is a 5.03 too, never the 4.xx of a failure: the device keeps the reading.
        let fault = crate::hold::EndpointFault::Status(401);
        let held = reply(&Answer::Held { fault, retry_after_secs: 3 });
        assert_eq!((held.code, held.max_age), (ResponseType::ServiceUnavailable, Some(3)));
        let failed = |s| reply(&Answer::Failed { upstream_status: s }).code;
        assert_eq!(failed(Some(404)), ResponseType::NotFound);
        assert_eq!(failed(Some(422)), ResponseType::UnprocessableEntity);
        assert_eq!(failed(Some(401)), ResponseType::BadRequest);
        assert_eq!(failed(None), ResponseType::BadRequest);
        assert_eq!(reply(&Answer::Unknown).code, ResponseType::Conflict);
        assert_eq!(reply(&Answer::Cancelled).max_age, Some(1));
    }

    #[test]
    fn uint_options_have_no_leading_zeros() {
        assert_eq!(uint(0), Vec::<u8>::new());
        assert_eq!(uint(7), vec![7]);
        assert_eq!(uint(0x1_0000), vec![1, 0, 0]);
    }
}
