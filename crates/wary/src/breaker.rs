//! A circuit breaker per endpoint: closed, open and half-open, one probe at a time, and a
//! jittered open time drawn like every other wait of the crate.
//!
//! An endpoint that refuses connections, times out or answers 5xx to every request is down; a
//! device that keeps calling it spends battery and, once it comes back, adds to the herd. After
//! `threshold` failures in a row (or one refused connection, where the settings say so) the
//! breaker opens: calls end at once without an attempt (the reading stays in the outbox). When
//! the open time is over, one request goes as a probe (half-open) while every other one is still
//! refused; the probe's success closes the breaker, its failure opens it again for a longer
//! time. Open times double from `open` up to `max_open` with equal jitter (half fixed, half
//! drawn), so a fleet whose breakers opened together does not probe together.
//!
//! ```
//! use wary::{Breaker, BreakerSettings, Draw, Duration, Instant, Permit};
//! let at = Instant::from_millis;
//! let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap(); // 2 failures, 30 s .. 10 min
//! for t in 0..2 {
//!     assert_eq!(b.admit(at(t)), Ok(Permit::Closed));
//!     b.on_failure(at(t), Draw::ZERO);
//! }
//! // Open for 15 s (half of 30 s fixed, the draw adds nothing): refused at once meanwhile.
//! assert_eq!(b.admit(at(1)), Err(Duration::from_millis(15_000)));
//! assert_eq!(b.admit(at(15_001)), Ok(Permit::Probe));
//! assert!(b.admit(at(15_002)).is_err()); // one probe at a time
//! assert!(b.on_success(at(15_100))); // true: it was not closed, the endpoint is back
//! assert_eq!(b.admit(at(15_101)), Ok(Permit::Closed));
//! ```
//!
//! Like [`crate::Pace`], a breaker is plain state owned by the task that calls its endpoint.

use crate::backoff::{Backoff, Draw, Jitter};
use crate::error::BreakerError;
use crate::time::{Duration, Instant};

/// A breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BreakerSettings {
    /// Failures in a row that open the breaker.
    pub threshold: u8,
    /// The first open time's ceiling; it doubles after each failed probe. Also how long a probe
    /// may stay unanswered before another is let through (a probe whose task was cancelled
    /// must not hold the breaker half-open for ever).
    pub open: Duration,
    /// The longest open time's ceiling.
    pub max_open: Duration,
    /// A refused connection opens a closed breaker at once, whatever `threshold` says: the
    /// connection was turned away before anything was sent (a TCP reset answering its SYN, no
    /// route), so nothing listens there now. Off by default, for a device as for a gateway: a
    /// server that restarts refuses one connection and serves the next a few hundred
    /// milliseconds later, and opening at once holds the caller for a whole open time
    /// (docs/pacing.md).
    pub refused_opens: bool,
}

impl BreakerSettings {
    /// A device's uplink: open after 2 failures in a row (a call's first attempt and its first
    /// retry), a refused connection counting as one, for 15–30 s the first time, doubling to
    /// 5–10 min.
    pub const DEVICE: BreakerSettings = BreakerSettings {
        threshold: 2,
        open: Duration::from_millis(30_000),
        max_open: Duration::from_millis(600_000),
        refused_opens: false,
    };
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BreakerState {
    /// Requests go; `failures` in a row so far.
    Closed {
        /// Failures in a row.
        failures: u8,
    },
    /// Requests are refused until `until`.
    Open {
        /// When the next probe may go.
        until: Instant,
        /// Times opened in a row (1 the first time).
        trips: u8,
    },
    /// One probe is out since `since`; other requests are refused.
    HalfOpen {
        /// When the probe went.
        since: Instant,
        /// Times opened in a row.
        trips: u8,
    },
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub const fn name(&self) -> &'static str {
        match self {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// A breaker's state without its instants, as a ledger records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Phase {
    /// Requests go.
    Closed,
    /// Requests are refused until the open time is over (then one goes as a probe).
    Open,
    /// A probe is out.
    HalfOpen,
}

impl Phase {
    /// `closed`, `open` or `half_open`.
    pub const fn name(&self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }

    /// The phase of a name written by [`Phase::name`].
    pub fn from_name(name: &str) -> Option<Phase> {
        match name {
            "closed" => Some(Phase::Closed),
            "open" => Some(Phase::Open),
            "half_open" => Some(Phase::HalfOpen),
            _ => None,
        }
    }
}

impl BreakerState {
    /// The phase, without its instants.
    pub const fn phase(&self) -> Phase {
        match self {
            BreakerState::Closed { .. } => Phase::Closed,
            BreakerState::Open { .. } => Phase::Open,
            BreakerState::HalfOpen { .. } => Phase::HalfOpen,
        }
    }
}

/// What a breaker let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Permit {
    /// A request while closed.
    Closed,
    /// The one probe of a half-open breaker: report its outcome.
    Probe,
}

/// A circuit breaker for one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Breaker {
    settings: BreakerSettings,
    state: BreakerState,
}

