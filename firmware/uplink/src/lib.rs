//! wary's device uplink, independent of the board: readings go from a sensor into a
//! fixed-capacity [`Outbox`], and [`uplink`] sends each one as a keyed write through the wary
//! runner over a [`Modem`] speaking the AT protocol of `wary-modem-proto` on any
//! `embedded-io-async` serial port.
//!
//! - **Keys**: `Key::from_parts(device, boot, sequence)`, made once per reading, sent on every
//!   attempt, in every round.
//! - **Keys**: the boot field is a per-boot nonce (or a persisted boot count): never the same
//!   in two boots, or a rebooted device's new readings would reuse old keys and be replayed.
//! - **Settling**: a reading leaves the outbox only when it landed (`ok`) or definitively
//!   `failed` (counted and logged). `gave_up`, `cancelled` (a cancel settles nothing) and
//!   `unknown` (which a keyed write should never produce) keep it for a later round.
//! - **Pacing**: rounds that kept readings are spaced by a jittered, doubling [`RoundBackoff`]
//!   (500 ms to 30 s, reset when a round lands something, one doubling longer while the fleet
//!   budget refuses retries); a server's Retry-After that a call could not wait out
//!   (`GiveUp::RetryAfterTooLong { asked }`) holds the whole outbox for `asked`.
//! - **Deadline**: [`POLICY`] bounds each call to 20 s; each answer timeout is capped to the
//!   time left.
//! - **A full outbox refuses the new reading and counts the refusal** ([`Outbox::offer`]); the
//!   sensor keeps its reading and offers it again, so nothing is dropped silently.
//! - **One attempt per AT command**: the modem never retries; the runner decides.
//! - Every attempt is logged with defmt by the ledger, as a `wary-ledger v1` line that
//!   `wary ledger from-defmt` turns into the host's replayable JSON lines.

#![no_std]
#![deny(missing_docs)]

pub mod http;

use core::cell::RefCell;
use core::fmt::Write as _;

use embassy_sync::blocking_mutex::Mutex as BlockingMutex;
use embassy_sync::blocking_mutex::raw::{CriticalSectionRawMutex, NoopRawMutex};
use embassy_sync::mutex::Mutex;
use embassy_sync::signal::Signal;
use embassy_time::{Delay, Duration, Instant, Timer, with_timeout};
use embedded_io_async::{Read, Write};
use heapless::Deque;
use rand_core::RngCore;
use wary::ledger::Ledger;
use wary::retry_after::Rules;
use wary::run::{EmbassyClock, Runner};
use wary::{FleetBudget, GiveUp, Key, Operation, Outcome, Policy, Preset, Verdict};
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
    link_errors: u32,
}

/// Most bytes [`Modem`] drops before a command (what is left of an earlier answer).
pub const DRAIN_MAX_BYTES: usize = 2 * MAX_LINE;
/// Longest [`Modem`] spends dropping them.
pub const DRAIN_MAX: Duration = Duration::from_millis(20);
/// Port errors or empty reads after which an exchange ends as a response timeout.
pub const MAX_LINK_ERRORS: u32 = 32;

impl<R: Read, W: Write> Modem<R, W> {
    /// A modem on `rx`/`tx`; an answer not complete within `timeout` is a response timeout.
    pub fn new(rx: R, tx: W, timeout: Duration) -> Self {
        Modem { rx, tx, lines: LineBuf::new(), timeout, noise: 0, lost_answers: 0, link_errors: 0 }
    }

    /// Lines skipped as noise (garbage, oversized, unsolicited).
    pub fn noise(&self) -> u32 {
        self.noise
    }

    /// Answers that never completed or could not be read.
    pub fn lost_answers(&self) -> u32 {
        self.lost_answers
    }

    /// Port errors and empty reads while waiting for answers.
    pub fn link_errors(&self) -> u32 {
        self.link_errors
    }

    /// Drops whatever is left of an earlier answer: at most [`DRAIN_MAX_BYTES`] bytes and
    /// [`DRAIN_MAX`] of time, so a port that never falls silent cannot hold the uplink.
    async fn drain(&mut self) {
        self.lines.clear();
        let rx = &mut self.rx;
        let drain = async {
            let mut buf = [0u8; 16];
            let mut bytes = 0usize;
            while bytes < DRAIN_MAX_BYTES {
                match with_timeout(Duration::from_millis(2), rx.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => bytes = bytes.saturating_add(n),
                    // Silent for 2 ms, at its end, or failing: nothing more to drop now.
                    _ => break,
                }
            }
        };
        let _ = with_timeout(DRAIN_MAX, drain).await;
    }

