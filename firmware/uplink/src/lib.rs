//! wary's device uplink, independent of the board: readings go from a sensor into a
//! fixed-capacity [`Outbox`], and [`uplink`] sends each one as a keyed write through the wary
//! runner over a [`Modem`] speaking the AT protocol of `wary-modem-proto` on any
//! `embedded-io-async` serial port.
//!
//! - **Keys**: `Key::from_parts(device, boot, sequence)`, made once per reading, sent on every
//!   attempt, in every round.
//! - **Settling**: a reading leaves the outbox only when it landed (`ok`) or definitively
//!   `failed` (counted and logged). `gave_up` (and `unknown`, which a keyed write should never
//!   produce) keep it for the next round.
//! - **A full outbox refuses the new reading and counts the refusal** ([`Outbox::offer`]); the
//!   sensor keeps its reading and offers it again, so nothing is dropped silently.
//! - **One attempt per AT command**: the modem never retries; the runner decides.
//! - Every attempt is logged with defmt by the ledger, as a `wary-ledger v1` line that
//!   `wary ledger from-defmt` turns into the host's replayable JSON lines.

#![no_std]
#![deny(missing_docs)]

use core::cell::RefCell;
use core::fmt::Write as _;

use embassy_sync::blocking_mutex::Mutex as BlockingMutex;
use embassy_sync::blocking_mutex::raw::{CriticalSectionRawMutex, NoopRawMutex};
use embassy_sync::mutex::Mutex;
use embassy_sync::signal::Signal;
use embassy_time::{Delay, Duration, Timer, with_timeout};
use embedded_io_async::{Read, Write};
use heapless::Deque;
use rand_core::RngCore;
use wary::ledger::Ledger;
use wary::retry_after::Rules;
use wary::run::{EmbassyClock, Runner};
use wary::{FleetBudget, Key, Operation, Outcome, Policy, Preset, Verdict};
use wary_modem_proto::{
    Event, Line, LineBuf, LineError, MAX_LINE, PostExchange, ProtoError, SEED_QUERY, parse_line, post_command,
};

/// The path readings are posted to.
pub const PATH: &str = "/readings";

/// One sensor reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub struct Reading {
    /// Sequence number since boot, from 0.
    pub seq: u32,
    /// Temperature in thousandths of a degree Celsius.
    pub milli_celsius: i32,
}

impl Reading {
    /// The JSON body sent for this reading.
    pub fn payload(&self) -> heapless::String<48> {
        let mut s = heapless::String::new();
        // At most 41 bytes: always fits.
        let _ = write!(s, "{{\"seq\":{},\"mC\":{}}}", self.seq, self.milli_celsius);
        s
    }
}

struct OutboxState<const N: usize> {
    queue: Deque<Reading, N>,
    accepted: u32,
    refused: u32,
}

/// A fixed-capacity outbox shared by a producer and the uplink. When full it **refuses** the
/// new reading and counts the refusal: the producer decides what to do with it (the sensor
/// here offers it again later).
pub struct Outbox<const N: usize> {
    state: BlockingMutex<CriticalSectionRawMutex, RefCell<OutboxState<N>>>,
    ready: Signal<CriticalSectionRawMutex, ()>,
}

impl<const N: usize> Default for Outbox<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Outbox<N> {
    /// An empty outbox.
    pub const fn new() -> Self {
        Outbox {
            state: BlockingMutex::new(RefCell::new(OutboxState {
                queue: Deque::new(),
                accepted: 0,
                refused: 0,
            })),
            ready: Signal::new(),
        }
    }

    /// Adds a reading; `false` (and one more refusal counted) when the outbox is full.
    pub fn offer(&self, reading: Reading) -> bool {
        let accepted = self.state.lock(|s| {
            let mut s = s.borrow_mut();
            let ok = s.queue.push_back(reading).is_ok();
            if ok {
                s.accepted = s.accepted.saturating_add(1);
            } else {
                s.refused = s.refused.saturating_add(1);
            }
            ok
        });
        if accepted {
            self.ready.signal(());
        }
        accepted
    }

    /// The readings waiting, oldest first.
    pub fn snapshot(&self) -> heapless::Vec<Reading, N> {
        self.state.lock(|s| s.borrow().queue.iter().copied().collect())
    }

