//! The outbox drain's rules, with no I/O: what a call's verdict does to its reading, when the
//! outbox is held and until when, the pause between rounds, and where a reset picks up.
//!
//! A device's uplink walks its outbox in rounds, one call a reading, oldest first. Between
//! calls it asks a [`Drain`]; after each call it tells it the verdict and hears the reading's
//! [`Fate`]; at a round's end it takes the pause. The same `Drain` runs in the firmware and in
//! the fleet simulation, so the rules are written once.
//!
//! - **Landed** (`ok`): the reading leaves the outbox.
//! - **Failed, the reading's fault** ([`Blame::Reading`]: a 400, a 422): the reading goes to a
//!   dead letter with its reason, and the round goes on. Should every reading fail so (a
//!   proxy that answers 400 to anything), the drain stops believing it after
//!   [`DrainSettings::suspect_after`] in a row with nothing landed: it holds the outbox as for
//!   an endpoint fault, and from then on dead-letters at most one reading a probe.
//! - **Failed, the endpoint's fault** ([`Blame::Endpoint`]: a 401, a 404, a TLS refusal): the
//!   reading stays, the round ends, and the whole outbox is held on a slow backoff of its own
//!   ([`DrainSettings::hold_base`] doubling to [`DrainSettings::hold_cap`]), one probe at a
//!   time: a fleet behind a revoked credential sends a few requests a device an hour.
//! - **Gave up, unknown, cancelled**: the reading stays for a later round. A server's asked
//!   wait is never dropped: a call that ended with a Retry-After (or a CoAP Max-Age) it did not
//!   wait out, whatever ended it, holds the outbox until then; an open breaker holds it for
//!   its open time.
//! - **Every hold has a cap**: [`DrainSettings::hold_limit`], whatever a server asks.
//!
//! ```
//! use wary::{Drain, DrainSettings, Draw, Duration, Failure, Fate, Instant, Table, Verdict};
//! let mut drain = Drain::<u32>::new(DrainSettings::DEVICE).unwrap();
//! let now = Instant::from_millis(1_000);
//! drain.start_round();
//! // A rotated credential: the reading stays, and the outbox is held for a minute or so.
//! let s = drain.settle(7, &Verdict::Failed, Some(&Failure::status(401)), &Table::DEFAULT, now, Duration::ZERO, Draw::ZERO);
//! assert_eq!((s.fate, s.end_round), (Fate::Keep, true));
//! assert_eq!(drain.held(now).map(|(_, until)| until), Some(Instant::from_millis(31_000)));
//! // A reading the server can never take goes to a dead letter; the round goes on.
//! drain.start_round();
//! let s = drain.settle(8, &Verdict::Failed, Some(&Failure::status(422)), &Table::DEFAULT, now, Duration::ZERO, Draw::ZERO);
//! assert_eq!((s.fate, s.end_round), (Fate::DeadLetter { reason: 422 }, false));
//! ```

use crate::backoff::{Backoff, Draw, Jitter, Sequence};
use crate::classify::{Blame, Failure, Table};
use crate::decide::{GiveUp, Verdict};
use crate::error::DrainError;
use crate::pace::Pace;
use crate::time::{Duration, Instant};

/// The drain's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DrainSettings {
    /// The ceiling of the pause after the first round in a row that kept a reading; it doubles
    /// with each such round.
    pub round_base: Duration,
    /// The longest pause between rounds.
    pub round_cap: Duration,
    /// The ceiling of the first wait before a probe after an endpoint fault; it doubles with
    /// each probe the endpoint refuses.
    pub hold_base: Duration,
    /// The longest wait between probes of a refusing endpoint: how long a fixed endpoint can
    /// stay unprobed.
    pub hold_cap: Duration,
    /// The longest any hold lasts, whatever a server asked for: a Retry-After of days does not
    /// park a device for days.
    pub hold_limit: Duration,
    /// Readings in a row failed as their own fault, with nothing landed, after which the next
    /// such failure is read as the endpoint's (0: never).
    pub suspect_after: u32,
}

