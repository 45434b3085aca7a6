//! A fleet that comes back after an outage: thousands of devices, each holding a backlog of
//! readings, drain it into a cloud of fixed capacity that has just come back.
//!
//! The cloud serves `capacity` requests in each second of its clock and answers every request
//! above that with a 503 at once (a load shedder). For the first `outage` it serves nothing: it
//! answers every request with a 503 without Retry-After, or refuses every connection. After it,
//! an overloaded 503 carries no Retry-After, or (`spread`) a Retry-After drawn uniformly from 1
//! to the whole seconds the backlog still needs at full capacity, so the asks spread the backlog
//! over the time it takes. Every reading exists at time 0; its delay is the time it lands.
//!
//! Each device drains its outbox as the uplink firmware does: a round sends each pending
//! reading as one call under the uplink's policy (`wary::Policy::decide_with_fleet`, with the
//! device's own `wary::FleetBudget`); readings whose call gave up wait for the next round, after
//! a pause that doubles from 500 ms to 30 s (equal jitter, one doubling more while the fleet
//! budget refuses retries) and starts again once a round lands something. The rows differ in
//! what gates each attempt: nothing, `wary::Pace`, `wary::Pace` and `wary::Breaker`, or smithy's
//! client rate limiter (written here from its published constants, in floating point, as the
//! reference). Two rows show the classic retry loop without the outbox: retry each reading until
//! it lands, with no jitter and with full jitter. Every decision is the core's own.
//!
//! A pace and a breaker are asked as the uplink asks them: the drain waits for the pace between
//! calls (asked on a copy), each call's attempts go through `wary::Attempts` (its first when the
//! call starts, a retry for the instant its backoff ends, the pace's wait charged to the call),
//! and each answer is told to both through `Attempts::report`. A call that meets an open breaker
//! ends the round; that round, like one ended by a Retry-After too long for a call, takes its
//! pause and holds the outbox until the breaker may let a probe through (or the asked wait is
//! over), whichever is later, as the uplink's loop does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use wary::{
    Attempts, Backoff, Breaker, BreakerSettings, Decision, Draw, Duration, Failure, FleetBudget, Gate,
    GiveUp, Guards, Instant, Jitter, Key, Operation, Outcome, Pace, PaceSettings, Policy, Preset, Signal,
    Verdict,
};

/// The world of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    /// Devices.
    pub devices: u32,
    /// Readings each device holds at time 0.
    pub backlog: u32,
    /// Requests the cloud serves per second.
    pub capacity: u32,
    /// How long the cloud serves nothing, in ms.
    pub outage_ms: u64,
    /// How the cloud answers during the outage.
    pub outage: OutageMode,
    /// Whether an overloaded 503 carries a spreading Retry-After.
    pub spread: bool,
    /// Mean round trip, ms.
    pub rtt_ms: u64,
    /// The round trip varies uniformly by this much either way, ms.
    pub rtt_spread_ms: u64,
    /// The run stops here even if readings are left, ms.
    pub horizon_ms: u64,
    /// The seed of the run's generator.
    pub seed: u64,
}

/// How the cloud answers during the outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageMode {
    /// A 503 without Retry-After to every request.
    Unavailable,
    /// Every connection refused.
    Refused,
}

impl OutageMode {
    /// The label in tables.
    pub const fn label(self) -> &'static str {
        match self {
            OutageMode::Unavailable => "503",
            OutageMode::Refused => "refused",
        }
    }
}

impl World {
    /// 10 000 devices with 20 readings each, a cloud of 500 requests/s after a 60 s outage, a
    /// 100 ± 20 ms round trip.
    pub const fn standard(outage: OutageMode, spread: bool, seed: u64) -> World {
        World {
            devices: 10_000,
            backlog: 20,
            capacity: 500,
            outage_ms: 60_000,
            outage,
            spread,
            rtt_ms: 100,
            rtt_spread_ms: 20,
            horizon_ms: 3_600_000,
            seed,
        }
    }

    /// All readings.
    pub const fn readings(&self) -> u64 {
        self.devices as u64 * self.backlog as u64
    }

    /// The ideal drain time after the outage: backlog ÷ capacity, ms.
    pub fn ideal_ms(&self) -> u64 {
        self.readings() * 1000 / u64::from(self.capacity.max(1))
    }
}

/// What gates each attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// Retry each reading until it lands, exponential backoff without jitter.
    NoJitter,
    /// The same with full jitter.
    FullJitter,
    /// The uplink as it ships: its policy, fleet budget and outbox rounds.
    WaryToday,
    /// The same, every attempt paced by `wary::Pace`.
    WaryPace,
    /// The same, and a `wary::Breaker` in front.
    WaryPaceBreaker,
    /// The uplink with smithy's client rate limiter instead of the pace.
    Smithy,
}

