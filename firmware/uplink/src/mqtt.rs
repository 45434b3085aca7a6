//! MQTT 5 per reading (feature `mqtt`): [`MqttTransport`] publishes each reading as one QoS 1
//! `PUBLISH` to `wary/<device id>/readings`, its payload the reading's JSON body, with the user
//! property `Idempotency-Key` (the same on every attempt), Content Type `application/json` and
//! Payload Format Indicator 1, over one MQTT connection kept across attempts and readings.
//!
//! The client is [rust-mqtt](https://docs.rs/rust-mqtt) 0.6 (no allocator, MQTT 5 only, async over
//! `embedded-io-async`): it hands every PUBACK's reason code and every DISCONNECT's reason code
//! to the caller and resends nothing by itself, so the wary runner decides every resend, as for
//! HTTP. firmware/README.md compares it with minimq.
//!
//! **Plain or TLS**: the client speaks over a [`Pipe`]: the plain TCP socket ([`SharedSocket`]),
//! or with feature `tls` a TLS 1.3 session on it ([`crate::tls::TlsPipe`], the server's chain
//! checked against a pinned CA as for HTTPS). Over TLS the handshake is part of the connect: a
//! handshake that fails or times out ends `open` before anything was sent, and the session
//! lives exactly as long as its MQTT connection (one handshake per connection, not per
//! reading).
//!
//! **Logging in**: user name = the device id as 16 lowercase hex digits, password = the
//! device's token (64 hex digits, never logged); the broker's ACL lets a device publish only
//! under its own topic. Client id = `wary-` and the device id. Clean Start 1, Session Expiry 0:
//! no session survives a connection, so a reading resent after a lost PUBACK is a new `PUBLISH`
//! (new packet id, no DUP) on a new connection, and its key deduplicates it upstream. (A
//! resumed session would let the device resend with DUP and the same packet id, but the session
//! lives in RAM and a reset loses it: the key is what holds in every case.)
//!
//! **Connecting is part of an attempt**: [`Transport::open`] connects (TCP, `CONNECT`,
//! `CONNACK`) when no connection is open, within the attempt's limit. A refused `CONNACK`, a
//! dropped connection and a broker's `DISCONNECT` (a kick after a successful connect) all end
//! the attempt with a failure, and the runner's backoff with jitter paces the next connect:
//! there is no fixed sleep anywhere in the transport.
//!
//! **Keep alive**: the device asks for [`KEEP_ALIVE`]; a Server Keep Alive in the `CONNACK`
//! replaces it. Before a kept connection carries a reading, `open` checks that it is still
//! established and quiet (a broker's `DISCONNECT` waiting on it is read and answered as below);
//! one that idled past three quarters of the keep alive is pinged (`PINGREQ`, `PINGRESP`) before
//! it is used, so the broker never closes it for silence while a `PUBLISH` is on its way. A
//! Session Expiry the broker sets in its `CONNACK` is recorded; with Clean Start 1 on every
//! connect no state depends on it.
//!
//! The answers, in the seam's terms (HTTP-shaped statuses where the broker answered, so the
//! core's one table classifies MQTT and HTTP alike; the reading is a keyed write):
//!
//! | what came back | answer | the runner |
//! |---|---|---|
//! | `PUBACK` 0x00 success | `Ok(200)` | landed |
//! | `PUBACK` 0x10 no matching subscribers | `Ok(503)` | the broker dropped it: not landed, resent with backoff |
//! | `PUBACK` 0x97 quota exceeded | `Ok(429)`, no Retry-After | throttled: backoff |
//! | `PUBACK` 0x87 not authorized | `Ok(403)` | fails |
//! | `PUBACK` 0x90 topic name invalid | `Ok(404)` (where: the endpoint's fault) | fails |
//! | `PUBACK` 0x99 payload format invalid | `Ok(422)` | fails |
//! | `PUBACK` any other error (0x80, 0x83, 0x91) | `Ok(500)` | resent with its key (a keyed write) |
//! | `DISCONNECT` 0x89 server busy, 0x9C use another server, after the `PUBLISH` | `Ok(503)` | resent with backoff, on a new connection |
//! | `DISCONNECT` 0x97 quota exceeded, 0x9F connection rate exceeded, after the `PUBLISH` | `Ok(429)` | throttled: backoff, then a new connection |
//! | any other `DISCONNECT`, or the connection lost after the `PUBLISH` left and before its `PUBACK` | `Reset` | may have landed: resent with the same key |
//! | no `PUBACK` within the attempt's limit | `ResponseTimeout` | may have landed |
//! | a `DISCONNECT` found on a kept connection before the `PUBLISH` (a kick) | `open` fails: 0x89/0x9C `503`, 0x97/0x9F `429`, others `Refused` | never sent: resent after backoff |
//! | TCP refused, no route, no network | `open` fails: `Refused` | never sent |
//! | TCP connect or `CONNACK` timed out | `open` fails: `ConnectTimeout` | never sent |
//! | `CONNACK` 0x86 bad user name or password, 0x87 not authorized, 0x8C bad authentication method | `open` fails: `401` | the same every time: fails |
//! | `CONNACK` 0x89, 0x88 server unavailable, 0x9C, 0x9D | `open` fails: `503` | backoff |
//! | `CONNACK` 0x97, 0x9F | `open` fails: `429` | backoff |
//! | any other refused `CONNACK` | `open` fails: `Refused` | never sent: backoff |
//!
//! The statuses are the core's vocabulary for "the server answered this": the broker's reason
//! code is what the device logs (`MQTT` line, counts only), the status is what the policy
//! classifies. Nothing in the seam needed to change: a refused `CONNACK` is a
//! [`Failure::Status`] of `open`, since nothing was sent.

