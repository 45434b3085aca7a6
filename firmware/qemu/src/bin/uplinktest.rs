//! On-target checks of `wary-uplink` against fake serial ports, no peer process needed: the
//! modem client stays bounded in time on a port that fails, returns nothing or never stops
//! talking; an answer timeout is capped to the time left; a command that cannot be formatted
//! fails at once; the round pause is jittered and grows; a cancelled reading stays; and a
//! server's Retry-After that a call could not wait out holds the outbox for that long.

#![no_std]
#![no_main]

use core::cell::RefCell;

use embassy_executor::Spawner;
use embassy_time::{Duration, Instant, Timer};
use embedded_io_async::{ErrorKind, ErrorType, Read, Write};
use wary::ledger::Ledger;
use wary::retry_after::Rules;
use wary::{FleetBudget, GiveUp, Outcome, Policy, Preset, Verdict};
use wary_qemu::Tally;
use wary_uplink::{
    Config, DRAIN_MAX_BYTES, MAX_LINK_ERRORS, Modem, Outbox, POLICY, Reading, RoundBackoff, Settle,
    SplitMix64, uplink,
};

/// How the fake port's receive side behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rx {
    /// Never a byte: every read waits forever.
    Silent,
    /// Every read fails at once.
    Failing,
    /// Every read returns `Ok(0)` at once.
    Empty,
    /// Every read returns garbage at once, forever.
    Noisy,
    /// Answers from `script`, one per command; waits when there is nothing to read.
    Scripted,
}

struct State {
    rx: Rx,
    /// The answer being read (scripted) and how much of it was read.
    pending: &'static [u8],
    /// Answers for the next commands, in order; the last one repeats.
    script: &'static [&'static str],
    /// When each `AT+HTTPPOST` was written (ms): the first 8, and how many in all.
    sent_at: [u64; 8],
    commands: usize,
    /// Bytes read by the device, and writes made.
    read_bytes: usize,
    writes: u32,
}

struct Port(RefCell<State>);

impl Port {
    fn new(rx: Rx, script: &'static [&'static str]) -> Self {
        Port(RefCell::new(State {
            rx,
            pending: &[],
            script,
            sent_at: [0; 8],
            commands: 0,
            read_bytes: 0,
            writes: 0,
        }))
    }
}

impl ErrorType for &Port {
    type Error = ErrorKind;
}

impl Read for &Port {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, ErrorKind> {
        let rx = self.0.borrow().rx;
        match rx {
            Rx::Silent => core::future::pending().await,
            Rx::Failing => Err(ErrorKind::Other),
            Rx::Empty => Ok(0),
            Rx::Noisy => {
                buf.fill(b'x');
                self.0.borrow_mut().read_bytes += buf.len();
                Ok(buf.len())
            }
            Rx::Scripted => loop {
                {
                    let mut s = self.0.borrow_mut();
                    if !s.pending.is_empty() {
                        let n = buf.len().min(s.pending.len());
                        let (now, later) = s.pending.split_at(n);
                        buf[..n].copy_from_slice(now);
                        s.pending = later;
                        s.read_bytes += n;
                        return Ok(n);
                    }
                }
                Timer::after_millis(1).await;
            },
        }
    }
}

impl Write for &Port {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, ErrorKind> {
        let mut s = self.0.borrow_mut();
        s.writes += 1;
        if buf.starts_with(b"AT+HTTPPOST") {
            let n = s.commands;
            if let Some(at) = s.sent_at.get_mut(n) {
                *at = Instant::now().as_millis();
            }
            s.commands += 1;
            let answers = s.script;
            if let Some(answer) = answers.get(n).or(answers.last()) {
                s.pending = answer.as_bytes();
            }
        }
        Ok(buf.len())
    }

    async fn flush(&mut self) -> Result<(), ErrorKind> {
        Ok(())
    }
}

const OK_200: &str = "\r\n+HTTPPOST: 200,\"\",\"\"\r\n\r\nOK\r\n";
const TOO_MANY_RA1: &str = "\r\n+HTTPPOST: 429,\"1\",\"\"\r\n\r\nOK\r\n";

const KEY: &str = "0a386001000000010000000000000000";

