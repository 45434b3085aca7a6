//! The MQTT fault proxy: a TCP proxy on 127.0.0.1 in front of a broker (the
//! [`crate::mosquitto`] one) that reads the MQTT 5 packets passing through and, per `PUBLISH`,
//! does what its script says. mosquitto 2.0 never sends these reason codes itself; the proxy
//! sends them in its place, as a broker that sends them would.
//!
//! Each QoS 1 `PUBLISH` a client sends takes the next [`Fault`] of the script ([`Fault::Pass`]
//! once it is empty):
//!
//! | fault | the broker gets the `PUBLISH` | the client gets |
//! |---|---|---|
//! | [`Fault::Pass`] | yes | the broker's `PUBACK` |
//! | [`Fault::Puback`] (0x10, 0x87, 0x90, 0x97, 0x99) | no: the message is not delivered | `PUBACK` with that reason code |
//! | [`Fault::Disconnect`] (0x89, 0x97, 0x9C, 0x9F) | yes | no `PUBACK`: a `DISCONNECT` with that reason code, then the connection ends |
//! | [`Fault::Drop`] | yes | no `PUBACK`: the connection ends (FIN) |
//! | [`Fault::Kick`] (0x89, 0x97, 0x9C, 0x9F) | yes | the broker's `PUBACK`, then a `DISCONNECT` with that reason code, then the connection ends |
//!
//! So a `PUBACK` error means "not delivered", and a `DISCONNECT` or a drop leaves a message that
//! did land unacknowledged: the client must resend it, and its key deduplicates it upstream.
//! [`Proxy::refuse_connects`] answers the next `CONNECT`s with a refusing `CONNACK` instead of
//! passing them on.
//!
//! [`Proxy::counts`] says what the proxy saw and did: packets and reason codes, and the
//! `Idempotency-Key` of every `PUBLISH` it passed to the broker (keys only: payloads, topics
//! and passwords are never kept).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};

/// The MQTT 5 packet types the proxy looks at (the fixed header's high nibble).
const CONNECT: u8 = 1;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;

/// The user property that carries a reading's key.
pub const KEY_PROPERTY: &str = "Idempotency-Key";

/// What the proxy does with one QoS 1 `PUBLISH`; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Passed to the broker, its `PUBACK` passed back.
    Pass,
    /// Not passed on; the client gets a `PUBACK` with this reason code.
    Puback(u8),
    /// Passed to the broker; its `PUBACK` is held back and the client gets a `DISCONNECT` with
    /// this reason code, then both connections end.
    Disconnect(u8),
    /// Passed to the broker; its `PUBACK` is held back and both connections end.
    Drop,
    /// Passed to the broker and its `PUBACK` passed back; then the client gets a `DISCONNECT`
    /// with this reason code and both connections end: a kick between publishes.
    Kick(u8),
}

/// What the proxy saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Client connections accepted.
    pub connections: u32,
    /// `CONNECT` packets seen.
    pub connects: u32,
    /// `CONNECT`s answered by the proxy with a refusing `CONNACK`, by reason code.
    pub connacks_refused: BTreeMap<u8, u32>,
    /// QoS 1 `PUBLISH` packets seen from clients.
    pub publishes: u32,
    /// `PUBLISH` packets with the DUP flag.
    pub dup_publishes: u32,
    /// `PUBACK`s passed back from the broker, by reason code.
    pub pubacks_passed: BTreeMap<u8, u32>,
    /// `PUBACK`s sent in the broker's place, by reason code.
    pub pubacks_injected: BTreeMap<u8, u32>,
    /// `DISCONNECT`s sent in the broker's place, by reason code.
    pub disconnects_injected: BTreeMap<u8, u32>,
    /// Connections ended after a `PUBLISH` reached the broker and before its `PUBACK`.
    pub drops: u32,
    /// The `Idempotency-Key` of every `PUBLISH` passed to the broker, in order (empty string:
    /// none).
    pub keys_forwarded: Vec<String>,
}