use core::fmt::Write as _;
use core::net::SocketAddrV4;
use core::num::NonZero;

use embassy_net::Stack;
use embassy_net::tcp::{State, TcpSocket};
use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embassy_sync::mutex::Mutex;
use embassy_time::{Instant, with_deadline};
use embedded_io_async::{ErrorType, Read, Write};
use heapless::String;
use rust_mqtt::Bytes;
/// The client's arena for what the broker sends (see [`Buffers`]).
pub use rust_mqtt::buffer::BumpBuffer;
use rust_mqtt::client::event::Event;
use rust_mqtt::client::options::DisconnectOptions;
use rust_mqtt::client::options::{ConnectOptions, PublicationOptions, TopicReference};
use rust_mqtt::client::{AbortError, Client, MqttError};
use rust_mqtt::config::{KeepAlive, SessionExpiryInterval};
use rust_mqtt::types::{MqttBinary, MqttString, MqttStringPair, TopicName};
use wary::{Duration, Failure};

use crate::http::{self, Response};
use crate::identity::Credential;
use crate::transport::{Answer, Counts, Message, Transport};

/// The keep alive the device asks for, in seconds; the broker's Server Keep Alive wins.
pub const KEEP_ALIVE: u16 = 60;

/// The name of the user property that carries the key.
pub const KEY_PROPERTY: &str = "Idempotency-Key";

/// The socket a [`MqttTransport`] uses, shared with the MQTT client through [`Link`] (the
/// client owns its stream; the transport must still reach the socket to close and reconnect it
/// whatever state the client was left in).
pub type SharedSocket<'a> = Mutex<NoopRawMutex, TcpSocket<'a>>;

/// The socket for a [`MqttTransport`], from `stack` with the buffers of [`Buffers::parts`].
pub fn shared_socket<'a>(stack: Stack<'a>, rx: &'a mut [u8], tx: &'a mut [u8]) -> SharedSocket<'a> {
    Mutex::new(TcpSocket::new(stack, rx, tx))
}

/// The MQTT client's stream: the shared socket. Only one of the transport and the client uses
/// it at a time (the transport's methods take `&mut self`), so the lock never waits.
#[derive(Clone, Copy)]
pub struct Link<'a>(&'a SharedSocket<'a>);

impl ErrorType for Link<'_> {
    type Error = embassy_net::tcp::Error;
}

