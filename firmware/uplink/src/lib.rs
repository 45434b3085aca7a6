//! wary's device uplink, independent of the board: readings wait in a durable outbox on flash
//! ([`store`]), and [`uplink`] sends each one as a keyed HTTP/1.1 `POST` through the wary runner
//! over any [`Transport`] — in practice [`HttpTransport`] on an `embassy-net` stack, whatever
//! link the stack runs on (Ethernet, PPP over a cellular modem).
//!
//! - **Keys**: `Key::from_parts(device, boot, sequence)`: the device's whole 64-bit id, then
//!   the reading's id on flash (boot count and sequence), made once, when the reading was
//!   pushed, and sent on every attempt, in every round and after every reset. The boot counter
//!   is on flash and goes up before the first send of a boot, and a boot whose sequence numbers
//!   run out starts a new one, so no two readings ever share a key.
//! - **Settling** (the core's [`wary::drain`], whose rules are in docs/semantics.md, *Whose
//!   fault*): a reading leaves the queue when it landed (`ok`), or goes to the outbox's dead
//!   letters on flash when the server refused it as it is (`failed`, the reading's fault: a
//!   400, a 422), counted and logged, never deleted. A refusal that is the endpoint's fault (a
//!   401, a 403, a 404, a TLS refusal) keeps the reading and holds the whole outbox, one probe
//!   at a time on a slow backoff of its own (about a minute doubling to an hour). `gave_up`,
//!   `cancelled` and `unknown` keep it for a later round, and a reset keeps it too.
//! - **Pacing**: rounds that kept readings are spaced by a jittered, doubling pause (500 ms to
//!   30 s, reset when a round lands something, one doubling longer while the fleet budget
//!   refuses retries); a server's asked wait (Retry-After, Max-Age) that a call did not wait
//!   out holds the whole outbox until then, as an open breaker does for its open time; no hold
//!   lasts more than an hour.
//! - **Across resets** ([`health`]): a kept round remembers on flash how far its pause had
//!   gone, and an endpoint hold how many probes were refused, so the first round after a reset
//!   waits the next step's pause (never zero) and a hold goes on where it was; boots that end
//!   unhealthy in a row make the next boot wait before its first network attempt
//!   ([`health::BootWait`]).
//! - **Deadline**: [`POLICY`] bounds each call to 20 s; each attempt's exchange is limited to
//!   the time left before it, and to [`Config::attempt_limit`].
//! - **A full outbox refuses the new reading and counts the refusal**; the sensor keeps its
//!   reading and offers it again, so nothing is dropped silently. With
//!   [`WhenFull::ShedOldest`] it moves its oldest readings to the dead letters instead.
//! - **Dead letters are reported** on every HTTP exchange while there are any
//!   ([`http::DEAD_LETTERS`]: `Wary-Dead-Letters: held=<n>, dropped=<n>`).
//! - **One request per attempt**: the transport never retries; the runner decides.
//! - **HTTPS** (feature `tls`): [`tls::TlsTransport`] is the same exchange over TLS 1.3, the
//!   server authenticated by a CA pinned in the firmware, one session kept across attempts and
//!   readings as the plain transport keeps its connection: both are [`transport::Http`], on
//!   the socket alone or on a TLS session ([`transport::Carrier`]).
//! - **CoAP** (feature `coap`): [`coap::CoapTransport`] sends each reading as a confirmable
//!   `POST` over UDP, one transmission per attempt under [`coap::POLICY`] (RFC 7252's timing).
//! - Every attempt is logged with defmt by the core's ledger, as a device line tagged
//!   [`wary::ledger::DEVICE_TAG`] (`wary-ledger v4`) that `wary ledger from-defmt` turns into the
//!   host's replayable JSON lines.

#![no_std]
#![deny(missing_docs)]