    async fn send(&mut self, parts: &[&[u8]]) -> bool {
        for part in parts {
            if self.tx.write_all(part).await.is_err() {
                return false;
            }
        }
        self.tx.flush().await.is_ok()
    }

    /// Reads classified lines until `step` returns a result, `timeout` passes or the port
    /// failed [`MAX_LINK_ERRORS`] times (errors or empty reads, each followed by a 1 ms pause, so
    /// a port that fails at once never spins without yielding; the time is also checked before
    /// every byte, for a port that never makes the read wait); `None` is a response timeout.
    async fn exchange<T>(
        &mut self,
        timeout: Duration,
        mut step: impl FnMut(Result<Line<'_>, LineError>) -> Option<T>,
    ) -> Option<T> {
        let Modem { rx, lines, link_errors, .. } = self;
        let deadline = Instant::now().saturating_add(timeout);
        let read = async {
            let mut byte = [0u8; 1];
            let mut errors = 0u32;
            loop {
                // A port that always has a byte ready never lets `with_timeout` run: check here.
                if Instant::now() >= deadline {
                    return None;
                }
                match rx.read(&mut byte).await {
                    Ok(1) => {}
                    // A UART error (framing, overrun) corrupts the line, which is then classified;
                    // an empty read returned at once. Either way: pause, count, and give up on a
                    // port that keeps failing.
                    Ok(_) | Err(_) => {
                        errors = errors.saturating_add(1);
                        *link_errors = link_errors.saturating_add(1);
                        if errors >= MAX_LINK_ERRORS {
                            return None;
                        }
                        Timer::after(Duration::from_millis(1)).await;
                        continue;
                    }
                }
                let got = match lines.push(byte[0]) {
                    Event::Pending => None,
                    Event::Line => step(parse_line(lines.line())),
                    Event::Overflow => step(Err(LineError::Overflow)),
                };
                if let Some(t) = got {
                    return Some(t);
                }
            }
        };
        with_timeout(timeout, read).await.ok().flatten()
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
            .exchange(self.timeout, |line| match line {
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
    /// The answer is awaited for the modem's timeout or `within`, whichever is shorter (the
    /// time left before the call's deadline, [`wary::run::Attempt::remaining`]).
    pub async fn post(
        &mut self,
        path: &str,
        key: &str,
        payload: &[u8],
        rules: &Rules,
        within: Option<Duration>,
    ) -> Outcome {
        let Ok(command) = post_command(path, key, payload.len()) else {
            // A command that cannot be formatted (too long a line) is our own bug: never sent,
            // and no resend can fix it, so it fails the call at once (`bad_body` is `failed`).
            defmt::error!("AT+HTTPPOST line too long for {=usize}-byte path: not sent", path.len());
            return Outcome::BadBody;
        };
        self.drain().await;
        if !self.send(&[command.as_bytes(), payload]).await {
            return Outcome::Refused;
        }
        let timeout = match within {
            Some(w) if w < self.timeout => w,
            _ => self.timeout,
        };
        let mut ex = PostExchange::new();
        let answer = self.exchange(timeout, |line| ex.feed(line)).await;
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
                defmt::warn!("modem answer incomplete after {=u64} ms", timeout.as_millis());
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
    /// The boot field of every key: a per-boot nonce (or a persisted boot count), never reused
    /// by a later boot, or the cloud replays old results for new readings.
    pub boot: u32,
    /// Readings to settle before [`uplink`] returns.
    pub readings: u32,
    /// The pause after the first round in a row that kept a reading ([`RoundBackoff`]).
    pub round_base: Duration,
    /// The longest pause between rounds.
    pub round_cap: Duration,
    /// Rounds after which the uplink stops even if readings remain (a safety stop).
    pub max_rounds: u32,
}

impl Config {
    /// `readings` readings from `device` in boot `boot`; between rounds that kept a reading a
    /// jittered pause doubling from 500 ms up to 30 s; a stop after 40 rounds.
    pub const fn new(device: u32, boot: u32, readings: u32) -> Self {
        Config {
            device,
            boot,
            readings,
            round_base: Duration::from_millis(500),
            round_cap: Duration::from_secs(30),
            max_rounds: 40,
        }
    }
}

/// The pause between outbox rounds that kept readings: equal jitter (half the ceiling plus a
/// uniform draw up to the other half) under a ceiling that doubles from `base` up to `cap`
/// with each such round in a row, and starts again at `base` once a round lands something.
/// While the fleet budget refuses retries the ceiling is one doubling higher (still capped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub struct RoundBackoff {
    base_ms: u64,
    cap_ms: u64,
    step: u32,
}

impl RoundBackoff {
    /// A backoff doubling from `base` up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        RoundBackoff { base_ms: base.as_millis(), cap_ms: cap.as_millis(), step: 0 }
    }

    /// The ceiling of the next pause, in ms.
    pub fn ceiling_ms(&self, throttled: bool) -> u64 {
        let step = self.step.saturating_add(u32::from(throttled)).min(63);
        self.base_ms.saturating_mul(1u64.checked_shl(step).unwrap_or(u64::MAX)).min(self.cap_ms)
    }

    /// The next pause from a uniform `draw`, and one doubling more for the pause after it.
    pub fn next(&mut self, draw: u64, throttled: bool) -> Duration {
        let ceiling = self.ceiling_ms(throttled);
        let half = ceiling / 2;
        let spread = ceiling.saturating_sub(half);
        let jitter = draw.checked_rem(spread.saturating_add(1)).unwrap_or(0);
        self.step = self.step.saturating_add(1);
        Duration::from_millis(half.saturating_add(jitter))
    }

    /// Back to `base`: a round landed something.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}

/// What a call's verdict does to its reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Settle {
    /// Landed: removed from the outbox.
    Landed,
    /// Definitively failed: removed, counted and logged.
    Failed,
    /// Not settled (gave up, unknown, cancelled): kept for a later round.
    Keep,
}

impl Settle {
    /// How `verdict` settles a reading. A cancelled call settled nothing: the reading stays.
    pub const fn of(verdict: &Verdict) -> Self {
        match verdict {
            Verdict::Ok => Settle::Landed,
            Verdict::Failed => Settle::Failed,
            Verdict::GaveUp(_) | Verdict::Unknown | Verdict::Cancelled => Settle::Keep,
        }
    }
}

/// The uplink's policy, in milliseconds: 100 ms base, 2 s cap, 8 s of waits per call, at most
/// six attempts, and a 20 s deadline per call counting attempt time (an attempt is cut to the
/// time left, and none starts with under 1 s left: a modem's HTTP request rarely answers
/// sooner on a cellular link). One definition for every board, so a device ledger replays
/// under one known policy.
pub static POLICY: Policy = match Policy::builder(Preset::Default)
    .base(100)
    .cap(2_000)
    .budget(8_000)
    .max_attempts(6)
    .deadline(20_000)
    .min_attempt(1_000)
    .build()
{
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
    /// The device id in the keys.
    pub device: u32,
    /// The boot field of the keys.
    pub boot: u32,
    /// Readings that landed.
    pub landed: u32,
    /// Readings that definitively failed (removed, counted, logged).
    pub failed: u32,
    /// Calls that gave up; each kept its reading for a later round.
    pub gave_up: u32,
    /// Calls that ended unknown (kept too; never expected for keyed writes).
    pub unknown: u32,
    /// Calls that were cancelled (kept: a cancel settles nothing).
    pub cancelled: u32,
    /// Times the outbox was held back for a server's Retry-After longer than a call could wait.
    pub held: u32,
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
            "SUMMARY device={=u32:08x} boot={=u32:08x} readings={=u32} landed={=u32} failed={=u32} gave_up={=u32} unknown={=u32} cancelled={=u32} held={=u32} left={=u32} rounds={=u32} refused={=u32} noise={=u32} lost_answers={=u32} calls={=u32} attempts={=u64} mean={=u64}.{=u64:03} p95={=u32} max={=u32}",
            self.device,
            self.boot,
            readings,
            self.landed,
            self.failed,
            self.gave_up,
            self.unknown,
            self.cancelled,
            self.held,
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
///
/// Between rounds that kept a reading the uplink pauses with [`RoundBackoff`] (jitter drawn
/// from `rng`); a call that gave up because the server's Retry-After (`asked`) was longer than
/// it could wait holds the whole outbox until `asked` has passed: the rest of that round is not
/// sent, and no round starts before. Each attempt's answer timeout is capped to the time left
/// before the call's deadline.
pub async fn uplink<R: Read, W: Write, G: RngCore, const N: usize, const L: usize>(
    config: &Config,
    policy: &Policy,
    fleet: &FleetBudget,
    mut rng: G,
    modem: &mut Modem<R, W>,
    outbox: &Outbox<N>,
    ledger: &mut Ledger<L>,
) -> Summary {
    let mut summary = Summary { device: config.device, boot: config.boot, ..Summary::default() };
    // The round pauses draw from their own stream, seeded from the device's generator.
    let mut pause_rng = SplitMix64::new(rng.next_u64());
    let mut pause = RoundBackoff::new(config.round_base, config.round_cap);
    let hz = u64::from(policy.tick_hz());
    let ticks_to_ms = |ticks: u64| {
        u64::try_from(u128::from(ticks).saturating_mul(1000).checked_div(u128::from(hz)).unwrap_or(0))
            .unwrap_or(u64::MAX)
    };
    let mut runner = Runner::new(policy, Delay, EmbassyClock, rng).fleet(fleet).ledger(&mut *ledger);
    let rules = *policy.retry_after_rules();
    let modem = Mutex::<NoopRawMutex, _>::new(modem);
    let mut settled = 0u32;
    // No send before this: a server's Retry-After that a call could not wait out.
    let mut hold_until: Option<Instant> = None;
    while settled < config.readings && summary.rounds < config.max_rounds {
        if outbox.is_empty() {
            outbox.wait().await;
            continue;
        }
        if let Some(until) = hold_until.take().filter(|until| Instant::now() < *until) {
            defmt::info!("outbox held for the server's Retry-After until {=u64} ms", until.as_millis());
            Timer::at(until).await;
        }
        summary.rounds = summary.rounds.saturating_add(1);
        let mut kept = 0u32;
        let mut landed = 0u32;
        for reading in outbox.snapshot() {
            let key = Key::from_parts(config.device, config.boot, u64::from(reading.seq));
            let payload = reading.payload();
            let (modem, payload, rules) = (&modem, &payload, &rules);
            let result = runner
                .call(Operation::KeyedWrite, key, |attempt| async move {
                    let hex = attempt.key.to_hex();
                    let within = attempt.remaining.map(|t| Duration::from_millis(ticks_to_ms(t)));
                    match modem.lock().await.post(PATH, &hex, payload.as_bytes(), rules, within).await {
                        Outcome::Ok => Ok(()),
                        other => Err(other),
                    }
                })
                .await;
            let verdict = match result {
                Ok(()) => Verdict::Ok,
                Err(stopped) => stopped.verdict,
            };
            match Settle::of(&verdict) {
                Settle::Landed => {
                    outbox.remove(reading.seq);
                    summary.landed = summary.landed.saturating_add(1);
                    settled = settled.saturating_add(1);
                    landed = landed.saturating_add(1);
                    defmt::info!("reading {=u32} landed", reading.seq);
                }
                Settle::Failed => {
                    outbox.remove(reading.seq);
                    summary.failed = summary.failed.saturating_add(1);
                    settled = settled.saturating_add(1);
                    defmt::error!("reading {=u32} failed ({}): removed", reading.seq, verdict);
                }
                Settle::Keep => {
                    kept = kept.saturating_add(1);
                    match verdict {
                        Verdict::GaveUp(_) => summary.gave_up = summary.gave_up.saturating_add(1),
                        Verdict::Cancelled => summary.cancelled = summary.cancelled.saturating_add(1),
                        _ => summary.unknown = summary.unknown.saturating_add(1),
                    }
                    defmt::warn!("reading {=u32} {}: kept for a later round", reading.seq, verdict);
                }
            }
            if let Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }) = verdict {
                let until = Instant::now().saturating_add(Duration::from_millis(ticks_to_ms(asked)));
                hold_until = Some(hold_until.map_or(until, |h| h.max(until)));
                summary.held = summary.held.saturating_add(1);
                // The server asked the device to stay away: the rest of this round waits too.
                break;
            }
        }
        if landed > 0 {
            pause.reset();
        }
        if kept > 0 {
            let throttled = !fleet.allows_retry();
            let wait = pause.next(pause_rng.next_u64(), throttled);
            defmt::info!(
                "round {=u32} kept {=u32}: next round in {=u64} ms{=str}",
                summary.rounds,
                kept,
                wait.as_millis(),
                if throttled { " (fleet budget refuses retries)" } else { "" }
            );
            Timer::after(wait).await;
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
