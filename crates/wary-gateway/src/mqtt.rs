//! MQTT in: the gateway takes devices' readings from a broker, as one of a shared group.
//!
//! Each reading is one MQTT 5 QoS 1 PUBLISH on `wary/<device id, 16 hex>/readings` whose payload
//! is the JSON body a device would POST, with the user property `Idempotency-Key`. The gateway
//! subscribes to `$share/<group>/wary/+/readings` with a persistent session (clean start off, a
//! session expiry) under a client id of its own, so a replica restarted under the same id gets
//! back the messages it had not acknowledged.
//!
//! - **Checked first**: the topic names a device, the key is one visible-ASCII value of at most
//!   255 bytes starting with that device's 16 hex digits, the payload is JSON within the body
//!   limit. A message failing any of these is refused: acknowledged, counted by reason, logged
//!   without its payload, never forwarded.
//! - **Forwarded** as one wary call, exactly as a `POST /readings` is (the same queue, workers,
//!   upstream client and key header).
//! - **Acknowledged after the verdict**: landed, or failed and reported (counted, logged with its
//!   key, in the ledger). A call that gave up is not a verdict the broker should hear: the
//!   gateway keeps the message and calls again (same key) after the give-up's `Retry-After`,
//!   until it lands or fails. Its acknowledgement waits; if the gateway dies meanwhile the broker
//!   redelivers it to the restarted replica. A call **held** because the upstream refused the
//!   gateway itself ([`crate::hold`]: its credential, path, proxy or TLS) is treated the same
//!   way: not acknowledged, called again after the hold's `Retry-After` (counted as `held` and
//!   `called_again`), never failed or dropped for the gateway's own configuration.
//! - **In order**: MQTT wants acknowledgements in the order the messages arrived, and the broker
//!   sends at most Receive Maximum unacknowledged messages. Calls run concurrently; each
//!   connection's acknowledgements are released in arrival order as soon as the oldest
//!   outstanding message has its verdict, so one slow call holds back the acknowledgements
//!   behind it (and, once the window is full, new deliveries) but not their calls.
//! - **Reconnects** are paced by the core's [`Backoff`] (jittered). Acknowledgements owed on a
//!   connection that broke are dropped, never sent on the next one: the broker redelivers those
//!   messages (DUP) when the session resumes, and the upstream deduplicates the second call by
//!   key. Calls already running still end with a verdict.
//! - **Leaving**: a replica id taken out of the set for good must leave the group
//!   ([`Ingress::leave`], `--mqtt-leave`), or the broker keeps dealing it turns that nobody takes.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration as StdDuration;

use http::header::HeaderValue;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use tokio::sync::mpsc;
use wary::{Backoff, Draw, Duration, Jitter};

use crate::credentials::device_of_key;
use crate::gateway::{Answer, Gateway};
use crate::ingress::MAX_KEY_LEN;
use crate::upstream::Forward;

/// The topic filter the readings are published under.
pub const READINGS_FILTER: &str = "wary/+/readings";
/// The user property carrying a reading's idempotency key.
pub const KEY_PROPERTY: &str = "Idempotency-Key";
/// The reconnect schedule: 100 ms doubling to 10 s, fully jittered, so that replicas that lost
/// the broker together do not come back together.
pub const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(10), Jitter::Full);

/// The shared subscription of `group`.
pub fn subscription(group: &str) -> String {
    format!("$share/{group}/{READINGS_FILTER}")
}

