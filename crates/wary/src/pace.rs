//! The adaptive send rate: a token bucket whose fill rate follows a CUBIC curve, cut when the
//! server throttles and grown back with time, in integer arithmetic on an injected clock.
//!
//! A fleet that comes back after an outage holds a backlog on every device. Backoff spaces the
//! *retries* of one call; it does nothing for the *first attempts* of the next readings, so ten
//! thousand devices that each drain twenty readings as fast as the answers come meet a cloud
//! that just came back with the whole backlog at once. A [`Pace`] is asked before every attempt,
//! first or not, and answers "send" or "wait this long".
//!
//! The rate starts open (no pacing). The first throttling answer sets it to the `start` rate
//! times `keep`; each later one cuts the rate in force to `keep` of it, and aims lower when it
//! comes before the rate is back (fast convergence). Between throttles the rate climbs back
//! along a CUBIC curve scaled to the rate it was cut from, `w_max`:
//!
//! `rate(t) = w_max · (1 − (1 − keep) · (1 − t/K)³)`, with `t` the time since the last cut and
//! `K` the `regrow` time: it is back at `w_max` after `K`, flat around it, then accelerates
//! past it (`w_max · (1 + (1 − keep) · ((t − K)/K)³)`), and the pace opens again once it
//! reaches the `ceiling`. Rates never go below the `floor`; a served answer after a cut made
//! at the floor starts again from `start`, as when a breaker closes. A `tolerate_percent` lets
//! a share of throttles pass without a cut, for an endpoint that hears many answers (a gateway).
//! Two throttles in a row with nothing answered between them are an outage, and so is the
//! endpoint's circuit breaker opening ([`Pace::on_down`]): the first served answer after it
//! starts the pace again over the fleet's window.
//!
//! ```
//! use wary::{Draw, Duration, Instant, Pace, PaceSettings};
//! let at = Instant::from_millis;
//! // 1 request/s assumed at the first throttle, halved on each, back in 60 s; no burst.
//! let settings = PaceSettings { start_milli: 1_000, burst: 1, ..PaceSettings::DEVICE };
//! let mut pace = Pace::new(settings).unwrap();
//! assert_eq!(pace.acquire(at(0)), Ok(())); // open: nothing is paced before a throttle
//! // A 503: the rate drops to 0.5 requests/s, and the next request waits between half an
//! // interval and one and a half, placed by the draw (the lowest here).
//! pace.on_throttled(at(0), Draw::ZERO);
//! assert_eq!(pace.rate_milli(at(0)), Some(500));
//! assert_eq!(pace.acquire(at(0)), Err(Duration::from_millis(1_000)));
//! assert_eq!(pace.acquire(at(1_000)), Ok(()));
//! // Then one interval: a little under 2 s, as the rate climbs back from the cut.
//! assert_eq!(pace.acquire(at(1_000)), Err(Duration::from_millis(1_909)));
//! ```
//!
//! A pace is per endpoint and owned by the task that sends to it: it is a few words of plain
//! state changed through `&mut self`. Tasks that share one endpoint share its pace through their
//! own mutex; see docs/pacing.md for why this is not an atomic like the fleet budget.

use crate::backoff::Draw;
use crate::classify::{Failure, Outcome};
use crate::error::PaceError;
use crate::time::{Duration, Instant};

/// What an answer says about the send rate: the input a transport maps its answers into.
///
/// HTTP: [`Signal::of`]. MQTT 5: reason codes 0x97 (quota exceeded) and 0x89 (server busy) are
/// `Throttled`, any accepted publish is `Served`. CoAP: 4.29 (too many requests) and 5.03
/// (service unavailable) are `Throttled`, any 2.xx is `Served`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Signal {
    /// The server answered and did not ask the client to slow down.
    Served,
    /// The server refused the request for load: slow down.
    Throttled,
    /// The server refused the request for load and said when to come back (a Retry-After).
    Asked {
        /// The wait it asked for.
        wait: Duration,
    },
    /// The answer says nothing about the rate (a timeout, a refused connection, a 500): the
    /// circuit breaker's business, not the pace's.
    Neither,
}

impl Signal {
    /// An HTTP outcome's signal: 429 and 503 throttle, with or without a Retry-After (a 503 is
    /// the server saying it is overloaded, and a load shedder that answers at once rarely adds
    /// one); any other status the server answered, and a success, count as served; connection
    /// failures and other 5xx say nothing about the rate.
    pub const fn of(outcome: &Outcome) -> Signal {
        match outcome {
            Outcome::Ok => Signal::Served,
            Outcome::Failure(Failure::Status { code: 429 | 503, retry_after: Some(wait), .. }) => {
                Signal::Asked { wait: *wait }
            }
            Outcome::Failure(Failure::Status { code: 429 | 503, .. }) => Signal::Throttled,
            Outcome::Failure(Failure::Status { code: 400..=499, .. }) => Signal::Served,
            Outcome::Failure(_) => Signal::Neither,
        }
    }
}

/// A pace's settings. Rates are in thousandths of a request per second (`1000` is one a second,
/// `50` one every 20 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PaceSettings {
    /// The rate the first throttle cuts from, when the pace was open.
    pub start_milli: u32,
    /// The lowest rate a cut reaches.
    pub floor_milli: u32,
    /// The rate at which the pace opens again.
    pub ceiling_milli: u32,
    /// The share of the rate a throttle keeps, in percent (CUBIC's β): 1..=99.
    pub keep_percent: u8,
    /// The time the curve takes to climb back to the rate it was cut from (CUBIC's K).
    pub regrow: Duration,
    /// Requests that may go at once when the bucket is full: 1..=100.
    pub burst: u8,
    /// The share of throttling answers a pace lets pass without a cut, in percent: 0..=90. A
    /// throttle cuts only when throttles are more than this share of the answers heard since
    /// the last cut (counted over at least [`TOLERANCE_SAMPLE`] answers). 0, a device's
    /// default: every throttle cuts (a device hears an answer every few seconds at most). A
    /// gateway hears hundreds a second from an upstream that may refuse a share of them at
    /// random; with 50 it keeps its rate while at least half are served.
    pub tolerate_percent: u8,
}

/// The fewest answers a share of throttles is counted over ([`PaceSettings::tolerate_percent`]):
/// with fewer heard since the last cut, the share is taken over this many.
pub const TOLERANCE_SAMPLE: u16 = 10;

impl PaceSettings {
    /// A device's uplink: one request every 10 s assumed when the first throttle comes (so one
    /// every 20 s after it), each throttle halves the rate down to one request every 100 s, 60 s
    /// to climb back, open again at 10 requests/s, a burst of 2. The start is low on purpose: a
    /// device cannot know how many others share the cloud, and the fleet simulation shows ten
    /// thousand devices starting at one a second bring back the herd the pace is for.
    pub const DEVICE: PaceSettings = PaceSettings {
        start_milli: 100,
        floor_milli: 10,
        ceiling_milli: 10_000,
        keep_percent: 50,
        regrow: Duration::from_millis(60_000),
        burst: 2,
        tolerate_percent: 0,
    };
}