impl Breaker {
    /// A closed breaker; refuses settings that could not open or close.
    pub const fn new(settings: BreakerSettings) -> Result<Breaker, BreakerError> {
        if settings.threshold == 0 {
            return Err(BreakerError::Threshold);
        }
        let (open, max) = (settings.open, settings.max_open);
        if open.as_millis() == 0 || max.is_max() || max.as_millis() < open.as_millis() {
            return Err(BreakerError::OpenTime);
        }
        Ok(Breaker { settings, state: BreakerState::Closed { failures: 0 } })
    }

    /// The settings.
    pub const fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// Where the breaker stands.
    pub const fn state(&self) -> BreakerState {
        self.state
    }

    /// How long from `now` until [`Breaker::admit`] may let a request through, without asking
    /// for one: zero while closed or once a probe may go. For an outbox that holds its readings
    /// while the breaker is open instead of offering each of them to it.
    pub fn wait(&self, now: Instant) -> Duration {
        match self.state {
            BreakerState::Closed { .. } => Duration::ZERO,
            BreakerState::Open { until, .. } if now < until => until.duration_since(now),
            BreakerState::HalfOpen { since, .. } if now.duration_since(since) < self.settings.open => {
                self.settings.open.saturating_sub(now.duration_since(since))
            }
            BreakerState::Open { .. } | BreakerState::HalfOpen { .. } => Duration::ZERO,
        }
    }

    /// Asks to send one request at `now`: `Ok` says as what, `Err` is how long until the
    /// breaker may let one through (the open time left, or the time a probe out may still take).
    pub fn admit(&mut self, now: Instant) -> Result<Permit, Duration> {
        let trips = match self.state {
            BreakerState::Closed { .. } => return Ok(Permit::Closed),
            BreakerState::Open { trips, .. } | BreakerState::HalfOpen { trips, .. } => trips,
        };
        let wait = self.wait(now);
        if wait > Duration::ZERO {
            return Err(wait);
        }
        self.state = BreakerState::HalfOpen { since: now, trips };
        Ok(Permit::Probe)
    }

    /// A success at `now`: the endpoint is up, the breaker closes. True if it was not closed
    /// (a probe answered): the endpoint has just come back, a moment to start sending slowly
    /// (the pace's outage rule, or [`crate::Pace::slow_start_drawn`]; see
    /// [`crate::Attempts::report`]).
    pub fn on_success(&mut self, _now: Instant) -> bool {
        let reopened = !matches!(self.state, BreakerState::Closed { .. });
        self.state = BreakerState::Closed { failures: 0 };
        reopened
    }

    /// A throttling answer at `now` (a 429 or a 503, with or without a Retry-After): the
    /// endpoint is there, only loaded, and its load is the pace's business. A probe answered so
    /// closes the breaker, without the slow start a served probe calls for (the pace has heard
    /// the throttle itself and paces from it), and failures counted while closed start again
    /// from none: they were not in a row. An open breaker (a late answer to a request let
    /// through before it opened) stays open.
    pub fn on_throttled(&mut self, _now: Instant) {
        if !matches!(self.state, BreakerState::Open { .. }) {
            self.state = BreakerState::Closed { failures: 0 };
        }
    }

