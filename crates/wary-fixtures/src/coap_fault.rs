//! A CoAP server with faults (RFC 7252 over UDP, 127.0.0.1), for the device's `coap-storm`
//! scenario: it takes confirmable `POST`s to `/r/<key>`, applies each key once (a second `POST`
//! of a known key is a replay, answered 2.04 with no second effect), and counts.
//!
//! Like a real server it remembers the message IDs it answered (per peer) and answers a
//! retransmission from that memory without processing it again; a [`Fault::Restart`] forgets
//! them, as a server that restarts does, so a retransmission after it is processed again and only
//! the key keeps it from a second effect.
//!
//! Faults, one per confirmable message (scripted first, then drawn from [`Plan`]'s rates; a
//! retransmission the memory answers takes a restart only):
//!
//! | fault | the server |
//! |---|---|
//! | [`Fault::LostAck`] | applies the write and sends nothing: the ACK is lost after the effect |
//! | [`Fault::Unavailable`] | answers 5.03 with Max-Age, does nothing |
//! | [`Fault::TooMany`] | answers 4.29 with Max-Age, does nothing |
//! | [`Fault::Duplicate`] | applies and sends its response twice |
//! | [`Fault::Slow`] | applies and answers after [`Plan::slow_ms`] (a device listening less long takes it late) |
//! | [`Fault::Restart`] | forgets every message ID first, then handles the message normally |

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// What the server does with one new message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Handled as a healthy server would.
    None,
    /// Applied, then no ACK.
    LostAck,
    /// 5.03 with Max-Age [`Plan::max_age`].
    Unavailable,
    /// 4.29 with Max-Age [`Plan::max_age`].
    TooMany,
    /// Applied, the response sent twice.
    Duplicate,
    /// Applied, the response sent [`Plan::slow_ms`] later.
    Slow,
    /// The message-ID memory forgotten, then handled.
    Restart,
}

/// The server's faults: `script` for the first new messages, then each drawn with its rate
/// (out of 1,000) from a generator seeded with `seed`.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Faults of the first new messages, in order.
    pub script: Vec<Fault>,
    /// Rates per 1,000 new messages after the script.
    pub lost_ack: u32,
    /// 5.03 with Max-Age.
    pub unavailable: u32,
    /// 4.29 with Max-Age.
    pub too_many: u32,
    /// Duplicated responses.
    pub duplicate: u32,
    /// Slow responses.
    pub slow: u32,
    /// How late a slow response is sent, in milliseconds.
    pub slow_ms: u64,
    /// Restarts that forget message IDs.
    pub restart: u32,
    /// The Max-Age of 5.03 and 4.29, seconds.
    pub max_age: u32,
    /// The generator's seed.
    pub seed: u64,
}

impl Plan {
    /// No faults at all.
    pub fn calm() -> Plan {
        Plan {
            script: vec![],
            lost_ack: 0,
            unavailable: 0,
            too_many: 0,
            duplicate: 0,
            slow: 0,
            slow_ms: 1500,
            restart: 0,
            max_age: 1,
            seed: 1,
        }
    }

    fn draw(&mut self, state: &mut u64) -> Fault {
        if !self.script.is_empty() {
            return self.script.remove(0);
        }
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let mut roll = ((z ^ (z >> 31)) % 1000) as u32;
        for (rate, fault) in [
            (self.lost_ack, Fault::LostAck),
            (self.unavailable, Fault::Unavailable),
            (self.too_many, Fault::TooMany),
            (self.duplicate, Fault::Duplicate),
            (self.slow, Fault::Slow),
            (self.restart, Fault::Restart),
        ] {
            if roll < rate {
                return fault;
            }
            roll -= rate;
        }
        Fault::None
    }
}

/// What one key saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeySeen {
    /// Times the write was applied (1 at most, unless the server is wrong).
    pub effects: u64,
    /// New messages for a key already applied (answered 2.04, no effect).
    pub replays: u64,
}

/// What the server saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Each key's effects and replays.
    pub keys: BTreeMap<String, KeySeen>,
    /// Datagrams received.
    pub datagrams: u64,
    /// Retransmissions answered from the message-ID memory (not processed again).
    pub remembered: u64,
    /// Each fault, how often it was dealt.
    pub faults: BTreeMap<&'static str, u64>,
    /// Datagrams that were not a confirmable POST to `/r/<key>` (answered 4.xx, or a Reset).
    pub refused: u64,
}