/// How the gateway meets the broker.
#[derive(Clone)]
pub struct MqttConfig {
    /// The broker's host.
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// The shared subscription's group.
    pub group: String,
    /// This replica's client id, kept across restarts so its session (and the messages it had
    /// not acknowledged) come back to it.
    pub client_id: String,
    /// The gateway's login.
    pub username: String,
    /// Its password (never logged: `Debug` leaves it out).
    pub password: String,
    /// The MQTT 5 session expiry: how long the broker keeps this replica's session, and queues
    /// messages for it, while it is away.
    pub session_expiry_secs: u32,
    /// Receive Maximum: unacknowledged messages the broker may send this replica at once.
    pub receive_maximum: u16,
    /// Keep alive.
    pub keep_alive: StdDuration,
    /// TLS to the broker with this client configuration (its roots say whom to trust; the
    /// broker's certificate must name `host`); `None`: plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl MqttConfig {
    /// Defaults for a broker at `host:port`: group `wary`, login `gateway`, a one-day session
    /// expiry, Receive Maximum 20 (mosquitto's in-flight default), 30 s keep alive.
    pub fn new(host: &str, port: u16, client_id: &str, password: &str) -> Self {
        MqttConfig {
            host: host.to_owned(),
            port,
            group: "wary".to_owned(),
            client_id: client_id.to_owned(),
            username: "gateway".to_owned(),
            password: password.to_owned(),
            session_expiry_secs: 86_400,
            receive_maximum: 20,
            keep_alive: StdDuration::from_secs(30),
            tls: None,
        }
    }
}

impl std::fmt::Debug for MqttConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("group", &self.group)
            .field("client_id", &self.client_id)
            .field("username", &self.username)
            .field("session_expiry_secs", &self.session_expiry_secs)
            .field("receive_maximum", &self.receive_maximum)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a message was refused (acknowledged, counted, never forwarded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The topic is not `wary/<16 hex>/readings`.
    #[error("topic is not wary/<device>/readings")]
    BadTopic,
    /// No `Idempotency-Key` user property.
    #[error("no Idempotency-Key")]
    NoKey,
    /// The key is not one value of 1..=255 visible ASCII characters.
    #[error("Idempotency-Key must be one value of 1..=255 visible ASCII characters")]
    BadKey,
    /// The key's device is not the topic's device.
    #[error("the key is not the topic's device's")]
    Forbidden,
    /// The payload is larger than the gateway accepts.
    #[error("payload too large")]
    TooLarge,
    /// The payload is empty or not JSON.
    #[error("payload is not JSON")]
    NotJson,
    /// Not QoS 1.
    #[error("not QoS 1")]
    NotQos1,
}

impl Refusal {
    /// Every refusal, for the counters.
    pub const ALL: [Refusal; 7] = [
        Refusal::BadTopic,
        Refusal::NoKey,
        Refusal::BadKey,
        Refusal::Forbidden,
        Refusal::TooLarge,
        Refusal::NotJson,
        Refusal::NotQos1,
    ];

    /// The counter's label.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::BadTopic => "bad_topic",
            Refusal::NoKey => "no_key",
            Refusal::BadKey => "bad_key",
            Refusal::Forbidden => "forbidden",
            Refusal::TooLarge => "too_large",
            Refusal::NotJson => "not_json",
            Refusal::NotQos1 => "not_qos1",
        }
    }
}

/// The device a readings topic names.
pub fn device_of_topic(topic: &[u8]) -> Option<u64> {
    let rest = topic.strip_prefix(b"wary/")?;
    let hex = rest.strip_suffix(b"/readings")?;
    if hex.len() != 16 || !hex.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)) {
        return None;
    }
    device_of_key(hex)
}