/// What a pace says about one request at one instant ([`Pace::view`]): integer numbers only,
/// as a ledger records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PaceView {
    /// The rate in force, in thousandths of a request a second; 0 while the pace is open.
    pub rate_milli: u32,
    /// How far the bucket's next token lies past what the burst allows, in ticks of 1/1024 ms
    /// (the bucket's own unit); 0 when a token is at hand.
    pub due: u64,
}

impl PaceView {
    /// The wait before the request may go: `due` rounded up to whole milliseconds (a wait is
    /// never shortened).
    pub const fn wait(&self) -> Duration {
        Duration::from_millis(self.due.saturating_add(TICKS_PER_MS - 1) >> 10)
    }
}

/// The highest rate a pace counts: 16 777 requests a second, in thousandths.
const MAX_RATE: u32 = (1 << 24) - 1;
/// The span after an outage began over which a fleet's climbs back are spread, in regrow times
/// ([`Pace::on_success`]).
const OUTAGE_REGROWS: u64 = 5;
/// One in Q12 fixed point.
const Q12: i32 = 1 << 12;

/// An adaptive send rate for one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pace {
    settings: PaceSettings,
    /// The rate the last cut was made from (`w_max`), in thousandths a second; 0 while open.
    w_max: u32,
    /// When the last cut was made.
    cut_at: Instant,
    /// The last served answer while paced; from a cut made on an open pace until the next
    /// served answer, when that cut was made (the outage's start, see `on_served`).
    served_at: Instant,
    /// The bucket as GCRA's theoretical arrival time, in ticks of 1/1024 ms: a request may go
    /// when it is at most `(burst − 1)` intervals ahead of now.
    tat: u64,
    /// Answers heard since the last cut (served or throttled), for the tolerance; halved with
    /// `throttles` when it reaches 256, so the share follows the recent answers.
    heard: u16,
    /// Throttles among them.
    throttles: u16,
    /// The last cut was made from an open pace, and nothing has been served or asked since.
    fresh: bool,
    /// A cut came while `fresh`: two throttles, the first from an open pace, with no answer
    /// between them, or the endpoint's breaker opened ([`Pace::on_down`]). The endpoint refuses
    /// everything (an outage answered 503, or down); the first answer that is not a throttle
    /// means it is back.
    outage: bool,
}

impl Pace {
    /// An open pace; refuses settings that could not pace.
    pub const fn new(settings: PaceSettings) -> Result<Pace, PaceError> {
        let s = settings;
        if s.floor_milli == 0 || s.floor_milli > s.start_milli || s.start_milli > s.ceiling_milli {
            return Err(PaceError::Rates);
        }
        if s.ceiling_milli > MAX_RATE {
            return Err(PaceError::TooFast);
        }
        if s.keep_percent == 0 || s.keep_percent > 99 {
            return Err(PaceError::Keep);
        }
        if s.regrow.as_millis() == 0 || s.regrow.is_max() {
            return Err(PaceError::Regrow);
        }
        if s.burst == 0 || s.burst > 100 {
            return Err(PaceError::Burst);
        }
        if s.tolerate_percent > 90 {
            return Err(PaceError::Tolerate);
        }
        Ok(Pace {
            settings,
            w_max: 0,
            cut_at: Instant::ZERO,
            served_at: Instant::ZERO,
            tat: 0,
            heard: 0,
            throttles: 0,
            fresh: false,
            outage: false,
        })
    }

    /// The settings.
    pub const fn settings(&self) -> &PaceSettings {
        &self.settings
    }

    /// True while no throttle is in force: nothing is paced (a server's ask may still hold the
    /// next request until its wait is over).
    pub const fn is_open(&self) -> bool {
        self.w_max == 0
    }

    /// The rate in force at `now`, in thousandths of a request a second; `None` while open.
    pub fn rate_milli(&self, now: Instant) -> Option<u32> {
        if self.is_open() {
            return None;
        }
        let s = &self.settings;
        let k = s.regrow.as_millis();
        // The curve's clock runs up to `regrow` past the last served answer: without answers the
        // rate climbs back to where it was cut from and waits there; past it, only answers
        // move it on (a device held back for minutes does not come back at a rate it never
        // tried).
        let confirmed = self.served_at.max(self.cut_at).as_millis().saturating_add(u64::from(k));
        let until = now.as_millis().min(confirmed);
        // Past 8K the curve stops climbing, at 1 + (1 − keep)·343 times w_max.
        let t = until.saturating_sub(self.cut_at.as_millis()).min(u64::from(k).saturating_mul(8));
        // 32-bit division only (no 64-bit division routine in a device's flash): K and t are
        // shifted together until K fits 16 bits, which keeps t below 2¹⁹.
        let shift = 16u32.saturating_sub(k.leading_zeros());
        let k = i32::try_from(k >> shift).unwrap_or(i32::MAX).max(1);
        let t = i32::try_from(t >> shift).unwrap_or(i32::MAX);
        // x = (t − K)/K in Q12, −1 (just cut) to 7: |t − K|·2¹² stays below 2³¹.
        let x = t.saturating_sub(k).saturating_mul(Q12).checked_div(k).unwrap_or(0).clamp(-Q12, 7 * Q12);
        // x³ in Q36 (|x| < 2¹⁵, so below 2⁴⁵), back to Q12.
        let x = i64::from(x);
        let cube = x.saturating_mul(x).saturating_mul(x) >> 24;
        // (1 − keep) in Q16, from a 32-bit division.
        let lost = (u32::from(100u8.saturating_sub(s.keep_percent)) << 16) / 100;
        let factor = i64::from(Q12).saturating_add(cube.saturating_mul(i64::from(lost)) >> 16);
        let rate = i64::from(self.w_max).saturating_mul(factor) >> 12;
        // Not `clamp`, which has a panic path for bounds the compiler cannot order.
        let rate = rate.max(i64::from(s.floor_milli)).min(i64::from(s.ceiling_milli));
        Some(u32::try_from(rate).unwrap_or(s.ceiling_milli))
    }

    /// Asks to send one request at `now`: `Ok` takes a token, `Err` is the wait until one is
    /// there (ask again then). Ask before every attempt, first ones included.
    pub fn acquire(&mut self, now: Instant) -> Result<(), Duration> {
        let view = self.view(now);
        if view.due == 0 {
            self.take(now);
            Ok(())
        } else {
            Err(view.wait())
        }
    }

