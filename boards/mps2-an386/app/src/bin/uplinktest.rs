//! On-target checks of `wary-uplink` with no peer process: what each exchange result means as
//! an outcome; the round pause; and the uplink loop over the durable outbox (on the emulated
//! flash) against a scripted transport: the same key on every attempt, a 400 moved to the
//! dead letters, a 401 keeping the reading and holding the outbox on flash until a probe lands,
//! a Retry-After too long to wait holding the outbox for that
//! long, each attempt's time limit capped to the time left before the call's deadline, a kept
//! round's backoff mark on flash and the wait it makes the next run resume with; and
//! the device credential in the request head of every attempt, in no `Debug` form, and absent
//! when the device has none; batches: due readings' first attempts in one exchange, each settled
//! by its own answer, the ones answered 503 retried alone with their keys, and the batch
//! answer read by place.

#![no_std]
#![no_main]

use core::cell::RefCell;

use core::fmt::Write as _;
use embassy_executor::Spawner;
use embassy_time::{Delay, Instant, Timer};
use heapless::Vec;
use mps2_an386::flash;
use wary::{
    Class, Drain, DrainSettings, Draw, Duration, Failure, FleetBudget, GiveUp, Operation, Outcome, Policy,
    Preset, Verdict, ledger::Ledger, retry_after::Rules,
};
use wary_outbox::{Config as OutboxConfig, Outbox};
use wary_qemu::Tally;

use wary_uplink::http::{self, HttpError, Post, Response};
use wary_uplink::identity::{Credential, parse_device_id};
use wary_uplink::transport::{Answer, Message, answer, failure, outcome};
use wary_uplink::{Config, POLICY, Reading, SplitMix64, Store, Transport, uplink};

const OUTBOX: OutboxConfig =
    OutboxConfig { boot_range: 0..0x2000, queue_range: 0x2000..0xA000, dead_range: 0xA000..0xC000 };

/// A test credential (random, used nowhere else) and the header line it must produce.
const TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const AUTHORIZATION_LINE: &str =
    "\r\nAuthorization: Bearer 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\r\n";

/// Answers from a script, one per attempt (the last repeats); records what each attempt was
/// given.
struct Scripted {
    script: &'static [Outcome],
    /// How long an attempt takes before it answers.
    takes: embassy_time::Duration,
    sent: RefCell<Vec<Sent, 16>>,
    /// Calls of `open` and `close`.
    opened: usize,
    closed: usize,
    /// The last dead letters' report the uplink gave the transport.
    reported: Option<(u32, u32)>,
}

#[derive(Clone, Copy)]
struct Sent {
    key: [u8; 32],
    limit: Duration,
    at: Instant,
}

impl Scripted {
    fn new(script: &'static [Outcome], takes: embassy_time::Duration) -> Self {
        Scripted { script, takes, sent: RefCell::new(Vec::new()), opened: 0, closed: 0, reported: None }
    }

    fn sent(&self) -> Vec<Sent, 16> {
        self.sent.borrow().clone()
    }
}

impl Transport for Scripted {
    async fn open(&mut self, _limit: Duration) -> Result<(), Failure> {
        self.opened += 1;
        Ok(())
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: Duration) {
        for (message, slot) in messages.iter().zip(answers.iter_mut()) {
            let n = self.sent.borrow().len();
            let mut k = [0u8; 32];
            for (d, s) in k.iter_mut().zip(message.key.bytes()) {
                *d = s;
            }
            let _ = self.sent.borrow_mut().push(Sent { key: k, limit, at: Instant::now() });
            Timer::after(self.takes.min(limit.into())).await;
            let last = self.script.len().saturating_sub(1);
            *slot = match self.script.get(n.min(last)).copied().unwrap_or(Outcome::Ok) {
                Outcome::Ok => Ok(reply(200, &[], None, true)),
                Outcome::Failure(failure) => Err(failure),
            };
        }
    }

    async fn close(&mut self) {
        self.closed += 1;
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        self.reported = Some((held, dropped));
    }
}

/// Takes batches of up to 4: in a batch, the messages at even places land (201) and those at odd
/// places get a 503; a message alone lands. Records each exchange's keys.
struct Batched {
    exchanges: Vec<Vec<[u8; 32], 4>, 8>,
}