impl DrainSettings {
    /// A device's: rounds paused from 500 ms doubling to 30 s; after an endpoint fault a probe
    /// from about a minute doubling to an hour; no hold longer than an hour; three reading
    /// faults in a row and the fourth is the endpoint's.
    pub const DEVICE: DrainSettings = DrainSettings {
        round_base: Duration::from_millis(500),
        round_cap: Duration::from_secs(30),
        hold_base: Duration::from_secs(60),
        hold_cap: Duration::from_secs(3600),
        hold_limit: Duration::from_secs(3600),
        suspect_after: 3,
    };

    /// The settings, or why they are refused.
    pub const fn check(&self) -> Result<(), DrainError> {
        if self.round_base.as_millis() == 0 || self.hold_base.as_millis() == 0 {
            return Err(DrainError::ZeroBase);
        }
        if self.round_cap.as_millis() < self.round_base.as_millis()
            || self.hold_cap.as_millis() < self.hold_base.as_millis()
        {
            return Err(DrainError::CapBelowBase);
        }
        if self.hold_limit.as_millis() < self.hold_base.as_millis() {
            return Err(DrainError::LimitBelowBase);
        }
        Ok(())
    }
}

/// Why the outbox is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Hold {
    /// The server asked for a wait (Retry-After, Max-Age) the call did not wait out.
    Asked {
        /// What it asked for (the hold is at most [`DrainSettings::hold_limit`]).
        asked: Duration,
    },
    /// The endpoint's circuit breaker is open.
    Breaker,
    /// The endpoint refused: `probes` refusals in a row, the last with `reason`
    /// ([`reason`]). The next probe waits on the hold's backoff.
    Endpoint {
        /// The status (or protocol code as a status) of the last refusal; 0 for a failure
        /// without one (TLS).
        reason: u16,
        /// Refusals in a row, this one included.
        probes: u32,
    },
}

/// What a call's verdict does to its reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Fate {
    /// It landed: it leaves the outbox.
    Landed,
    /// It can never succeed as it is: it goes to the dead letter with `reason` ([`reason`]).
    DeadLetter {
        /// The status (or protocol code as a status) the server refused it with.
        reason: u16,
    },
    /// It stays for a later round.
    Keep,
}

/// What [`Drain::settle`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Settled {
    /// The reading's fate.
    pub fate: Fate,
    /// The round ends here: the outbox is held, and the other readings would meet the same.
    pub end_round: bool,
    /// The hold this call started, if it started one (also in [`Drain::held`]).
    pub hold: Option<(Hold, Instant)>,
}

/// What the application can show of the uplink: delivering, or held and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Health {
    /// Nothing holds the outbox.
    Delivering,
    /// The outbox is held until `until`.
    Held {
        /// Why.
        hold: Hold,
        /// Until when (the next probe).
        until: Instant,
    },
}

/// How far the drain had gone when a round kept readings, for the flash: after a reset,
/// [`Drain::resume`] picks up from here rather than from zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RoundEnd<Id> {
    /// The pause before the next round (zero when the round kept nothing).
    pub pause: Duration,
    /// The oldest reading the round kept and the pauses taken in a row: `None` when the round
    /// kept nothing.
    pub kept: Option<(Id, u32)>,
}

/// The status of `failure` as a dead letter's or a hold's reason: its status (a CoAP or MQTT
/// code is one, as the transport maps it), or 0 for a failure without one.
pub const fn reason(failure: &Failure) -> u16 {
    match failure.code() {
        Some(code) => code,
        None => 0,
    }
}

/// The pace's wait before the next call, asked on a copy (the call's own admission takes the
/// token): `None` when a request may go now or nothing paces the endpoint. Ask again after the
/// wait: a wait given early is a lower bound while the rate climbs.
pub fn pace_wait(pace: Option<&Pace>, now: Instant) -> Option<Duration> {
    let mut copy = *pace?;
    copy.acquire(now).err()
}