impl Row {
    /// Every row, in table order.
    pub const ALL: [Row; 6] =
        [Row::NoJitter, Row::FullJitter, Row::WaryToday, Row::WaryPace, Row::WaryPaceBreaker, Row::Smithy];

    /// The label in tables.
    pub const fn label(self) -> &'static str {
        match self {
            Row::NoJitter => "no jitter (retry until landed)",
            Row::FullJitter => "full jitter (retry until landed)",
            Row::WaryToday => "wary today (uplink)",
            Row::WaryPace => "wary + pace",
            Row::WaryPaceBreaker => "wary + pace + breaker",
            Row::Smithy => "uplink + smithy adaptive limiter",
        }
    }

    /// The key in results.json.
    pub const fn key(self) -> &'static str {
        match self {
            Row::NoJitter => "no_jitter",
            Row::FullJitter => "full_jitter",
            Row::WaryToday => "wary_today",
            Row::WaryPace => "wary_pace",
            Row::WaryPaceBreaker => "wary_pace_breaker",
            Row::Smithy => "smithy_adaptive",
        }
    }

    const fn outbox(self) -> bool {
        !matches!(self, Row::NoJitter | Row::FullJitter)
    }
}

/// The uplink firmware's policy (firmware/uplink `POLICY`): 100 ms base, 2 s cap, 8 s of waits,
/// six attempts, a 20 s deadline.
pub fn uplink_policy() -> Policy {
    Policy::builder(Preset::Default)
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(2))
        .budget(Duration::from_secs(8))
        .max_attempts(6)
        .deadline(Duration::from_secs(20))
        .min_attempt(Duration::from_secs(1))
        .build()
        .unwrap_or_else(|e| panic!("uplink policy refused: {e:?}"))
}

/// Retry until landed: the default preset's 100 ms base and 10 s cap, no budget to speak of.
fn until_landed(jitter: Jitter) -> Policy {
    Policy::builder(Preset::Default)
        .jitter(jitter)
        .budget(crate::sim::LONGEST)
        .max_attempts(u32::MAX - 1)
        .build()
        .unwrap_or_else(|e| panic!("retry-until-landed policy refused: {e:?}"))
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Requests that reached the cloud (or were refused at its door).
    pub requests: u64,
    /// Of them, during the outage.
    pub outage_requests: u64,
    /// Readings landed.
    pub delivered: u64,
    /// The most requests in one second of the recovery.
    pub peak_per_s: u64,
    /// When the last reading landed, ms after the outage ended (the horizon if some did not).
    pub drain_ms: u64,
    /// The 99th percentile of the readings' delay, ms (of the landed ones).
    pub p99_delay_ms: u64,
    /// Arrivals in each second from time 0.
    pub per_second: Vec<u32>,
    /// Calls that met an open breaker.
    pub breaker_refusals: u64,
}

impl Stats {
    /// Requests per landed reading.
    pub fn per_reading(&self) -> f64 {
        self.requests as f64 / self.delivered.max(1) as f64
    }
}

/// smithy-rs's `ClientRateLimiter` (aws-smithy-runtime), from its published constants: β 0.7,
/// scale constant 0.4, smoothing 0.8, a minimum fill rate of 0.5/s and capacity of 1, rates
/// measured in half-second buckets; enabled at the first throttle. Floating point: host code.
#[derive(Debug, Clone)]
struct Smithy {
    fill_rate: f64,
    max_capacity: f64,
    current_capacity: f64,
    last_timestamp: Option<f64>,
    enabled: bool,
    measured_tx_rate: f64,
    last_tx_rate_bucket: f64,
    request_count: u64,
    last_max_rate: f64,
    time_of_last_throttle: f64,
    time_window: f64,
}

impl Smithy {
    const MIN_FILL_RATE: f64 = 0.5;
    const MIN_CAPACITY: f64 = 1.0;
    const SMOOTH: f64 = 0.8;
    const BETA: f64 = 0.7;
    const SCALE_CONSTANT: f64 = 0.4;

    fn new(now: f64) -> Smithy {
        Smithy {
            fill_rate: 0.0,
            max_capacity: f64::MAX,
            current_capacity: 0.0,
            last_timestamp: None,
            enabled: false,
            measured_tx_rate: 0.0,
            last_tx_rate_bucket: now.floor(),
            request_count: 0,
            last_max_rate: 0.0,
            time_of_last_throttle: 0.0,
            time_window: 0.0,
        }
    }

    /// `Ok` or the time to sleep before sending; the token is taken either way.
    fn acquire(&mut self, now: f64) -> Result<(), f64> {
        if !self.enabled {
            return Ok(());
        }
        self.refill(now);
        let res = if self.current_capacity < 1.0 {
            Err((1.0 - self.current_capacity) / self.fill_rate)
        } else {
            Ok(())
        };
        self.current_capacity -= 1.0;
        res
    }