impl Transport for Batched {
    const BATCH: usize = 4;

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], _limit: Duration) {
        let mut keys = Vec::new();
        for (n, (message, slot)) in messages.iter().zip(answers.iter_mut()).enumerate() {
            let mut k = [0u8; 32];
            for (d, s) in k.iter_mut().zip(message.key.bytes()) {
                *d = s;
            }
            let _ = keys.push(k);
            let status = if messages.len() > 1 && n % 2 == 1 { 503 } else { 201 };
            *slot = Ok(reply(status, &[], None, true));
        }
        let _ = self.exchanges.push(keys);
    }
}

/// An in-memory connection: the `n`-th reply becomes readable once the `n`-th request was
/// flushed, as on a real connection; past what is readable, a read sees the end.
struct Wire {
    replies: &'static [&'static [u8]],
    released: usize,
    reply: usize,
    at: usize,
}

impl Wire {
    fn new(replies: &'static [&'static [u8]]) -> Self {
        Wire { replies, released: 0, reply: 0, at: 0 }
    }
}

impl embedded_io_async::ErrorType for Wire {
    type Error = core::convert::Infallible;
}

impl embedded_io_async::Read for Wire {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        while self.reply < self.released {
            let rest = self.replies.get(self.reply).and_then(|r| r.get(self.at..)).unwrap_or(&[]);
            if rest.is_empty() {
                self.reply += 1;
                self.at = 0;
                continue;
            }
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.at += n;
            return Ok(n);
        }
        Ok(0)
    }
}

impl embedded_io_async::Write for Wire {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        Ok(buf.len())
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        self.released += 1;
        Ok(())
    }
}

/// One exchange on `wire`: the reply's status (or error) and whether the connection may carry
/// the next request.
async fn exchange(wire: &mut Wire) -> (Result<u16, HttpError>, bool) {
    let mut head = [0u8; 512];
    let request = b"POST /readings HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    head[..request.len()].copy_from_slice(request);
    let deadline = Instant::now() + embassy_time::Duration::from_secs(1);
    let (result, keep) = http::send_and_read_framed(wire, request.len(), b"", &mut head, deadline).await;
    (result.map(|r| r.status), keep)
}

/// Kept connections: which replies leave the connection at a known byte, and the next reply
/// read from the right one.
async fn keep_alive_checks(tally: &mut Tally) {
    let mut wire = Wire::new(&[
        b"HTTP/1.1 201 Created\r\nContent-Length: 9\r\n\r\n{\"id\":95}",
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ]);
    let first = exchange(&mut wire).await;
    let second = exchange(&mut wire).await;
    let third = exchange(&mut wire).await;
    tally.check(
        "keep-alive: length-framed and chunked replies keep the connection, each next reply read from its first byte",
        first == (Ok(201), true) && second == (Ok(503), true) && third == (Ok(200), true),
    );
    let ends: [&'static [&'static [u8]]; 5] = [
        &[b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"],
        &[b"HTTP/1.1 201 Created\r\nconnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n{}"],
        &[b"HTTP/1.0 201 Created\r\nContent-Length: 2\r\n\r\n{}"],
        &[b"HTTP/1.1 201 Created\r\n\r\n{}"],
        &[b"HTTP/1.1 201 Created\r\nContent-Length: 20\r\n\r\n{}"],
    ];
    let mut all_end = true;
    for replies in ends {
        all_end &= exchange(&mut Wire::new(replies)).await == (Ok(201), false);
    }
    tally.check(
        "keep-alive: Connection: close (any case, in a list), HTTP/1.0, a body to the close, a body cut short end the connection",
        all_end,
    );
    let closed = exchange(&mut Wire::new(&[b""])).await;
    tally.check(
        "keep-alive: a request that left and met the close with no reply byte may have landed",
        closed.0 == Err(HttpError::Closed) && !closed.1 && HttpError::Closed.may_have_landed(),
    );
    tally.check(
        "keep-alive: a write that failed before the whole request left was never sent",
        !HttpError::SendFailed.may_have_landed(),
    );
    let post =
        Post { path: "/readings", idempotency_key: "k", body: b"{}", credential: None, dead_letters: None };
    let mut head = [0u8; 256];
    let kept = match http::encode_head_for(&post, "10.0.2.2:8080", false, &mut head).await {
        Ok(n) => {
            head.get(..n).and_then(|b| core::str::from_utf8(b).ok()).unwrap_or("").contains("Connection")
        }
        Err(_) => true,
    };
    let mut head = [0u8; 256];
    let closing = match http::encode_head_for(&post, "10.0.2.2:8080", true, &mut head).await {
        Ok(n) => head
            .get(..n)
            .and_then(|b| core::str::from_utf8(b).ok())
            .unwrap_or("")
            .contains("\r\nConnection: close\r\n"),
        Err(_) => false,
    };
    tally.check(
        "keep-alive: a kept request has no Connection header, a closing one Connection: close",
        !kept && closing,
    );
}