/// The drain of one outbox: the round pause, the hold, and the tallies of the round under way.
/// `Id` is the outbox's record id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Drain<Id> {
    settings: DrainSettings,
    pause: Sequence,
    probes: Sequence,
    hold: Option<(Hold, Instant)>,
    /// The endpoint fault in force since the last landing: its reason and refusals in a row.
    endpoint: Option<(u16, u32)>,
    /// Readings failed as their own fault in a row since the last landing.
    suspects: u32,
    kept: u32,
    landed: u32,
    first_kept: Option<Id>,
}

impl<Id: Copy> Drain<Id> {
    /// A drain with nothing held, or why `settings` are refused.
    pub const fn new(settings: DrainSettings) -> Result<Self, DrainError> {
        if let Err(e) = settings.check() {
            return Err(e);
        }
        Ok(Drain {
            settings,
            pause: Sequence::new(Backoff::new(settings.round_base, settings.round_cap, Jitter::Equal)),
            probes: Sequence::new(Backoff::new(settings.hold_base, settings.hold_cap, Jitter::Equal)),
            hold: None,
            endpoint: None,
            suspects: 0,
            kept: 0,
            landed: 0,
            first_kept: None,
        })
    }

    /// Its settings.
    pub const fn settings(&self) -> &DrainSettings {
        &self.settings
    }

    /// After a reset: `pauses` rounds in a row had kept a reading, and `refusals` (with the
    /// last refusal's reason) probes in a row had been refused by the endpoint, as flash kept
    /// them. The wait before the first round is the next pause's, never zero; a hold goes on
    /// with the next probe's wait (in [`Drain::held`]). Returns the pause.
    pub fn resume(
        &mut self,
        now: Instant,
        pauses: Option<u32>,
        refusals: Option<(u32, u16)>,
        draw: Draw,
    ) -> Duration {
        let pause = match pauses {
            Some(step) => {
                self.pause.resume(step);
                self.pause.next(draw)
            }
            None => Duration::ZERO,
        };
        if let Some((probes, reason)) = refusals.filter(|(probes, _)| *probes > 0) {
            self.probes.resume(probes.saturating_sub(1));
            self.endpoint = Some((reason, probes.saturating_sub(1)));
            self.hold_endpoint(reason, now, draw);
        }
        pause
    }

    /// What holds the outbox at `now`, and until when; `None`: a call may start.
    pub fn held(&self, now: Instant) -> Option<(Hold, Instant)> {
        self.hold.filter(|(_, until)| now < *until)
    }

    /// What the application can show at `now`.
    pub fn health(&self, now: Instant) -> Health {
        match self.held(now) {
            Some((hold, until)) => Health::Held { hold, until },
            None => Health::Delivering,
        }
    }

    /// The endpoint fault in force, for the flash: refusals in a row and the last reason;
    /// `None` once something landed.
    pub const fn refusals(&self) -> Option<(u32, u16)> {
        match self.endpoint {
            Some((reason, probes)) => Some((probes, reason)),
            None => None,
        }
    }

    /// A round starts.
    pub fn start_round(&mut self) {
        self.kept = 0;
        self.landed = 0;
        self.first_kept = None;
    }