/// Checks one message and makes the upstream call's input, or says why it is refused.
pub fn check(publish: &Publish, max_body: usize) -> Result<Forward, Refusal> {
    let device = device_of_topic(&publish.topic).ok_or(Refusal::BadTopic)?;
    if publish.qos != QoS::AtLeastOnce {
        return Err(Refusal::NotQos1);
    }
    let props = publish.properties.as_ref();
    let mut keys = props
        .into_iter()
        .flat_map(|p: &PublishProperties| p.user_properties.iter())
        .filter(|(name, _)| name.eq_ignore_ascii_case(KEY_PROPERTY));
    let (_, key) = keys.next().ok_or(Refusal::NoKey)?;
    let ok = keys.next().is_none()
        && (1..=MAX_KEY_LEN).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_graphic());
    let key = HeaderValue::from_str(key).ok().filter(|_| ok).ok_or(Refusal::BadKey)?;
    if device_of_key(key.as_bytes()) != Some(device) {
        return Err(Refusal::Forbidden);
    }
    if publish.payload.len() > max_body {
        return Err(Refusal::TooLarge);
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(&publish.payload).is_err() {
        return Err(Refusal::NotJson);
    }
    let content_type = props
        .and_then(|p| p.content_type.as_deref())
        .and_then(|c| HeaderValue::from_str(c).ok())
        .unwrap_or(HeaderValue::from_static("application/json"));
    Ok(Forward {
        wary_key: crate::ingress::wary_key(&key),
        key,
        body: publish.payload.clone(),
        content_type: Some(content_type),
    })
}

/// The MQTT ingress's counters (Prometheus `wary_gateway_mqtt_*`).
#[derive(Debug, Default)]
pub struct MqttCounts {
    /// Messages received.
    pub received: AtomicU64,
    /// Of them, redeliveries (the DUP flag set).
    pub redelivered: AtomicU64,
    /// Messages refused, by [`Refusal`] (in [`Refusal::ALL`]'s order).
    pub refused: [AtomicU64; 7],
    /// Messages that landed upstream.
    pub landed: AtomicU64,
    /// Messages the upstream failed (a resend cannot help), reported and acknowledged.
    pub failed: AtomicU64,
    /// Messages answered `unknown` (legacy upstreams), surfaced and acknowledged.
    pub unknown: AtomicU64,
    /// Calls that gave up, were held or were cancelled, and were made again later, same key.
    pub called_again: AtomicU64,
    /// Of them, calls held because the upstream refused the gateway itself ([`crate::hold`]).
    pub held: AtomicU64,
    /// Acknowledgements sent.
    pub acked: AtomicU64,
    /// Acknowledgements dropped because their connection had broken (the broker redelivers).
    pub acks_dropped: AtomicU64,
    /// Connections made (CONNACK received).
    pub connects: AtomicU64,
    /// Of them, connections that found the session kept.
    pub sessions_resumed: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl MqttCounts {
    /// Refusals of one kind.
    pub fn refused(&self, r: Refusal) -> u64 {
        Refusal::ALL
            .iter()
            .position(|x| *x == r)
            .and_then(|i| self.refused.get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn refuse(&self, r: Refusal) {
        if let Some(c) = Refusal::ALL.iter().position(|x| *x == r).and_then(|i| self.refused.get(i)) {
            bump(c);
        }
    }

    /// The Prometheus text of these counters.
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        let mut one = |name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(s, "# HELP wary_gateway_mqtt_{name} {help}");
            let _ = writeln!(s, "# TYPE wary_gateway_mqtt_{name} counter");
            let _ = writeln!(s, "wary_gateway_mqtt_{name} {}", v.load(Ordering::Relaxed));
        };
        one("received_total", "MQTT messages received.", &self.received);
        one("redelivered_total", "MQTT messages received with DUP set (redeliveries).", &self.redelivered);
        one("landed_total", "MQTT messages that landed upstream.", &self.landed);
        one("failed_total", "MQTT messages the upstream failed, reported and acknowledged.", &self.failed);
        one("unknown_total", "MQTT messages answered unknown, surfaced and acknowledged.", &self.unknown);
        one("called_again_total", "Calls that gave up and were made again, same key.", &self.called_again);
        one(
            "held_total",
            "Calls held (the upstream refused the gateway itself), not acknowledged, made again.",
            &self.held,
        );
        one("acked_total", "PUBACKs sent.", &self.acked);
        one("acks_dropped_total", "PUBACKs dropped with their broken connection.", &self.acks_dropped);
        one("connects_total", "Connections to the broker.", &self.connects);
        one("sessions_resumed_total", "Connections that found the session kept.", &self.sessions_resumed);
        let _ = writeln!(s, "# HELP wary_gateway_mqtt_refused_total MQTT messages refused, by reason.");
        let _ = writeln!(s, "# TYPE wary_gateway_mqtt_refused_total counter");
        for r in Refusal::ALL {
            let _ =
                writeln!(s, "wary_gateway_mqtt_refused_total{{reason=\"{}\"}} {}", r.name(), self.refused(r));
        }
        s
    }
}

/// The MQTT ingress of one gateway: start it with [`Ingress::start`].
pub struct Ingress {
    counts: Arc<MqttCounts>,
    client: AsyncClient,
    filter: String,
    leaving: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Ingress {
    /// Connects to the broker (and keeps reconnecting) and forwards its messages through `gw`.
    pub fn start(gw: Arc<Gateway>, config: &MqttConfig) -> Self {
        let mut options = MqttOptions::new(config.client_id.clone(), config.host.clone(), config.port);
        options
            .set_credentials(config.username.clone(), config.password.clone())
            .set_clean_start(false)
            .set_session_expiry_interval(Some(config.session_expiry_secs))
            .set_receive_maximum(Some(config.receive_maximum.max(1)))
            .set_manual_acks(true)
            .set_keep_alive(config.keep_alive)
            // Room for any message the broker passes on: one over the body limit is refused
            // (and counted) here, not dropped unseen because the packet was too large.
            .set_max_packet_size(Some(1 << 20));
        if let Some(tls) = &config.tls {
            options.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(
                tls.clone(),
            )));
        }
        // The request channel holds acknowledgements and the subscription; it never needs more
        // than the window, with room to spare.
        let cap = usize::from(config.receive_maximum.max(1)).saturating_mul(4).max(64);
        let (client, eventloop) = AsyncClient::new(options, cap);
        let counts = Arc::new(MqttCounts::default());
        gw.attach_mqtt(counts.clone());
        let epoch = Arc::new(AtomicU64::new(0));
        let leaving = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let filter = subscription(&config.group);
        let (tx, rx) = mpsc::unbounded_channel();
        let link = Link { client: client.clone(), filter: filter.clone(), leaving: leaving.clone() };
        let poll = tokio::spawn(poll(eventloop, link, counts.clone(), epoch.clone(), tx));
        let order = tokio::spawn(order(gw, client.clone(), counts.clone(), epoch, rx));
        Ingress { counts, client, filter, leaving, tasks: vec![poll, order] }
    }