impl Seen {
    /// The report in the terms of the test cloud's (`keys`, `cloud.duplicates.keys`,
    /// `cloud.requests`, `cloud.faults`), for the device scenarios' check.
    pub fn report(&self) -> serde_json::Value {
        let keys: serde_json::Map<String, serde_json::Value> = self
            .keys
            .iter()
            .map(|(k, s)| (k.clone(), serde_json::json!({ "effects": s.effects, "replays": s.replays })))
            .collect();
        let duplicates = self.keys.values().filter(|s| s.effects > 1).count();
        let replays: u64 = self.keys.values().map(|s| s.replays).sum();
        serde_json::json!({
            "keys": keys,
            "cloud": {
                "requests": self.datagrams,
                "replays": replays,
                "remembered": self.remembered,
                "faults": self.faults,
                "duplicates": { "keys": duplicates },
            }
        })
    }
}

/// The server, running on its own thread until [`CoapFault::stop`].
pub struct CoapFault {
    /// Its UDP port on 127.0.0.1.
    pub port: u16,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<JoinHandle<()>>,
}

impl CoapFault {
    /// Binds a free port on 127.0.0.1 and serves `plan`.
    ///
    /// # Errors
    ///
    /// The socket cannot be bound.
    pub fn start(plan: Plan) -> Result<CoapFault> {
        let socket = UdpSocket::bind("127.0.0.1:0").context("binding the CoAP fault server")?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let port = socket.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = thread::spawn(move || serve(&socket, plan, &stop2, &seen2));
        Ok(CoapFault { port, stop, seen, thread: Some(thread) })
    }