impl Read for Link<'_> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        self.0.lock().await.read(buf).await
    }
}

impl Write for Link<'_> {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        self.0.lock().await.write(buf).await
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        self.0.lock().await.flush().await
    }
}

/// The connection the MQTT client speaks over: the plain socket ([`SharedSocket`]) or, with
/// feature `tls`, a TLS session on it ([`crate::tls::TlsPipe`]). The transport connects, checks
/// and ends it between the client's exchanges; the client reads and writes it through
/// [`Pipe::stream`] during them, never both at once (the transport's methods take `&mut self`).
#[allow(async_fn_in_trait)]
pub trait Pipe<'a> {
    /// The client's handle on the connection.
    type Stream: Read + Write;

    /// A handle for the client, given to it at each connect.
    fn stream(&'a self) -> Self::Stream;

    /// Opens the connection to `server` by `deadline`, closing what is left of an earlier one
    /// first (over TLS, the handshake too). Every failure is before anything was sent.
    async fn connect(&self, server: SocketAddrV4, deadline: Instant) -> Result<(), Failure>;

    /// Whether the connection is established and may still send, and whether the server sent
    /// bytes nobody has read.
    async fn state(&self) -> (bool, bool);

    /// Ends the connection: a clean close (over TLS a `close_notify`, then a FIN) when `clean`,
    /// an RST otherwise, waiting at most until `deadline`.
    async fn finish(&self, clean: bool, deadline: Instant);
}

impl<'a> Pipe<'a> for SharedSocket<'a> {
    type Stream = Link<'a>;

    fn stream(&'a self) -> Link<'a> {
        Link(self)
    }

    async fn connect(&self, server: SocketAddrV4, deadline: Instant) -> Result<(), Failure> {
        let mut socket = self.lock().await;
        http::reconnect(&mut socket, server, deadline).await.map_err(crate::transport::failure)
    }

    async fn state(&self) -> (bool, bool) {
        let socket = self.lock().await;
        (socket.state() == State::Established && socket.may_send(), socket.can_recv())
    }

    async fn finish(&self, clean: bool, deadline: Instant) {
        let mut socket = self.lock().await;
        http::finish(&mut socket, clean, deadline).await;
    }
}

/// The socket's buffers and the client's arena (strings the broker sends: with Request Problem
/// Information 0 it sends none on a `PUBACK`, so the arena only holds what a `CONNACK` or a
/// `DISCONNECT` carries). `const`, so they can live in a static.
pub struct Buffers<const SOCKET_RX: usize, const SOCKET_TX: usize, const ARENA: usize> {
    socket_rx: [u8; SOCKET_RX],
    socket_tx: [u8; SOCKET_TX],
    arena: [u8; ARENA],
}

impl<const SOCKET_RX: usize, const SOCKET_TX: usize, const ARENA: usize> Default
    for Buffers<SOCKET_RX, SOCKET_TX, ARENA>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<const SOCKET_RX: usize, const SOCKET_TX: usize, const ARENA: usize>
    Buffers<SOCKET_RX, SOCKET_TX, ARENA>
{
    /// Zeroed buffers.
    pub const fn new() -> Self {
        Self { socket_rx: [0; SOCKET_RX], socket_tx: [0; SOCKET_TX], arena: [0; ARENA] }
    }

    /// The socket's receive and send buffers and the arena, apart.
    pub fn parts(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        (&mut self.socket_rx, &mut self.socket_tx, &mut self.arena)
    }
}

/// The MQTT client as the transport uses it: publishes only (no subscriptions, no topic
/// aliases), one QoS 1 publish in flight, one user property.
type MqttClient<'a, S> = Client<'a, 'a, S, BumpBuffer<'a>, 0, 1, 1, 0, 1, 0, 0>;