    /// Takes this replica's id out of the group for good: unsubscribes (so the broker deals it
    /// no more turns), forwards and acknowledges what its session still held, and returns once
    /// nothing has arrived for `quiet` and every message received is acknowledged; then
    /// disconnects. Its session is left empty. Gives up after `limit` with the number of
    /// messages still unacknowledged (the session keeps them).
    pub async fn leave(&self, quiet: StdDuration, limit: StdDuration) -> Result<(), u64> {
        self.leaving.store(true, Ordering::SeqCst);
        let end = tokio::time::Instant::now() + limit;
        let connected = |c: &MqttCounts| c.connects.load(Ordering::SeqCst) > 0;
        while !connected(&self.counts) && tokio::time::Instant::now() < end {
            tokio::time::sleep(StdDuration::from_millis(20)).await;
        }
        let _ = self.client.unsubscribe(self.filter.clone()).await;
        let mut last = (u64::MAX, tokio::time::Instant::now());
        loop {
            let received = self.counts.received.load(Ordering::SeqCst);
            let acked = self.counts.acked.load(Ordering::SeqCst);
            let now = tokio::time::Instant::now();
            if received != last.0 {
                last = (received, now);
            } else if acked >= received && now.duration_since(last.1) >= quiet {
                let _ = self.client.disconnect().await;
                tokio::time::sleep(StdDuration::from_millis(100)).await;
                return Ok(());
            }
            if now >= end {
                return Err(received.saturating_sub(acked));
            }
            tokio::time::sleep(StdDuration::from_millis(20)).await;
        }
    }