    fn refill(&mut self, now: f64) {
        if let Some(last) = self.last_timestamp {
            let fill = (now - last) * self.fill_rate;
            self.current_capacity = self.max_capacity.min(self.current_capacity + fill);
        }
        self.last_timestamp = Some(now);
    }

    fn update(&mut self, now: f64, throttled: bool) {
        self.update_measured_rate(now);
        let calculated = if throttled {
            let rate_to_use =
                if self.enabled { self.measured_tx_rate.min(self.fill_rate) } else { self.measured_tx_rate };
            self.last_max_rate = rate_to_use;
            self.time_window = (self.last_max_rate * (1.0 - Self::BETA) / Self::SCALE_CONSTANT).cbrt();
            self.time_of_last_throttle = now;
            self.enabled = true;
            rate_to_use * Self::BETA
        } else {
            self.time_window = (self.last_max_rate * (1.0 - Self::BETA) / Self::SCALE_CONSTANT).cbrt();
            let dt = now - self.time_of_last_throttle - self.time_window;
            Self::SCALE_CONSTANT * dt.powi(3) + self.last_max_rate
        };
        let new_rate = calculated.min(2.0 * self.measured_tx_rate);
        self.refill(now);
        self.fill_rate = new_rate.max(Self::MIN_FILL_RATE);
        self.max_capacity = new_rate.max(Self::MIN_CAPACITY);
        self.current_capacity = self.current_capacity.min(self.max_capacity);
    }

    fn update_measured_rate(&mut self, now: f64) {
        let bucket = (now * 2.0).floor() / 2.0;
        self.request_count += 1;
        if bucket > self.last_tx_rate_bucket {
            let rate = self.request_count as f64 / (bucket - self.last_tx_rate_bucket);
            self.measured_tx_rate = rate * Self::SMOOTH + self.measured_tx_rate * (1.0 - Self::SMOOTH);
            self.request_count = 0;
            self.last_tx_rate_bucket = bucket;
        }
    }
}

/// One device.
struct Device {
    /// Readings not yet landed.
    pending: u32,
    /// Position in the current round.
    in_round: u32,
    /// Readings kept in this round.
    kept: u32,
    /// Whether this round landed something.
    landed: bool,
    /// The current call, if one is under way.
    call: Option<Attempts>,
    /// The round pause's doublings in a row.
    round_step: u32,
    fleet: FleetBudget,
    pace: Option<Pace>,
    breaker: Option<Breaker>,
    smithy: Option<Smithy>,
    /// A smithy token already taken for the attempt this wake-up sends.
    paid: bool,
}

impl Device {
    /// True when a pace or a breaker gates its attempts (through [`Attempts::admit`], as the
    /// uplink's runner asks them).
    fn guarded(&self) -> bool {
        self.pace.is_some() || self.breaker.is_some()
    }
}

/// An event: a device is ready for its next call (or, without a pace or breaker, its next
/// attempt), an attempt goes, or an answer arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Ready,
    Send,
    Answer { outcome: u8, retry_after_s: u32 },
}

const OK: u8 = 0;
const UNAVAILABLE: u8 = 1;
const REFUSED: u8 = 2;

type Queue = BinaryHeap<Reverse<(u64, u32, Event)>>;

/// A run's state besides its devices: what the round and call endings need.
struct Sim {
    row: Row,
    rounds: Backoff,
    rng: fastrand::Rng,
    queue: Queue,
    s: Stats,
    delays: Vec<u64>,
    recovery_start: u64,
}

impl Sim {
    /// How a round ends, as the uplink ends it: a round that kept a reading pauses (doubling
    /// from 500 ms, one doubling more while the fleet budget refuses retries; back to 500 ms once
    /// a round lands something); a server's Retry-After too long for a call, or an open breaker,
    /// holds the outbox until `hold` as well. The next round starts when both are over.
    fn end_round(&mut self, dev: &mut Device, d: u32, t: u64, hold: Option<u64>) {
        if dev.landed {
            dev.round_step = 0;
        }
        let mut wake = t;
        if dev.kept > 0 {
            let throttled = !dev.fleet.allows_retry();
            let k = dev.round_step + 1 + u32::from(throttled);
            let pause = self.rounds.wait(k, Duration::ZERO, Draw::unit(self.rng.u32(..)));
            dev.round_step += 1;
            wake = t + u64::from(pause.as_millis());
        }
        (dev.in_round, dev.kept, dev.landed) = (0, 0, false);
        self.queue.push(Reverse((wake.max(hold.unwrap_or(0)), d, Event::Ready)));
    }