    /// Reading `id`'s call ended with `verdict`, its last attempt's failure `last` (none if no
    /// attempt was sent), blamed by `table`, at `now`; `breaker_wait` is how long the endpoint's
    /// breaker stays open (for a call it refused), `draw` a fresh draw for a hold's wait.
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &mut self,
        id: Id,
        verdict: &Verdict,
        last: Option<&Failure>,
        table: &Table,
        now: Instant,
        breaker_wait: Duration,
        draw: Draw,
    ) -> Settled {
        let why = last.map_or(0, reason);
        let (fate, hold) = match verdict {
            Verdict::Ok => {
                self.landed = self.landed.saturating_add(1);
                self.endpoint = None;
                self.suspects = 0;
                self.probes.reset();
                (Fate::Landed, None)
            }
            // A failed call with no attempt cannot happen; were it to, nothing is known of the
            // reading, so it stays.
            Verdict::Failed => match last.map_or(Blame::Endpoint, |f| table.blame(f)) {
                Blame::Endpoint => (Fate::Keep, Some(self.hold_endpoint(why, now, draw))),
                Blame::Reading
                    if self.settings.suspect_after > 0 && self.suspects >= self.settings.suspect_after =>
                {
                    // Too many readings in a row refused as their own fault: the endpoint is
                    // suspect. The first time the reading stays; on a probe that meets the
                    // same, it goes (at most one a probe), and the hold goes on either way.
                    let fate =
                        if self.endpoint.is_some() { Fate::DeadLetter { reason: why } } else { Fate::Keep };
                    (fate, Some(self.hold_endpoint(why, now, draw)))
                }
                Blame::Reading => {
                    self.suspects = self.suspects.saturating_add(1);
                    (Fate::DeadLetter { reason: why }, None)
                }
            },
            Verdict::Unknown | Verdict::Cancelled => (Fate::Keep, self.asked(last, now)),
            Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }) => {
                (Fate::Keep, Some(self.hold_asked(*asked, now)))
            }
            Verdict::GaveUp(GiveUp::CircuitOpen) => {
                let until = now.saturating_add(breaker_wait.min(self.settings.hold_limit));
                (Fate::Keep, Some(self.set_hold(Hold::Breaker, until)))
            }
            Verdict::GaveUp(_) => (Fate::Keep, self.asked(last, now)),
        };
        if fate == Fate::Keep {
            self.kept = self.kept.saturating_add(1);
            if self.first_kept.is_none() {
                self.first_kept = Some(id);
            }
        }
        Settled { fate, end_round: hold.is_some(), hold }
    }

    /// The round is over: its pause (a round that landed something starts the pauses again; one
    /// that kept a reading pauses, one doubling longer while `throttled`, the fleet budget
    /// refusing retries) and what flash keeps of it.
    pub fn end_round(&mut self, throttled: bool, draw: Draw) -> RoundEnd<Id> {
        if self.landed > 0 {
            self.pause.reset();
        }
        match self.first_kept {
            Some(id) if self.kept > 0 => {
                let pause = self.pause.next_raised(throttled as u32, draw);
                RoundEnd { pause, kept: Some((id, self.pause.step())) }
            }
            _ => RoundEnd { pause: Duration::ZERO, kept: None },
        }
    }

    /// A hold for what the server asked in `last`, if it asked for anything.
    fn asked(&mut self, last: Option<&Failure>, now: Instant) -> Option<(Hold, Instant)> {
        let asked = last.and_then(Failure::retry_after).filter(|a| *a > Duration::ZERO)?;
        Some(self.hold_asked(asked, now))
    }

    fn hold_asked(&mut self, asked: Duration, now: Instant) -> (Hold, Instant) {
        let until = now.saturating_add(asked.min(self.settings.hold_limit));
        // An endpoint hold that is longer already stays.
        match self.hold {
            Some((held @ Hold::Endpoint { .. }, later)) if later > until => (held, later),
            _ => self.set_hold(Hold::Asked { asked }, until),
        }
    }

    fn hold_endpoint(&mut self, reason: u16, now: Instant, draw: Draw) -> (Hold, Instant) {
        let probes = self.endpoint.map_or(0, |(_, p)| p).saturating_add(1);
        self.endpoint = Some((reason, probes));
        let wait = self.probes.next(draw).min(self.settings.hold_limit);
        self.set_hold(Hold::Endpoint { reason, probes }, now.saturating_add(wait))
    }

    fn set_hold(&mut self, hold: Hold, until: Instant) -> (Hold, Instant) {
        self.hold = Some((hold, until));
        (hold, until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Transport;

    const S: u64 = 1000;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn drain() -> Drain<u32> {
        Drain::new(DrainSettings::DEVICE).unwrap()
    }

    fn failed(d: &mut Drain<u32>, id: u32, f: Failure, now: Instant, draw: Draw) -> Settled {
        d.settle(id, &Verdict::Failed, Some(&f), &Table::DEFAULT, now, Duration::ZERO, draw)
    }

    #[test]
    fn bad_settings_are_refused() {
        let d = DrainSettings::DEVICE;
        assert_eq!(
            Drain::<u32>::new(DrainSettings { round_base: Duration::ZERO, ..d }),
            Err(DrainError::ZeroBase)
        );
        assert_eq!(
            Drain::<u32>::new(DrainSettings { hold_base: Duration::ZERO, ..d }),
            Err(DrainError::ZeroBase)
        );
        let short = Duration::from_millis(499);
        assert_eq!(Drain::<u32>::new(DrainSettings { round_cap: short, ..d }), Err(DrainError::CapBelowBase));
        let hold_cap = Duration::from_secs(59);
        assert_eq!(Drain::<u32>::new(DrainSettings { hold_cap, ..d }), Err(DrainError::CapBelowBase));
        let hold_limit = Duration::from_secs(59);
        assert_eq!(Drain::<u32>::new(DrainSettings { hold_limit, ..d }), Err(DrainError::LimitBelowBase));
        assert!(DrainSettings::DEVICE.check().is_ok());
    }

    #[test]
    fn an_endpoint_fault_keeps_the_reading_and_holds_the_outbox() {
        for f in [401, 403, 404, 405, 407, 410, 421, 501, 505, 511]
            .map(Failure::status)
            .into_iter()
            .chain([Failure::Tls, Failure::BadBody])
        {
            let mut d = drain();
            d.start_round();
            let s = failed(&mut d, 1, f, at(10 * S), Draw::ZERO);
            let reason = reason(&f);
            assert_eq!((s.fate, s.end_round), (Fate::Keep, true), "{f:?}");
            assert_eq!(s.hold, Some((Hold::Endpoint { reason, probes: 1 }, at(40 * S))), "{f:?}");
            assert_eq!(d.held(at(39 * S)), s.hold);
            assert_eq!(d.held(at(40 * S)), None, "the probe may go once the hold ends");
            assert_eq!(d.refusals(), Some((1, reason)));
            let top = failed(&mut drain(), 1, f, at(10 * S), Draw::TOP);
            assert_eq!(top.hold.map(|(_, until)| until), Some(at(70 * S - 1)), "{f:?}");
        }
    }

    #[test]
    fn refused_probes_double_up_to_the_cap_and_a_landing_starts_again() {
        let mut d = drain();
        let mut now = at(0);
        let mut waits = heapless::Vec::<u64, 16>::new();
        for _ in 0..10 {
            let s = failed(&mut d, 1, Failure::status(401), now, Draw::TOP);
            let until = s.hold.unwrap().1;
            waits.push(until.duration_since(now).as_millis().into()).unwrap();
            now = until;
        }
        // 60 s, 120 s, … up to the hour, each drawn at the top of its range.
        assert_eq!(
            waits.as_slice(),
            [
                59_999, 119_999, 239_999, 479_999, 959_999, 1_919_999, 3_599_999, 3_599_999, 3_599_999,
                3_599_999
            ]
        );
        assert_eq!(d.refusals(), Some((10, 401)));
        assert_eq!(
            d.settle(1, &Verdict::Ok, None, &Table::DEFAULT, now, Duration::ZERO, Draw::ZERO).fate,
            Fate::Landed
        );
        assert_eq!(d.refusals(), None);
        let s = failed(&mut d, 2, Failure::status(403), now, Draw::TOP);
        assert_eq!(
            s.hold,
            Some((
                Hold::Endpoint { reason: 403, probes: 1 },
                now.saturating_add(Duration::from_millis(59_999))
            ))
        );
    }

    #[test]
    fn a_reading_fault_goes_to_the_dead_letter_and_the_round_goes_on() {
        for code in [400, 409, 413, 415, 422] {
            let mut d = drain();
            d.start_round();
            let s = failed(&mut d, 1, Failure::status(code), at(0), Draw::ZERO);
            assert_eq!(s, Settled { fate: Fate::DeadLetter { reason: code }, end_round: false, hold: None });
            assert_eq!(d.held(at(0)), None);
            assert_eq!(d.end_round(false, Draw::ZERO).kept, None, "a dead letter is not kept");
        }
    }

    #[test]
    fn reading_faults_in_a_row_make_the_endpoint_suspect() {
        let mut d = drain();
        d.start_round();
        for id in 1..=3 {
            assert_eq!(
                failed(&mut d, id, Failure::status(400), at(0), Draw::ZERO).fate,
                Fate::DeadLetter { reason: 400 }
            );
        }
        // The fourth in a row with nothing landed: kept, and the outbox held.
        let s = failed(&mut d, 4, Failure::status(400), at(0), Draw::ZERO);
        assert_eq!((s.fate, s.end_round), (Fate::Keep, true));
        assert_eq!(s.hold.unwrap().0, Hold::Endpoint { reason: 400, probes: 1 });
        // The probe meets the same: that one reading goes, and the hold goes on, longer.
        let s = failed(&mut d, 4, Failure::status(400), at(30 * S), Draw::ZERO);
        assert_eq!((s.fate, s.end_round), (Fate::DeadLetter { reason: 400 }, true));
        assert_eq!(s.hold, Some((Hold::Endpoint { reason: 400, probes: 2 }, at(90 * S))));
        // A landing clears the suspicion: three more may be dead-lettered before the next hold.
        d.settle(5, &Verdict::Ok, None, &Table::DEFAULT, at(90 * S), Duration::ZERO, Draw::ZERO);
        for id in 6..=8 {
            assert_eq!(failed(&mut d, id, Failure::status(422), at(91 * S), Draw::ZERO).hold, None);
        }
        assert!(failed(&mut d, 9, Failure::status(422), at(91 * S), Draw::ZERO).hold.is_some());
        // With the rule off, every reading fault is the reading's.
        let mut off = Drain::<u32>::new(DrainSettings { suspect_after: 0, ..DrainSettings::DEVICE }).unwrap();
        for id in 1..=20 {
            assert_eq!(
                failed(&mut off, id, Failure::status(400), at(0), Draw::ZERO).fate,
                Fate::DeadLetter { reason: 400 }
            );
        }
    }

    #[test]
    fn a_table_decides_the_blame() {
        let table = Table::DEFAULT
            .with_blame(404, Blame::Reading)
            .unwrap()
            .with_transport_blame(Transport::Tls, Blame::Reading);
        let mut d = drain();
        for f in [Failure::status(404), Failure::Tls] {
            let s = d.settle(1, &Verdict::Failed, Some(&f), &table, at(0), Duration::ZERO, Draw::ZERO);
            assert_eq!(s.fate, Fate::DeadLetter { reason: reason(&f) });
        }
        let table = Table::DEFAULT.with_blame(422, Blame::Endpoint).unwrap();
        let s = d.settle(
            1,
            &Verdict::Failed,
            Some(&Failure::status(422)),
            &table,
            at(0),
            Duration::ZERO,
            Draw::ZERO,
        );
        assert_eq!(s.fate, Fate::Keep);
    }

    #[test]
    fn a_servers_asked_wait_holds_the_outbox_whatever_ended_the_call() {
        let asked = Duration::from_secs(2);
        let ra = Failure::status_after(503, asked);
        for verdict in [
            Verdict::GaveUp(GiveUp::Throttled),
            Verdict::GaveUp(GiveUp::Budget),
            Verdict::GaveUp(GiveUp::Deadline),
            Verdict::GaveUp(GiveUp::Attempts),
            Verdict::GaveUp(GiveUp::OutcomesExhausted),
            Verdict::Unknown,
            Verdict::Cancelled,
        ] {
            let mut d = drain();
            d.start_round();
            let s = d.settle(1, &verdict, Some(&ra), &Table::DEFAULT, at(5 * S), Duration::ZERO, Draw::ZERO);
            assert_eq!(
                s,
                Settled { fate: Fate::Keep, end_round: true, hold: Some((Hold::Asked { asked }, at(7 * S))) },
                "{verdict}"
            );
            // Without an asked wait the reading is kept and the round goes on.
            let s = d.settle(
                2,
                &verdict,
                Some(&Failure::status(503)),
                &Table::DEFAULT,
                at(5 * S),
                Duration::ZERO,
                Draw::ZERO,
            );
            assert_eq!((s.fate, s.end_round), (Fate::Keep, false), "{verdict}");
        }
        // A wait the call could not afford holds for what was asked.
        let mut d = drain();
        let too_long = Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: Duration::from_secs(40) });
        let s = d.settle(
            1,
            &too_long,
            Some(&Failure::status(429)),
            &Table::DEFAULT,
            at(0),
            Duration::ZERO,
            Draw::ZERO,
        );
        assert_eq!(s.hold, Some((Hold::Asked { asked: Duration::from_secs(40) }, at(40 * S))));
    }

    #[test]
    fn every_hold_has_a_cap() {
        let mut d = drain();
        let asked = Duration::MAX;
        let s = d.settle(
            1,
            &Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }),
            None,
            &Table::DEFAULT,
            at(0),
            Duration::ZERO,
            Draw::ZERO,
        );
        assert_eq!(s.hold, Some((Hold::Asked { asked }, at(3600 * S))));
        let ra = Failure::status_after(429, Duration::from_secs(1_000_000));
        let s = d.settle(
            1,
            &Verdict::GaveUp(GiveUp::Throttled),
            Some(&ra),
            &Table::DEFAULT,
            at(0),
            Duration::ZERO,
            Draw::ZERO,
        );
        assert_eq!(s.hold.unwrap().1, at(3600 * S));
        let s = d.settle(
            1,
            &Verdict::GaveUp(GiveUp::CircuitOpen),
            None,
            &Table::DEFAULT,
            at(0),
            Duration::MAX,
            Draw::ZERO,
        );
        assert_eq!(s.hold, Some((Hold::Breaker, at(3600 * S))));
        let short = DrainSettings { hold_limit: Duration::from_secs(90), ..DrainSettings::DEVICE };
        let mut d = Drain::<u32>::new(short).unwrap();
        let mut now = at(0);
        for _ in 0..5 {
            let until = failed(&mut d, 1, Failure::status(401), now, Draw::TOP).hold.unwrap().1;
            assert!(until.duration_since(now) <= Duration::from_secs(90));
            now = until;
        }
    }

    #[test]
    fn an_asked_wait_does_not_shorten_an_endpoint_hold() {
        let mut d = drain();
        let long = failed(&mut d, 1, Failure::status(401), at(0), Draw::ZERO).hold.unwrap();
        let ra = Failure::status_after(503, Duration::from_secs(1));
        let s = d.settle(
            2,
            &Verdict::GaveUp(GiveUp::Budget),
            Some(&ra),
            &Table::DEFAULT,
            at(0),
            Duration::ZERO,
            Draw::ZERO,
        );
        assert_eq!(s.hold, Some(long));
    }

    #[test]
    fn an_open_breaker_holds_for_its_open_time() {
        let mut d = drain();
        d.start_round();
        let wait = Duration::from_secs(25);
        let s = d.settle(
            3,
            &Verdict::GaveUp(GiveUp::CircuitOpen),
            None,
            &Table::DEFAULT,
            at(S),
            wait,
            Draw::ZERO,
        );
        assert_eq!(s, Settled { fate: Fate::Keep, end_round: true, hold: Some((Hold::Breaker, at(26 * S))) });
        assert_eq!(d.health(at(2 * S)), Health::Held { hold: Hold::Breaker, until: at(26 * S) });
        assert_eq!(d.health(at(26 * S)), Health::Delivering);
    }

    #[test]
    fn a_round_pauses_when_it_kept_a_reading() {
        let mut d = drain();
        d.start_round();
        let give_up = Verdict::GaveUp(GiveUp::Budget);
        d.settle(4, &give_up, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        d.settle(5, &give_up, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        assert_eq!(
            d.end_round(false, Draw::ZERO),
            RoundEnd { pause: Duration::from_millis(250), kept: Some((4, 1)) }
        );
        d.start_round();
        d.settle(5, &give_up, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        // Throttled: one doubling more (step 2 drawn as step 3).
        assert_eq!(
            d.end_round(true, Draw::ZERO),
            RoundEnd { pause: Duration::from_millis(1000), kept: Some((5, 2)) }
        );
        // A round that landed something starts the pauses again, even if it kept another.
        d.start_round();
        d.settle(5, &Verdict::Ok, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        d.settle(6, &give_up, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        assert_eq!(
            d.end_round(false, Draw::TOP),
            RoundEnd { pause: Duration::from_millis(499), kept: Some((6, 1)) }
        );
        // A round that kept nothing does not pause.
        d.start_round();
        d.settle(6, &Verdict::Ok, None, &Table::DEFAULT, at(0), Duration::ZERO, Draw::ZERO);
        assert_eq!(d.end_round(false, Draw::TOP), RoundEnd { pause: Duration::ZERO, kept: None });
    }

    #[test]
    fn a_reset_picks_up_the_pause_and_the_hold() {
        let mut d = drain();
        // Three kept rounds before the reset: the first round waits the fourth pause (2 s ceiling).
        assert_eq!(d.resume(at(0), Some(3), None, Draw::ZERO), Duration::from_millis(2000));
        assert_eq!(d.held(at(0)), None);
        let mut d = drain();
        // Two refusals before the reset: the hold goes on, waiting the second wait again (a
        // 120 s ceiling, half of it at the lowest draw), not the first.
        assert_eq!(d.resume(at(0), None, Some((2, 401)), Draw::ZERO), Duration::ZERO);
        assert_eq!(d.held(at(0)), Some((Hold::Endpoint { reason: 401, probes: 2 }, at(60 * S))));
        assert_eq!(d.refusals(), Some((2, 401)));
        // No mark: nothing to wait for.
        let mut d = drain();
        assert_eq!(d.resume(at(0), None, None, Draw::TOP), Duration::ZERO);
        assert_eq!(d.held(at(0)), None);
    }

    /// SplitMix64, for draws in the long-run tests.
    fn draws(seed: u64) -> impl FnMut() -> Draw {
        let mut x = seed;
        move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            Draw::unit(((z ^ (z >> 31)) >> 32) as u32)
        }
    }

    /// A ten-minute endpoint fault with the defaults costs a device at most 10 requests: the
    /// one that met it and the probes after it, over a thousand draws.
    #[test]
    fn a_ten_minute_endpoint_fault_costs_at_most_ten_requests() {
        let mut most = 0;
        for seed in 0..1000 {
            let mut draw = draws(seed);
            let mut d = drain();
            let (mut now, mut sent) = (at(0), 0u32);
            while now < at(600 * S) {
                if let Some((_, until)) = d.held(now) {
                    now = until;
                    continue;
                }
                sent += 1;
                d.start_round();
                assert!(failed(&mut d, 1, Failure::status(401), now, draw()).end_round);
                d.end_round(false, draw());
            }
            most = most.max(sent);
        }
        // 0 s, then probes at least 30, 60, 120 and 240 s apart: five at most.
        assert!(most <= 10, "{most}");
        assert_eq!(most, 5);
    }

    #[test]
    fn the_pace_is_asked_on_a_copy() {
        assert_eq!(pace_wait(None, at(0)), None);
        let mut pace = Pace::new(crate::PaceSettings::DEVICE).unwrap();
        let before = pace;
        // However the pace answers, asking does not take its token.
        let _ = pace_wait(Some(&pace), at(0));
        assert_eq!(pace, before);
        // A 503 closes it: at its start rate of 0.1 a second, the burst of two goes and the
        // third request waits.
        pace.on_throttled(at(0), Draw::ZERO);
        let mut taken = 0;
        while taken < 100 && pace.acquire(at(0)).is_ok() {
            taken += 1;
        }
        assert!(taken < 100, "a closed pace kept giving tokens");
        assert!(pace_wait(Some(&pace), at(0)).is_some_and(|w| w > Duration::ZERO));
    }
}