#[derive(Default)]
struct Shared {
    script: VecDeque<Fault>,
    connacks: VecDeque<u8>,
    counts: Counts,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    port: u16,
    shared: Arc<Mutex<Shared>>,
    done: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and passes each connection on to the broker on
    /// `broker_port` of 127.0.0.1, applying the script.
    pub fn start(broker_port: u16) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the MQTT fault proxy")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let done = Arc::new(AtomicBool::new(false));
        let (s, d) = (Arc::clone(&shared), Arc::clone(&done));
        let acceptor = thread::spawn(move || accept_loop(&listener, broker_port, &s, &d));
        Ok(Self { port, shared, done, acceptor: Some(acceptor) })
    }

    /// The port on 127.0.0.1 (the QEMU guest reaches it at 10.0.2.2).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Appends faults to the script: the next `PUBLISH`es take them in order.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.lock().script.extend(faults);
    }

    /// Answers the next `CONNECT`s (one per code) with a `CONNACK` refusing with `codes`,
    /// without passing them to the broker.
    pub fn refuse_connects(&self, codes: impl IntoIterator<Item = u8>) {
        self.lock().connacks.extend(codes);
    }

    /// Faults of the script not used yet.
    pub fn pending(&self) -> usize {
        self.lock().script.len()
    }

    /// What the proxy saw so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    broker_port: u16,
    shared: &Arc<Mutex<Shared>>,
    done: &Arc<AtomicBool>,
) {
    while !done.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                shared.lock().unwrap_or_else(PoisonError::into_inner).counts.connections += 1;
                let (shared, done) = (Arc::clone(shared), Arc::clone(done));
                thread::spawn(move || {
                    let _ = serve(client, broker_port, &shared, &done);
                });
            }
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// One packet: the fixed header's first byte and the rest (after the remaining length).
struct Packet {
    first: u8,
    body: Vec<u8>,
}

impl Packet {
    fn kind(&self) -> u8 {
        self.first >> 4
    }

    fn encode(&self) -> Vec<u8> {
        encode(self.first, &self.body)
    }
}

/// A packet's bytes: `first`, the remaining length, `body`.
pub fn encode(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// Reads one packet; `None` at a clean end of the stream.
fn read_packet(stream: &mut impl Read) -> io::Result<Option<Packet>> {
    let mut first = [0u8; 1];
    if stream.read(&mut first)? == 0 {
        return Ok(None);
    }
    let mut len = 0usize;
    for shift in [0, 7, 14, 21] {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte)?;
        len |= usize::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            let mut body = vec![0u8; len];
            stream.read_exact(&mut body)?;
            return Ok(Some(Packet { first: first[0], body }));
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "remaining length over 4 bytes"))
}