    /// Removes the reading with `seq`; `false` if it was not there.
    pub fn remove(&self, seq: u32) -> bool {
        self.state.lock(|s| {
            let mut s = s.borrow_mut();
            let before = s.queue.len();
            let mut kept = Deque::<Reading, N>::new();
            for r in s.queue.iter().filter(|r| r.seq != seq) {
                // Never more than were there.
                let _ = kept.push_back(*r);
            }
            s.queue = kept;
            s.queue.len() < before
        })
    }

    /// Readings waiting.
    pub fn len(&self) -> usize {
        self.state.lock(|s| s.borrow().queue.len())
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Readings refused because the outbox was full.
    pub fn refused(&self) -> u32 {
        self.state.lock(|s| s.borrow().refused)
    }

    /// Readings accepted.
    pub fn accepted(&self) -> u32 {
        self.state.lock(|s| s.borrow().accepted)
    }

    /// Waits until a reading was offered since the last wait.
    pub async fn wait(&self) {
        self.ready.wait().await;
    }
}

/// A simulated sensor: `count` readings, one every `period`, each offered until the outbox
/// takes it (every refusal is counted by the outbox).
pub async fn sense<const N: usize>(outbox: &Outbox<N>, count: u32, period: Duration) {
    for seq in 0..count {
        let wobble = i32::try_from(seq.wrapping_mul(37) % 500).unwrap_or(0);
        let reading = Reading { seq, milli_celsius: 21_000_i32.saturating_add(wobble) };
        while !outbox.offer(reading) {
            defmt::warn!("outbox full: reading {=u32} refused, offered again later", seq);
            Timer::after(period).await;
        }
        Timer::after(period).await;
    }
}

/// SplitMix64: a small `RngCore` for jitter draws, seeded per device and run.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
}

impl RngCore for SplitMix64 {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            for (d, s) in chunk.iter_mut().zip(bytes) {
                *d = s;
            }
        }
    }
}

/// The device's end of the AT link: one command, one answer, bounded in bytes and in time.
pub struct Modem<R, W> {
    rx: R,
    tx: W,
    lines: LineBuf<MAX_LINE>,
    timeout: Duration,
    noise: u32,
    lost_answers: u32,
}

impl<R: Read, W: Write> Modem<R, W> {
    /// A modem on `rx`/`tx`; an answer not complete within `timeout` is a response timeout.
    pub fn new(rx: R, tx: W, timeout: Duration) -> Self {
        Modem { rx, tx, lines: LineBuf::new(), timeout, noise: 0, lost_answers: 0 }
    }

    /// Lines skipped as noise (garbage, oversized, unsolicited).
    pub fn noise(&self) -> u32 {
        self.noise
    }

    /// Answers that never completed or could not be read.
    pub fn lost_answers(&self) -> u32 {
        self.lost_answers
    }

    /// Drops whatever is left of an earlier answer.
    async fn drain(&mut self) {
        self.lines.clear();
        let mut buf = [0u8; 16];
        while let Ok(Ok(n)) = with_timeout(Duration::from_millis(2), self.rx.read(&mut buf)).await {
            if n == 0 {
                break;
            }
        }
    }

    async fn send(&mut self, parts: &[&[u8]]) -> bool {
        for part in parts {
            if self.tx.write_all(part).await.is_err() {
                return false;
            }
        }
        self.tx.flush().await.is_ok()
    }