    /// What it saw so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops it: what it saw.
    pub fn stop(mut self) -> Seen {
        self.halt();
        self.seen()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CoapFault {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A parsed request: type, code, message ID, token, Uri-Path segments.
struct Request {
    kind: u8,
    code: u8,
    id: u16,
    token: Vec<u8>,
    path: Vec<String>,
}

/// Reads a CoAP message (RFC 7252 section 3): header, token, options (Uri-Path kept), payload.
fn parse(d: &[u8]) -> Option<Request> {
    let first = *d.first()?;
    let tkl = usize::from(first & 0x0f);
    if first >> 6 != 1 || tkl > 8 {
        return None;
    }
    let code = *d.get(1)?;
    let id = u16::from_be_bytes([*d.get(2)?, *d.get(3)?]);
    let token = d.get(4..4 + tkl)?.to_vec();
    let mut at = 4 + tkl;
    let mut number = 0u32;
    let mut path = vec![];
    while let Some(&byte) = d.get(at) {
        if byte == 0xff {
            break;
        }
        at += 1;
        let mut ext = |nibble: u8| -> Option<u32> {
            match nibble {
                13 => {
                    let v = u32::from(*d.get(at)?) + 13;
                    at += 1;
                    Some(v)
                }
                14 => {
                    let v = u32::from(u16::from_be_bytes([*d.get(at)?, *d.get(at + 1)?])) + 269;
                    at += 2;
                    Some(v)
                }
                15 => None,
                n => Some(u32::from(n)),
            }
        };
        let delta = ext(byte >> 4)?;
        let len = ext(byte & 0x0f)? as usize;
        number += delta;
        let value = d.get(at..at + len)?;
        at += len;
        if number == 11 {
            path.push(String::from_utf8(value.to_vec()).ok()?);
        }
    }
    Some(Request { kind: (first >> 4) & 3, code, id, token, path })
}

/// A piggybacked response (ACK, the request's message ID and token) with `code` and, when
/// given, Max-Age (option 14) in as few bytes as it takes.
fn response(req: &Request, code: u8, max_age: Option<u32>) -> Vec<u8> {
    let mut out = vec![0x60 | req.token.len() as u8, code];
    out.extend_from_slice(&req.id.to_be_bytes());
    out.extend_from_slice(&req.token);
    if let Some(secs) = max_age {
        let bytes = secs.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let value = &bytes[skip..];
        // Option 14: delta 13 + 1 in one extension byte.
        out.push((13 << 4) | value.len() as u8);
        out.push(1);
        out.extend_from_slice(value);
    }
    out
}

/// 2.01 Created, 2.04 Changed, 4.04, 4.05, 4.29, 5.03, and the method POST.
const CREATED: u8 = 0x41;
const CHANGED: u8 = 0x44;
const NOT_FOUND: u8 = 0x84;
const NOT_ALLOWED: u8 = 0x85;
const TOO_MANY: u8 = 0x9d;
const UNAVAILABLE: u8 = 0xa3;
const POST: u8 = 0x02;

fn serve(socket: &UdpSocket, mut plan: Plan, stop: &AtomicBool, seen: &Mutex<Seen>) {
    let mut state = plan.seed;
    // Per peer and message ID: the responses sent (none for a lost ACK: the effect is done).
    let mut memory: HashMap<(SocketAddr, u16), Vec<Vec<u8>>> = HashMap::new();
    let mut order: VecDeque<(SocketAddr, u16)> = VecDeque::new();
    let mut buf = [0u8; 1500];
    // Slow responses: when each is due, and to whom.
    let mut later: Vec<(Instant, Vec<u8>, SocketAddr)> = vec![];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        for (_, d, peer) in later.iter().filter(|(due, _, _)| *due <= now) {
            let _ = socket.send_to(d, *peer);
        }
        later.retain(|(due, _, _)| *due > now);
        let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
        let Ok(mut seen) = seen.lock() else { return };
        seen.datagrams += 1;
        let Some(req) = buf.get(..n).and_then(parse) else {
            seen.refused += 1;
            continue;
        };
        if req.kind != 0 {
            // ACKs and Resets from the device answer nothing here.
            continue;
        }
        // Drawn for every confirmable message, retransmissions too: a restart may fall between a
        // lost ACK and its retransmission. A retransmission the memory answers deals no other fault.
        let mut fault = plan.draw(&mut state);
        if fault == Fault::Restart {
            *seen.faults.entry(name(fault)).or_insert(0) += 1;
            memory.clear();
            order.clear();
        }
        if let Some(sent) = memory.get(&(peer, req.id)) {
            seen.remembered += 1;
            for d in sent {
                let _ = socket.send_to(d, peer);
            }
            continue;
        }
        if fault != Fault::None && fault != Fault::Restart {
            *seen.faults.entry(name(fault)).or_insert(0) += 1;
        }
        if fault == Fault::Restart {
            fault = Fault::None;
        }
        let key = match req.path.as_slice() {
            [r, key] if r == "r" && key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()) => {
                key.clone()
            }
            _ => {
                seen.refused += 1;
                let _ = socket.send_to(&response(&req, NOT_FOUND, None), peer);
                continue;
            }
        };
        if req.code != POST {
            seen.refused += 1;
            let _ = socket.send_to(&response(&req, NOT_ALLOWED, None), peer);
            continue;
        }
        let reply = match fault {
            Fault::Unavailable => vec![response(&req, UNAVAILABLE, Some(plan.max_age))],
            Fault::TooMany => vec![response(&req, TOO_MANY, Some(plan.max_age))],
            _ => {
                let entry = seen.keys.entry(key).or_default();
                let code = if entry.effects == 0 {
                    entry.effects = 1;
                    CREATED
                } else {
                    entry.replays += 1;
                    CHANGED
                };
                let r = response(&req, code, None);
                match fault {
                    Fault::LostAck => vec![],
                    Fault::Duplicate => vec![r.clone(), r],
                    Fault::Slow => {
                        later.push((Instant::now() + Duration::from_millis(plan.slow_ms), r.clone(), peer));
                        memory.insert((peer, req.id), vec![r]);
                        order.push_back((peer, req.id));
                        continue;
                    }
                    _ => vec![r],
                }
            }
        };
        for d in &reply {
            let _ = socket.send_to(d, peer);
        }
        // A healthy answer is remembered once; a duplicate is sent once more on a retransmission.
        let remembered = match reply.first() {
            Some(r) => vec![r.clone()],
            // The lost ACK's response, for the retransmission to get.
            None => vec![response(&req, CREATED, None)],
        };
        memory.insert((peer, req.id), remembered);
        order.push_back((peer, req.id));
        // EXCHANGE_LIFETIME's worth for a device's pace: the oldest 4,096 are forgotten.
        if order.len() > 4096
            && let Some(old) = order.pop_front()
        {
            memory.remove(&old);
        }
    }
}

fn name(f: Fault) -> &'static str {
    match f {
        Fault::None => "none",
        Fault::LostAck => "lost_ack",
        Fault::Unavailable => "503",
        Fault::TooMany => "429",
        Fault::Duplicate => "duplicate",
        Fault::Slow => "slow",
        Fault::Restart => "restart",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "574152590a386001000000010000000a";

    fn post(id: u16, token: &[u8], key: &str) -> Vec<u8> {
        let mut d = vec![0x40 | token.len() as u8, POST];
        d.extend_from_slice(&id.to_be_bytes());
        d.extend_from_slice(token);
        // Uri-Path "r" (option 11), then the key (delta 0; a length of 13 or more in one
        // extension byte).
        d.extend_from_slice(&[0xb1, b'r']);
        match key.len() {
            n @ 0..13 => d.push(n as u8),
            n => d.extend_from_slice(&[0x0d, (n - 13) as u8]),
        }
        d.extend_from_slice(key.as_bytes());
        d.extend_from_slice(&[0xff, b'{', b'}']);
        d
    }

    fn client() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        s
    }