#[cfg(feature = "coap")]
pub mod coap;
pub mod health;
pub mod http;
pub mod identity;
#[cfg(feature = "mqtt")]
pub mod mqtt;
pub mod store;
#[cfg(feature = "tls")]
pub mod tls;
pub mod transport;

use core::cell::Cell;

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embassy_sync::mutex::Mutex;
use embassy_time::{Instant, Timer};
use embedded_hal_async::delay::DelayNs;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use rand_core::RngCore;
use wary::drain::{Hold, pace_wait};
use wary::{
    Breaker, BreakerSettings, Drain, DrainSettings, Draw, Duration, EmbassyClock, Failure, Fate, FleetBudget,
    GiveUp, Guards, Key, Operation, Pace, PaceSettings, Policy, Preset, Runner, Verdict, ledger::Ledger,
};
use wary_outbox::{BackoffMark, HoldMark, RecordId, Settlement};

pub use identity::{Credential, parse_device_id};

use crate::transport::Message;

pub use store::{Reading, Store, WhenFull, offer, payload, sense};
pub use transport::{Answer, HttpTransport, Reply, Transport};

/// The path readings are posted to.
pub const PATH: &str = "/readings";
/// The path batches of readings are posted to (docs/batches.md).
pub const BATCH_PATH: &str = "/readings/batch";

/// The most readings the uplink gathers for one exchange (a transport may take fewer).
const GATHER: usize = transport::MAX_BATCH;

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

/// What the uplink is to do.
#[derive(Debug, Clone, Copy, defmt::Format)]
pub struct Config {
    /// The device id in every key: the whole 64-bit identity, the first 16 hex digits of each
    /// key.
    pub device: u64,
    /// The longest one attempt's exchange may take (connect, send, reply); the time left
    /// before the call's deadline shortens it further.
    pub attempt_limit: Duration,
    /// The drain's rules between calls: the pause between rounds that kept a reading, the
    /// endpoint hold's probe backoff, the cap on every hold ([`DrainSettings`]). Settings
    /// [`Drain::new`] refuses are replaced by [`DrainSettings::DEVICE`], with an error logged.
    pub drain: DrainSettings,
    /// Rounds after which the uplink stops even if readings remain (a safety stop for tests;
    /// `u32::MAX` on a device that runs for ever).
    pub max_rounds: u32,
    /// The base of the wait before a boot's first network attempt after unhealthy boots
    /// ([`health::BootWait`]).
    pub boot_base: Duration,
    /// The longest such wait.
    pub boot_cap: Duration,
    /// Uptime after which a landed reading marks the boot healthy.
    pub healthy_after: Duration,
    /// Pace every attempt with [`PaceSettings::DEVICE`] and break the circuit with
    /// [`BreakerSettings::DEVICE`] (docs/pacing.md). On by default: a fleet back from an outage
    /// must not come back as a herd. The device settings are set for that herd, so a device
    /// alone under a cloud that fails a share of every request at random (one answer in eight a
    /// 503) cannot tell that from load and sends at the herd's pace, about 0.1 requests/s, once
    /// throttled (docs/pacing.md, *A device alone under a flaky cloud*). Turn it off only where
    /// the cloud is known never to throttle for load.
    pub pacing: bool,
}

impl Config {
    /// Readings from `device`: 5 s per exchange at most; between rounds that kept a reading a
    /// jittered pause doubling from 500 ms up to 30 s, and after an endpoint's refusal a probe
    /// from about a minute doubling to an hour ([`DrainSettings::DEVICE`]); a stop after 60
    /// rounds; after unhealthy
    /// boots a first wait from 10 s doubling up to 15 minutes; healthy after 60 s up and a
    /// landed reading; paced, with a circuit breaker.
    pub const fn new(device: u64) -> Self {
        Config {
            device,
            attempt_limit: Duration::from_secs(5),
            drain: DrainSettings::DEVICE,
            max_rounds: 60,
            boot_base: Duration::from_secs(10),
            boot_cap: Duration::from_secs(15 * 60),
            healthy_after: Duration::from_secs(60),
            pacing: true,
        }
    }
}