fn reply(status: u16, retry_after: &[&[u8]], date: Option<&[u8]>, body_complete: bool) -> Response {
    let mut values = Vec::new();
    for v in retry_after {
        let _ = values.push(Vec::from_slice(v).unwrap_or_default());
    }
    Response {
        status,
        retry_after: values,
        retry_after_dropped: 0,
        date: date.and_then(|d| Vec::from_slice(d).ok()),
        date_dropped: false,
        body_complete,
    }
}

const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";
const DATE_PLUS_5: &[u8] = b"Sun, 06 Nov 1994 08:49:42 GMT";

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let _board = mps2_an386::init();
    let mut tally = Tally::new();
    let rules = Rules::LENIENT;

    // The credential: `Authorization: Bearer <token>` in the head of each attempt's request,
    // exactly once; never in a Debug form; no such header without one.
    let credential = Credential::from_token(TOKEN);
    tally.check("a 64-hex-digit token is a credential", credential.is_some());
    let post = Post {
        path: "/readings",
        idempotency_key: "574152590a3860010000000100000000",
        body: b"{}",
        credential: credential.as_ref(),
        dead_letters: None,
    };
    let mut every_attempt = true;
    for _attempt in 0..3 {
        let mut head = [0u8; 512];
        let text = match http::encode_head(&post, "10.0.2.2:8080", &mut head).await {
            Ok(n) => head.get(..n).and_then(|b| core::str::from_utf8(b).ok()).unwrap_or(""),
            Err(_) => "",
        };
        every_attempt &= text.matches("Authorization").count() == 1
            && text.contains(AUTHORIZATION_LINE)
            && text.contains("\r\nIdempotency-Key: 574152590a3860010000000100000000\r\n")
            && text.ends_with("\r\n\r\n");
    }
    tally.check(
        "credential: one Authorization: Bearer line with the whole token, every attempt",
        every_attempt,
    );
    let mut shown: heapless::String<256> = heapless::String::new();
    let _ = write!(shown, "{:?} {:?}", credential, post);
    tally.check(
        "credential: Debug of it and of the request shows no part of the token",
        shown.contains("Credential(..)") && !shown.contains(&TOKEN[..8]) && !shown.contains(&TOKEN[56..]),
    );
    let anonymous = Post { credential: None, ..post };
    let mut head = [0u8; 512];
    let text = match http::encode_head(&anonymous, "10.0.2.2:8080", &mut head).await {
        Ok(n) => head.get(..n).and_then(|b| core::str::from_utf8(b).ok()).unwrap_or(""),
        Err(_) => "",
    };
    tally.check(
        "no credential: no Authorization header, the rest unchanged",
        !text.is_empty() && !text.contains("Authorization") && text.contains("\r\nIdempotency-Key: "),
    );
    // The dead letters' report: one header, the value as made, beside the rest; none without.
    let value = http::dead_letters_value(2, 1);
    let reporting = Post { dead_letters: Some(&value), ..post };
    let mut head = [0u8; 512];
    let text = match http::encode_head(&reporting, "10.0.2.2:8080", &mut head).await {
        Ok(n) => head.get(..n).and_then(|b| core::str::from_utf8(b).ok()).unwrap_or(""),
        Err(_) => "",
    };
    tally.check(
        "dead letters: one Wary-Dead-Letters: held=2, dropped=1 line, with the credential and the key",
        text.matches("Wary-Dead-Letters").count() == 1
            && text.contains("\r\nWary-Dead-Letters: held=2, dropped=1\r\n")
            && text.contains(AUTHORIZATION_LINE)
            && text.contains("\r\nIdempotency-Key: "),
    );
    let mut head = [0u8; 512];
    let text = match http::encode_head(&post, "10.0.2.2:8080", &mut head).await {
        Ok(n) => head.get(..n).and_then(|b| core::str::from_utf8(b).ok()).unwrap_or(""),
        Err(_) => "",
    };
    tally.check(
        "no dead letters: no Wary-Dead-Letters header",
        !text.is_empty() && !text.contains("Wary-Dead"),
    );
    keep_alive_checks(&mut tally).await;
    tally.check(
        "a malformed token is refused",
        Credential::from_token(&TOKEN[1..]).is_none() && Credential::from_token("Z").is_none(),
    );
    tally.check(
        "a 16-hex-digit device id",
        parse_device_id("574152590a386001") == Some(0x5741_5259_0a38_6001),
    );
    tally.check(
        "a decimal device id; anything else refused",
        parse_device_id("18446744073709551615") == Some(u64::MAX)
            && parse_device_id("18446744073709551616").is_none()
            && parse_device_id("0x2a").is_none()
            && parse_device_id("").is_none(),
    );

    // What an exchange result means for the request.
    tally.check(
        "a 2xx is landed, whatever its body",
        outcome(&Ok(reply(201, &[], None, false)), &rules).0 == Outcome::Ok,
    );
    tally.check(
        "503 with Retry-After seconds",
        outcome(&Ok(reply(503, &[b"2"], None, true)), &rules).0
            == Outcome::status_after(503, Duration::from_secs(2)),
    );
    tally.check(
        "429 with an HTTP-date Retry-After, measured against the reply's Date",
        outcome(&Ok(reply(429, &[DATE_PLUS_5], Some(DATE), true)), &rules).0
            == Outcome::status_after(429, Duration::from_secs(5)),
    );
    let (status_kept, reading) = outcome(&Ok(reply(503, &[b"soon"], None, true)), &rules);
    tally.check(
        "an unreadable Retry-After is ignored, the status kept",
        status_kept.code() == Some(503) && status_kept.retry_after().is_none(),
    );
    tally.check(
        "an unreadable Retry-After is counted, on the failure the ledger records too",
        reading.unreadable == 1 && status_kept.failure().map(|f| f.unreadable_retry_after()) == Some(1),
    );
    let table = [
        (HttpError::NoNetwork, Failure::Refused),
        (HttpError::NoRoute, Failure::Refused),
        (HttpError::Refused, Failure::Refused),
        (HttpError::SendFailed, Failure::Refused),
        (HttpError::ConnectTimeout, Failure::ConnectTimeout),
        (HttpError::BadRequest, Failure::BadBody),
        (HttpError::ResponseTimeout, Failure::ResponseTimeout),
        (HttpError::Reset, Failure::Reset),
        (HttpError::Closed, Failure::Reset),
        (HttpError::Truncated, Failure::Reset),
        (HttpError::Malformed, Failure::Reset),
        (HttpError::HeadersTooLarge, Failure::Reset),
    ];
    let mut mapped = true;
    for (err, expected) in table {
        let got = failure(err);
        mapped &= got == expected;
        mapped &= outcome(&answer(Err(err)), &rules).0 == Outcome::Failure(expected);
        // Never-sent failures are safe to resend on any write; the rest only with a key.
        let retry_any = POLICY.classify(Operation::Write, &got.into()) == Class::Retry;
        mapped &= retry_any != err.may_have_landed() || expected == Failure::BadBody;
    }
    tally.check("every exchange failure maps by whether it may have landed", mapped);

    // The round pause on this target, as the uplink takes it from the core's drain: equal
    // jitter, doubling from 500 ms, capped at 30 s, reset by a landing.
    let config_drain = Config::new(0).drain;
    tally.check("the uplink drains under the device's settings", config_drain == DrainSettings::DEVICE);
    let Ok(mut drain) = Drain::<u32>::new(config_drain) else {
        tally.check("the device's drain settings are accepted", false);
        tally.finish()
    };
    let budget = Verdict::GaveUp(GiveUp::Budget);
    let mut within_ok = true;
    for (raw, expected) in [0, u32::MAX, 0x9e37_79b9, 1, 12_345, u32::MAX / 3, 7, 0]
        .into_iter()
        .zip([500u32, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000])
    {
        drain.start_round();
        let _ =
            drain.settle(1, &budget, None, POLICY.table(), wary::Instant::ZERO, Duration::ZERO, Draw::ZERO);
        let pause = drain.end_round(false, Draw::unit(raw)).pause.as_millis();
        within_ok &= pause >= expected / 2 && pause <= expected;
    }
    tally.check("round pauses within [ceiling/2, ceiling], doubling from 500 ms to 30 s", within_ok);
    drain.start_round();
    let _ =
        drain.settle(2, &Verdict::Ok, None, POLICY.table(), wary::Instant::ZERO, Duration::ZERO, Draw::ZERO);
    let _ = drain.settle(1, &budget, None, POLICY.table(), wary::Instant::ZERO, Duration::ZERO, Draw::ZERO);
    let reset = drain.end_round(true, Draw::unit(u32::MAX)).pause.as_millis();
    tally.check(
        "a landing resets the pause; throttled, one doubling longer (1 s)",
        (500..=1_000).contains(&reset),
    );
    tally.check(
        "POLICY: 20 s deadline, 1 s min_attempt",
        POLICY.deadline() == Some(Duration::from_secs(20)) && POLICY.min_attempt() == Duration::from_secs(1),
    );

    // The loop over the outbox on the emulated flash.
    let Some(psram) = flash::take() else {
        tally.check("the emulated flash is handed out", false);
        tally.finish()
    };
    let outbox = match Outbox::open(psram, OUTBOX).await {
        Ok((outbox, _)) => outbox,
        Err(_) => {
            tally.check("the outbox opens", false);
            tally.finish()
        }
    };
    let store = Store::new(outbox);
    store.finish_sensing();
    // These cases check the uplink's rounds and the policy's decisions on scripted outcomes,
    // attempt by attempt: without the pace and breaker, whose waits would change them.
    let config = Config { pacing: false, ..Config::new(0x5741_5259_0a38_6001) };
    let fleet = FleetBudget::new(10, 500).unwrap_or_else(|_| tally.finish());

    // A 503, then ok: one reading, two attempts with one key.
    static RETRY_THEN_OK: [Outcome; 2] = [Outcome::status(503), Outcome::Ok];
    let mut t = Scripted::new(&RETRY_THEN_OK, embassy_time::Duration::from_millis(1));
    let _ = store.push(Reading { milli_celsius: 21_000 }).await;
    let mut ledger = Ledger::<8>::new();
    let s = uplink(&config, &POLICY, &fleet, Delay, SplitMix64::new(1), &mut t, &store, &mut ledger).await;
    let sent = t.sent();
    tally.check("503 then ok: landed after two attempts", s.landed == 1 && s.left == 0 && sent.len() == 2);
    tally.check("503 then ok: the same key on both attempts", sent.len() == 2 && sent[0].key == sent[1].key);
    tally.check(
        "503 then ok: the transport opened for each attempt, kept after a round that kept nothing",
        t.opened == 2 && t.closed == 0 && s.rounds == 1,
    );

    // A 400 fails at once: the reading leaves the queue for the dead letters, kept on flash.
    static BAD_REQUEST: [Outcome; 1] = [Outcome::status(400)];
    let mut t = Scripted::new(&BAD_REQUEST, embassy_time::Duration::from_millis(1));
    let _ = store.push(Reading { milli_celsius: 21_001 }).await;
    let s = uplink(&config, &POLICY, &fleet, Delay, SplitMix64::new(2), &mut t, &store, &mut ledger).await;
    tally.check(
        "400: one attempt, the reading dead-lettered, off the queue",
        t.sent().len() == 1 && s.dead_lettered == 1 && s.left == 0 && s.dead_letters == 1,
    );
    tally.check("400: the transport reports the dead letter (held 1, dropped 0)", t.reported == Some((1, 0)));

    // A 401 is the endpoint's refusal: the reading stays, the outbox is held, and flash keeps
    // the hold. The next run (as after a reset) goes on with the hold: its probe waits at least
    // the hold's floor (half of 3 s), longer than any pause the round could make it wait (at
    // most 1 s at step 2), and, landing, clears it.
    static UNAUTHORIZED: [Outcome; 1] = [Outcome::status(401)];
    let mut t = Scripted::new(&UNAUTHORIZED, embassy_time::Duration::from_millis(1));
    let _ = store.push(Reading { milli_celsius: 21_005 }).await;
    let mut held = config;
    held.max_rounds = 1;
    held.drain.hold_base = Duration::from_secs(3);
    held.drain.hold_cap = Duration::from_secs(6);
    let s = uplink(&held, &POLICY, &fleet, Delay, SplitMix64::new(7), &mut t, &store, &mut ledger).await;
    let mark = store.hold().await;
    tally.check(
        "401: one attempt, the reading kept, the outbox held",
        t.sent().len() == 1 && s.dead_lettered == 0 && s.left == 1 && s.held == 1,
    );
    tally.check(
        "401: the hold is on flash (one refusal, 401)",
        mark.is_some_and(|m| m.step == 1 && m.reason == 401),
    );
    static PROBE_LANDS: [Outcome; 1] = [Outcome::Ok];
    let mut t = Scripted::new(&PROBE_LANDS, embassy_time::Duration::from_millis(1));
    let started = Instant::now();
    let s = uplink(&held, &POLICY, &fleet, Delay, SplitMix64::new(8), &mut t, &store, &mut ledger).await;
    let waited = t.sent().first().map_or(0, |a| a.at.duration_since(started).as_millis());
    tally.check("held after a reset: the probe waits the hold's floor (1.5 s)", waited >= 1_500);
    tally.check(
        "held after a reset: the probe landed, the hold is cleared on flash",
        s.landed == 1 && s.left == 0 && store.hold().await.is_none(),
    );

    // Retry-After longer than the call can wait (1 s against a 500 ms budget): the reading is
    // kept, and nothing is sent for 1 s; the second reading waits too.
    let ms = Duration::from_millis;
    let Ok(policy) =
        Policy::builder(Preset::Default).base(ms(100)).cap(ms(2_000)).budget(ms(500)).max_attempts(6).build()
    else {
        tally.check("test policy builds", false);
        tally.finish()
    };
    static TOO_LONG: [Outcome; 2] = [Outcome::status_after(429, Duration::from_secs(1)), Outcome::Ok];
    let mut t = Scripted::new(&TOO_LONG, embassy_time::Duration::from_millis(1));
    let _ = store.push(Reading { milli_celsius: 21_002 }).await;
    let _ = store.push(Reading { milli_celsius: 21_003 }).await;
    let s = uplink(&config, &policy, &fleet, Delay, SplitMix64::new(3), &mut t, &store, &mut ledger).await;
    let sent = t.sent();
    let gap = match (sent.first(), sent.get(1)) {
        (Some(a), Some(b)) => b.at.duration_since(a.at).as_millis(),
        _ => 0,
    };
    defmt::info!(
        "Retry-After 1 s over a 500 ms budget: {=usize} sends, {=u64} ms apart; {}",
        sent.len(),
        gap,
        s
    );
    tally.check(
        "retry-after too long: gave up once, held once, then both landed",
        s.gave_up == 1 && s.held == 1 && s.landed == 2 && s.left == 0,
    );
    tally.check("retry-after too long: nothing sent for 1 s", sent.len() == 3 && gap >= 1_000);

    // Each attempt's limit is the time left before the deadline (1.5 s here), never more.
    let Ok(policy) = Policy::builder(Preset::Default)
        .base(ms(100))
        .cap(ms(200))
        .budget(ms(1_000))
        .max_attempts(6)
        .deadline(ms(1_500))
        .min_attempt(ms(100))
        .build()
    else {
        tally.check("deadline policy builds", false);
        tally.finish()
    };
    static TIMEOUTS: [Outcome; 1] = [Outcome::Failure(Failure::ResponseTimeout)];
    let mut t = Scripted::new(&TIMEOUTS, embassy_time::Duration::from_millis(600));
    let kept = store.push(Reading { milli_celsius: 21_004 }).await;
    let mut one_round = config;
    one_round.max_rounds = 1;
    let s = uplink(&one_round, &policy, &fleet, Delay, SplitMix64::new(4), &mut t, &store, &mut ledger).await;
    let sent = t.sent();
    let limits_ok = sent.first().is_some_and(|a| a.limit == ms(1_500))
        && sent.windows(2).all(|w| w[1].limit + Duration::from(w[1].at.duration_since(w[0].at)) <= ms(1_500));
    defmt::info!("deadline 1.5 s: {=usize} attempts; {}", sent.len(), s);
    tally.check("attempt limits: the first is the whole 1.5 s, each later one what is left", limits_ok);
    tally.check("attempt limits: the call gave up and kept the reading", s.gave_up == 1 && s.left == 1);
    tally.check(
        "attempt limits: the transport closed after each round that kept the reading",
        t.closed == s.rounds as usize && s.rounds >= 1,
    );

    // That round kept the reading: its backoff is on flash, where the next boot finds it.
    let mark = store.backoff().await;
    tally.check(
        "a kept round marks its backoff on flash: the kept reading, step 1",
        matches!((mark, kept), (Some(m), Ok(id)) if m.id == id && m.step == 1),
    );
    // The next run, as after a reset, resumes: its first send waits at least the floor of the
    // next step's pause (step 2: half of 2 × 500 ms), never zero.
    static LANDS: [Outcome; 1] = [Outcome::Ok];
    let mut t = Scripted::new(&LANDS, embassy_time::Duration::from_millis(1));
    let started = Instant::now();
    let s = uplink(&one_round, &POLICY, &fleet, Delay, SplitMix64::new(5), &mut t, &store, &mut ledger).await;
    let waited = t.sent().first().map_or(0, |a| a.at.duration_since(started).as_millis());
    defmt::info!("resumed backoff: first send after {=u64} ms; {}", waited, s);
    tally.check("resumed backoff: the first send waits step 2's floor (500 ms) at least", waited >= 500);
    tally.check("resumed backoff: the reading landed, and the mark is cleared", s.landed == 1 && s.left == 0);
    tally.check(
        "resumed backoff: a round that keeps nothing clears the mark",
        store.backoff().await.is_none(),
    );

    // Batches: four due readings go out in one exchange; the two answered 503 at their places
    // are retried alone, each with its own key; all four land once.
    let mut t = Batched { exchanges: Vec::new() };
    for mc in 0..4 {
        let _ = store.push(Reading { milli_celsius: 22_000 + mc }).await;
    }
    let s = uplink(&config, &POLICY, &fleet, Delay, SplitMix64::new(6), &mut t, &store, &mut ledger).await;
    let ex = &t.exchanges;
    let batch = ex.first().cloned().unwrap_or_default();
    tally.check("batch: the four readings' first attempts in one exchange", batch.len() == 4);
    tally.check(
        "batch: only the two answered 503 are sent again, alone, with their own keys",
        ex.len() == 3
            && ex.get(1).is_some_and(|e| e.len() == 1 && e.first() == batch.get(1))
            && ex.get(2).is_some_and(|e| e.len() == 1 && e.first() == batch.get(3)),
    );
    tally.check("batch: all four landed, none left", s.landed == 4 && s.left == 0 && s.dead_lettered == 0);

    // The answer's format: positional statuses, a Retry-After in seconds in a pair.
    let mut answers: [Answer; 2] = [Err(Failure::Reset), Err(Failure::Reset)];
    let read = wary_uplink::transport::read_batch_answer(b"[201, [503,2]]", &mut answers);
    let retry_after_2 = matches!(&answers[1], Ok(r) if r.status == 503 && r.retry_after.first().map(|v| v.as_slice()) == Some(&b"2"[..]));
    tally.check(
        "batch answer: read by place",
        read && matches!(&answers[0], Ok(r) if r.status == 201 && r.retry_after.is_empty()) && retry_after_2,
    );
    let mut three: [Answer; 3] = [Err(Failure::Reset), Err(Failure::Reset), Err(Failure::Reset)];
    tally.check(
        "batch answer: another count, or not an array, is refused",
        !wary_uplink::transport::read_batch_answer(b"[201,201]", &mut three)
            && !wary_uplink::transport::read_batch_answer(b"{\"a\":1}", &mut answers)
            && !wary_uplink::transport::read_batch_answer(b"[201,[503]]", &mut answers),
    );

    tally.finish()
}