    /// A failure at `now` (a timeout, a reset, a 5xx other than 503): counts toward opening,
    /// or opens again after a failed probe, for an open time drawn with `draw`. A failure of a
    /// request admitted before the breaker opened changes nothing.
    pub fn on_failure(&mut self, now: Instant, draw: Draw) {
        self.fail(now, draw, false);
    }

    /// A refused connection at `now`: opens a closed breaker at once if the settings say so
    /// ([`BreakerSettings::refused_opens`]), and otherwise counts as [`Breaker::on_failure`].
    pub fn on_refused(&mut self, now: Instant, draw: Draw) {
        self.fail(now, draw, self.settings.refused_opens);
    }

    fn fail(&mut self, now: Instant, draw: Draw, at_once: bool) {
        let trips = match self.state {
            BreakerState::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures < self.settings.threshold && !at_once {
                    self.state = BreakerState::Closed { failures };
                    return;
                }
                1
            }
            BreakerState::HalfOpen { trips, .. } => trips.saturating_add(1),
            BreakerState::Open { .. } => return,
        };
        let backoff = Backoff::new(self.settings.open, self.settings.max_open, Jitter::Equal);
        let open = backoff.wait(u32::from(trips), Duration::ZERO, draw);
        self.state = BreakerState::Open {
            until: Instant::from_millis(now.as_millis().saturating_add(u64::from(open.as_millis()))),
            trips,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn trip(b: &mut Breaker, now: u64, draw: Draw) {
        for _ in 0..b.settings().threshold {
            assert_eq!(b.admit(at(now)), Ok(Permit::Closed));
            b.on_failure(at(now), draw);
        }
    }

    #[test]
    fn refuses_settings_that_cannot_work() {
        let d = BreakerSettings::DEVICE;
        assert_eq!(Breaker::new(BreakerSettings { threshold: 0, ..d }).err(), Some(BreakerError::Threshold));
        assert_eq!(
            Breaker::new(BreakerSettings { open: Duration::ZERO, ..d }).err(),
            Some(BreakerError::OpenTime)
        );
        let below = BreakerSettings { max_open: Duration::from_millis(29_999), ..d };
        assert_eq!(Breaker::new(below).err(), Some(BreakerError::OpenTime));
        assert_eq!(
            Breaker::new(BreakerSettings { max_open: Duration::MAX, ..d }).err(),
            Some(BreakerError::OpenTime)
        );
        assert!(Breaker::new(BreakerSettings { threshold: 1, max_open: d.open, ..d }).is_ok());
    }

    #[test]
    fn opens_after_the_threshold_in_a_row_and_a_success_resets_the_count() {
        let three = BreakerSettings { threshold: 3, ..BreakerSettings::DEVICE };
        let mut b = Breaker::new(three).unwrap();
        b.on_failure(at(0), Draw::ZERO);
        b.on_failure(at(0), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Closed { failures: 2 });
        assert!(!b.on_success(at(1)), "it was closed");
        b.on_failure(at(2), Draw::ZERO);
        b.on_failure(at(2), Draw::ZERO);
        assert_eq!(b.state().name(), "closed");
        b.on_failure(at(2), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: at(15_002), trips: 1 });
        // A late failure of a request let through before it opened changes nothing.
        b.on_failure(at(3), Draw::TOP);
        assert_eq!(b.state(), BreakerState::Open { until: at(15_002), trips: 1 });
    }