    fn exchange(s: &UdpSocket, port: u16, d: &[u8]) -> Vec<Vec<u8>> {
        s.send_to(d, ("127.0.0.1", port)).unwrap();
        let mut got = vec![];
        let mut buf = [0u8; 512];
        while let Ok((n, _)) = s.recv_from(&mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    }

    fn plan(script: Vec<Fault>) -> Plan {
        Plan { script, max_age: 7, ..Plan::calm() }
    }

    #[test]
    fn a_post_is_applied_once_and_answered_in_its_ack() {
        let server = CoapFault::start(plan(vec![])).unwrap();
        let s = client();
        let got = exchange(&s, server.port, &post(0x1234, &[1, 2], KEY));
        // ACK, 2.01, the request's message ID and token.
        assert_eq!(got, vec![vec![0x62, CREATED, 0x12, 0x34, 1, 2]]);
        let again = exchange(&s, server.port, &post(0x1235, &[1, 3], KEY));
        assert_eq!(again[0][1], CHANGED);
        let seen = server.stop();
        assert_eq!(seen.keys[KEY], KeySeen { effects: 1, replays: 1 });
    }

    #[test]
    fn a_lost_ack_is_sent_on_the_retransmission_without_a_second_effect() {
        let server = CoapFault::start(plan(vec![Fault::LostAck])).unwrap();
        let s = client();
        assert!(exchange(&s, server.port, &post(7, &[9], KEY)).is_empty());
        let got = exchange(&s, server.port, &post(7, &[9], KEY));
        assert_eq!(got, vec![vec![0x61, CREATED, 0, 7, 9]]);
        let seen = server.stop();
        assert_eq!((seen.keys[KEY], seen.remembered), (KeySeen { effects: 1, replays: 0 }, 1));
    }

    #[test]
    fn a_restart_forgets_message_ids_and_the_key_keeps_the_effect_single() {
        let server = CoapFault::start(plan(vec![Fault::LostAck, Fault::Restart])).unwrap();
        let s = client();
        assert!(exchange(&s, server.port, &post(7, &[9], KEY)).is_empty());
        // The server restarts as the retransmission of 7 arrives: it is new to it.
        let got = exchange(&s, server.port, &post(7, &[9], KEY));
        assert_eq!(got[0][1], CHANGED);
        let seen = server.stop();
        assert_eq!((seen.keys[KEY], seen.remembered), (KeySeen { effects: 1, replays: 1 }, 0));
    }

    #[test]
    fn unavailable_and_too_many_carry_max_age_and_do_nothing() {
        let server = CoapFault::start(plan(vec![Fault::Unavailable, Fault::TooMany])).unwrap();
        let s = client();
        // Option 14 (Max-Age) as delta 13 + 1, one byte: 7.
        assert_eq!(
            exchange(&s, server.port, &post(1, &[1], KEY)),
            vec![vec![0x61, UNAVAILABLE, 0, 1, 1, 0xd1, 1, 7]]
        );
        assert_eq!(
            exchange(&s, server.port, &post(2, &[2], KEY)),
            vec![vec![0x61, TOO_MANY, 0, 2, 2, 0xd1, 1, 7]]
        );
        let seen = server.stop();
        assert!(!seen.keys.contains_key(KEY));
        assert_eq!((seen.faults["503"], seen.faults["429"]), (1, 1));
    }

    #[test]
    fn a_duplicated_response_arrives_twice_and_applies_once() {
        let server = CoapFault::start(plan(vec![Fault::Duplicate])).unwrap();
        let s = client();
        let got = exchange(&s, server.port, &post(3, &[4], KEY));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], got[1]);
        let seen = server.stop();
        assert_eq!(seen.keys[KEY].effects, 1);
        assert_eq!(seen.report()["cloud"]["duplicates"]["keys"], 0);
    }

    #[test]
    fn a_slow_response_comes_after_its_delay() {
        let server = CoapFault::start(Plan { slow_ms: 600, ..plan(vec![Fault::Slow]) }).unwrap();
        let s = client();
        // The client listens 300 ms: nothing yet.
        assert!(exchange(&s, server.port, &post(4, &[5], KEY)).is_empty());
        let mut buf = [0u8; 64];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let (n, _) = s.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[0x61, CREATED, 0, 4, 5]);
        let seen = server.stop();
        assert_eq!((seen.keys[KEY].effects, seen.faults["slow"]), (1, 1));
    }

    #[test]
    fn another_path_is_not_found() {
        let server = CoapFault::start(plan(vec![])).unwrap();
        let s = client();
        let got = exchange(&s, server.port, &post(5, &[], "short"));
        assert_eq!(got[0][1], NOT_FOUND);
        assert_eq!(server.stop().refused, 1);
    }
}