    /// Reads classified lines until `step` returns a result or the timeout passes.
    async fn exchange<T>(
        &mut self,
        mut step: impl FnMut(Result<Line<'_>, LineError>) -> Option<T>,
    ) -> Option<T> {
        let Modem { rx, lines, timeout, .. } = self;
        let read = async {
            let mut byte = [0u8; 1];
            loop {
                match rx.read(&mut byte).await {
                    Ok(1) => {}
                    // A UART error (framing, overrun) corrupts the line, which is then classified.
                    Ok(_) | Err(_) => continue,
                }
                let got = match lines.push(byte[0]) {
                    Event::Pending => None,
                    Event::Line => step(parse_line(lines.line())),
                    Event::Overflow => step(Err(LineError::Overflow)),
                };
                if let Some(t) = got {
                    return t;
                }
            }
        };
        with_timeout(*timeout, read).await.ok()
    }

    /// Asks the host for a jitter seed (`AT+SEED?`).
    pub async fn seed(&mut self) -> Option<u64> {
        self.drain().await;
        if !self.send(&[SEED_QUERY]).await {
            return None;
        }
        let mut seed = None;
        let mut noise = 0u32;
        let done = self
            .exchange(|line| match line {
                Ok(Line::Seed(n)) => {
                    seed = Some(n);
                    None
                }
                Ok(Line::Ok | Line::Error) => Some(()),
                _ => {
                    noise = noise.saturating_add(1);
                    None
                }
            })
            .await;
        self.noise = self.noise.saturating_add(noise);
        done.and(seed)
    }

    /// One `AT+HTTPPOST`: exactly one HTTP request by the modem, its result as a wary outcome.
    pub async fn post(&mut self, path: &str, key: &str, payload: &[u8], rules: &Rules) -> Outcome {
        self.drain().await;
        let Ok(command) = post_command(path, key, payload.len()) else {
            // Never sent.
            return Outcome::Refused;
        };
        if !self.send(&[command.as_bytes(), payload]).await {
            return Outcome::Refused;
        }
        let mut ex = PostExchange::new();
        let answer = self.exchange(|line| ex.feed(line)).await;
        self.noise = self.noise.saturating_add(ex.noise());
        match answer {
            Some(Ok(answer)) => answer.outcome(rules),
            Some(Err(e)) => {
                self.lost_answers = self.lost_answers.saturating_add(1);
                defmt::warn!("modem answer unreadable: {}", e);
                e.outcome()
            }
            None => {
                self.lost_answers = self.lost_answers.saturating_add(1);
                defmt::warn!("modem answer incomplete after {=u64} ms", self.timeout.as_millis());
                ProtoError::Timeout.outcome()
            }
        }
    }
}

/// What the uplink is to do.
#[derive(Debug, Clone, Copy, defmt::Format)]
pub struct Config {
    /// The device id in every key.
    pub device: u32,
    /// The boot count in every key.
    pub boot: u32,
    /// Readings to settle before [`uplink`] returns.
    pub readings: u32,
    /// Pause after a round in which a reading was kept.
    pub round_pause: Duration,
    /// Rounds after which the uplink stops even if readings remain (a safety stop).
    pub max_rounds: u32,
}

impl Config {
    /// `readings` readings from `device` in boot `boot`, pausing 500 ms after a round that kept a
    /// reading and stopping after 40 rounds.
    pub const fn new(device: u32, boot: u32, readings: u32) -> Self {
        Config { device, boot, readings, round_pause: Duration::from_millis(500), max_rounds: 40 }
    }
}

/// The uplink's policy, in milliseconds: 100 ms base, 2 s cap, 8 s of waits per call, at most six
/// attempts. One definition for every board, so a device ledger replays under one known policy.
pub static POLICY: Policy =
    match Policy::builder(Preset::Default).base(100).cap(2_000).budget(8_000).max_attempts(6).build() {
        Ok(p) => p,
        Err(_) => panic!("uplink policy refused"),
    };

/// The device-wide retry budget: 10 tokens, half a token back per success.
pub static FLEET: FleetBudget = match FleetBudget::new(10, 500) {
    Ok(f) => f,
    Err(_) => panic!("fleet budget refused"),
};

/// What happened, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, defmt::Format)]
pub struct Summary {
    /// Readings that landed.
    pub landed: u32,
    /// Readings that definitively failed (removed, counted, logged).
    pub failed: u32,
    /// Calls that gave up; each kept its reading for a later round.
    pub gave_up: u32,
    /// Calls that ended unknown (kept too; never expected for keyed writes).
    pub unknown: u32,
    /// Rounds over the outbox.
    pub rounds: u32,
    /// Readings still in the outbox at the end.
    pub left: u32,
    /// Calls (runner verdicts) recorded by the ledger.
    pub calls: u32,
    /// Attempts over all calls.
    pub attempts: u64,
    /// Attempts per call, mean, in thousandths.
    pub mean_milli: u64,
    /// Attempts per call, 95th percentile.
    pub p95: u32,
    /// Attempts per call, most.
    pub max: u32,
}

impl Summary {
    /// True if every one of `readings` landed and none is left.
    pub const fn all_landed(&self, readings: u32) -> bool {
        self.landed == readings && self.failed == 0 && self.left == 0
    }