    #[test]
    fn the_open_time_is_jittered_by_the_draw_and_doubles_after_each_failed_probe() {
        let mut lo = Breaker::new(BreakerSettings::DEVICE).unwrap();
        let mut hi = lo;
        trip(&mut lo, 0, Draw::ZERO);
        trip(&mut hi, 0, Draw::TOP);
        assert_eq!(lo.admit(at(0)), Err(Duration::from_millis(15_000)));
        assert_eq!(hi.admit(at(0)), Err(Duration::from_millis(29_999)));
        let mut t = 15_000;
        let mut opens = Vec::new();
        for _ in 0..7 {
            assert_eq!(lo.admit(at(t)), Ok(Permit::Probe));
            lo.on_failure(at(t), Draw::ZERO);
            let BreakerState::Open { until, trips } = lo.state() else { panic!("{:?}", lo.state()) };
            opens.push(((until - at(t)).as_millis(), trips));
            t = until.as_millis();
        }
        let want =
            [(30_000, 2), (60_000, 3), (120_000, 4), (240_000, 5), (300_000, 6), (300_000, 7), (300_000, 8)];
        assert_eq!(opens, want);
        assert_eq!(lo.admit(at(t)), Ok(Permit::Probe));
        assert!(lo.on_success(at(t)), "a probe's success closes it");
        assert_eq!(lo.state(), BreakerState::Closed { failures: 0 });
        // Closed again, a new trip starts from the first open time.
        trip(&mut lo, t, Draw::ZERO);
        assert_eq!(lo.admit(at(t)), Err(Duration::from_millis(15_000)));
    }

    #[test]
    fn a_refused_connection_opens_it_at_once_where_the_settings_say_so() {
        let at_once = BreakerSettings { refused_opens: true, ..BreakerSettings::DEVICE };
        let mut b = Breaker::new(at_once).unwrap();
        assert_eq!(b.admit(at(0)), Ok(Permit::Closed));
        b.on_refused(at(100), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: at(15_100), trips: 1 });
        // A failed probe opens it again for longer, as any failure does.
        assert_eq!(b.admit(at(15_100)), Ok(Permit::Probe));
        b.on_refused(at(15_200), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: at(45_200), trips: 2 });
        // Without the setting (the default) a refusal is one failure of `threshold`, like a
        // timeout.
        let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap();
        b.on_refused(at(0), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Closed { failures: 1 });
        b.on_refused(at(100), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: at(15_100), trips: 1 });
        // And with it, other failures still count to `threshold`.
        let mut b = Breaker::new(at_once).unwrap();
        b.on_failure(at(0), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Closed { failures: 1 });
    }

    #[test]
    fn a_throttled_probe_closes_it() {
        let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap();
        trip(&mut b, 0, Draw::ZERO);
        // A late throttle while open changes nothing.
        b.on_throttled(at(10));
        assert_eq!(b.state(), BreakerState::Open { until: at(15_000), trips: 1 });
        // The probe answered with a 503 (or a 429): the endpoint is there, closed.
        assert_eq!(b.admit(at(15_000)), Ok(Permit::Probe));
        b.on_throttled(at(15_100));
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
        // A throttle between two failures: they were not in a row.
        b.on_failure(at(16_000), Draw::ZERO);
        b.on_throttled(at(16_100));
        b.on_failure(at(16_200), Draw::ZERO);
        assert_eq!(b.state(), BreakerState::Closed { failures: 1 });
    }

    #[test]
    fn one_probe_at_a_time_until_it_answers_or_times_out() {
        let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap();
        assert_eq!(b.wait(at(0)), Duration::ZERO);
        trip(&mut b, 0, Draw::ZERO);
        // `wait` says what `admit` would, and asks for nothing.
        assert_eq!(b.wait(at(5_000)), Duration::from_millis(10_000));
        assert_eq!(b.wait(at(15_000)), Duration::ZERO);
        assert_eq!(b.state(), BreakerState::Open { until: at(15_000), trips: 1 });
        assert_eq!(b.admit(at(14_999)), Err(Duration::from_millis(1)));
        assert_eq!(b.admit(at(15_000)), Ok(Permit::Probe));
        assert_eq!(b.admit(at(15_000)), Err(Duration::from_millis(30_000)));
        assert_eq!(b.wait(at(15_000)), Duration::from_millis(30_000));
        assert_eq!(b.admit(at(44_999)), Err(Duration::from_millis(1)));
        assert_eq!(b.wait(at(45_000)), Duration::ZERO);
        // The probe never answered (its task was cancelled): another goes after `open`.
        assert_eq!(b.admit(at(45_000)), Ok(Permit::Probe));
        assert_eq!(b.state(), BreakerState::HalfOpen { since: at(45_000), trips: 1 });
        assert_eq!(b.state().name(), "half_open");
    }
}
