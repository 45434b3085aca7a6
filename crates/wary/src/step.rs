//! One call's attempts, step by step, with no I/O: the bookkeeping every retry loop needs.
//!
//! Whoever sends the attempts (the async [`Runner`](crate::Runner) on a device, a tower policy
//! or a reqwest middleware on a host) reads its own clock and draw and hands them in; an
//! [`Attempts`] numbers the attempts, measures them, asks the decision (with the fleet budget
//! when there is one) and builds the ledger record. The loop around it only sends, sleeps and
//! writes the record where its ledger is.
//!
//! ```
//! use wary::{Attempts, Decision, Draw, Duration, Instant, Key, Operation, Outcome, Policy, Preset};
//! let p = Policy::builder(Preset::Default).deadline(Duration::from_secs(10)).build().unwrap();
//! let key = Key::from_parts(1, 1, 1);
//! let mut call = Attempts::new(Instant::from_millis(0));
//! // Before the first attempt: its number, and how long it may take.
//! let remaining = call.start(&p, Instant::from_millis(0));
//! assert_eq!((call.number(), remaining), (1, Some(Duration::from_secs(10))));
//! // After it: the decision and its record.
//! let (d, rec) = call.end(&p, None, Operation::Idempotent, key, Outcome::status(503), Draw::ZERO, Instant::from_millis(40));
//! assert_eq!(d, Decision::Retry { wait: Duration::from_millis(50) });
//! assert_eq!((rec.attempt, rec.attempt_time, rec.wait), (1, Duration::from_millis(40), Duration::from_millis(50)));
//! assert_eq!(call.number(), 2);
//! ```

use crate::backoff::Draw;
use crate::breaker::{Breaker, Phase};
use crate::classify::{Failure, Operation, Outcome};
use crate::decide::{CallState, Decision, GiveUp, Verdict};
use crate::key::Key;
use crate::pace::{Pace, PaceView, Signal};
use crate::policy::Policy;
use crate::record::{Admission, Record};
use crate::throttle::FleetBudget;
use crate::time::{Duration, Instant};

/// What the send rate and the circuit breaker say before an attempt ([`Attempts::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Gate {
    /// Send the attempt now.
    Go,
    /// Wait this long (charged to the call's wait budget), then send: the pace's token is
    /// taken for then.
    Wait(Duration),
    /// The call ends here, before the attempt: the breaker is open
    /// ([`GiveUp::CircuitOpen`]), or the pace's wait would pass the wait budget or the deadline.
    Stop(GiveUp),
}

/// What a runner asks of the endpoint it sends to: its send rate and its circuit breaker, if it
/// has them. `()` has neither (a plain call, which pays nothing for them); [`Guards`] borrows a
/// [`Pace`] and a [`Breaker`] owned by the task; a host shares them across tasks behind its own
/// lock by implementing this on its handle.
pub trait Endpoint {
    /// [`Attempts::admit`] with this endpoint's pace and breaker.
    fn admit(&mut self, call: &mut Attempts, policy: &Policy, now: Instant) -> Gate;
    /// [`Attempts::report`] to this endpoint's pace and breaker.
    fn report(&mut self, outcome: &Outcome, draw: Draw, now: Instant);
    /// False when there is nothing to ask or tell (the runner then takes no extra draw).
    fn is_active(&self) -> bool;
}

impl Endpoint for () {
    fn admit(&mut self, _: &mut Attempts, _: &Policy, _: Instant) -> Gate {
        Gate::Go
    }
    fn report(&mut self, _: &Outcome, _: Draw, _: Instant) {}
    fn is_active(&self) -> bool {
        false
    }
}

/// A pace and a breaker owned by the task that sends to their endpoint, each optional.
#[derive(Debug, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Guards<'a> {
    /// The endpoint's send rate.
    pub pace: Option<&'a mut Pace>,
    /// The endpoint's circuit breaker.
    pub breaker: Option<&'a mut Breaker>,
}

impl<'a> Guards<'a> {
    /// Both, borrowed for the runner's life.
    pub fn new(pace: &'a mut Pace, breaker: &'a mut Breaker) -> Self {
        Guards { pace: Some(pace), breaker: Some(breaker) }
    }
}