    /// A call of device `d` ended with `verdict` at `t`: the reading lands or is kept, and the
    /// round goes on, or ends.
    fn end_call(&mut self, dev: &mut Device, d: u32, t: u64, verdict: Verdict) {
        dev.call = None;
        if verdict == Verdict::Ok {
            self.s.delivered += 1;
            self.delays.push(t);
            self.s.drain_ms = t.saturating_sub(self.recovery_start);
            dev.pending -= 1;
            dev.landed = true;
        } else {
            dev.kept += 1;
            dev.in_round += 1;
        }
        if verdict == Verdict::GaveUp(GiveUp::CircuitOpen) {
            self.s.breaker_refusals += 1;
        }
        if dev.pending == 0 {
            return;
        }
        if !self.row.outbox() {
            // Retry until landed: a call that stops starts again at once.
            self.queue.push(Reverse((t, d, Event::Ready)));
            return;
        }
        match verdict {
            // The server asked the device to stay away: the rest of the round waits too.
            Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }) => {
                self.end_round(dev, d, t, Some(t + u64::from(asked.as_millis())));
            }
            // Every other reading of the round would meet the same open breaker: the round
            // ends, and the outbox waits until the breaker may let a probe through.
            Verdict::GaveUp(GiveUp::CircuitOpen) => {
                let now = Instant::from_millis(t);
                let wait = dev.breaker.as_ref().map_or(Duration::ZERO, |b| b.wait(now));
                self.end_round(dev, d, t, Some(t + u64::from(wait.as_millis()).max(1)));
            }
            _ if dev.in_round < dev.pending => self.queue.push(Reverse((t, d, Event::Ready))),
            _ => self.end_round(dev, d, t, None),
        }
    }
}