    /// What the pace says at `now`, without taking anything: the rate in force and how far the
    /// bucket's next token lies past what its burst allows. The numbers a ledger records, from
    /// which [`PaceView::wait`] re-derives the wait.
    pub fn view(&self, now: Instant) -> PaceView {
        // Open, only a server's ask holds the bucket ([`Pace::on_asked`]).
        let Some(rate) = self.rate_milli(now) else {
            return PaceView { rate_milli: 0, due: self.tat.saturating_sub(ticks(now)) };
        };
        let limit = ticks(now).saturating_add(self.tolerance(interval_ticks(rate)));
        PaceView { rate_milli: rate, due: self.tat.saturating_sub(limit) }
    }

    /// Takes one token for a request asked about at `now` and sent when [`Pace::view`]'s wait
    /// is over: the bucket moves one interval of the rate in force at `now`. With a token at
    /// hand this is [`Pace::acquire`]'s `Ok`; without, the token is the one that comes free
    /// after the wait, reserved, so the request goes then without asking again.
    pub fn take(&mut self, now: Instant) {
        if let Some(rate) = self.rate_milli(now) {
            self.tat = self.tat.max(ticks(now)).saturating_add(u64::from(interval_ticks(rate)));
        }
    }

    /// A throttling answer at `now`: unless the tolerance lets it pass, the rate is cut to
    /// `keep` of the rate in force (of `start` if the pace was open; of ¾ of it with `keep` 50 %
    /// when the curve was not yet back where it was last cut from), and the bucket is emptied:
    /// the next request waits between half an interval and one and a half of the new rate,
    /// placed by `draw`. Devices throttled together would otherwise come back together,
    /// interval after interval.
    pub fn on_throttled(&mut self, now: Instant, draw: Draw) {
        let s = self.settings;
        self.hear(true);
        // Within the tolerance: no cut (nothing is tolerated at 0).
        let sample = u32::from(self.heard.max(TOLERANCE_SAMPLE));
        let (throttles, tolerated) = (
            u32::from(self.throttles).saturating_mul(100),
            u32::from(s.tolerate_percent).saturating_mul(sample),
        );
        if s.tolerate_percent > 0 && throttles <= tolerated {
            return;
        }
        self.cut(now, draw);
    }

    /// The endpoint is down at `now`: its circuit breaker has just opened (on refused
    /// connections, timeouts, resets or 5xx in a row). The pace reads it as it reads two
    /// throttles in a row with nothing answered between them, an outage: the rate is cut twice
    /// (whatever the tolerance), the next request is placed as after a cut, and the first
    /// served answer starts the pace again over the fleet's window ([`Pace::on_success`]). A
    /// fleet whose breakers opened together would otherwise probe on each breaker's open time
    /// and come back on each probe's slow start, all of them within the same minute. Nothing
    /// changes if the pace already reads an outage.
    ///
    /// ```
    /// use wary::{Draw, Instant, Pace, PaceSettings};
    /// let at = Instant::from_millis;
    /// let mut down = Pace::new(PaceSettings::DEVICE).unwrap();
    /// let mut throttled = down;
    /// down.on_down(at(100), Draw::ZERO);
    /// throttled.on_throttled(at(100), Draw::ZERO);
    /// throttled.on_throttled(at(100), Draw::ZERO);
    /// assert_eq!(down, throttled);
    /// // 0.1/s assumed, cut to 0.05/s, then aimed lower (fast convergence): 0.018/s.
    /// assert_eq!(down.rate_milli(at(100)), Some(18));
    /// ```
    pub fn on_down(&mut self, now: Instant, draw: Draw) {
        if self.outage {
            return;
        }
        self.cut(now, draw);
        self.fresh = true;
        self.cut(now, draw);
    }

    /// True while the pace reads an outage: two throttles in a row with nothing answered between
    /// them ([`Pace::on_throttled`]), or an endpoint down ([`Pace::on_down`]), until the first
    /// answer that is not a throttle.
    pub const fn in_outage(&self) -> bool {
        self.outage
    }

    /// A cut at `now` past the tolerance: see [`Pace::on_throttled`].
    fn cut(&mut self, now: Instant, draw: Draw) {
        let s = self.settings;
        (self.heard, self.throttles) = (0, 0);
        // A first throttle on an open pace, then another with nothing answered between them:
        // the endpoint refuses everything, an outage (see `on_served`).
        if self.is_open() {
            self.fresh = true;
            // Nothing was served while paced before this: the curve reads the cut's instant
            // either way, and an outage's restart reads when it began.
            self.served_at = now;
        } else if self.fresh {
            self.outage = true;
        }
        let from = self.rate_milli(now).unwrap_or(s.start_milli).max(s.floor_milli);
        // Cut again before the curve was back where it was last cut from: the server's room
        // has shrunk since. Aim lower (CUBIC's fast convergence): the curve's top is the
        // midpoint between `keep` of `from` and `from`, and the rate starts at `keep` of that.
        // Without it, a device that hears one throttle every few tens of seconds is back near
        // its old rate before each, and an outage leaves the whole fleet at the rate it
        // started from.
        self.w_max = if !self.is_open() && from < self.w_max {
            // 32-bit: `from` is below 2²⁴ and the factor below 200.
            (from.saturating_mul(100u32.saturating_add(u32::from(s.keep_percent))) / 200).max(s.floor_milli)
        } else {
            from
        };
        self.cut_at = now;
        // `rate_milli` now reads `keep` of `w_max`: the curve at t = 0.
        let interval = interval_ticks(self.rate_milli(now).unwrap_or(s.floor_milli));
        self.place_next(now, interval, interval / 2, draw);
    }

    /// A served answer at `now`: lets the curve climb on past the rate it was cut from; once it
    /// has climbed to the ceiling the pace opens again.
    ///
    /// A served answer after a cut made *at the floor* is an endpoint coming back, not a load
    /// easing: the pace was throttled even at its lowest rate (the server refused everything,
    /// an outage answered 503), and growing back from the floor along a curve scaled to the
    /// floor would take many regrow times. It starts again as when a breaker closes
    /// ([`Pace::slow_start`]): `keep` of `start`, climbing back to `start` in the regrow time.
    ///
    /// So does the first served answer after an outage answered 503 (a first throttle on an open
    /// pace, then another with nothing served or asked between them), with its next request
    /// half an interval to one and a half away (as after a cut: the answer that ended the
    /// outage was a request at the new rate already), and its climb held back until an instant
    /// drawn within what is left of five regrow times since the outage began (its first
    /// throttle), one regrow time at least: the fleet's window rather than each device's next
    /// minute, so a device back early is held longer than one back late. Without a draw (this
    /// method) the hold is nil and the next request half an interval away; [`Pace::report`]
    /// passes its draw.
    pub fn on_success(&mut self, now: Instant) {
        self.on_served(now, Draw::ZERO);
    }