impl Endpoint for Guards<'_> {
    fn admit(&mut self, call: &mut Attempts, policy: &Policy, now: Instant) -> Gate {
        call.admit(policy, self.pace.as_deref_mut(), self.breaker.as_deref_mut(), now)
    }
    fn report(&mut self, outcome: &Outcome, draw: Draw, now: Instant) {
        Attempts::report(self.pace.as_deref_mut(), self.breaker.as_deref_mut(), outcome, draw, now);
    }
    fn is_active(&self) -> bool {
        self.pace.is_some() || self.breaker.is_some()
    }
}

/// One call's attempts: its [`CallState`], when it started and when its current attempt
/// started (as the call's time then, 4 bytes), and what the endpoint said about the next
/// attempt, for its record. `Copy`, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Attempts {
    state: CallState,
    started: Instant,
    /// The call's time when the current attempt started.
    attempt_started: Duration,
    /// The endpoint's last answer ([`Attempts::admit`]), for the next record.
    admission: Option<Admission>,
}

impl Attempts {
    /// A call that started at `start` and has made no attempt.
    pub const fn new(start: Instant) -> Self {
        Attempts { state: CallState::new(), started: start, attempt_started: Duration::ZERO, admission: None }
    }

    /// The decision's state: attempts decided, time waited.
    pub const fn state(&self) -> &CallState {
        &self.state
    }

    /// Attempts decided so far.
    pub const fn attempts(&self) -> u32 {
        self.state.attempts()
    }

    /// The number of the next attempt (or of the one under way), from 1.
    pub const fn number(&self) -> u32 {
        self.state.attempts().saturating_add(1)
    }

    /// When the call started.
    pub const fn started(&self) -> Instant {
        self.started
    }