/// What the MQTT transport saw, beside the exchange counts: reason codes by kind, for the
/// `MQTT` summary line. Counts only, never payloads, keys or the token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, defmt::Format)]
pub struct MqttCounts {
    /// `CONNACK` 0x00 received.
    pub connacks: u32,
    /// `CONNACK`s that refused the connection.
    pub connack_refused: u32,
    /// `PUBLISH` packets sent.
    pub publishes: u32,
    /// `PUBACK` 0x00.
    pub puback_ok: u32,
    /// `PUBACK` 0x10 (no matching subscribers).
    pub puback_no_subscribers: u32,
    /// `PUBACK` 0x97 (quota exceeded).
    pub puback_quota: u32,
    /// `PUBACK` 0x87, 0x90, 0x99 and other errors.
    pub puback_error: u32,
    /// `DISCONNECT`s from the broker (while a `PUBLISH` waited, or found on a kept connection).
    pub disconnects: u32,
    /// Connections lost with a `PUBLISH` unanswered (may have landed).
    pub lost_in_flight: u32,
    /// `PINGREQ`s sent on a kept connection that idled.
    pub pings: u32,
    /// The keep alive in force on the last connection, in seconds (0: none).
    pub keep_alive: u16,
}

impl MqttCounts {
    /// Logs the `MQTT` line the host-side scenarios read.
    pub fn log(&self) {
        defmt::info!(
            "MQTT connacks={=u32} connack_refused={=u32} publishes={=u32} puback_ok={=u32} puback_no_subscribers={=u32} puback_quota={=u32} puback_error={=u32} disconnects={=u32} lost_in_flight={=u32} pings={=u32} keep_alive={=u16}",
            self.connacks,
            self.connack_refused,
            self.publishes,
            self.puback_ok,
            self.puback_no_subscribers,
            self.puback_quota,
            self.puback_error,
            self.disconnects,
            self.lost_in_flight,
            self.pings,
            self.keep_alive
        );
    }
}

/// The status a `PUBACK` reason code is answered as (see the module docs' table).
pub const fn puback_status(code: u8) -> u16 {
    match code {
        0x00 => 200,
        // No matching subscribers: the broker accepted the packet and dropped the message.
        0x10 => 503,
        0x97 => 429,
        0x87 => 403,
        0x90 => 404,
        0x99 => 422,
        _ => 500,
    }
}

/// The status a broker's `DISCONNECT` reason code paces the reconnect with, or `None` when it
/// says nothing about the broker's load (the exchange is then a plain failure).
pub const fn disconnect_status(code: u8) -> Option<u16> {
    match code {
        0x89 | 0x9C => Some(503),
        0x97 | 0x9F => Some(429),
        _ => None,
    }
}

/// The failure of `open` for a `CONNACK` that refused the connection with `code`.
pub const fn connack_failure(code: u8) -> Failure {
    match code {
        0x86 | 0x87 | 0x8C => Failure::status(401),
        0x88 | 0x89 | 0x9C | 0x9D => Failure::status(503),
        0x97 | 0x9F => Failure::status(429),
        _ => Failure::Refused,
    }
}

fn reply(status: u16) -> Response {
    Response {
        status,
        retry_after: heapless::Vec::new(),
        retry_after_dropped: 0,
        date: None,
        date_dropped: false,
        body_complete: true,
    }
}

/// How a connect ended.
enum Connack {
    Accepted,
    Refused(u8),
    /// The connection broke or the broker broke the protocol before a `CONNACK`.
    Broken,
    TimedOut,
}

/// The open connection.
#[derive(Clone, Copy)]
struct Session {
    /// When the device last sent a packet on it.
    last_sent: Instant,
    /// The keep alive in force, if any.
    keep_alive: Option<embassy_time::Duration>,
    /// `PUBLISH`es it carried.
    publishes: u32,
}

/// Readings as MQTT 5 QoS 1 `PUBLISH`es to one broker, over the plain socket or a TLS session
/// ([`Pipe`]); see the module docs.
pub struct MqttTransport<'a, P: Pipe<'a> = SharedSocket<'a>> {
    stack: Stack<'a>,
    server: SocketAddrV4,
    socket: &'a P,
    client: MqttClient<'a, P::Stream>,
    credential: &'a Credential,
    user: String<16>,
    client_id: String<21>,
    topic: String<40>,
    session: Option<Session>,
    deadline: Option<Instant>,
    counts: Counts,
    mqtt: MqttCounts,
}