    /// A served answer at `now`, `draw` placing the climb after an outage.
    fn on_served(&mut self, now: Instant, draw: Draw) {
        self.hear(false);
        let outage = self.outage;
        (self.fresh, self.outage) = (false, false);
        if self.is_open() {
            return;
        }
        if self.settings.start_milli > self.settings.floor_milli {
            if self.w_max <= self.settings.floor_milli {
                self.slow_start(now);
                self.served_at = now;
                return;
            }
            if outage {
                // Every device of a fleet meets the same outage and comes back within seconds of
                // the others: the climb back is held until a drawn instant of what is left of
                // `OUTAGE_REGROWS` regrow times since the outage began (the cut on the open
                // pace, kept in `served_at`), and of at least one regrow time. The window is
                // the fleet's, not each device's next minute: a device back early is held
                // longer than one back late, and the fleet's climbs are spread over the same
                // span whenever each came back. The next request is placed as after a cut
                // (half an interval to one and a half): the answer that ended the outage was a
                // request at the new rate already.
                let k = u64::from(self.settings.regrow.as_millis());
                let end = self.served_at.as_millis().saturating_add(k.saturating_mul(OUTAGE_REGROWS));
                let window = end.saturating_sub(now.as_millis()).max(k);
                self.start_again(now, draw, Duration::from_millis(window), true);
                self.served_at = now;
                return;
            }
        }
        self.served_at = self.served_at.max(now);
        if self.rate_milli(now).is_some_and(|r| r >= self.settings.ceiling_milli) {
            self.w_max = 0;
            // Open again: no token reserved at the old rate holds what comes next.
            self.tat = self.tat.min(ticks(now));
        }
    }

    /// A throttling answer at `now` that said when to come back: nothing goes before `wait` is
    /// over, and the rate stays where it is (open stays open). The server that spreads its asks
    /// knows its capacity better than a device can guess it, and cutting as well would count
    /// the same refusal twice; a server that asks an open endpoint to wait a second (a rate
    /// limit's 429) has said how long, not that the endpoint should send at a herd's pace from
    /// then on.
    ///
    /// An ask after an outage (a cut at the floor, or a first throttle on an open pace and
    /// another with nothing answered between them) says the endpoint is back: the pace starts
    /// again from `keep` of `start` ([`Pace::slow_start`]), as a served answer would.
    pub fn on_asked(&mut self, now: Instant, wait: Duration) {
        let s = self.settings;
        // `outage` is only ever set on a paced endpoint.
        let outage = !self.is_open() && (self.outage || self.w_max <= s.floor_milli);
        (self.fresh, self.outage) = (false, false);
        if outage && s.start_milli > s.floor_milli {
            // Paced from here at the start rate, for when the wait is over.
            self.slow_start(now);
        }
        let tolerance = self.tolerance(self.rate_milli(now).map_or(0, interval_ticks));
        let until = ticks(Instant::from_millis(now.as_millis().saturating_add(u64::from(wait.as_millis()))));
        self.tat = self.tat.max(until.saturating_add(tolerance));
    }

    /// Paces from `now` as if a first throttle had come: `keep` of the `start` rate, climbing
    /// back to it in the regrow time. For an endpoint that has just come back (its breaker
    /// closed after a probe, or a served answer after a cut at the floor), where sending the
    /// whole backlog unpaced would meet every other device doing the same.
    ///
    /// The bucket is re-spaced to the new rate: its next token is at most one interval of it
    /// away. Tokens taken at a slower rate for requests still waiting keep their instants (those
    /// requests go then), so for one interval of the old rate the endpoint may see both: at
    /// most the old rate on top of the new.
    pub fn slow_start(&mut self, now: Instant) {
        self.w_max = self.settings.start_milli;
        self.cut_at = now;
        let interval = self.rate_milli(now).map_or(0, interval_ticks);
        self.tat = self.tat.min(ticks(now).saturating_add(u64::from(interval)));
    }

    /// [`Pace::slow_start`] for a fleet: the next request waits a drawn share of one interval
    /// of the new rate (rather than going at once), and the climb back to `start` begins after
    /// a drawn share of three regrow times (the rate holds at `keep` of `start` meanwhile). For
    /// an endpoint that has just come back after its breaker closed on a probe: every device
    /// of a fleet met the same outage, their breakers close within seconds of each other, and
    /// climbing together they overshoot the cloud's capacity before its first throttle or ask
    /// reaches them. `draw` places both (from its two halves).
    pub fn slow_start_drawn(&mut self, now: Instant, draw: Draw) {
        let regrows = u64::from(self.settings.regrow.as_millis()).saturating_mul(3);
        self.start_again(now, draw, Duration::from_millis(regrows), false);
    }

    /// [`Pace::slow_start`], the climb after a drawn share of `window`, and the next request
    /// after a drawn share of an interval (past half an interval more when `after_a_request`:
    /// the answer that started it again was a request at the new rate).
    fn start_again(&mut self, now: Instant, draw: Draw, window: Duration, after_a_request: bool) {
        self.slow_start(now);
        let hold = draw.scale(window);
        self.cut_at = Instant::from_millis(now.as_millis().saturating_add(u64::from(hold.as_millis())));
        let interval = self.rate_milli(now).map_or(0, interval_ticks);
        // The other half of the draw, so that the first request and the climb are not tied.
        let second = match draw {
            Draw::Unit(v) => Draw::Unit(v.rotate_left(16)),
            other => other,
        };
        self.place_next(now, interval, if after_a_request { interval / 2 } else { 0 }, second);
    }

    /// How far ahead of now the bucket may run before a request waits: `burst − 1` intervals.
    fn tolerance(&self, interval: u32) -> u64 {
        u64::from(interval).saturating_mul(u64::from(self.settings.burst.saturating_sub(1)))
    }

    /// Places the next request at `now` plus `offset` and a share of one `interval` drawn by
    /// `draw` (in ticks), past what the burst allows; a later token already reserved stays.
    fn place_next(&mut self, now: Instant, interval: u32, offset: u32, draw: Draw) {
        // The draw scales a count of ticks as it scales milliseconds.
        let spread = draw.scale(Duration::from_millis(u64::from(interval))).as_millis();
        let wait = u64::from(offset).saturating_add(u64::from(spread));
        self.tat = self.tat.max(ticks(now).saturating_add(self.tolerance(interval)).saturating_add(wait));
    }

    /// Counts one answer for the tolerance.
    fn hear(&mut self, throttle: bool) {
        if self.settings.tolerate_percent == 0 {
            return;
        }
        if self.heard >= 256 {
            (self.heard, self.throttles) = (self.heard / 2, self.throttles / 2);
        }
        self.heard = self.heard.saturating_add(1);
        self.throttles = self.throttles.saturating_add(u16::from(throttle));
    }