    /// The counters.
    pub fn counts(&self) -> &Arc<MqttCounts> {
        &self.counts
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

enum Delivery {
    /// A connection came up (its epoch).
    Connected(u64),
    /// A message on the connection of that epoch.
    Message(u64, Box<Publish>),
}

/// What the poll task needs of the client: to subscribe after each connect, unless the replica
/// is leaving the group.
struct Link {
    client: AsyncClient,
    filter: String,
    leaving: Arc<std::sync::atomic::AtomicBool>,
}

async fn poll(
    mut eventloop: EventLoop,
    link: Link,
    counts: Arc<MqttCounts>,
    epoch: Arc<AtomicU64>,
    tx: mpsc::UnboundedSender<Delivery>,
) {
    let mut failures = 0u32;
    let mut previous = Duration::ZERO;
    let mut rng = wary_host::draw::for_call();
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                failures = 0;
                previous = Duration::ZERO;
                bump(&counts.connects);
                if ack.session_present {
                    bump(&counts.sessions_resumed);
                }
                let e = epoch.fetch_add(1, Ordering::SeqCst).saturating_add(1);
                eprintln!(
                    "wary-gateway: connected to the MQTT broker (session kept: {})",
                    ack.session_present
                );
                // Subscribing again on a kept session changes nothing; on a new one it is needed.
                if !link.leaving.load(Ordering::SeqCst)
                    && link.client.try_subscribe(link.filter.clone(), QoS::AtLeastOnce).is_err()
                {
                    eprintln!("wary-gateway: could not queue the subscription");
                }
                if tx.send(Delivery::Connected(e)).is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let e = epoch.load(Ordering::SeqCst);
                if tx.send(Delivery::Message(e, Box::new(p))).is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| !matches!(c, rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)))
                {
                    eprintln!("wary-gateway: the broker refused the subscription: {:?}", ack.return_codes);
                }
            }
            Ok(_) => {}
            Err(e) => {
                // Acknowledgements owed on the broken connection must not go out on the next.
                epoch.fetch_add(1, Ordering::SeqCst);
                failures = failures.saturating_add(1);
                let wait = RECONNECT.wait(failures, previous, Draw::from_rng(&mut rng));
                previous = wait;
                eprintln!("wary-gateway: MQTT connection lost ({}); next try in {wait}", kind(&e));
                wary_host::time::sleep(wait).await;
            }
        }
    }
}

/// A connection error's kind, never its text (which may quote what the broker sent).
fn kind(e: &rumqttc::v5::ConnectionError) -> String {
    use rumqttc::v5::ConnectionError as E;
    match e {
        E::Io(io) => format!("i/o: {:?}", io.kind()),
        E::ConnectionRefused(code) => format!("refused: {code:?}"),
        E::Timeout(_) => "timeout".to_owned(),
        E::MqttState(_) => "protocol state".to_owned(),
        E::NotConnAck(_) => "no CONNACK".to_owned(),
        E::RequestsDone => "client closed".to_owned(),
        // The handshake's refusal (an unknown issuer, a wrong name) as rustls names it: its
        // own words, not the broker's.
        E::Tls(rumqttc::TlsError::TLS(e)) => format!("TLS: {e:?}"),
        E::Tls(rumqttc::TlsError::Io(io)) => {
            match io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                Some(e) => format!("TLS: {e:?}"),
                None => format!("TLS: i/o: {:?}", io.kind()),
            }
        }
        E::Tls(_) => "TLS: the broker's address or name".to_owned(),
    }
}

struct Slot {
    seq: u64,
    publish: Publish,
    done: bool,
}