impl<'a, P: Pipe<'a>> MqttTransport<'a, P> {
    /// Publishes for `device` (logging in with its `credential`) to the broker at `server`,
    /// through `socket` (made from `stack`: a [`SharedSocket`], or a TLS session's
    /// [`crate::tls::TlsPipe`]), with `arena` for what the broker sends.
    pub fn new(
        stack: Stack<'a>,
        server: SocketAddrV4,
        device: u64,
        credential: &'a Credential,
        socket: &'a P,
        arena: &'a mut BumpBuffer<'a>,
    ) -> Self {
        let mut user = String::new();
        let mut client_id = String::new();
        let mut topic = String::new();
        // Fixed-width hex: each fits its capacity, so none of these fails.
        let _ = write!(user, "{device:016x}");
        let _ = write!(client_id, "wary-{device:016x}");
        let _ = write!(topic, "wary/{device:016x}/readings");
        MqttTransport {
            stack,
            server,
            socket,
            client: Client::new(arena),
            credential,
            user,
            client_id,
            topic,
            session: None,
            deadline: None,
            counts: Counts::default(),
            mqtt: MqttCounts::default(),
        }
    }

    /// The exchange counts (the summary's `exchanges`, `maybe_landed`, `never_sent`, `connects`,
    /// `reused`).
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The reason codes seen.
    pub fn mqtt_counts(&self) -> MqttCounts {
        self.mqtt
    }

    /// Ends the connection: the TCP connection is closed (a FIN when `clean`, an RST
    /// otherwise); the client's state is replaced at the next connect.
    async fn end(&mut self, clean: bool) {
        self.session = None;
        // The client's connection state ends too, so the next `connect` starts from a closed
        // one: after a failure it sends its DISCONNECT with the reason (if it has one) and
        // gives the stream up; on a connection it still takes for healthy (an attempt ran out
        // of time) it sends a plain DISCONNECT. Onto a closed socket these fail harmlessly.
        let grace = http::CLOSE_GRACE;
        if let Ok(Err(AbortError::Connected)) = embassy_time::with_timeout(grace, self.client.abort()).await {
            let _ =
                embassy_time::with_timeout(grace, self.client.disconnect(&DisconnectOptions::new())).await;
        }
        let deadline = Instant::now().saturating_add(http::CLOSE_GRACE);
        self.socket.finish(clean, deadline).await;
    }

    /// Checks the kept connection before it carries a reading: gone, kicked, or idle too long.
    async fn check_kept(&mut self, deadline: Instant) -> Result<(), Failure> {
        let Some(session) = self.session else { return Ok(()) };
        let (established, waiting) = self.socket.state().await;
        if waiting {
            // The broker sent something nobody asked for: a DISCONNECT (a kick), or garbage.
            let code = match with_deadline(deadline, self.client.poll()).await {
                Ok(Err(MqttError::Disconnect { reason, .. })) => Some(reason.value()),
                _ => None,
            };
            self.mqtt.disconnects = self.mqtt.disconnects.saturating_add(u32::from(code.is_some()));
            self.end(false).await;
            defmt::info!("mqtt: the kept connection was ended by the broker ({=?})", code);
            return Err(match code.and_then(disconnect_status) {
                Some(status) => Failure::status(status),
                None => Failure::Refused,
            });
        }
        if !established {
            defmt::info!("mqtt: the kept connection was closed by the broker; a new one");
            self.end(false).await;
            return Ok(());
        }
        if let Some(keep_alive) = session.keep_alive
            && session.last_sent.elapsed() > keep_alive.checked_mul(3).map_or(keep_alive, |d| d / 4)
        {
            self.mqtt.pings = self.mqtt.pings.saturating_add(1);
            let pinged = match with_deadline(deadline, self.client.ping()).await {
                Ok(Ok(())) => {
                    matches!(with_deadline(deadline, self.client.poll()).await, Ok(Ok(Event::Pingresp)))
                }
                _ => false,
            };
            if pinged {
                if let Some(s) = self.session.as_mut() {
                    s.last_sent = Instant::now();
                }
            } else {
                self.end(false).await;
            }
        }
        Ok(())
    }

    /// Makes sure a connection is open by `deadline`.
    async fn ensure_open(&mut self, deadline: Instant) -> Result<(), Failure> {
        self.check_kept(deadline).await?;
        if self.session.is_some() {
            return Ok(());
        }
        if !self.stack.is_link_up() || self.stack.config_v4().is_none() {
            return Err(Failure::Refused);
        }
        self.counts.connects = self.counts.connects.saturating_add(1);
        self.socket.connect(self.server, deadline).await?;
        // SAFETY: nothing borrowed from the arena outlives a call into this transport (every
        // event the client returns is read and dropped before `open` or `send` returns), so no
        // slice of it is alive when it is reused for a new connection.
        unsafe { self.client.buffer_mut().reset() };
        let token = self.credential.header_value().strip_prefix("Bearer ").unwrap_or_default();
        let (Ok(user), Ok(password), Ok(client_id)) = (
            MqttString::from_str(&self.user),
            MqttBinary::from_slice(token.as_bytes()),
            MqttString::from_str(&self.client_id),
        ) else {
            self.end(false).await;
            return Err(Failure::BadBody);
        };
        let options = ConnectOptions::new()
            .clean_start()
            .session_expiry_interval(SessionExpiryInterval::EndOnDisconnect)
            .keep_alive(NonZero::new(KEEP_ALIVE).map_or(KeepAlive::Infinite, KeepAlive::Seconds))
            .user_name(user)
            .password(password);
        let connack = match with_deadline(
            deadline,
            self.client.connect(self.socket.stream(), &options, Some(client_id)),
        )
        .await
        {
            Ok(Ok(_connected)) => Connack::Accepted,
            Ok(Err(MqttError::Disconnect { reason, .. })) => Connack::Refused(reason.value()),
            Ok(Err(_)) => Connack::Broken,
            Err(_) => Connack::TimedOut,
        };
        match connack {
            Connack::Accepted => {
                self.mqtt.connacks = self.mqtt.connacks.saturating_add(1);
                let keep_alive = match self.client.shared_config().keep_alive {
                    KeepAlive::Seconds(s) => Some(embassy_time::Duration::from_secs(u64::from(s.get()))),
                    KeepAlive::Infinite => None,
                };
                self.mqtt.keep_alive =
                    keep_alive.map_or(0, |k| u16::try_from(k.as_secs()).unwrap_or(u16::MAX));
                self.session = Some(Session { last_sent: Instant::now(), keep_alive, publishes: 0 });
                Ok(())
            }
            Connack::Refused(code) => {
                self.mqtt.connack_refused = self.mqtt.connack_refused.saturating_add(1);
                self.end(false).await;
                defmt::info!("mqtt: CONNACK refused with {=u8:#04x}", code);
                Err(connack_failure(code))
            }
            Connack::Broken => {
                self.end(false).await;
                Err(Failure::Refused)
            }
            Connack::TimedOut => {
                self.end(false).await;
                Err(Failure::ConnectTimeout)
            }
        }
    }

    /// One reading as one `PUBLISH` on the open connection, and its answer.
    async fn exchange(&mut self, message: &Message<'_>, deadline: Instant) -> Answer {
        if self.session.is_none() {
            return Err(Failure::Refused);
        }
        let (Ok(topic), Ok(name), Ok(key), Ok(json)) = (
            MqttString::from_str(&self.topic),
            MqttString::from_str(KEY_PROPERTY),
            MqttString::from_str(message.key),
            MqttString::from_str("application/json"),
        ) else {
            return Err(Failure::BadBody);
        };
        let Some(topic) = TopicName::new(topic) else { return Err(Failure::BadBody) };
        let properties = [MqttStringPair::new(name, key)];
        let mut options = PublicationOptions::new(TopicReference::Name(topic))
            .at_least_once()
            .payload_format_indicator(true);
        options.content_type = Some(json);
        options.user_properties = &properties;
        let reused = self.session.is_some_and(|s| s.publishes > 0);
        self.mqtt.publishes = self.mqtt.publishes.saturating_add(1);
        let sent = with_deadline(deadline, self.client.publish(&options, Bytes::from(message.body))).await;
        let pid = match sent {
            Ok(Ok(Some(pid))) => pid,
            Ok(Ok(None)) | Ok(Err(_)) => {
                // Part of the packet may be on its way: it may have landed.
                self.mqtt.lost_in_flight = self.mqtt.lost_in_flight.saturating_add(1);
                self.end(false).await;
                return Err(Failure::Reset);
            }
            Err(_) => {
                self.end(false).await;
                return Err(Failure::ResponseTimeout);
            }
        };
        if reused {
            self.counts.reused = self.counts.reused.saturating_add(1);
        }
        if let Some(s) = self.session.as_mut() {
            s.last_sent = Instant::now();
            s.publishes = s.publishes.saturating_add(1);
        }
        loop {
            let event = match with_deadline(deadline, self.client.poll()).await {
                Ok(event) => event,
                Err(_) => {
                    self.end(false).await;
                    return Err(Failure::ResponseTimeout);
                }
            };
            let code: Result<u8, Answer> = match event {
                Ok(Event::PublishAcknowledged(ack)) if ack.packet_identifier == pid => {
                    Ok(ack.reason_code.value())
                }
                Ok(Event::PublishRejected(rej)) if rej.packet_identifier == pid => {
                    Ok(rej.reason_code.value())
                }
                // A PINGRESP or a stale answer: keep reading.
                Ok(_) => continue,
                Err(MqttError::Disconnect { reason, .. }) => {
                    self.mqtt.disconnects = self.mqtt.disconnects.saturating_add(1);
                    self.mqtt.lost_in_flight = self.mqtt.lost_in_flight.saturating_add(1);
                    self.end(false).await;
                    Err(match disconnect_status(reason.value()) {
                        Some(status) => Ok(reply(status)),
                        None => Err(Failure::Reset),
                    })
                }
                Err(_) => {
                    self.mqtt.lost_in_flight = self.mqtt.lost_in_flight.saturating_add(1);
                    self.end(false).await;
                    Err(Err(Failure::Reset))
                }
            };
            return match code {
                Ok(code) => {
                    let counter = match code {
                        0x00 => &mut self.mqtt.puback_ok,
                        0x10 => &mut self.mqtt.puback_no_subscribers,
                        0x97 => &mut self.mqtt.puback_quota,
                        _ => &mut self.mqtt.puback_error,
                    };
                    *counter = counter.saturating_add(1);
                    Ok(reply(puback_status(code)))
                }
                Err(answer) => answer,
            };
        }
    }
}