    /// Feeds an answer's [`Signal`] at `now` (`draw` as for [`Pace::on_throttled`]).
    pub fn report(&mut self, now: Instant, signal: Signal, draw: Draw) {
        match signal {
            Signal::Served => self.on_served(now, draw),
            Signal::Throttled => self.on_throttled(now, draw),
            Signal::Asked { wait } => self.on_asked(now, wait),
            Signal::Neither => {}
        }
    }
}

/// The bucket's clock ticks 1024 times a millisecond: fine enough for 16 777 requests a
/// second, and milliseconds come back with a shift, not a division.
const TICKS_PER_MS: u64 = 1024;

/// `now` in ticks.
fn ticks(now: Instant) -> u64 {
    now.as_millis().saturating_mul(TICKS_PER_MS)
}

/// Ticks between tokens at `rate` thousandths a second, from a 32-bit division (1024·10⁶ fits).
fn interval_ticks(rate_milli: u32) -> u32 {
    1_024_000_000u32.checked_div(rate_milli).unwrap_or(1_024_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    /// One request/s assumed at the first throttle, no burst.
    fn settings() -> PaceSettings {
        PaceSettings { start_milli: 1_000, burst: 1, ..PaceSettings::DEVICE }
    }

    /// A cut whose next request waits exactly one interval (the middle draw).
    const MID: Draw = Draw::Unit(1 << 31);

    #[test]
    fn refuses_settings_that_cannot_pace() {
        let d = PaceSettings::DEVICE;
        assert_eq!(Pace::new(PaceSettings { floor_milli: 0, ..d }).err(), Some(PaceError::Rates));
        assert_eq!(Pace::new(PaceSettings { floor_milli: 200, ..d }).err(), Some(PaceError::Rates));
        assert_eq!(Pace::new(PaceSettings { start_milli: 20_000, ..d }).err(), Some(PaceError::Rates));
        // The highest rate counted is 16 777.215 requests a second.
        let fast = PaceSettings { ceiling_milli: 16_777_216, ..d };
        assert_eq!(Pace::new(fast).err(), Some(PaceError::TooFast));
        assert!(Pace::new(PaceSettings { ceiling_milli: 16_777_215, ..d }).is_ok());
        assert_eq!(Pace::new(PaceSettings { keep_percent: 0, ..d }).err(), Some(PaceError::Keep));
        assert_eq!(Pace::new(PaceSettings { keep_percent: 100, ..d }).err(), Some(PaceError::Keep));
        assert_eq!(Pace::new(PaceSettings { regrow: Duration::ZERO, ..d }).err(), Some(PaceError::Regrow));
        assert_eq!(Pace::new(PaceSettings { regrow: Duration::MAX, ..d }).err(), Some(PaceError::Regrow));
        assert_eq!(Pace::new(PaceSettings { burst: 0, ..d }).err(), Some(PaceError::Burst));
        assert_eq!(Pace::new(PaceSettings { burst: 101, ..d }).err(), Some(PaceError::Burst));
        assert_eq!(Pace::new(PaceSettings { tolerate_percent: 91, ..d }).err(), Some(PaceError::Tolerate));
        assert!(Pace::new(PaceSettings { tolerate_percent: 90, ..d }).is_ok());
        let edge = PaceSettings { burst: 100, keep_percent: 99, floor_milli: 100, start_milli: 100, ..d };
        assert!(Pace::new(edge).is_ok());
        assert_eq!(Pace::new(d).unwrap().settings(), &d);
    }

    #[test]
    fn an_endpoint_down_is_an_outage_whatever_the_pace_was_doing() {
        // Open: two throttles in a row, and the outage begins now.
        let open = Pace::new(settings()).unwrap();
        let mut down = open;
        down.on_down(at(1_000), MID);
        let mut twice = open;
        twice.on_throttled(at(1_000), MID);
        twice.on_throttled(at(1_000), MID);
        assert_eq!(down, twice);
        assert!(down.in_outage() && !open.in_outage());
        // Paced and served since its last cut: two throttles would be a load, not an outage;
        // a breaker that opened says the endpoint is down, and the pace reads an outage.
        let mut paced = open;
        paced.on_throttled(at(0), MID);
        paced.on_success(at(500));
        let mut two = paced;
        two.on_throttled(at(1_000), MID);
        two.on_throttled(at(1_000), MID);
        assert!(!two.in_outage());
        let mut down = paced;
        down.on_down(at(1_000), MID);
        assert!(down.in_outage());
        assert_eq!(down.rate_milli(at(1_000)), two.rate_milli(at(1_000)));
        // Whatever the tolerance: a single throttle within it cuts nothing, the endpoint down does.
        let tolerant = Pace::new(PaceSettings { tolerate_percent: 50, ..settings() }).unwrap();
        let mut t = tolerant;
        t.on_throttled(at(0), MID);
        assert!(t.is_open());
        t.on_down(at(0), MID);
        assert!(t.in_outage() && t.rate_milli(at(0)).is_some());
        // Read once: the same outage again changes nothing.
        let mut again = down;
        again.on_down(at(5_000), Draw::ZERO);
        assert_eq!(again, down);
        // Its first served answer ends it and starts the pace again over the fleet's window.
        down.on_success(at(90_000));
        assert!(!down.in_outage() && !down.is_open());
    }

    #[test]
    fn open_until_the_first_throttle() {
        let mut p = Pace::new(settings()).unwrap();
        for _ in 0..1_000 {
            assert_eq!(p.acquire(at(5)), Ok(()));
        }
        assert!(p.is_open() && p.rate_milli(at(5)).is_none());
        p.on_success(at(5));
        assert!(p.is_open());
    }

    #[test]
    fn each_throttle_cuts_the_rate_in_force_down_to_the_floor() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID);
        assert_eq!(p.rate_milli(at(0)), Some(500));
        // Cut again at once: from 500, aiming at 375 (the midpoint of 250 and 500), starting at
        // half of that.
        p.on_throttled(at(0), MID);
        assert_eq!(p.rate_milli(at(0)), Some(187));
        assert_eq!(p.rate_milli(at(60_000)), Some(375));
        for _ in 0..20 {
            p.on_throttled(at(0), MID);
        }
        assert_eq!(p.rate_milli(at(0)), Some(10));
        // The cut empties the bucket: with the middle draw, the next request waits one interval
        // at the floor, 100 s.
        assert_eq!(p.acquire(at(0)), Err(Duration::from_millis(100_000)));
        assert_eq!(p.acquire(at(100_000)), Ok(()));
    }

    #[test]
    fn the_draw_places_the_first_request_after_a_cut_within_an_interval() {
        let first = |draw| {
            let mut p = Pace::new(settings()).unwrap();
            p.on_throttled(at(0), draw); // 0.5/s: a 2 s interval
            p.acquire(at(0)).unwrap_err()
        };
        assert_eq!(first(Draw::ZERO), Duration::from_millis(1_000));
        assert_eq!(first(MID), Duration::from_millis(2_000));
        assert_eq!(first(Draw::TOP), Duration::from_millis(3_000));
    }

    #[test]
    fn the_curve_climbs_back_in_regrow_time_then_on_past_it_with_answers() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID); // w_max 1000, rate 500
        let r = |p: &Pace, t| p.rate_milli(at(t)).unwrap();
        // Concave up to w_max: half the lost rate is back after a fifth of K (1 − 0.8³ ≈ 0.49).
        assert_eq!(r(&p, 12_000), 744);
        assert!(r(&p, 30_000) > 900 && r(&p, 30_000) < 1_000);
        assert_eq!(r(&p, 60_000), 1_000);
        // Without a served answer it waits at w_max however long.
        assert_eq!(r(&p, 120_000), 1_000);
        assert_eq!(r(&p, 10_000_000), 1_000);
        // Answers move it on, convex: +50 % of w_max at 2K, then fast.
        p.on_success(at(60_000));
        let (a, b, c) = (r(&p, 70_000), r(&p, 90_000), r(&p, 110_000));
        assert!(1_000 < a && a < b && b < c && c < 1_500, "{a} {b} {c}");
        assert_eq!(r(&p, 120_000), 1_500);
        assert_eq!(r(&p, 200_000), r(&p, 120_000)); // again waiting for answers
        // A success before the ceiling does not open it; one past the ceiling does.
        p.on_success(at(120_000));
        assert!(!p.is_open());
        p.on_success(at(180_000));
        assert_eq!(r(&p, 250_000), 10_000);
        p.on_success(at(250_000));
        assert!(p.is_open());
        assert_eq!(p.acquire(at(250_000)), Ok(()));
    }

    #[test]
    fn a_regrow_past_65_s_draws_the_same_curve_stretched() {
        // Past 2^16 ms the curve's times are shifted down before its 32-bit division: the rate
        // at each share of the regrow time is the 60 s curve's at the same share.
        let curve = |regrow_ms: u64| {
            let mut p =
                Pace::new(PaceSettings { regrow: Duration::from_millis(regrow_ms), ..settings() }).unwrap();
            p.on_throttled(at(0), MID);
            let mut rates = [0u32; 5];
            for (rate, tenths) in rates.iter_mut().zip([0, 2, 5, 8, 10]) {
                *rate = p.rate_milli(at(regrow_ms * tenths / 10)).unwrap();
            }
            p.on_success(at(regrow_ms));
            (rates, p.rate_milli(at(regrow_ms * 3 / 2)).unwrap())
        };
        let (short, past) = curve(60_000);
        // 1 + (1 − keep)·((t − K)/K)³ of the rate cut from, 1 000.
        assert_eq!(short, [500, 744, 937, 995, 1_000]);
        for regrow in [65_536, 600_000, 3_600_000] {
            let (long, long_past) = curve(regrow);
            for (a, b) in long.iter().zip(short) {
                assert!(a.abs_diff(b) <= 2, "regrow {regrow} ms: {long:?} against {short:?}");
            }
            assert!(long_past.abs_diff(past) <= 2, "regrow {regrow} ms: {long_past} against {past}");
        }
    }

    #[test]
    fn a_pace_whose_start_is_its_floor_has_no_slow_start_to_go_back_to() {
        // With `start` at the floor there is no lower rate to start again from: a served answer
        // or an ask after a cut at the floor leave the curve's climb where it was.
        let flat = PaceSettings { start_milli: 100, floor_milli: 100, ..settings() };
        let r = |p: &Pace, t| p.rate_milli(at(t)).unwrap();
        let mut p = Pace::new(flat).unwrap();
        p.on_throttled(at(0), MID);
        assert_eq!(r(&p, 0), 100);
        // Answers move the climb on from the cut; it opens as any pace does.
        for t in (10_000..=600_000).step_by(10_000) {
            p.on_success(at(t));
        }
        assert!(p.is_open(), "{:?}", p.rate_milli(at(600_000)));
        // An ask long after the cut does not start the climb again either.
        let mut p = Pace::new(flat).unwrap();
        p.on_throttled(at(0), MID);
        p.on_asked(at(200_000), Duration::from_millis(1_000));
        p.on_success(at(202_000));
        assert!(r(&p, 230_000) > 1_000, "{}", r(&p, 230_000));
    }

    #[test]
    fn a_cut_before_the_curve_is_back_aims_lower() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID); // w_max 1000, rate 500
        let climbed = p.rate_milli(at(12_000)).unwrap();
        assert_eq!(climbed, 744);
        // Throttled again at 744, short of the 1000 it was cut from: the top is now the midpoint
        // of 372 and 744 (558), and the rate starts at half of it.
        p.on_throttled(at(12_000), MID);
        assert_eq!(p.rate_milli(at(12_000)), Some(279));
        assert_eq!(p.rate_milli(at(72_000)), Some(558));
        // Throttled once the curve is back: a plain cut, the top where it was cut from.
        let mut q = Pace::new(settings()).unwrap();
        q.on_throttled(at(0), MID);
        q.on_throttled(at(60_000), MID);
        assert_eq!(q.rate_milli(at(60_000)), Some(500));
        assert_eq!(q.rate_milli(at(120_000)), Some(1_000));
    }

    #[test]
    fn a_cut_starts_from_the_rate_in_force_not_the_last_peak() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID);
        p.on_success(at(100_000));
        p.on_throttled(at(120_000), MID); // in force 1500 → w_max 1500, rate 750
        assert_eq!(p.rate_milli(at(120_000)), Some(750));
        assert_eq!(p.rate_milli(at(180_000)), Some(1_500));
    }

    #[test]
    fn the_bucket_paces_at_the_rate_and_holds_a_burst() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID); // 0.5/s: a 2 s interval, emptied
        assert_eq!(p.acquire(at(0)), Err(Duration::from_millis(2_000)));
        assert_eq!(p.acquire(at(1_999)), Err(Duration::from_millis(1)));
        assert_eq!(p.acquire(at(2_000)), Ok(()));
        assert!(p.acquire(at(2_000)).is_err());
        // Idle for a long time, a bucket of three holds three requests, not more.
        let mut p = Pace::new(PaceSettings { burst: 3, ..settings() }).unwrap();
        p.on_throttled(at(0), MID);
        assert!(p.acquire(at(0)).is_err());
        let sent = (0..10).filter(|_| p.acquire(at(40_000)).is_ok()).count();
        assert_eq!(sent, 3);
        // Count what goes through over 100 s of asking every 10 ms: the rate climbs back from
        // 0.5/s to 1/s, so more than 50 and fewer than 100.
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(0), MID);
        let sent = (0..10_000u64).filter(|i| p.acquire(at(i * 10)).is_ok()).count();
        assert!((60..=95).contains(&sent), "{sent}");
    }

    #[test]
    fn a_retry_after_holds_the_bucket_without_a_cut() {
        let mut p = Pace::new(settings()).unwrap();
        // Open: it waits out the ask and stays open, every request going at once after it.
        p.on_asked(at(0), Duration::from_secs(30));
        assert_eq!(p.rate_milli(at(0)), None);
        assert_eq!(p.view(at(0)), PaceView { rate_milli: 0, due: 30_000 * TICKS_PER_MS });
        assert_eq!(p.acquire(at(29_999)), Err(Duration::from_millis(1)));
        assert!((0..5).all(|_| p.acquire(at(30_000)) == Ok(())));
        assert!(p.is_open());
        // Paced: the rate stays where it is.
        p.on_throttled(at(30_000), MID);
        p.on_success(at(30_000));
        let before = p.rate_milli(at(40_000));
        p.report(at(40_000), Signal::of(&Outcome::status_after(429, Duration::from_secs(5))), MID);
        assert_eq!(p.rate_milli(at(40_000)), before);
        assert_eq!(p.acquire(at(44_999)), Err(Duration::from_millis(1)));
        assert_eq!(p.acquire(at(45_000)), Ok(()));
    }

    #[test]
    fn slow_start_paces_an_endpoint_that_came_back() {
        let mut p = Pace::new(settings()).unwrap();
        p.slow_start(at(1_000));
        assert!(!p.is_open());
        assert_eq!(p.rate_milli(at(1_000)), Some(500));
        assert_eq!(p.rate_milli(at(61_000)), Some(1_000));
        // The bucket was full: the first request goes at once, the next waits.
        assert_eq!(p.acquire(at(1_000)), Ok(()));
        assert!(p.acquire(at(1_000)).is_err());
    }

    #[test]
    fn a_served_answer_after_a_cut_at_the_floor_starts_again_from_start() {
        let mut p = Pace::new(settings()).unwrap(); // start 1/s, floor 0.01/s
        // An outage answered 503: throttle after throttle down to the floor, and one more there.
        for i in 0..8 {
            p.on_throttled(at(i * 1_000), MID);
        }
        assert_eq!(p.rate_milli(at(8_000)), Some(10));
        // A cut from above the floor that lands on it is load, not yet an outage: a served
        // answer then climbs along the curve as usual.
        let mut q = Pace::new(PaceSettings { floor_milli: 500, ..settings() }).unwrap();
        q.on_throttled(at(0), MID); // 1000 → 500, the floor; w_max 1000
        q.on_success(at(1_000));
        assert_eq!(q.rate_milli(at(1_000)), Some(524)); // the curve 1 s after the cut
        assert_eq!(q.rate_milli(at(60_000)), Some(1_000));
        // Served after the cut at the floor: back to half the start at once, the start in the
        // regrow time, and the bucket's next token within one interval of the new rate (2 s),
        // not the floor's 100 s.
        assert!(p.acquire(at(9_000)).unwrap_err() > Duration::from_secs(50));
        p.on_success(at(9_000));
        assert_eq!(p.rate_milli(at(9_000)), Some(500));
        assert_eq!(p.rate_milli(at(69_000)), Some(1_000));
        assert_eq!(p.acquire(at(9_000)), Err(Duration::from_millis(2_000)));
        assert_eq!(p.acquire(at(11_000)), Ok(()));
        // A throttle from there cuts from the new rate, not from the floor (and, the curve not
        // yet back at the start, aims at the midpoint).
        let climbed = p.rate_milli(at(11_000)).unwrap();
        assert!(climbed > 500, "{climbed}");
        p.on_throttled(at(11_000), MID);
        let aim = climbed * 150 / 200;
        let cut = p.rate_milli(at(11_000)).unwrap();
        assert!((aim / 2 - 1..=aim / 2).contains(&cut), "{cut} {aim}");
        // A start at the floor has nowhere to start from: the curve as usual.
        let mut f = Pace::new(PaceSettings { floor_milli: 1_000, ..settings() }).unwrap();
        f.on_throttled(at(0), MID);
        f.on_success(at(1_000));
        assert_eq!(f.rate_milli(at(1_000)), Some(1_000));
    }

    #[test]
    fn a_served_answer_after_an_outage_starts_again_and_holds_the_climb_a_drawn_while() {
        // An outage answered 503: a first throttle on the open pace, another with nothing
        // answered between them.
        let outage = || {
            let mut p = Pace::new(settings()).unwrap();
            p.on_throttled(at(0), MID);
            p.on_throttled(at(10_000), MID);
            assert!(p.rate_milli(at(10_000)).unwrap() < 500);
            p
        };
        // Served 20 s after the outage began: `keep` of `start`, held there for half of what
        // is left of five regrow times since it began (280 s) with the middle draw, then back
        // at `start` a regrow time later; the next request half an interval away and the other
        // half of the draw (within a millisecond) past it.
        let mut p = outage();
        p.report(at(20_000), Signal::Served, MID);
        assert_eq!(p.rate_milli(at(20_000)), Some(500));
        assert_eq!(p.rate_milli(at(159_000)), Some(500));
        assert!(p.rate_milli(at(190_000)).unwrap() > 500);
        assert_eq!(p.rate_milli(at(220_000)), Some(1_000));
        assert_eq!(p.acquire(at(20_000)), Err(Duration::from_millis(1_001)));
        assert_eq!(p.acquire(at(21_001)), Ok(()));
        // Served after the five regrow times: held half of one regrow time, the least window.
        let mut late = outage();
        late.report(at(400_000), Signal::Served, MID);
        assert_eq!(late.rate_milli(at(429_000)), Some(500));
        assert_eq!(late.rate_milli(at(490_000)), Some(1_000));
        // `on_success` has no draw: no hold.
        let mut q = outage();
        q.on_success(at(20_000));
        assert_eq!(q.rate_milli(at(80_000)), Some(1_000));
        // Asked after the outage: it is back too, and starts again from `keep` of `start`
        // (no hold: the ask already says when), the bucket held for the wait.
        let mut a = outage();
        a.on_asked(at(20_000), Duration::from_secs(30));
        assert_eq!(a.rate_milli(at(20_000)), Some(500));
        assert_eq!(a.rate_milli(at(80_000)), Some(1_000));
        assert!(a.acquire(at(49_999)).is_err());
        assert_eq!(a.acquire(at(50_000)), Ok(()));
        // Load is not an outage: throttles with served answers between them cut as usual, and
        // a served answer after them moves the curve on.
        let mut l = Pace::new(settings()).unwrap();
        l.on_throttled(at(0), MID);
        l.on_success(at(5_000));
        l.on_throttled(at(10_000), MID);
        let cut = l.rate_milli(at(10_000)).unwrap();
        l.report(at(20_000), Signal::Served, MID);
        assert!(l.rate_milli(at(20_000)).unwrap() > cut);
        assert!(l.rate_milli(at(20_000)).unwrap() < 500);
        // Nor is an asked wait between two throttles.
        let mut k = Pace::new(settings()).unwrap();
        k.on_throttled(at(0), MID);
        k.on_asked(at(5_000), Duration::from_secs(1));
        k.on_throttled(at(10_000), MID);
        let cut = k.rate_milli(at(10_000)).unwrap();
        k.report(at(20_000), Signal::Served, MID);
        assert!(k.rate_milli(at(20_000)).unwrap() > cut);
    }

    #[test]
    fn a_drawn_slow_start_spreads_the_next_request_and_the_climb() {
        // The lowest draw: as `slow_start`, except that the bucket is not left full.
        let mut p = Pace::new(settings()).unwrap();
        p.slow_start_drawn(at(0), Draw::ZERO);
        assert_eq!(p.rate_milli(at(0)), Some(500));
        assert_eq!(p.rate_milli(at(60_000)), Some(1_000));
        assert_eq!(p.acquire(at(0)), Ok(()));
        // The highest: the next request one interval away (2 s), the climb held for about
        // three regrow times.
        let mut q = Pace::new(settings()).unwrap();
        q.slow_start_drawn(at(0), Draw::TOP);
        assert_eq!(q.acquire(at(0)), Err(Duration::from_millis(2_000)));
        assert_eq!(q.rate_milli(at(179_000)), Some(500));
        assert_eq!(q.rate_milli(at(240_000)), Some(1_000));
        // A throttle during the hold cuts from the held rate, and the curve runs from the cut.
        q.on_throttled(at(100_000), MID);
        assert!(q.rate_milli(at(100_000)).unwrap() < 500);
        assert!(q.rate_milli(at(160_000)).unwrap() < 500);
    }

    #[test]
    fn slow_start_re_spaces_a_bucket_reserved_at_a_slower_rate() {
        let mut p = Pace::new(PaceSettings { burst: 1, ..settings() }).unwrap();
        for _ in 0..8 {
            p.on_throttled(at(0), MID);
        }
        // Ten requests queued at the floor: their tokens reach 1 000 s ahead.
        for _ in 0..10 {
            p.take(at(0));
        }
        assert!(p.acquire(at(0)).unwrap_err() > Duration::from_secs(1_000));
        p.slow_start(at(0));
        assert_eq!(p.acquire(at(0)), Err(Duration::from_millis(2_000)));
        // A bucket already closer than one interval is left as it is.
        let mut q = Pace::new(settings()).unwrap();
        q.slow_start(at(0));
        assert_eq!(q.acquire(at(0)), Ok(()));
    }

    #[test]
    fn a_tolerance_lets_a_share_of_throttles_pass_and_cuts_past_it() {
        let tolerant = PaceSettings { tolerate_percent: 50, ..settings() };
        // An upstream that refuses three answers in ten at random and serves the rest: never cut.
        let mut p = Pace::new(tolerant).unwrap();
        for i in 0..3_000u64 {
            if i % 10 < 3 {
                p.on_throttled(at(i), MID);
            } else {
                p.on_success(at(i));
            }
            assert!(p.is_open(), "cut at answer {i}");
        }
        // An outage: the sixth throttle in a row is more than half of the ten answers the share
        // is counted over at least, and cuts; the next cut needs six more.
        let mut q = Pace::new(tolerant).unwrap();
        for i in 0..5 {
            q.on_throttled(at(i), MID);
            assert!(q.is_open());
        }
        q.on_throttled(at(5), MID);
        assert_eq!(q.rate_milli(at(5)), Some(500));
        for i in 6..11 {
            q.on_throttled(at(i), MID);
        }
        assert_eq!(q.rate_milli(at(11)).map(|r| r > 400), Some(true));
        q.on_throttled(at(11), MID);
        assert!(q.rate_milli(at(11)).unwrap() < 400);
        // After the first 30 % stretch, an upstream that starts refusing most answers is cut
        // within a few hundred answers: the count is halved as it reaches 256, so the share
        // follows what is heard now.
        let mut cut = None;
        for i in 0..1_000u64 {
            if i % 10 < 7 {
                p.on_throttled(at(10_000 + i), MID);
            } else {
                p.on_success(at(10_000 + i));
            }
            if !p.is_open() {
                cut = Some(i);
                break;
            }
        }
        assert!(cut.is_some_and(|i| i < 400), "{cut:?}");
        // Nothing tolerated (a device's default): the first throttle cuts, as every test above.
        let mut d = Pace::new(settings()).unwrap();
        d.on_success(at(0));
        d.on_throttled(at(1), MID);
        assert!(!d.is_open());
    }

    #[test]
    fn signals_from_http_outcomes() {
        assert_eq!(Signal::of(&Outcome::Ok), Signal::Served);
        assert_eq!(Signal::of(&Outcome::status(429)), Signal::Throttled);
        assert_eq!(Signal::of(&Outcome::status(503)), Signal::Throttled);
        let asked = Signal::of(&Outcome::status_after(503, Duration::from_secs(3)));
        assert_eq!(asked, Signal::Asked { wait: Duration::from_secs(3) });
        assert_eq!(Signal::of(&Outcome::status_after(500, Duration::from_secs(3))), Signal::Neither);
        assert_eq!(Signal::of(&Outcome::status(404)), Signal::Served);
        assert_eq!(Signal::of(&Outcome::status(500)), Signal::Neither);
        assert_eq!(Signal::of(&Outcome::status(502)), Signal::Neither);
        assert_eq!(Signal::of(&Outcome::Failure(Failure::Refused)), Signal::Neither);
        let mut p = Pace::new(settings()).unwrap();
        p.report(at(0), Signal::Neither, MID);
        p.report(at(0), Signal::Served, MID);
        assert!(p.is_open());
        p.report(at(0), Signal::Throttled, MID);
        assert_eq!(p.rate_milli(at(0)), Some(500));
    }

    #[test]
    fn extreme_clocks_saturate_instead_of_panicking() {
        let mut p = Pace::new(settings()).unwrap();
        p.on_throttled(at(u64::MAX), MID);
        assert_eq!(p.rate_milli(at(u64::MAX)), Some(500));
        let _ = p.acquire(at(u64::MAX));
        p.on_asked(at(u64::MAX), Duration::MAX);
        assert_eq!(p.rate_milli(at(0)), Some(500)); // a clock that went back reads "just cut"
        let mut q = Pace::new(settings()).unwrap();
        q.on_throttled(at(0), MID);
        assert_eq!(q.rate_milli(at(u64::MAX)), Some(1_000));
        q.on_success(at(u64::MAX)); // the curve runs to the ceiling: open again
        assert!(q.is_open());
    }
}