async fn order(
    gw: Arc<Gateway>,
    client: AsyncClient,
    counts: Arc<MqttCounts>,
    epoch: Arc<AtomicU64>,
    mut rx: mpsc::UnboundedReceiver<Delivery>,
) {
    let max_body = gw.config().max_body;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, u64)>();
    // The current connection's messages in arrival order, and its epoch.
    let mut window: VecDeque<Slot> = VecDeque::new();
    let mut current = 0u64;
    let mut seq = 0u64;
    loop {
        tokio::select! {
            d = rx.recv() => match d {
                None => return,
                Some(Delivery::Connected(e)) => {
                    counts.acks_dropped.fetch_add(window.len() as u64, Ordering::Relaxed);
                    window.clear();
                    current = e;
                }
                Some(Delivery::Message(e, p)) => {
                    if e != current {
                        // Delivered on a connection already gone: the broker sends it again.
                        counts.acks_dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    bump(&counts.received);
                    if p.dup {
                        bump(&counts.redelivered);
                    }
                    seq = seq.wrapping_add(1);
                    match check(&p, max_body) {
                        Ok(reading) => {
                            tokio::spawn(forward(gw.clone(), reading, counts.clone(), done_tx.clone(), (e, seq)));
                            window.push_back(Slot { seq, publish: *p, done: false });
                        }
                        Err(r) => {
                            counts.refuse(r);
                            let device = device_of_topic(&p.topic).map_or_else(|| "?".to_owned(), |d| format!("{d:016x}"));
                            eprintln!("wary-gateway: MQTT message refused (device {device}): {r}; acknowledged");
                            window.push_back(Slot { seq, publish: *p, done: true });
                        }
                    }
                }
            },
            Some((e, s)) = done_rx.recv() => {
                if e == current
                    && let Some(slot) = window.iter_mut().find(|x| x.seq == s)
                {
                    slot.done = true;
                }
            }
        }
        while window.front().is_some_and(|s| s.done) {
            let Some(slot) = window.pop_front() else { break };
            if epoch.load(Ordering::SeqCst) != current {
                bump(&counts.acks_dropped);
                continue;
            }
            if client.ack(&slot.publish).await.is_err() {
                return;
            }
            bump(&counts.acked);
        }
    }
}

/// One message's call, made again after each give-up until it lands or fails.
async fn forward(
    gw: Arc<Gateway>,
    reading: Forward,
    counts: Arc<MqttCounts>,
    done: mpsc::UnboundedSender<(u64, u64)>,
    id: (u64, u64),
) {
    loop {
        let answer = gw.submit(reading.clone()).await.unwrap_or(Answer::Cancelled);
        let key = reading.key.to_str().unwrap_or_default();
        match answer {
            Answer::Landed(_) => bump(&counts.landed),
            Answer::Failed { upstream_status } => {
                bump(&counts.failed);
                let status = upstream_status.map_or_else(|| "none".to_owned(), |s| s.to_string());
                eprintln!(
                    "wary-gateway: MQTT reading {key} failed upstream (status {status}); acknowledged, reported"
                );
            }
            Answer::Unknown => {
                bump(&counts.unknown);
                eprintln!("wary-gateway: MQTT reading {key} may have landed; surfaced, acknowledged");
            }
            Answer::GaveUp { retry_after_secs, .. } => {
                bump(&counts.called_again);
                tokio::time::sleep(StdDuration::from_secs(retry_after_secs.max(1))).await;
                continue;
            }
            Answer::Held { retry_after_secs, .. } => {
                // The gateway's own configuration: the message is kept, never acknowledged as
                // failed (the gateway logs the cause itself, once an interval).
                bump(&counts.held);
                bump(&counts.called_again);
                tokio::time::sleep(StdDuration::from_secs(retry_after_secs.max(1))).await;
                continue;
            }
            _ => {
                bump(&counts.called_again);
                tokio::time::sleep(StdDuration::from_secs(1)).await;
                continue;
            }
        }
        let _ = done.send(id);
        return;
    }
}