/// Runs one row in one world.
pub fn run(row: Row, world: &World) -> Stats {
    let policy = match row {
        Row::NoJitter => until_landed(Jitter::None),
        Row::FullJitter => until_landed(Jitter::Full),
        _ => uplink_policy(),
    };
    let pace = Pace::new(PaceSettings::DEVICE).unwrap_or_else(|e| panic!("pace refused: {e:?}"));
    let breaker = Breaker::new(BreakerSettings::DEVICE).unwrap_or_else(|e| panic!("breaker refused: {e:?}"));
    let mut rng = fastrand::Rng::with_seed(world.seed);
    let mut devices: Vec<Device> = (0..world.devices)
        .map(|_| Device {
            pending: world.backlog,
            in_round: 0,
            kept: 0,
            landed: false,
            call: None,
            round_step: 0,
            fleet: FleetBudget::new(10, 500).unwrap_or_else(|e| panic!("fleet budget refused: {e:?}")),
            pace: matches!(row, Row::WaryPace | Row::WaryPaceBreaker).then_some(pace),
            breaker: matches!(row, Row::WaryPaceBreaker).then_some(breaker),
            smithy: matches!(row, Row::Smithy).then(|| Smithy::new(0.0)),
            paid: false,
        })
        .collect();
    // Devices wake within the first second (their own timers), in a fixed order per seed.
    let queue: Queue = (0..world.devices).map(|d| Reverse((rng.u64(0..1000), d, Event::Ready))).collect();
    let recovery_start = world.outage_ms;
    let mut sim = Sim {
        row,
        rounds: Backoff::new(Duration::from_millis(500), Duration::from_secs(30), Jitter::Equal),
        rng,
        queue,
        s: Stats::default(),
        delays: Vec::with_capacity(world.readings() as usize),
        recovery_start,
    };
    let (mut second, mut served) = (u64::MAX, 0u32);
    // Every reading's call carries a key; the simulation's are all the same (nothing reads them).
    let key = Key::from_parts(0, 0, 0);
    while let Some(Reverse((t, d, event))) = sim.queue.pop() {
        if t >= world.horizon_ms {
            break;
        }
        let dev = &mut devices[d as usize];
        let now = Instant::from_millis(t);
        match event {
            Event::Ready => {
                if dev.pending == 0 {
                    continue;
                }
                if dev.call.is_none() && dev.guarded() {
                    // The drain honours the pace between calls, asked on a copy (the call takes
                    // the token); then the call asks the breaker and the pace before its first
                    // attempt, as the uplink's runner does.
                    if let Some(p) = dev.pace.as_ref()
                        && let Err(wait) = { *p }.acquire(now)
                    {
                        sim.queue.push(Reverse((t + u64::from(wait.as_millis()).max(1), d, Event::Ready)));
                        continue;
                    }
                    let mut call = Attempts::new(now);
                    let gate = call.admit(&policy, dev.pace.as_mut(), dev.breaker.as_mut(), now);
                    dev.call = Some(call);
                    match gate {
                        Gate::Go => {}
                        Gate::Wait(wait) => {
                            sim.queue.push(Reverse((t + u64::from(wait.as_millis()), d, Event::Send)));
                            continue;
                        }
                        Gate::Stop(why) => {
                            let verdict = Verdict::GaveUp(why);
                            sim.end_call(dev, d, t, verdict);
                            continue;
                        }
                    }
                } else {
                    // Smithy's limiter gates every attempt, retries included, before it goes.
                    if let Some(sm) = dev.smithy.as_mut()
                        && !dev.paid
                        && let Err(secs) = sm.acquire(t as f64 / 1000.0)
                    {
                        dev.paid = true;
                        sim.queue.push(Reverse((t + (secs * 1000.0).ceil() as u64, d, Event::Ready)));
                        continue;
                    }
                    dev.paid = false;
                    if dev.call.is_none() {
                        dev.call = Some(Attempts::new(now));
                    }
                }
                sim.queue.push(Reverse((t, d, Event::Send)));
            }
            Event::Send => {
                if let Some(call) = dev.call.as_mut() {
                    call.start(&policy, now);
                }
                // The request reaches the cloud.
                sim.s.requests += 1;
                let sec = t / 1000;
                if sim.s.per_second.len() <= sec as usize {
                    sim.s.per_second.resize(sec as usize + 1, 0);
                }
                sim.s.per_second[sec as usize] += 1;
                if sec != second {
                    (second, served) = (sec, 0);
                }
                let (outcome, retry_after_s) = if t < recovery_start {
                    sim.s.outage_requests += 1;
                    match world.outage {
                        OutageMode::Unavailable => (UNAVAILABLE, 0),
                        OutageMode::Refused => (REFUSED, 0),
                    }
                } else if served < world.capacity {
                    served += 1;
                    (OK, 0)
                } else if world.spread {
                    let left = world.readings() - sim.s.delivered;
                    let need_s = left.div_ceil(u64::from(world.capacity)).max(1);
                    (UNAVAILABLE, sim.rng.u64(1..=need_s) as u32)
                } else {
                    (UNAVAILABLE, 0)
                };
                let rtt = world.rtt_ms - world.rtt_spread_ms + sim.rng.u64(0..=2 * world.rtt_spread_ms);
                sim.queue.push(Reverse((t + rtt, d, Event::Answer { outcome, retry_after_s })));
            }
            Event::Answer { outcome, retry_after_s } => {
                let outcome = match outcome {
                    OK => Outcome::Ok,
                    REFUSED => Outcome::Failure(Failure::Refused),
                    _ if retry_after_s > 0 => {
                        Outcome::status_after(503, Duration::from_secs(u64::from(retry_after_s)))
                    }
                    _ => Outcome::status(503),
                };
                // The pace and the breaker hear the answer as the uplink's runner tells them (a
                // draw only for rows that have them, so the other rows' runs stay as they were).
                if dev.guarded() {
                    let draw = Draw::unit(sim.rng.u32(..));
                    Attempts::report(dev.pace.as_mut(), dev.breaker.as_mut(), &outcome, draw, now);
                }
                if let Some(sm) = dev.smithy.as_mut() {
                    let signal = Signal::of(&outcome);
                    sm.update(t as f64 / 1000.0, matches!(signal, Signal::Throttled | Signal::Asked { .. }));
                }
                let guarded = dev.guarded();
                let Some(call) = dev.call.as_mut() else { continue };
                let draw = Draw::unit(sim.rng.u32(..));
                let fleet = row.outbox().then_some(&dev.fleet);
                let (decision, _) = call.end(&policy, fleet, Operation::KeyedWrite, key, outcome, draw, now);
                match decision {
                    Decision::Retry { wait } if guarded => {
                        // Asked for the instant the backoff wait ends: a retry they refuse ends
                        // the call there.
                        let at = t + u64::from(wait.as_millis());
                        match call.admit_at(
                            &mut Guards { pace: dev.pace.as_mut(), breaker: dev.breaker.as_mut() },
                            &policy,
                            Instant::from_millis(at),
                        ) {
                            Ok(more) => {
                                sim.queue.push(Reverse((at + u64::from(more.as_millis()), d, Event::Send)))
                            }
                            Err(why) => {
                                let verdict = Verdict::GaveUp(why);
                                sim.end_call(dev, d, t, verdict);
                            }
                        }
                    }
                    Decision::Retry { wait } => {
                        sim.queue.push(Reverse((t + u64::from(wait.as_millis()), d, Event::Ready)));
                    }
                    Decision::Done(verdict) => {
                        sim.end_call(dev, d, t, verdict);
                    }
                }
            }
        }
    }
    if sim.s.delivered < world.readings() {
        sim.s.drain_ms = world.horizon_ms.saturating_sub(recovery_start);
    }
    sim.s.peak_per_s =
        sim.s.per_second.iter().skip((recovery_start / 1000) as usize).copied().max().unwrap_or(0).into();
    sim.delays.sort_unstable();
    let idx = (sim.delays.len() * 99).div_ceil(100).saturating_sub(1);
    sim.s.p99_delay_ms = sim.delays.get(idx).copied().unwrap_or(0);
    sim.s
}

/// The section's heading in results.md.
pub const HEADING: &str = "\n## Fleet recovery after an outage";

/// One row of one world.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The world.
    pub world: World,
    /// The row.
    pub row: Row,
    /// What it measured.
    pub stats: Stats,
}