    /// The call's time at `now`.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.duration_since(self.started)
    }

    /// Marks the start of attempt [`Attempts::number`] at `now`; returns the time left before
    /// the call's deadline (`None` without one): an attempt caps its own timeout to it, so a
    /// slow answer cannot hold the call past its deadline.
    pub fn start(&mut self, policy: &Policy, now: Instant) -> Option<Duration> {
        let elapsed = self.elapsed(now);
        self.attempt_started = elapsed;
        policy.deadline().map(|d| d.saturating_sub(elapsed))
    }

    /// Asks the endpoint's breaker and pace, when the call has them, whether the next attempt
    /// may go at `now`; call it once before every attempt, the first included.
    ///
    /// An open breaker ends the call at once ([`Gate::Stop`] with [`GiveUp::CircuitOpen`]):
    /// waiting out its open time inside one call would hold the caller for minutes with
    /// nothing sent; the caller (an outbox) keeps the work for later. The pace's wait is a wait
    /// like a backoff's: it counts toward the wait budget, and one that would pass the budget
    /// or the deadline ends the call ([`GiveUp::Budget`], [`GiveUp::Deadline`]) instead of
    /// sleeping past it. Otherwise the pace's token is taken for the end of its wait
    /// ([`Gate::Wait`]: send then, without asking again) and the breaker is asked for that
    /// instant, so a half-open breaker's one probe is taken only by an attempt that is sent.
    ///
    /// What they said is kept, in integer units ([`Admission`]), for the ledger: the next
    /// attempt's record carries it, or, when they end the call after a retry was chosen, the
    /// last record ([`Attempts::refused`]).
    pub fn admit(
        &mut self,
        policy: &Policy,
        pace: Option<&mut Pace>,
        breaker: Option<&mut Breaker>,
        now: Instant,
    ) -> Gate {
        let elapsed = self.elapsed(now);
        let mut seen = Admission { at: elapsed, ..Admission::default() };
        // A copy is asked first: a half-open breaker's probe is not taken yet.
        if let Some(peek) = breaker.as_deref() {
            seen.breaker = Some(peek.state().phase());
            if let Err(left) = { *peek }.admit(now) {
                seen.breaker_left = left;
                self.admission = Some(seen);
                return Gate::Stop(GiveUp::CircuitOpen);
            }
        }
        seen.pace = pace.as_deref().map_or(PaceView::default(), |p| p.view(now));
        seen.wait = seen.pace.wait();
        self.admission = Some(seen);
        if seen.wait > Duration::ZERO
            && let Err(why) = policy.charge_wait(&mut self.state, seen.wait, Some(elapsed))
        {
            return Gate::Stop(why);
        }
        let go = Instant::from_millis(now.as_millis().saturating_add(u64::from(seen.wait.as_millis())));
        if let Some(b) = breaker
            && let Err(left) = b.admit(go)
        {
            // Not reached while nothing else changes the breaker: one that admits now admits
            // later too. Kept so a breaker is never passed.
            seen.breaker_left = left;
            self.admission = Some(seen);
            return Gate::Stop(GiveUp::CircuitOpen);
        }
        if let Some(p) = pace {
            p.take(now);
        }
        if seen.wait == Duration::ZERO { Gate::Go } else { Gate::Wait(seen.wait) }
    }

    /// [`Attempts::admit`] through `endpoint` at `at` (now, or the instant a retry's backoff
    /// wait ends): the time from `at` until the attempt may go (its token is taken for then),
    /// or why the call ends there. The pace's wait is charged as it is granted.
    pub fn admit_at<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        policy: &Policy,
        at: Instant,
    ) -> Result<Duration, GiveUp> {
        match endpoint.admit(self, policy, at) {
            Gate::Go => Ok(Duration::ZERO),
            Gate::Wait(w) => Ok(w),
            Gate::Stop(why) => Err(why),
        }
    }

    /// The record of an attempt after which the endpoint refused the retry the policy chose:
    /// the call ends there, `gave_up` with `why`, waits for nothing, and carries what the
    /// endpoint said ([`Record::refused`]).
    pub fn refused(&mut self, record: Record, why: GiveUp) -> Record {
        Record {
            wait: Duration::ZERO,
            verdict: Some(Verdict::GaveUp(why)),
            refused: self.admission.take(),
            ..record
        }
    }

    /// Tells the endpoint's pace and breaker how an attempt that ended at `now` went: the pace
    /// hears its [`Signal`] (`draw` places the next request after a cut, and draws the
    /// breaker's open time); the breaker counts refused connections (which open it at once
    /// where [`crate::BreakerSettings::refused_opens`] says so), timeouts, resets, TLS
    /// failures and 5xx other than 503 as the endpoint being down, and any answer it served, a
    /// 4xx included, as up. A throttle (429, 503) says the endpoint is there, only loaded (the
    /// pace's business): it closes a half-open breaker without a slow start, ends a run of
    /// failures, and never opens one ([`Breaker::on_throttled`]); a cancel and a broken body
    /// change nothing.
    ///
    /// When the breaker opens from closed, the pace hears that the endpoint is down
    /// ([`Pace::on_down`]): it reads an outage, as after two throttles in a row, and its next
    /// request (the breaker's probe, when the breaker lets one through) waits for its rate too.
    /// When a success then closes the breaker, the pace starts again by its own outage rule,
    /// over the fleet's window; a pace that did not read the outage starts slowly
    /// ([`Pace::slow_start_drawn`]). Either way the whole backlog does not go at once.
    pub fn report(
        pace: Option<&mut Pace>,
        breaker: Option<&mut Breaker>,
        outcome: &Outcome,
        draw: Draw,
        now: Instant,
    ) {
        let signal = Signal::of(outcome);
        let mut came_back = false;
        let mut went_down = false;
        if let Some(b) = breaker {
            let was_closed = b.state().phase() == Phase::Closed;
            match (signal, outcome) {
                (Signal::Served, _) => came_back = b.on_success(now),
                (Signal::Throttled | Signal::Asked { .. }, _) => b.on_throttled(now),
                (Signal::Neither, Outcome::Failure(Failure::Refused)) => b.on_refused(now, draw),
                (
                    Signal::Neither,
                    Outcome::Failure(
                        Failure::ConnectTimeout
                        | Failure::ResponseTimeout
                        | Failure::Reset
                        | Failure::Tls
                        | Failure::Status { code: 500..=599, .. },
                    ),
                ) => b.on_failure(now, draw),
                _ => {}
            }
            went_down = was_closed && b.state().phase() == Phase::Open;
        }
        if let Some(p) = pace {
            if went_down {
                p.on_down(now, draw);
            }
            // A pace that read the outage starts again by its own rule when the endpoint is back.
            let knew = p.in_outage();
            p.report(now, signal, draw);
            if came_back && !knew {
                p.slow_start_drawn(now, draw);
            }
        }
    }

    /// Decides after the attempt that ended at `now` with `outcome`: the decision (through the
    /// fleet budget when there is one, which this charges) and the attempt's ledger record.
    /// `draw` decides the wait if the call retries.
    #[allow(clippy::too_many_arguments)] // each is one input of the step, read by the caller
    pub fn end(
        &mut self,
        policy: &Policy,
        fleet: Option<&FleetBudget>,
        op: Operation,
        key: Key,
        outcome: Outcome,
        draw: Draw,
        now: Instant,
    ) -> (Decision, Record) {
        let number = self.number();
        let elapsed = self.elapsed(now);
        let decision = match fleet {
            Some(fleet) => {
                policy.decide_with_fleet(&mut self.state, op, &outcome, draw, Some(elapsed), fleet)
            }
            None => policy.decide(&mut self.state, op, &outcome, draw, Some(elapsed)),
        };
        let attempt_time = elapsed.saturating_sub(self.attempt_started);
        let mut record =
            Record::decided(policy, key, number, op, outcome, draw, decision, attempt_time, elapsed);
        record.admitted = self.admission.take();
        (decision, record)
    }

    /// [`Attempts::end`]'s answer for an attempt that cannot be sent again (a request whose
    /// body cannot be copied): a retry the policy would make ends the call `gave_up
    /// (attempts)` instead, as if the attempt cap were reached, and its record says so.
    pub fn unrepeatable((decision, record): (Decision, Record)) -> (Decision, Record) {
        match decision {
            Decision::Retry { .. } => {
                let gave_up = Verdict::GaveUp(GiveUp::Attempts);
                (Decision::Done(gave_up), Record { wait: Duration::ZERO, verdict: Some(gave_up), ..record })
            }
            Decision::Done(_) => (decision, record),
        }
    }

    /// True if a write a probe found not landed may be sent once more at `now`: the decision's
    /// stop rules for a retry with no wait ([`Policy::may_resend`]).
    pub fn may_resend(&self, policy: &Policy, fleet: Option<&FleetBudget>, now: Instant) -> bool {
        policy.may_resend(&self.state, self.elapsed(now), fleet)
    }

    /// The last record of the call, cancelled at `now`.
    pub fn cancelled(&self, policy: &Policy, op: Operation, key: Key, now: Instant) -> Record {
        Record::cancelled(policy, key, self.state.attempts(), op, self.elapsed(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Class, Preset};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn a_step_numbers_times_decides_and_records_each_attempt() {
        let p = Policy::builder(Preset::Default).deadline(ms(1_000)).build().unwrap();
        let key = Key::from_parts(7, 1, 2);
        let mut a = Attempts::new(at(100));
        assert_eq!(a.start(&p, at(150)), Some(ms(950)));
        let (d, r) = a.end(&p, None, Operation::Idempotent, key, Outcome::status(503), Draw::ZERO, at(190));
        assert_eq!(d, Decision::Retry { wait: ms(50) });
        assert_eq!((r.attempt, r.attempt_time, r.total_time), (1, ms(40), ms(90)));
        assert_eq!(
            (r.class, r.draw, r.verdict, r.policy),
            (Class::Retry, Some(Draw::ZERO), None, p.fingerprint())
        );
        assert_eq!(a.start(&p, at(250)), Some(ms(850)));
        let (d, r) = a.end(&p, None, Operation::Idempotent, key, Outcome::Ok, Draw::ZERO, at(260));
        assert_eq!(d, Decision::Done(Verdict::Ok));
        assert_eq!((r.attempt, r.attempt_time, r.total_time, r.draw), (2, ms(10), ms(160), None));
        assert_eq!(a.attempts(), 2);
        let c = a.cancelled(&p, Operation::Idempotent, key, at(300));
        assert_eq!((c.attempt, c.total_time, c.verdict), (2, ms(200), Some(Verdict::Cancelled)));
    }

    #[test]
    fn what_the_pace_and_the_breaker_said_goes_into_the_records() {
        use crate::{BreakerSettings, PaceSettings, Phase};
        let p = Policy::builder(Preset::Default).build().unwrap();
        let key = Key::from_parts(1, 1, 1);
        let settings = PaceSettings { start_milli: 1_000, burst: 1, ..PaceSettings::DEVICE };
        let mut pace = Pace::new(settings).unwrap();
        pace.on_throttled(at(0), Draw::ZERO); // 0.5/s, the next request 1 s away
        let mut breaker = Breaker::new(BreakerSettings::DEVICE).unwrap();
        let mut a = Attempts::new(at(0));
        // One ask: the wait is the bucket's, the token is taken for its end.
        let mut guards = Guards::new(&mut pace, &mut breaker);
        assert_eq!(a.admit_at(&mut guards, &p, at(0)), Ok(ms(1_000)));
        assert_eq!(a.state().waited(), ms(1_000), "charged to the budget");
        a.start(&p, at(1_000));
        let (_, r) = a.end(
            &p,
            None,
            Operation::KeyedWrite,
            key,
            Outcome::Failure(Failure::Refused),
            Draw::ZERO,
            at(1_010),
        );
        let said = r.admitted.unwrap();
        assert_eq!((said.at, said.wait, said.pace.rate_milli), (ms(0), ms(1_000), 500));
        assert_eq!(said.pace.wait(), said.wait);
        assert_eq!((said.breaker, said.breaker_left), (Some(Phase::Closed), ms(0)));
        // The breaker opens after two failures; the retry it refuses ends the call, and the
        // last record says what refused it.
        breaker.on_failure(at(1_010), Draw::ZERO);
        breaker.on_failure(at(1_010), Draw::ZERO);
        let mut guards = Guards::new(&mut pace, &mut breaker);
        assert_eq!(a.admit_at(&mut guards, &p, at(1_100)), Err(GiveUp::CircuitOpen));
        let last = a.refused(r, GiveUp::CircuitOpen);
        let refused = last.refused.unwrap();
        assert_eq!(
            (refused.breaker, refused.breaker_left, refused.at),
            (Some(Phase::Open), ms(14_910), ms(1_100))
        );
        assert_eq!((last.wait, last.verdict), (ms(0), Some(Verdict::GaveUp(GiveUp::CircuitOpen))));
        // A plain call says nothing.
        let mut plain = Attempts::new(at(0));
        assert_eq!(plain.admit_at(&mut (), &p, at(0)), Ok(ms(0)));
        let (_, r) = plain.end(&p, None, Operation::KeyedWrite, key, Outcome::Ok, Draw::ZERO, at(5));
        assert_eq!((r.admitted, r.refused), (None, None));
    }

    #[test]
    fn an_endpoint_that_adds_no_wait_lets_the_attempt_go_whatever_the_call_has_left() {
        // Only a wait the pace adds is charged to the call: the deadline is the decision's to
        // judge, not the admission's.
        let p = Policy::builder(Preset::Default).deadline(ms(1_000)).build().unwrap();
        let mut pace = Pace::new(crate::PaceSettings::DEVICE).unwrap();
        let mut guards = Guards { pace: Some(&mut pace), breaker: None };
        let mut a = Attempts::new(at(0));
        assert_eq!(a.admit_at(&mut guards, &p, at(5_000)), Ok(ms(0)));
        assert_eq!(a.state().waited(), ms(0));
    }

    #[test]
    fn a_step_charges_the_fleet_and_a_refused_retry_is_throttled() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let fleet = FleetBudget::new(3, 100).unwrap();
        let mut a = Attempts::new(at(0));
        let key = Key::from_parts(1, 1, 1);
        a.start(&p, at(0));
        let (d, _) =
            a.end(&p, Some(&fleet), Operation::Idempotent, key, Outcome::status(503), Draw::ZERO, at(1));
        assert!(matches!(d, Decision::Retry { .. }));
        assert_eq!(fleet.tokens_milli(), 2_000);
        a.start(&p, at(2));
        let (d, r) =
            a.end(&p, Some(&fleet), Operation::Idempotent, key, Outcome::status(503), Draw::ZERO, at(3));
        assert_eq!(d, Decision::Done(Verdict::GaveUp(GiveUp::Throttled)));
        assert_eq!(r.verdict, Some(Verdict::GaveUp(GiveUp::Throttled)));
    }

    #[test]
    fn report_opens_the_breaker_on_one_refusal_where_set_and_counts_other_failures() {
        let refused = Outcome::Failure(Failure::Refused);
        let at_once = crate::BreakerSettings { refused_opens: true, ..crate::BreakerSettings::DEVICE };
        let mut b = Breaker::new(at_once).unwrap();
        Attempts::report(None, Some(&mut b), &Outcome::Failure(Failure::ResponseTimeout), Draw::ZERO, at(0));
        assert_eq!(b.state().phase(), crate::Phase::Closed);
        let mut b = Breaker::new(at_once).unwrap();
        Attempts::report(None, Some(&mut b), &refused, Draw::ZERO, at(0));
        assert_eq!(b.state().phase(), crate::Phase::Open);
        // By default a refusal is one failure of the threshold.
        let mut b = Breaker::new(crate::BreakerSettings::DEVICE).unwrap();
        Attempts::report(None, Some(&mut b), &refused, Draw::ZERO, at(0));
        assert_eq!(b.state().phase(), crate::Phase::Closed);
        Attempts::report(None, Some(&mut b), &refused, Draw::ZERO, at(10));
        assert_eq!(b.state().phase(), crate::Phase::Open);
    }

    #[test]
    fn report_tells_the_breaker_what_says_the_endpoint_is_down_and_what_says_it_is_there() {
        use crate::{BreakerSettings, Phase};
        let phase_after = |outcomes: &[Outcome]| {
            let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap();
            for (t, o) in (0..).step_by(10).zip(outcomes) {
                Attempts::report(None, Some(&mut b), o, Draw::ZERO, at(t));
            }
            b.state().phase()
        };
        let f = Outcome::Failure;
        // Down: two in a row open it (the device's threshold).
        for down in [
            f(Failure::ConnectTimeout),
            f(Failure::ResponseTimeout),
            f(Failure::Reset),
            f(Failure::Tls),
            Outcome::status(500),
            Outcome::status(502),
            Outcome::status(504),
        ] {
            assert_eq!(phase_after(&[down]), Phase::Closed, "{down:?}");
            assert_eq!(phase_after(&[down, down]), Phase::Open, "{down:?}");
        }
        // Says nothing of the endpoint: a broken body, a cancel.
        for nothing in [f(Failure::BadBody), f(Failure::Cancelled)] {
            assert_eq!(phase_after(&[nothing, nothing, nothing]), Phase::Closed, "{nothing:?}");
        }
        // There: served (a 4xx included) or throttled (429 or 503, asked to wait or not). Either
        // ends the run of failures.
        let timeout = f(Failure::ResponseTimeout);
        for there in [
            Outcome::Ok,
            Outcome::status(404),
            Outcome::status(429),
            Outcome::status(503),
            Outcome::status_after(503, ms(5_000)),
        ] {
            assert_eq!(phase_after(&[timeout, there, timeout]), Phase::Closed, "{there:?}");
        }
        // A throttled probe closes a half-open breaker; a timed-out one opens it again.
        for (answer, then) in [(Outcome::status(429), Phase::Closed), (timeout, Phase::Open)] {
            let mut b = Breaker::new(BreakerSettings::DEVICE).unwrap();
            Attempts::report(None, Some(&mut b), &timeout, Draw::ZERO, at(0));
            Attempts::report(None, Some(&mut b), &timeout, Draw::ZERO, at(10));
            assert_eq!(b.admit(at(100_000)), Ok(crate::Permit::Probe));
            Attempts::report(None, Some(&mut b), &answer, Draw::ZERO, at(100_010));
            assert_eq!(b.state().phase(), then, "{answer:?}");
        }
    }

    #[test]
    fn a_breaker_that_opens_tells_the_pace_an_outage_began_and_its_return_starts_the_pace_once() {
        use crate::{BreakerSettings, Pace, PaceSettings, Phase};
        let (pace, breaker) =
            (Pace::new(PaceSettings::DEVICE).unwrap(), Breaker::new(BreakerSettings::DEVICE).unwrap());
        let d = Draw::Unit(0x9000_1234);
        for down in [Outcome::Failure(Failure::Refused), Outcome::Failure(Failure::ResponseTimeout)] {
            let (mut p, mut b) = (pace, breaker);
            // The first failure counts toward the threshold and leaves the pace alone.
            Attempts::report(Some(&mut p), Some(&mut b), &down, d, at(0));
            assert_eq!((p, b.state().phase()), (pace, Phase::Closed), "{down:?}");
            // The second opens the breaker: the pace reads it as an outage, as `on_down` says.
            Attempts::report(Some(&mut p), Some(&mut b), &down, d, at(100));
            assert_eq!(b.state().phase(), Phase::Open);
            let mut expected = pace;
            expected.on_down(at(100), d);
            assert_eq!(p, expected, "{down:?}");
            assert!(p.in_outage());
            // A failed probe opens the breaker again and cuts nothing more: the same outage.
            let probe_at = 200_000;
            assert_eq!(b.admit(at(probe_at)), Ok(crate::Permit::Probe));
            Attempts::report(Some(&mut p), Some(&mut b), &down, d, at(probe_at));
            assert_eq!((p, b.state().phase()), (expected, Phase::Open));
            // A served probe closes it, and the pace starts again once, by its own outage rule
            // (the fleet's window), not by a second slow start on top of it.
            let back = probe_at + 400_000;
            assert_eq!(b.admit(at(back)), Ok(crate::Permit::Probe));
            Attempts::report(Some(&mut p), Some(&mut b), &Outcome::Ok, d, at(back));
            expected.report(at(back), Signal::Served, d);
            assert_eq!((p, b.state().phase()), (expected, Phase::Closed));
            assert!(!p.in_outage() && !p.is_open());
        }
        // A pace that did not read the outage (it joined an open breaker) starts slowly when
        // the breaker closes, with the drawn slow start.
        let mut b = breaker;
        Attempts::report(None, Some(&mut b), &Outcome::Failure(Failure::Reset), d, at(0));
        Attempts::report(None, Some(&mut b), &Outcome::Failure(Failure::Reset), d, at(10));
        let mut p = pace;
        assert_eq!(b.admit(at(100_000)), Ok(crate::Permit::Probe));
        Attempts::report(Some(&mut p), Some(&mut b), &Outcome::Ok, d, at(100_000));
        let mut expected = pace;
        expected.slow_start_drawn(at(100_000), d);
        assert_eq!(p, expected);
        // Throttles never open the breaker, so they never reach the pace as an outage twice.
        let (mut p, mut b) = (pace, breaker);
        for t in [0, 10] {
            Attempts::report(Some(&mut p), Some(&mut b), &Outcome::status(503), d, at(t));
        }
        let mut expected = pace;
        expected.on_throttled(at(0), d);
        expected.on_throttled(at(10), d);
        assert_eq!((p, b.state().phase()), (expected, Phase::Closed));
    }

    #[test]
    fn an_unrepeatable_attempt_gives_up_where_it_would_retry() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let key = Key::from_parts(1, 1, 1);
        let mut a = Attempts::new(at(0));
        a.start(&p, at(0));
        let step = a.end(&p, None, Operation::KeyedWrite, key, Outcome::status(503), Draw::ZERO, at(5));
        assert!(matches!(step.0, Decision::Retry { .. }));
        let (d, r) = Attempts::unrepeatable(step);
        let gave_up = Verdict::GaveUp(GiveUp::Attempts);
        assert_eq!(
            (d, r.verdict, r.wait, r.draw),
            (Decision::Done(gave_up), Some(gave_up), ms(0), Some(Draw::ZERO))
        );
        // A call that ended anyway keeps its verdict.
        a.start(&p, at(10));
        let step = a.end(&p, None, Operation::KeyedWrite, key, Outcome::status(400), Draw::ZERO, at(15));
        assert_eq!(Attempts::unrepeatable(step), step);
        assert_eq!(step.0, Decision::Done(Verdict::Failed));
    }

    #[test]
    fn a_resend_obeys_the_attempt_cap_the_deadline_and_the_fleet() {
        let p = Policy::builder(Preset::Default)
            .max_attempts(2)
            .deadline(ms(1_000))
            .min_attempt(ms(100))
            .build()
            .unwrap();
        let key = Key::from_parts(1, 1, 1);
        let unknown = |a: &mut Attempts| {
            a.start(&p, at(0));
            a.end(&p, None, Operation::Write, key, Outcome::status(503), Draw::ZERO, at(10))
        };
        let mut a = Attempts::new(at(0));
        assert_eq!(unknown(&mut a).0, Decision::Done(Verdict::Unknown));
        assert!(a.may_resend(&p, None, at(900)));
        // An attempt started now could not end by the deadline.
        assert!(!a.may_resend(&p, None, at(901)));
        let empty = FleetBudget::new(2, 100).unwrap();
        empty.on_failure();
        empty.on_failure();
        assert!(!a.may_resend(&p, Some(&empty), at(10)));
        // The second attempt reaches the cap.
        assert_eq!(unknown(&mut a).0, Decision::Done(Verdict::Unknown));
        assert!(!a.may_resend(&p, None, at(10)));
    }
}