/// The uplink's policy: 100 ms base, 2 s cap, 8 s of waits per call, at most six attempts, and
/// a 20 s deadline per call counting attempt time (an attempt is cut to the time left, and none
/// starts with under 1 s left: a request over a cellular link rarely answers sooner). One
/// definition for every board, so a device ledger replays under one known policy.
pub static POLICY: Policy = match Policy::builder(Preset::Default)
    .base(Duration::from_millis(100))
    .cap(Duration::from_secs(2))
    .budget(Duration::from_secs(8))
    .max_attempts(6)
    .deadline(Duration::from_secs(20))
    .min_attempt(Duration::from_secs(1))
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

/// What happened in one run of [`uplink`], for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, defmt::Format)]
pub struct Summary {
    /// The device id in the keys.
    pub device: u64,
    /// This boot's number (the boot field of the keys of readings made in it).
    pub boot: u32,
    /// Readings that landed (in this boot; some may have been made in an earlier one).
    pub landed: u32,
    /// Readings the server refused as they are, moved to the dead letters on flash (counted,
    /// logged, never sent again, never deleted).
    pub dead_lettered: u32,
    /// Calls that gave up; each kept its reading for a later round.
    pub gave_up: u32,
    /// Calls that ended unknown (kept too; never expected for keyed writes).
    pub unknown: u32,
    /// Calls that were cancelled (kept: a cancel settles nothing).
    pub cancelled: u32,
    /// Holds of the whole outbox started or continued: an endpoint's refusal (each refused
    /// probe counts), a server's asked wait, an open breaker.
    pub held: u32,
    /// Dead letters on flash at the end (this boot's and earlier ones'), and dropped over the
    /// device's life to make room.
    pub dead_letters: u32,
    /// Dead letters dropped to make room, over the device's life.
    pub dead_dropped: u32,
    /// Rounds over the outbox.
    pub rounds: u32,
    /// Readings still in the outbox at the end.
    pub left: u32,
    /// Flash operations of the uplink (walking or settling) that failed; the reading stays.
    pub flash_errors: u32,
    /// Replies with a `Retry-After` value that could not be read at all under the policy's
    /// rules (neither a number nor an HTTP-date): the backoff alone decided their wait.
    pub retry_after_unreadable: u32,
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
    /// True if nothing is left and nothing went to the dead letters.
    pub const fn all_landed(&self) -> bool {
        self.dead_lettered == 0 && self.left == 0
    }

    /// True if nothing is left in the queue: every reading landed or is a dead letter.
    pub const fn all_settled(&self) -> bool {
        self.left == 0
    }

    /// Logs the `SUMMARY` line the host-side scenario checks, with the outbox's counters.
    pub fn log(&self, outbox: &wary_outbox::Counters, net: &transport::Counts) {
        defmt::info!(
            "SUMMARY device={=u64:016x} boot={=u32} landed={=u32} dead_lettered={=u32} gave_up={=u32} unknown={=u32} cancelled={=u32} held={=u32} left={=u32} dead_letters={=u32} dead_dropped={=u32} rounds={=u32} accepted={=u32} refused={=u32} flash_errors={=u32} regions_reset={=u32} exchanges={=u32} maybe_landed={=u32} never_sent={=u32} calls={=u32} attempts={=u64} mean={=u64}.{=u64:03} p95={=u32} max={=u32}",
            self.device,
            self.boot,
            self.landed,
            self.dead_lettered,
            self.gave_up,
            self.unknown,
            self.cancelled,
            self.held,
            self.left,
            self.dead_letters,
            self.dead_dropped,
            self.rounds,
            outbox.accepted,
            outbox.refused,
            outbox.flash_errors.saturating_add(self.flash_errors),
            outbox.regions_reset,
            net.exchanges,
            net.maybe_landed,
            net.never_sent,
            self.calls,
            self.attempts,
            self.mean_milli / 1000,
            self.mean_milli % 1000,
            self.p95,
            self.max
        );
    }
}