impl<'a, P: Pipe<'a>> Transport for MqttTransport<'a, P> {
    async fn open(&mut self, limit: Duration) -> Result<(), Failure> {
        let deadline = Instant::now().saturating_add(limit.into());
        self.deadline = Some(deadline);
        let result = self.ensure_open(deadline).await;
        if result.is_err() {
            self.counts.exchanges = self.counts.exchanges.saturating_add(1);
            self.counts.never_sent = self.counts.never_sent.saturating_add(1);
        }
        result
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        let by_limit = Instant::now().saturating_add(limit.into());
        let deadline = self.deadline.take().map_or(by_limit, |open| open.min(by_limit));
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            let answer = self.exchange(message, deadline).await;
            self.counts.exchanges = self.counts.exchanges.saturating_add(1);
            match &answer {
                Ok(_) => self.counts.replies = self.counts.replies.saturating_add(1),
                Err(Failure::Refused | Failure::BadBody) => {
                    self.counts.never_sent = self.counts.never_sent.saturating_add(1);
                }
                Err(_) => self.counts.maybe_landed = self.counts.maybe_landed.saturating_add(1),
            }
            *slot = answer;
        }
    }

    async fn close(&mut self) {
        if self.session.is_some() {
            // A clean DISCONNECT (0x00), then the FIN.
            self.end(true).await;
        }
    }
}