async fn timed_post(port: &Port, timeout_ms: u64, within: Option<u64>, path: &str) -> (Outcome, u64, u32) {
    let mut modem = Modem::new(port, port, Duration::from_millis(timeout_ms));
    let rules = Rules::LENIENT;
    let t0 = Instant::now();
    let outcome = modem.post(path, KEY, b"{}", &rules, within.map(Duration::from_millis)).await;
    (outcome, t0.elapsed().as_millis(), modem.link_errors())
}

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let _board = mps2_an386::init();
    let mut tally = Tally::new();

    // 2. The answer timeout is capped to the time left before the call's deadline.
    let silent = Port::new(Rx::Silent, &[]);
    let (outcome, ms, _) = timed_post(&silent, 3_000, Some(50), "/readings").await;
    defmt::info!("silent port, 3 s timeout, 50 ms left: {} after {=u64} ms", outcome, ms);
    tally.check("silent port: response timeout", outcome == Outcome::ResponseTimeout);
    tally.check("answer timeout capped to the time left (50..=80 ms)", (50..=80).contains(&ms));
    let (outcome, ms, _) = timed_post(&silent, 200, Some(5_000), "/readings").await;
    defmt::info!("silent port, 200 ms timeout, 5 s left: {} after {=u64} ms", outcome, ms);
    tally.check("the modem's own timeout when it is shorter (200..=230 ms)", (200..=230).contains(&ms));

    // 3. A port that fails or returns nothing at once ends as a response timeout, bounded.
    for (name, rx) in [("failing", Rx::Failing), ("empty-read", Rx::Empty)] {
        let port = Port::new(rx, &[]);
        let (outcome, ms, errors) = timed_post(&port, 3_000, None, "/readings").await;
        defmt::info!("{=str} port: {} after {=u64} ms, {=u32} link errors", name, outcome, ms, errors);
        tally.check("failing/empty port: response timeout", outcome == Outcome::ResponseTimeout);
        tally.check("failing/empty port: ended by the error bound", errors == MAX_LINK_ERRORS);
        tally.check("failing/empty port: well before the 3 s timeout", ms < 500);
    }
    // A port that never stops talking: drain stops at its byte bound, the exchange at its time.
    let noisy = Port::new(Rx::Noisy, &[]);
    let (outcome, ms, _) = timed_post(&noisy, 3_000, Some(100), "/readings").await;
    let read = noisy.0.borrow().read_bytes;
    defmt::info!("noisy port: {} after {=u64} ms, {=usize} bytes read", outcome, ms, read);
    tally.check("noisy port: response timeout", outcome == Outcome::ResponseTimeout);
    tally.check("noisy port: ends near the time left (100..=150 ms)", (100..=150).contains(&ms));
    tally.check("noisy port: drain read at least its bound", read >= DRAIN_MAX_BYTES);

    // 4. A command that cannot be formatted fails at once and is never sent.
    let port = Port::new(Rx::Scripted, &[OK_200]);
    let long_path = "/readings/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let (outcome, _, _) = timed_post(&port, 3_000, None, long_path).await;
    tally.check("too long a command: bad_body", outcome == Outcome::BadBody);
    tally.check("too long a command: nothing written", port.0.borrow().writes == 0);
    tally.check(
        "bad_body fails a keyed write at once",
        POLICY.classify(wary::Operation::KeyedWrite, &Outcome::BadBody) == wary::Class::Failed,
    );

    // 1. The round pause: equal jitter, doubling from 500 ms, capped at 30 s, reset.
    let mut b = RoundBackoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut ceilings_ok = true;
    let mut within_ok = true;
    let draws = [0, u64::MAX, 0x9e37_79b9_7f4a_7c15, 1, 12_345, u64::MAX / 3, 7, 0];
    for (draw, expected) in
        draws.into_iter().zip([500u64, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000])
    {
        let ceiling = b.ceiling_ms(false);
        let pause = b.next(draw, false).as_millis();
        ceilings_ok &= ceiling == expected;
        within_ok &= pause >= expected / 2 && pause <= expected;
    }
    tally.check("round pause ceilings double from 500 ms to the 30 s cap", ceilings_ok);
    tally.check("round pause within [ceiling/2, ceiling]", within_ok);
    let mut lo = RoundBackoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut hi = lo;
    let (a, z) = (lo.next(0, false).as_millis(), hi.next(u64::MAX - 1, false).as_millis());
    tally.check("round pause is jittered (draws 0 and max differ)", a == 250 && z > 250);
    b.reset();
    tally.check("round pause resets to 500 ms", b.ceiling_ms(false) == 500);
    tally.check("round pause one doubling longer while throttled", b.ceiling_ms(true) == 1_000);

    // 5. A cancelled call settles nothing.
    tally.check("cancelled: kept", Settle::of(&Verdict::Cancelled) == Settle::Keep);
    tally.check("gave_up: kept", Settle::of(&Verdict::GaveUp(GiveUp::Budget)) == Settle::Keep);
    tally.check("failed: removed", Settle::of(&Verdict::Failed) == Settle::Failed);
    tally.check("ok: landed", Settle::of(&Verdict::Ok) == Settle::Landed);

    // 2. The uplink policy has a deadline.
    tally.check(
        "POLICY: 20 s deadline, 1 s min_attempt",
        POLICY.deadline() == Some(20_000) && POLICY.min_attempt() == 1_000,
    );

    // 1. Retry-After longer than the call can wait (1 s against a 500 ms budget): the reading
    // is kept, and nothing is sent for 1 s.
    let policy =
        match Policy::builder(Preset::Default).base(100).cap(2_000).budget(500).max_attempts(6).build() {
            Ok(p) => p,
            Err(_) => {
                tally.check("test policy builds", false);
                tally.finish()
            }
        };
    let fleet = match FleetBudget::new(10, 500) {
        Ok(f) => f,
        Err(_) => {
            tally.check("test fleet builds", false);
            tally.finish()
        }
    };
    let port = Port::new(Rx::Scripted, &[TOO_MANY_RA1, OK_200]);
    let mut modem = Modem::new(&port, &port, Duration::from_millis(500));
    let outbox = Outbox::<2>::new();
    let _ = outbox.offer(Reading { seq: 0, milli_celsius: 21_000 });
    let config = Config::new(0x0a38_6001, 0x1234_5678, 1);
    let mut ledger = Ledger::<8>::new();
    let s = uplink(&config, &policy, &fleet, SplitMix64::new(1), &mut modem, &outbox, &mut ledger).await;
    let (sent, at) = {
        let st = port.0.borrow();
        (st.commands, st.sent_at)
    };
    let gap = at[1].saturating_sub(at[0]);
    defmt::info!(
        "Retry-After 1 s over a 500 ms budget: {=usize} commands, {=u64} ms apart; {}",
        sent,
        gap,
        s
    );
    tally.check("retry-after too long: gave up once, held once, then landed", {
        s.gave_up == 1 && s.held == 1 && s.landed == 1 && s.left == 0
    });
    tally.check("retry-after too long: two commands, at least 1 s apart", sent == 2 && gap >= 1_000);

    tally.finish()
}