/// What [`MqttCounts`] held, as plain numbers (for tests and reports).
pub fn snapshot(c: &MqttCounts) -> BTreeMap<&'static str, u64> {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    BTreeMap::from([
        ("received", l(&c.received)),
        ("redelivered", l(&c.redelivered)),
        ("landed", l(&c.landed)),
        ("failed", l(&c.failed)),
        ("unknown", l(&c.unknown)),
        ("called_again", l(&c.called_again)),
        ("held", l(&c.held)),
        ("acked", l(&c.acked)),
        ("acks_dropped", l(&c.acks_dropped)),
        ("connects", l(&c.connects)),
        ("sessions_resumed", l(&c.sessions_resumed)),
    ])
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn publish(topic: &str, key: Option<&str>, payload: &'static [u8]) -> Publish {
        let mut p = Publish::new(topic, QoS::AtLeastOnce, Bytes::from_static(payload), None);
        p.properties = key.map(|k| PublishProperties {
            user_properties: vec![(KEY_PROPERTY.to_owned(), k.to_owned())],
            content_type: Some("application/json".to_owned()),
            payload_format_indicator: Some(1),
            ..PublishProperties::default()
        });
        p
    }

    const DEV: &str = "00000000000000a1";
    const KEY: &str = "00000000000000a10000000100000007";

    #[test]
    fn a_good_message_becomes_the_same_call_as_a_post() {
        let f = check(&publish(&format!("wary/{DEV}/readings"), Some(KEY), b"{\"t\":1}"), 1024).unwrap();
        assert_eq!(f.key, KEY);
        assert_eq!(f.wary_key, wary::Key::from_hex(KEY).unwrap());
        assert_eq!(&f.body[..], b"{\"t\":1}");
        assert_eq!(f.content_type.unwrap(), "application/json");
    }

    #[test]
    fn every_refusal_has_its_reason() {
        let t = format!("wary/{DEV}/readings");
        let cases: [(String, Option<&str>, &'static [u8], Refusal); 8] = [
            ("wary/00000000000000A1/readings".into(), Some(KEY), b"{}", Refusal::BadTopic),
            ("wary/a1/readings".into(), Some(KEY), b"{}", Refusal::BadTopic),
            (format!("wary/{DEV}/other"), Some(KEY), b"{}", Refusal::BadTopic),
            (t.clone(), None, b"{}", Refusal::NoKey),
            (t.clone(), Some("with space"), b"{}", Refusal::BadKey),
            (t.clone(), Some("00000000000000b20000000100000007"), b"{}", Refusal::Forbidden),
            (t.clone(), Some(KEY), b"not json", Refusal::NotJson),
            (t.clone(), Some(KEY), b"[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]", Refusal::TooLarge),
        ];
        for (topic, key, payload, want) in cases {
            assert_eq!(check(&publish(&topic, key, payload), 16).err(), Some(want), "{topic} {key:?}");
        }
        let mut two = publish(&t, Some(KEY), b"{}");
        if let Some(p) = two.properties.as_mut() {
            p.user_properties.push((KEY_PROPERTY.to_owned(), KEY.to_owned()));
        }
        assert_eq!(check(&two, 16).err(), Some(Refusal::BadKey));
        let mut q0 = publish(&t, Some(KEY), b"{}");
        q0.qos = QoS::AtMostOnce;
        assert_eq!(check(&q0, 16).err(), Some(Refusal::NotQos1));
    }

    #[test]
    fn counters_are_exposed_by_reason() {
        let c = MqttCounts::default();
        c.refuse(Refusal::Forbidden);
        c.refuse(Refusal::Forbidden);
        bump(&c.landed);
        let text = c.prometheus();
        assert!(text.contains("wary_gateway_mqtt_refused_total{reason=\"forbidden\"} 2\n"), "{text}");
        assert!(text.contains("wary_gateway_mqtt_refused_total{reason=\"no_key\"} 0\n"), "{text}");
        assert!(text.contains("\nwary_gateway_mqtt_landed_total 1\n"), "{text}");
    }
}