/// Sends the readings in `store` until nothing is pending and the sensor has finished, or
/// `config.max_rounds` rounds have passed. Each reading is one keyed write through the wary
/// runner (waits on `delay`, draws from `rng`), sharing `fleet` with any other runner of the
/// device, one [`Transport::send`] of one message per attempt, after [`Transport::open`]
/// (when the transport takes batches, the first attempts of up to
/// [`Transport::batch_limit`] due readings share one `send`, each reading's call starting from
/// its own answer: docs/batches.md); the
/// transport is closed at the end of every round that kept a reading (a pause follows), and
/// otherwise keeps its connection for the next reading. Replies are classified here, under the
/// policy's Retry-After rules: the one place a device reads them.
///
/// What each verdict does to its reading, and when the next round may start, is the core's
/// [`Drain`] under `config.drain`: a landed reading leaves the queue, one refused as it is
/// goes to the dead letters, and every other outcome keeps it. An endpoint's refusal, a
/// server's asked wait the call did not wait out, or an open breaker holds the whole outbox:
/// the rest of that round is not sent, and no round starts before the hold ends. A hold and the
/// round pause are kept on flash, so a reset resumes them. Each attempt's exchange is capped to
/// the time left before the call's deadline.
#[allow(clippy::too_many_arguments)]
pub async fn uplink<F, T, D, G, const L: usize>(
    config: &Config,
    policy: &Policy,
    fleet: &FleetBudget,
    delay: D,
    mut rng: G,
    transport: &mut T,
    store: &Store<F>,
    ledger: &mut Ledger<L>,
) -> Summary
where
    F: MultiwriteNorFlash,
    T: Transport,
    D: DelayNs,
    G: RngCore,
{
    let boot = store.boot().await;
    let mut summary = Summary { device: config.device, boot, ..Summary::default() };
    // The round pauses and the holds draw from their own stream, seeded from the device's generator.
    let mut pause_rng = SplitMix64::new(rng.next_u64());
    let mut drain = match Drain::<RecordId>::new(config.drain) {
        Ok(drain) => drain,
        Err(e) => {
            defmt::error!("the drain's settings are refused ({}): the device's are used", e);
            match Drain::new(DrainSettings::DEVICE) {
                Ok(drain) => drain,
                // The device's settings are checked by the core's tests; were they refused,
                // nothing is sent rather than sent under no rules.
                Err(_) => return summary,
            }
        }
    };
    // The cloud's send rate and circuit breaker, when `config.pacing` asks (docs/pacing.md):
    // every attempt, first ones included, waits for the pace; an open breaker ends a call at
    // once and the outbox keeps its reading for a later round.
    let mut pace = Pace::new(PaceSettings::DEVICE).ok().filter(|_| config.pacing);
    let mut breaker = Breaker::new(BreakerSettings::DEVICE).ok().filter(|_| config.pacing);
    let mut runner = Runner::new(policy, delay, EmbassyClock, rng)
        .fleet(fleet)
        .ledger(&mut *ledger)
        .endpoint(Guards { pace: pace.as_mut(), breaker: breaker.as_mut() });
    let transport = Mutex::<NoopRawMutex, _>::new(transport);
    let attempt_limit = config.attempt_limit;
    // The one source of the Retry-After rules and of whose fault a refusal is: the policy's.
    let rules = policy.retry_after_rules();
    let table = policy.table();
    let unreadable = Cell::new(0u32);
    // A reset does not start the pause over, nor end a hold: while the reading it was kept for
    // is pending, the first round waits the pause after the last one taken, and an endpoint
    // that refused goes on being probed on its backoff.
    let mark = store.backoff().await;
    let refused = store.hold().await.filter(|h| h.step > 0);
    if mark.is_some() || refused.is_some() {
        let pauses = mark.map(|m| u32::from(m.step));
        let refusals = refused.map(|h| (u32::from(h.step), h.reason));
        let wait = drain.resume(Instant::now().into(), pauses, refusals, Draw::from_rng(&mut pause_rng));
        if let Some(mark) = mark {
            defmt::info!(
                "RESUME backoff of reading {} after {=u8} kept rounds: first round in {=u32} ms",
                mark.id,
                mark.step,
                wait.as_millis()
            );
        }
        if let Some(h) = refused {
            defmt::warn!(
                "RESUME hold: the endpoint refused {=u8} probes in a row (the last {=u16}); readings kept",
                h.step,
                h.reason
            );
        }
        Timer::after(wait.into()).await;
    }
    let mut healthy = false;
    while summary.rounds < config.max_rounds {
        if store.is_empty().await {
            if store.sensing_done() {
                break;
            }
            store.wait().await;
            continue;
        }
        if let Some((hold, until)) = drain.held(Instant::now().into()) {
            let until = Instant::from_millis(until.as_millis());
            match hold {
                Hold::Asked { asked } => defmt::info!(
                    "outbox held for the server's asked wait ({=u32} ms) until {=u64} ms",
                    asked.as_millis(),
                    until.as_millis()
                ),
                Hold::Breaker => {
                    defmt::info!("outbox held while the breaker is open, until {=u64} ms", until.as_millis())
                }
                Hold::Endpoint { reason, probes } => defmt::info!(
                    "outbox held: the endpoint refused {=u32} probes in a row (the last {=u16}); next probe at {=u64} ms",
                    probes,
                    reason,
                    until.as_millis()
                ),
            }
            Timer::at(until).await;
        }
        summary.rounds = summary.rounds.saturating_add(1);
        drain.start_round();
        // A full outbox may have shed readings to the dead letters since the last round.
        let (held, dropped) = store.dead_letters().await;
        transport.lock().await.report_dead_letters(held, dropped);
        let mut kept = 0u32;
        let mut after = None;
        let mut read_failed = false;
        'round: loop {
            // The readings due now, in outbox order: up to the transport's batch at once.
            let mut due: heapless::Vec<(RecordId, heapless::String<32>, heapless::String<64>), GATHER> =
                heapless::Vec::new();
            let most = transport.lock().await.batch_limit().clamp(1, GATHER);
            while due.len() < most {
                let record = match store.next_after(after).await {
                    Ok(Some(record)) => record,
                    Ok(None) => break,
                    Err(e) => {
                        // Counted by the outbox; the round ends and the next one reads again.
                        defmt::error!("reading the outbox failed: {}", e);
                        read_failed = true;
                        break;
                    }
                };
                after = Some(record.id);
                let hex = Key::from_parts(config.device, record.id.boot, record.id.seq).to_hex();
                let _ = due.push((record.id, hex, payload(&record)));
            }
            if due.is_empty() {
                break;
            }
            // Several due: their first attempts go out as one batch exchange, each answered by
            // its place; every reading's call then starts from its own answer (docs/batches.md).
            // The batch's answers, one per gathered reading, each taken by its reading's call
            // (one array: an answer is a few hundred bytes).
            let mut answers: [Answer; GATHER] = core::array::from_fn(|_| Err(Failure::Reset));
            let batched = due.len() > 1;
            if batched {
                let messages: heapless::Vec<Message<'_>, GATHER> = due
                    .iter()
                    .map(|(_, key, body)| Message { key: key.as_str(), body: body.as_bytes() })
                    .collect();
                let n = messages.len();
                let mut t = transport.lock().await;
                match t.open(attempt_limit).await {
                    Ok(()) => t.send(&messages, answers.get_mut(..n).unwrap_or(&mut []), attempt_limit).await,
                    Err(failure) => answers.iter_mut().for_each(|a| *a = Err(failure)),
                }
            }
            for ((id, _, body), slot) in due.iter().zip(answers.iter_mut()) {
                let first = batched.then(|| core::mem::replace(slot, Err(Failure::Reset)));
                let key = Key::from_parts(config.device, id.boot, id.seq);
                let record_id = *id;
                // The drain honours the pace: the wait for the next token is spent here, between
                // calls, not out of the call's wait budget (the call takes the token). Asked
                // again after each wait: a wait given early is a lower bound while the rate climbs.
                while let Some(wait) = pace_wait(runner.endpoint_ref().pace.as_deref(), Instant::now().into())
                {
                    Timer::after(wait.into()).await;
                }
                let first = Cell::new(first);
                let (transport, body, unreadable, first) = (&transport, body, &unreadable, &first);
                let result = runner
                    .call(Operation::KeyedWrite, key, |attempt| async move {
                        // The batch's answer is this reading's first attempt.
                        let answer = match first.take() {
                            Some(answer) => answer,
                            None => {
                                let hex = attempt.key.to_hex();
                                let limit =
                                    attempt.remaining.map_or(attempt_limit, |left| left.min(attempt_limit));
                                let mut transport = transport.lock().await;
                                // `open` and `send` share the attempt's limit (see `Transport::open`).
                                transport.open(limit).await?;
                                // Filled by the transport; should one not, the message may have landed.
                                let mut answers = [Err(Failure::Reset)];
                                let message = Message { key: &hex, body: body.as_bytes() };
                                transport.send(&[message], &mut answers, limit).await;
                                let [answer] = answers;
                                answer
                            }
                        };
                        let (outcome, reading) = transport::outcome(&answer, rules);
                        if reading.unreadable > 0 {
                            unreadable.set(unreadable.get().saturating_add(1));
                        }
                        outcome.into_result()
                    })
                    .await;
                let (verdict, last) = match result {
                    Ok(()) => (Verdict::Ok, None),
                    Err(stopped) => (stopped.verdict, stopped.last),
                };
                let now: wary::Instant = Instant::now().into();
                let breaker_wait = match verdict {
                    Verdict::GaveUp(GiveUp::CircuitOpen) => {
                        runner.endpoint_ref().breaker.as_deref().map_or(Duration::ZERO, |b| b.wait(now))
                    }
                    _ => Duration::ZERO,
                };
                let settled = drain.settle(
                    record_id,
                    &verdict,
                    last.as_ref(),
                    table,
                    now,
                    breaker_wait,
                    Draw::from_rng(&mut pause_rng),
                );
                match settled.fate {
                    Fate::Landed => {
                        if let Err(e) = store.settle(record_id, Settlement::Landed).await {
                            // The reading stays pending and goes out again with the same key: the
                            // cloud answers the resend from its record, without a second effect.
                            summary.flash_errors = summary.flash_errors.saturating_add(1);
                            defmt::error!("settling reading {} failed ({}): it stays pending", record_id, e);
                        }
                        summary.landed = summary.landed.saturating_add(1);
                        defmt::info!("LANDED boot={=u32:08x} seq={=u32}", record_id.boot, record_id.seq);
                        if !healthy
                            && Instant::now().as_millis() >= u64::from(config.healthy_after.as_millis())
                        {
                            match store.mark_healthy().await {
                                Ok(_) => {
                                    healthy = true;
                                    defmt::info!("HEALTHY: boot {=u32} marked healthy", boot);
                                }
                                Err(e) => defmt::error!("marking the boot healthy failed: {}", e),
                            }
                        }
                    }
                    Fate::DeadLetter { reason } => match store.dead_letter(record_id, reason).await {
                        Ok(_) => {
                            summary.dead_lettered = summary.dead_lettered.saturating_add(1);
                            // Reported on every exchange from the next one on, while there are any.
                            let (held, dropped) = store.dead_letters().await;
                            transport.lock().await.report_dead_letters(held, dropped);
                            defmt::error!(
                                "DEAD_LETTER boot={=u32:08x} seq={=u32} reason={=u16}: refused as it is ({}); kept on flash, not sent again",
                                record_id.boot,
                                record_id.seq,
                                reason,
                                verdict
                            );
                        }
                        Err(e) => {
                            // Still pending: the next round sends it again with the same key.
                            summary.flash_errors = summary.flash_errors.saturating_add(1);
                            kept = kept.saturating_add(1);
                            defmt::error!(
                                "dead-lettering reading {} failed ({}): it stays pending",
                                record_id,
                                e
                            );
                        }
                    },
                    Fate::Keep => {
                        kept = kept.saturating_add(1);
                        match verdict {
                            Verdict::GaveUp(_) => summary.gave_up = summary.gave_up.saturating_add(1),
                            Verdict::Cancelled => summary.cancelled = summary.cancelled.saturating_add(1),
                            Verdict::Failed => {}
                            _ => summary.unknown = summary.unknown.saturating_add(1),
                        }
                        defmt::warn!("reading {} {}: kept for a later round", record_id, verdict);
                    }
                }
                if let Some((hold, until)) = settled.hold {
                    summary.held = summary.held.saturating_add(1);
                    if let Hold::Endpoint { reason, probes } = hold {
                        // One line a refused probe: probes are a minute to an hour apart.
                        defmt::error!(
                            "HELD reason={=u16} probes={=u32}: the endpoint refused the device, not the reading; every reading kept, next probe at {=u64} ms",
                            reason,
                            probes,
                            until.as_millis()
                        );
                    }
                }
                if settled.end_round {
                    // Every other reading of the round would meet the same: the round ends.
                    break 'round;
                }
            }
            if read_failed {
                break;
            }
        }
        // A round that kept a reading pauses, perhaps for long: the connection ends with it. A
        // round that emptied the outbox keeps it for the next reading (the transport ends it
        // when it idles past its limit).
        if kept > 0 || read_failed {
            transport.lock().await.close().await;
        }
        let throttled = !fleet.allows_retry();
        let end = drain.end_round(throttled, Draw::from_rng(&mut pause_rng));
        // A flash read that failed kept nothing the drain saw: the next round still waits.
        let pause = if read_failed { end.pause.max(config.drain.round_base) } else { end.pause };
        if pause > Duration::ZERO {
            defmt::info!(
                "round {=u32} kept {=u32}: next round in {=u32} ms{=str}",
                summary.rounds,
                kept,
                pause.as_millis(),
                if throttled { " (fleet budget refuses retries)" } else { "" }
            );
        }
        let mark = end.kept.map(|(id, step)| BackoffMark { id, step: u8::try_from(step).unwrap_or(u8::MAX) });
        let hold = drain
            .refusals()
            .map(|(probes, reason)| HoldMark { step: u8::try_from(probes).unwrap_or(u8::MAX), reason });
        // On flash before the pause: a reset during it resumes from here.
        if let Err(e) = store.set_backoff(mark).await {
            defmt::error!("remembering the backoff failed: {}", e);
        }
        if let Err(e) = store.set_hold(hold).await {
            defmt::error!("remembering the hold failed: {}", e);
        }
        if pause > Duration::ZERO {
            Timer::after(pause.into()).await;
        }
    }
    let stats = runner.ledger_ref().stats();
    summary.calls = stats.calls();
    summary.attempts = stats.attempts();
    summary.mean_milli = stats.mean_milli();
    summary.p95 = stats.percentile(95);
    summary.max = stats.max();
    summary.left = store.len().await;
    (summary.dead_letters, summary.dead_dropped) = store.dead_letters().await;
    summary.retry_after_unreadable = unreadable.get();
    summary
}