    /// Logs the `SUMMARY` line the host-side scenario checks.
    pub fn log(&self, readings: u32, refused: u32, noise: u32, lost_answers: u32) {
        defmt::info!(
            "SUMMARY readings={=u32} landed={=u32} failed={=u32} gave_up={=u32} unknown={=u32} left={=u32} rounds={=u32} refused={=u32} noise={=u32} lost_answers={=u32} calls={=u32} attempts={=u64} mean={=u64}.{=u64:03} p95={=u32} max={=u32}",
            readings,
            self.landed,
            self.failed,
            self.gave_up,
            self.unknown,
            self.left,
            self.rounds,
            refused,
            noise,
            lost_answers,
            self.calls,
            self.attempts,
            self.mean_milli / 1000,
            self.mean_milli % 1000,
            self.p95,
            self.max
        );
    }
}

/// Sends readings from `outbox` until `config.readings` have settled (landed or failed) or
/// `config.max_rounds` rounds have passed. Each reading is one keyed write through the wary
/// runner, sharing `fleet` with any other runner of the device.
pub async fn uplink<R: Read, W: Write, G: RngCore, const N: usize, const L: usize>(
    config: &Config,
    policy: &Policy,
    fleet: &FleetBudget,
    rng: G,
    modem: &mut Modem<R, W>,
    outbox: &Outbox<N>,
    ledger: &mut Ledger<L>,
) -> Summary {
    let mut summary = Summary::default();
    let mut runner = Runner::new(policy, Delay, EmbassyClock, rng).fleet(fleet).ledger(&mut *ledger);
    let rules = *policy.retry_after_rules();
    let modem = Mutex::<NoopRawMutex, _>::new(modem);
    let mut settled = 0u32;
    while settled < config.readings && summary.rounds < config.max_rounds {
        if outbox.is_empty() {
            outbox.wait().await;
            continue;
        }
        summary.rounds = summary.rounds.saturating_add(1);
        let mut kept = 0u32;
        for reading in outbox.snapshot() {
            let key = Key::from_parts(config.device, config.boot, u64::from(reading.seq));
            let payload = reading.payload();
            let (modem, payload, rules) = (&modem, &payload, &rules);
            let result = runner
                .call(Operation::KeyedWrite, key, |attempt| async move {
                    let hex = attempt.key.to_hex();
                    match modem.lock().await.post(PATH, &hex, payload.as_bytes(), rules).await {
                        Outcome::Ok => Ok(()),
                        other => Err(other),
                    }
                })
                .await;
            let verdict = match result {
                Ok(()) => Verdict::Ok,
                Err(stopped) => stopped.verdict,
            };
            match verdict {
                Verdict::Ok => {
                    outbox.remove(reading.seq);
                    summary.landed = summary.landed.saturating_add(1);
                    settled = settled.saturating_add(1);
                    defmt::info!("reading {=u32} landed", reading.seq);
                }
                Verdict::Failed | Verdict::Cancelled => {
                    outbox.remove(reading.seq);
                    summary.failed = summary.failed.saturating_add(1);
                    settled = settled.saturating_add(1);
                    defmt::error!("reading {=u32} failed ({}): removed", reading.seq, verdict);
                }
                Verdict::GaveUp(why) => {
                    summary.gave_up = summary.gave_up.saturating_add(1);
                    kept = kept.saturating_add(1);
                    defmt::warn!("reading {=u32} gave up ({}): kept for the next round", reading.seq, why);
                }
                Verdict::Unknown => {
                    summary.unknown = summary.unknown.saturating_add(1);
                    kept = kept.saturating_add(1);
                    defmt::warn!("reading {=u32} unknown: kept for the next round", reading.seq);
                }
            }
        }
        if kept > 0 {
            Timer::after(config.round_pause).await;
        }
    }
    let stats = runner.ledger_ref().stats();
    summary.calls = stats.calls();
    summary.attempts = stats.attempts();
    summary.mean_milli = stats.mean_milli();
    summary.p95 = stats.percentile(95);
    summary.max = stats.max();
    summary.left = u32::try_from(outbox.len()).unwrap_or(u32::MAX);
    summary
}