/// Every row in the four worlds: a 503 or refused outage, then recovery without or with a
/// spreading Retry-After.
pub fn sweep(seed: u64) -> Vec<Cell> {
    let mut cells = Vec::new();
    for spread in [false, true] {
        for outage in [OutageMode::Unavailable, OutageMode::Refused] {
            let world = World::standard(outage, spread, seed);
            for row in Row::ALL {
                cells.push(Cell { world, row, stats: run(row, &world) });
            }
        }
    }
    cells
}

/// A cell's four figures: peak ÷ capacity, drain ÷ ideal, requests per reading, p99 delay (s).
pub fn figures(c: &Cell) -> (f64, f64, f64, f64) {
    let w = &c.world;
    (
        c.stats.peak_per_s as f64 / f64::from(w.capacity),
        c.stats.drain_ms as f64 / w.ideal_ms() as f64,
        c.stats.per_reading(),
        c.stats.p99_delay_ms as f64 / 1000.0,
    )
}

/// The results.md section.
pub fn section(cells: &[Cell], seed: u64, secs: f64) -> String {
    use std::fmt::Write as _;
    let mut md = format!("{HEADING}\n\n");
    let Some(first) = cells.first() else { return md };
    let w = first.world;
    let _ = writeln!(
        md,
        "{} devices × {} readings, a cloud serving {} requests/s that answers 503 at once above it, \
         a {} s outage, a {} ± {} ms round trip; seed {seed}, {secs:.1} s for all runs. Peak: the most \
         requests in one second of the recovery ÷ capacity. Drain: the last landing after the outage ÷ \
         the ideal {} s. Requests per landed reading count the outage's requests too. p99: the \
         readings' delay from time 0. Every decision is the core's (`Policy::decide_with_fleet`, \
         `Pace`, `Breaker`, asked and told through `Attempts` as the uplink does); smithy's \
         limiter is written in the bench from its published constants.\n",
        w.devices,
        w.backlog,
        w.capacity,
        w.outage_ms / 1000,
        w.rtt_ms,
        w.rtt_spread_ms,
        w.ideal_ms() / 1000
    );
    for spread in [false, true] {
        for outage in [OutageMode::Unavailable, OutageMode::Refused] {
            let ra = if spread { "spread Retry-After" } else { "no Retry-After" };
            let _ = writeln!(md, "\n### Outage answered {}, recovery with {ra}\n", outage.label());
            md.push_str("| row | peak × capacity | drain × ideal | requests / reading | p99 delay (s) | outage requests | breaker refusals |\n");
            md.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
            for c in cells.iter().filter(|c| c.world.spread == spread && c.world.outage == outage) {
                let (peak, drain, per, p99) = figures(c);
                let left = c.world.readings() - c.stats.delivered;
                let drain =
                    if left > 0 { format!("> {drain:.3} ({left} left)") } else { format!("{drain:.3}") };
                let _ = writeln!(
                    md,
                    "| {} | {peak:.3} | {drain} | {per:.3} | {p99:.0} | {} | {} |",
                    c.row.label(),
                    c.stats.outage_requests,
                    c.stats.breaker_refusals
                );
            }
        }
    }
    md.push_str("\n### Against the targets (wary + pace + breaker)\n\n");
    for t in targets(cells) {
        let _ = writeln!(md, "- {t}: {}", if t.met() { "met" } else { "**not met**" });
    }
    md
}

/// One target of the row with the pace and the breaker, in one world.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The world's outage.
    pub outage: OutageMode,
    /// Whether the world's cloud spreads its asks.
    pub spread: bool,
    /// `peak × capacity`, `drain × ideal` or `requests / reading`.
    pub figure: &'static str,
    /// The row's figure.
    pub value: f64,
    /// The most it may be.
    pub limit: f64,
    /// Where the limit comes from.
    pub against: &'static str,
}

impl Target {
    /// True if the figure is within its limit.
    pub fn met(&self) -> bool {
        self.value <= self.limit
    }
}

/// The world, the figure and its limit: `refused outage, spread Retry-After: requests / reading
/// 1.146, at most 1.200 (1.2)`.
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let asks = if self.spread { "spread Retry-After" } else { "no Retry-After" };
        write!(
            f,
            "{} outage, {asks}: {} {:.3}, at most {:.3} ({})",
            self.outage.label(),
            self.figure,
            self.value,
            self.limit,
            self.against
        )
    }
}