/// Reads a variable byte integer at `at`; the value and the index after it.
fn varint(bytes: &[u8], mut at: usize) -> Option<(usize, usize)> {
    let mut value = 0usize;
    for shift in [0, 7, 14, 21] {
        let byte = *bytes.get(at)?;
        at += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// A length-prefixed string or binary at `at`; it and the index after it.
fn prefixed(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = usize::from(u16_at(bytes, at)?);
    let start = at + 2;
    Some((bytes.get(start..start + len)?, start + len))
}

/// What the proxy reads of a `PUBLISH`: its QoS, packet id and `Idempotency-Key` property.
#[derive(Debug, PartialEq, Eq)]
pub struct PublishInfo {
    /// QoS (0, 1 or 2).
    pub qos: u8,
    /// The DUP flag.
    pub dup: bool,
    /// The packet id (QoS > 0).
    pub packet_id: Option<u16>,
    /// The `Idempotency-Key` user property, if any.
    pub key: Option<String>,
}

/// Reads a `PUBLISH` packet's header flags (`first`) and variable header (`body`).
pub fn publish_info(first: u8, body: &[u8]) -> Option<PublishInfo> {
    let qos = (first >> 1) & 0b11;
    let dup = first & 0b1000 != 0;
    let (_topic, mut at) = prefixed(body, 0)?;
    let packet_id = if qos > 0 {
        let id = u16_at(body, at)?;
        at += 2;
        Some(id)
    } else {
        None
    };
    let (len, start) = varint(body, at)?;
    let end = start.checked_add(len)?;
    let props = body.get(start..end)?;
    let mut key = None;
    let mut i = 0;
    while i < props.len() {
        let id = props[i];
        i += 1;
        i = match id {
            0x01 => i + 1,
            0x02 => i + 4,
            0x23 => i + 2,
            0x0B => varint(props, i)?.1,
            0x03 | 0x08 | 0x09 => prefixed(props, i)?.1,
            0x26 => {
                let (name, after) = prefixed(props, i)?;
                let (value, after) = prefixed(props, after)?;
                if name == KEY_PROPERTY.as_bytes() {
                    key = Some(String::from_utf8_lossy(value).into_owned());
                }
                after
            }
            // A property a PUBLISH may not carry: stop reading.
            _ => break,
        };
    }
    Some(PublishInfo { qos, dup, packet_id, key })
}

/// Held-back `PUBACK`s: packet id → what to do when the broker's arrives.
type Held = Arc<Mutex<HashMap<u16, Fault>>>;

fn serve(
    client: TcpStream,
    broker_port: u16,
    shared: &Arc<Mutex<Shared>>,
    done: &Arc<AtomicBool>,
) -> Result<()> {
    let lock = || shared.lock().unwrap_or_else(PoisonError::into_inner);
    let mut from_client = client.try_clone()?;
    let to_client = Arc::new(Mutex::new(client.try_clone()?));
    from_client.set_read_timeout(Some(Duration::from_millis(200)))?;
    // The CONNECT decides whether the broker is asked at all.
    let connect = loop {
        match read_packet(&mut from_client) {
            Ok(Some(p)) => break p,
            Ok(None) => return Ok(()),
            Err(e) if is_timeout(&e) && !done.load(Ordering::SeqCst) => {}
            Err(_) => return Ok(()),
        }
    };
    if connect.kind() != CONNECT {
        return Ok(());
    }
    let refusal = {
        let mut s = lock();
        s.counts.connects += 1;
        let code = s.connacks.pop_front();
        if let Some(code) = code {
            *s.counts.connacks_refused.entry(code).or_default() += 1;
        }
        code
    };
    if let Some(code) = refusal {
        let mut c = to_client.lock().unwrap_or_else(PoisonError::into_inner);
        c.write_all(&encode(0x20, &[0, code, 0]))?;
        let _ = c.shutdown(Shutdown::Both);
        return Ok(());
    }
    let mut broker = TcpStream::connect(("127.0.0.1", broker_port)).context("the broker behind the proxy")?;
    broker.write_all(&connect.encode())?;
    let held: Held = Arc::default();
    let from_broker = broker.try_clone()?;
    let back = {
        let (to_client, held, shared, done) =
            (Arc::clone(&to_client), Arc::clone(&held), Arc::clone(shared), Arc::clone(done));
        let client = client.try_clone()?;
        let broker = broker.try_clone()?;
        thread::spawn(move || {
            broker_to_client(from_broker, &to_client, &held, &shared, &done, &client, &broker)
        })
    };
    loop {
        let packet = match read_packet(&mut from_client) {
            Ok(Some(p)) => p,
            Err(e) if is_timeout(&e) && !done.load(Ordering::SeqCst) => continue,
            _ => break,
        };
        if packet.kind() == PUBLISH
            && let Some(info) = publish_info(packet.first, &packet.body)
            && let (1, Some(pid)) = (info.qos, info.packet_id)
        {
            let fault = {
                let mut s = lock();
                s.counts.publishes += 1;
                s.counts.dup_publishes += u32::from(info.dup);
                let fault = s.script.pop_front().unwrap_or(Fault::Pass);
                if !matches!(fault, Fault::Puback(_)) {
                    s.counts.keys_forwarded.push(info.key.clone().unwrap_or_default());
                }
                if let Fault::Puback(code) = fault {
                    *s.counts.pubacks_injected.entry(code).or_default() += 1;
                }
                fault
            };
            match fault {
                Fault::Puback(code) => {
                    let [hi, lo] = pid.to_be_bytes();
                    let mut c = to_client.lock().unwrap_or_else(PoisonError::into_inner);
                    if c.write_all(&encode(PUBACK << 4, &[hi, lo, code])).is_err() {
                        break;
                    }
                    continue;
                }
                Fault::Pass => {}
                Fault::Disconnect(_) | Fault::Drop | Fault::Kick(_) => {
                    held.lock().unwrap_or_else(PoisonError::into_inner).insert(pid, fault);
                }
            }
        }
        if broker.write_all(&packet.encode()).is_err() {
            break;
        }
    }
    let _ = broker.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
    let _ = back.join();
    Ok(())
}

fn broker_to_client(
    mut from_broker: TcpStream,
    to_client: &Mutex<TcpStream>,
    held: &Held,
    shared: &Mutex<Shared>,
    done: &AtomicBool,
    client: &TcpStream,
    broker: &TcpStream,
) {
    let _ = from_broker.set_read_timeout(Some(Duration::from_millis(200)));
    loop {
        let packet = match read_packet(&mut from_broker) {
            Ok(Some(p)) => p,
            Err(e) if is_timeout(&e) && !done.load(Ordering::SeqCst) => continue,
            _ => break,
        };
        if packet.kind() == PUBACK
            && let Some(pid) = u16_at(&packet.body, 0)
            && let Some(fault) = held.lock().unwrap_or_else(PoisonError::into_inner).remove(&pid)
        {
            let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
            let mut c = to_client.lock().unwrap_or_else(PoisonError::into_inner);
            match fault {
                Fault::Kick(code) => {
                    let passed = packet.body.get(2).copied().unwrap_or(0);
                    *s.counts.pubacks_passed.entry(passed).or_default() += 1;
                    *s.counts.disconnects_injected.entry(code).or_default() += 1;
                    let _ = c.write_all(&packet.encode());
                    let _ = c.write_all(&encode(0xE0, &[code]));
                }
                Fault::Disconnect(code) => {
                    *s.counts.disconnects_injected.entry(code).or_default() += 1;
                    let _ = c.write_all(&encode(0xE0, &[code]));
                }
                _ => s.counts.drops += 1,
            }
            let _ = client.shutdown(Shutdown::Both);
            let _ = broker.shutdown(Shutdown::Both);
            break;
        }
        if packet.kind() == PUBACK {
            let code = packet.body.get(2).copied().unwrap_or(0);
            *shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .counts
                .pubacks_passed
                .entry(code)
                .or_default() += 1;
        }
        let mut c = to_client.lock().unwrap_or_else(PoisonError::into_inner);
        if c.write_all(&packet.encode()).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// A minimal MQTT 5 client's packets, for tests and host tools that check the proxy and the
/// broker without a client library.
pub mod wire {
    use super::encode;

    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(s);
    }

    /// `CONNECT`: MQTT 5, clean start, keep alive 60 s, with a user name and password.
    pub fn connect(client_id: &str, user: &str, password: &str) -> Vec<u8> {
        let mut body = vec![];
        string(&mut body, b"MQTT");
        body.push(5);
        body.push(0b1100_0010);
        body.extend_from_slice(&60u16.to_be_bytes());
        body.push(0);
        string(&mut body, client_id.as_bytes());
        string(&mut body, user.as_bytes());
        string(&mut body, password.as_bytes());
        encode(0x10, &body)
    }

    /// A QoS 1 `PUBLISH` with the `Idempotency-Key` user property.
    pub fn publish(topic: &str, packet_id: u16, key: &str, payload: &[u8]) -> Vec<u8> {
        let mut props = vec![0x26];
        string(&mut props, super::KEY_PROPERTY.as_bytes());
        string(&mut props, key.as_bytes());
        let mut body = vec![];
        string(&mut body, topic.as_bytes());
        body.extend_from_slice(&packet_id.to_be_bytes());
        body.push(u8::try_from(props.len()).unwrap_or(u8::MAX));
        body.extend_from_slice(&props);
        body.extend_from_slice(payload);
        encode(0x32, &body)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    use super::*;
    use crate::mosquitto::{Broker, GATEWAY_USER, Login, READINGS_FILTER, Settings, readings_topic};

    const DEVICE: &str = "00000000000000d1";

    /// Reads packets until one of `kind` or the end; the packet or `None`.
    fn next_of(stream: &mut TcpStream, kind: u8) -> Option<Packet> {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            match read_packet(stream) {
                Ok(Some(p)) if p.kind() == kind => return Some(p),
                Ok(Some(_)) => {}
                Err(e) if is_timeout(&e) => {}
                _ => return None,
            }
        }
        None
    }

    fn connected(port: u16, password: &str) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the proxy accepts");
        s.set_read_timeout(Some(Duration::from_millis(200))).expect("a timeout");
        s.write_all(&wire::connect("t-d1", DEVICE, password)).expect("CONNECT sent");
        s
    }

    #[test]
    fn publish_header_and_key_are_read() {
        let bytes = wire::publish("wary/x/readings", 7, "ab12", b"{}");
        let mut cursor = io::Cursor::new(bytes);
        let p = read_packet(&mut cursor).expect("read").expect("a packet");
        assert_eq!(p.kind(), PUBLISH);
        let info = publish_info(p.first, &p.body).expect("a PUBLISH");
        assert_eq!(info, PublishInfo { qos: 1, dup: false, packet_id: Some(7), key: Some("ab12".into()) });
        assert_eq!(p.encode(), wire::publish("wary/x/readings", 7, "ab12", b"{}"), "re-encoded unchanged");
    }

    #[test]
    fn remaining_lengths_over_127_take_two_bytes() {
        let body = vec![0u8; 300];
        let bytes = encode(0x30, &body);
        assert_eq!(&bytes[..3], &[0x30, 0xAC, 0x02]);
        let p = read_packet(&mut io::Cursor::new(bytes)).expect("read").expect("a packet");
        assert_eq!(p.body.len(), 300);
    }

    /// Every scripted fault against a real mosquitto: what the client gets, and what a
    /// subscriber behind the broker gets.
    #[test]
    fn faults_are_injected_in_front_of_mosquitto() -> Result<()> {
        if !Path::new(crate::mosquitto::MOSQUITTO).exists() {
            eprintln!("skipped: mosquitto is not installed (cargo xtask ci installs it)");
            return Ok(());
        }
        let dir = std::env::temp_dir().join(format!("wary-mqtt-fault-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let token = "d".repeat(64);
        let gw = Login::new(GATEWAY_USER, "g".repeat(64));
        let broker =
            Broker::start(&dir, &[Login::new(DEVICE, token.clone()), gw.clone()], &Settings::default())?;
        let proxy = Proxy::start(broker.port())?;
        let sub = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &broker.port().to_string(), "-V", "mqttv5", "-q", "1"])
            .args(["-u", &gw.user, "-P", &gw.password, "-t", READINGS_FILTER, "-W", "4", "-F", "%p"])
            .stdout(Stdio::piped())
            .spawn()?;
        thread::sleep(Duration::from_millis(500));
        let topic = readings_topic(DEVICE);

        // A refused CONNECT never reaches the broker.
        proxy.refuse_connects([0x89]);
        let mut s = connected(proxy.port(), &token);
        let connack = next_of(&mut s, 2).expect("a CONNACK");
        assert_eq!(connack.body, vec![0, 0x89, 0]);

        let mut s = connected(proxy.port(), &token);
        assert_eq!(next_of(&mut s, 2).expect("a CONNACK").body.get(1), Some(&0), "the broker accepts");
        let codes = [0x10u8, 0x87, 0x90, 0x97, 0x99];
        proxy.script(codes.map(Fault::Puback));
        proxy.script([Fault::Pass]);
        for (i, code) in codes.iter().enumerate() {
            let pid = u16::try_from(i + 1)?;
            s.write_all(&wire::publish(&topic, pid, &format!("k{i}"), format!("injected-{i}").as_bytes()))?;
            let ack = next_of(&mut s, PUBACK).expect("a PUBACK");
            assert_eq!(ack.body, vec![0, u8::try_from(pid)?, *code]);
        }
        s.write_all(&wire::publish(&topic, 9, "k-pass", b"passed"))?;
        assert_eq!(next_of(&mut s, PUBACK).expect("the broker's PUBACK").body.get(..2), Some(&[0u8, 9][..]));

        // A DISCONNECT after the message reached the broker, and a drop.
        proxy.script([Fault::Disconnect(0x97)]);
        s.write_all(&wire::publish(&topic, 10, "k-disc", b"kicked"))?;
        let disc = next_of(&mut s, 0xE).expect("a DISCONNECT");
        assert_eq!(disc.body, vec![0x97]);
        assert!(next_of(&mut s, PUBACK).is_none(), "no PUBACK after the DISCONNECT");
        let mut s = connected(proxy.port(), &token);
        next_of(&mut s, 2).expect("a CONNACK");
        proxy.script([Fault::Kick(0x9F)]);
        s.write_all(&wire::publish(&topic, 12, "k-kick", b"acked-then-kicked"))?;
        assert_eq!(next_of(&mut s, PUBACK).expect("the broker's PUBACK").body.get(..2), Some(&[0u8, 12][..]));
        assert_eq!(next_of(&mut s, 0xE).expect("then a DISCONNECT").body, vec![0x9F]);
        let mut s = connected(proxy.port(), &token);
        next_of(&mut s, 2).expect("a CONNACK");
        proxy.script([Fault::Drop]);
        s.write_all(&wire::publish(&topic, 11, "k-drop", b"dropped"))?;
        assert!(next_of(&mut s, PUBACK).is_none(), "the connection ends without a PUBACK");

        let out = sub.wait_with_output()?;
        let seen = String::from_utf8_lossy(&out.stdout);
        let mut seen: Vec<&str> = seen.lines().collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            ["acked-then-kicked", "dropped", "kicked", "passed"],
            "only what the proxy passed reached the broker"
        );
        let counts = proxy.counts();
        assert_eq!(counts.connects, 4);
        assert_eq!(counts.connacks_refused, BTreeMap::from([(0x89, 1)]));
        assert_eq!(counts.publishes, 9);
        assert_eq!(counts.pubacks_injected, codes.iter().map(|c| (*c, 1)).collect());
        assert_eq!(counts.pubacks_passed, BTreeMap::from([(0, 2)]));
        assert_eq!(counts.disconnects_injected, BTreeMap::from([(0x97, 1), (0x9F, 1)]));
        assert_eq!(counts.drops, 1);
        assert_eq!(counts.keys_forwarded, ["k-pass", "k-disc", "k-kick", "k-drop"]);
        assert_eq!(proxy.pending(), 0);
        drop(proxy);
        drop(broker);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