/// The targets the row with the pace and the breaker must meet in each world of `cells`. Without
/// Retry-After the devices learn only from their own answers and cannot know the fleet's size, so
/// the peak is held against the baselines (half the uplink's today, and smithy's limiter's),
/// the drain within 1.5× the ideal and 1.5 requests a reading; where the cloud spreads its asks,
/// the peak within 1.3× its capacity, the drain within 1.3× the ideal and 1.2 requests a reading.
pub fn targets(cells: &[Cell]) -> Vec<Target> {
    let mut out = Vec::new();
    for spread in [false, true] {
        for outage in [OutageMode::Unavailable, OutageMode::Refused] {
            let world = |row: Row| {
                cells
                    .iter()
                    .find(|c| c.world.spread == spread && c.world.outage == outage && c.row == row)
                    .map(figures)
            };
            let Some((peak, drain, per, _)) = world(Row::WaryPaceBreaker) else { continue };
            let target =
                |figure, value, limit, against| Target { outage, spread, figure, value, limit, against };
            if spread {
                out.push(target("peak × capacity", peak, 1.3, "1.3× capacity"));
                out.push(target("drain × ideal", drain, 1.3, "1.3× the ideal"));
                out.push(target("requests / reading", per, 1.2, "1.2"));
            } else {
                if let Some((today, ..)) = world(Row::WaryToday) {
                    out.push(target("peak × capacity", peak, today / 2.0, "half of wary today's"));
                }
                if let Some((smithy, ..)) = world(Row::Smithy) {
                    out.push(target("peak × capacity", peak, smithy, "smithy's limiter's"));
                }
                out.push(target("drain × ideal", drain, 1.5, "1.5× the ideal"));
                out.push(target("requests / reading", per, 1.5, "1.5"));
            }
        }
    }
    out
}

/// The `fleet_recovery` value in results.json.
pub fn json(cells: &[Cell], seed: u64) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            let (peak, drain, per, p99) = figures(c);
            serde_json::json!({
                "row": c.row.key(), "outage": c.world.outage.label(), "spread_retry_after": c.world.spread,
                "peak_x_capacity": peak, "drain_x_ideal": drain, "requests_per_reading": per,
                "p99_delay_s": p99, "requests": c.stats.requests, "outage_requests": c.stats.outage_requests,
                "delivered": c.stats.delivered, "breaker_refusals": c.stats.breaker_refusals,
                "per_second": c.stats.per_second,
            })
        })
        .collect();
    let targets: Vec<serde_json::Value> = targets(cells)
        .iter()
        .map(|t| {
            serde_json::json!({
                "outage": t.outage.label(), "spread_retry_after": t.spread, "figure": t.figure,
                "value": t.value, "limit": t.limit, "against": t.against, "met": t.met(),
            })
        })
        .collect();
    serde_json::json!({ "seed": seed, "rows": rows, "targets": targets })
}

/// `old` with this section (from its heading to the next `## ` heading) replaced by `section`,
/// or with `section` added at the end.
pub fn splice(old: &str, section: &str) -> String {
    let Some(start) = old.find(HEADING) else {
        return format!("{}\n{}", old.trim_end(), section);
    };
    let after = start + HEADING.len();
    let end = old[after..].find("\n## ").map_or(old.len(), |i| after + i);
    let head = old[..start].trim_end_matches('\n');
    format!("{head}\n{}{}", section, &old[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small world with the standard one's proportions: 400 devices × 5 readings, a cloud of
    /// 20 requests/s, a 20 s outage.
    fn small(outage: OutageMode, spread: bool, seed: u64) -> World {
        World {
            devices: 400,
            backlog: 5,
            capacity: 20,
            outage_ms: 20_000,
            horizon_ms: 2_000_000,
            ..World::standard(outage, spread, seed)
        }
    }

    /// A cell of the standard world whose row measured `peak` requests in its busiest second,
    /// drained in `drain_s` and sent `requests` for every reading.
    fn cell(outage: OutageMode, spread: bool, row: Row, peak: u64, drain_s: u64, requests: u64) -> Cell {
        let world = World::standard(outage, spread, 1);
        let delivered = world.readings();
        let stats =
            Stats { requests, delivered, peak_per_s: peak, drain_ms: drain_s * 1000, ..Stats::default() };
        Cell { world, row, stats }
    }

    #[test]
    fn the_targets_hold_each_world_to_its_own_limits() {
        use OutageMode::{Refused, Unavailable};
        let readings = World::standard(Refused, true, 1).readings();
        let cells = [
            // Without Retry-After: the peak against the baselines.
            cell(Unavailable, false, Row::WaryToday, 10_000, 400, readings * 30),
            cell(Unavailable, false, Row::Smithy, 4_000, 400, readings * 8),
            cell(Unavailable, false, Row::WaryPaceBreaker, 4_001, 600, readings * 3 / 2),
            // With spread asks: against the capacity (500/s) and the ideal (400 s).
            cell(Refused, true, Row::WaryPaceBreaker, 650, 521, readings * 6 / 5 + 1),
        ];
        let seen: Vec<(&str, f64, bool)> =
            targets(&cells).iter().map(|t| (t.figure, t.limit, t.met())).collect();
        assert_eq!(
            seen,
            [
                ("peak × capacity", 10.0, true), // 8.002× within half of wary today's 20×
                ("peak × capacity", 8.0, false), // but over smithy's 8×
                ("drain × ideal", 1.5, true),    // 1.5× exactly
                ("requests / reading", 1.5, true),
                ("peak × capacity", 1.3, true),     // 1.3× exactly
                ("drain × ideal", 1.3, false),      // 521 s of 400
                ("requests / reading", 1.2, false), // one request over 1.2 a reading
            ]
        );
        // A world without the row has no targets.
        assert!(targets(&cells[..2]).is_empty());
    }

    #[test]
    fn a_seed_fixes_the_run_and_every_row_lands_every_reading() {
        let w = small(OutageMode::Unavailable, false, 3);
        for row in Row::ALL {
            let s = run(row, &w);
            assert_eq!(s.delivered, w.readings(), "{row:?}");
            assert!(s.requests >= w.readings() + s.outage_requests, "{row:?}: {s:?}");
            if row == Row::WaryPaceBreaker {
                assert_eq!(s, run(row, &w));
                assert_ne!(s, run(row, &small(OutageMode::Unavailable, false, 4)));
            }
        }
    }

    #[test]
    fn the_cloud_never_serves_above_its_capacity_nor_during_the_outage() {
        let w = small(OutageMode::Refused, true, 5);
        let s = run(Row::NoJitter, &w);
        // Every landed reading was served in some second of the recovery, at most capacity each.
        let recovery_seconds = s.per_second.len() as u64 - w.outage_ms / 1000;
        assert!(s.delivered <= recovery_seconds * u64::from(w.capacity));
        assert_eq!(s.delivered, w.readings());
        assert!(s.drain_ms >= w.ideal_ms(), "{} < {}", s.drain_ms, w.ideal_ms());
    }

    #[test]
    fn pace_and_breaker_lower_the_peak_and_the_requests_of_the_uplink() {
        for outage in [OutageMode::Unavailable, OutageMode::Refused] {
            let w = small(outage, false, 7);
            let today = run(Row::WaryToday, &w);
            let paced = run(Row::WaryPaceBreaker, &w);
            assert!(paced.peak_per_s * 2 <= today.peak_per_s, "{outage:?}: {paced:?} vs {today:?}");
            assert!(paced.requests * 2 <= today.requests, "{outage:?}");
            assert!(paced.outage_requests * 4 <= today.outage_requests, "{outage:?}");
        }
    }

    #[test]
    fn an_open_breaker_refuses_calls_and_bounds_the_outage_requests() {
        let w = small(OutageMode::Refused, false, 9);
        let s = run(Row::WaryPaceBreaker, &w);
        assert!(s.breaker_refusals > 0);
        // Two failures open it for at least 15 s, then one probe per open time: in 20 s of
        // outage, at most the two and one probe per device.
        assert!(s.outage_requests <= u64::from(w.devices) * 3, "{s:?}");
        let without = run(Row::WaryPace, &w);
        assert_eq!(without.breaker_refusals, 0);
        assert!(without.outage_requests > s.outage_requests * 4);
    }

    #[test]
    fn smithys_limiter_turns_on_at_the_first_throttle_and_cuts_the_measured_rate() {
        let mut l = Smithy::new(0.0);
        assert_eq!(l.acquire(0.1), Ok(()));
        // Ten requests a second measured over two half-second buckets.
        for i in 0..20 {
            l.update(0.05 + f64::from(i) * 0.1, false);
        }
        assert!(!l.enabled);
        let measured = l.measured_tx_rate;
        assert!(measured > 8.0 && measured < 12.0, "{measured}");
        l.update(2.0, true);
        assert!(l.enabled);
        assert!((l.fill_rate - l.last_max_rate * Smithy::BETA).abs() < 1e-9);
        // With an empty bucket the next request sleeps 1/fill_rate and still takes its token.
        l.current_capacity = 0.0;
        l.last_timestamp = Some(2.0);
        let sleep = l.acquire(2.0).unwrap_err();
        assert!((sleep - 1.0 / l.fill_rate).abs() < 1e-9);
        assert!(l.current_capacity < 0.0);
    }

    #[test]
    fn the_section_replaces_its_own_and_keeps_the_others() {
        let old = "# wary benchmarks\n\n## A\n\na\n\n## Fleet recovery after an outage\n\nold\n\n## B\n\nb\n";
        let new = splice(old, "\n## Fleet recovery after an outage\n\nnew\n");
        assert_eq!(
            new,
            "# wary benchmarks\n\n## A\n\na\n\n## Fleet recovery after an outage\n\nnew\n\n## B\n\nb\n"
        );
        let added = splice("# t\n\n## A\n", "\n## Fleet recovery after an outage\n\nx\n");
        assert!(added.ends_with("## A\n\n## Fleet recovery after an outage\n\nx\n"), "{added}");
    }
}
