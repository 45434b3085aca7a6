//! Per-call stop rules and the decision after each attempt.
//!
//! A call's whole state is a small `Copy` value: the attempts made, the ticks waited and the
//! last wait. After each attempt, [`Policy::decide`] classifies the outcome and either ends the
//! call with a verdict or returns the wait before the next attempt, having checked every stop
//! rule: the attempt cap, a Retry-After longer than the call can afford, the wait budget and the
//! deadline. Waits are integer ticks, so `.1 + .2` s fits a `.3` s budget exactly (in
//! floating point it would not).
//!
//! ```
//! use wary::{CallState, Decision, Draw, GiveUp, Operation, Outcome, Policy, Preset, Verdict};
//! let p = Policy::builder(Preset::Strict).build().unwrap();
//! let mut s = CallState::new();
//! let d = Draw::ZERO;
//! assert_eq!(p.decide(&mut s, Operation::Read, &Outcome::status(503), d, None), Decision::Retry { wait: 100 });
//! assert_eq!(p.decide(&mut s, Operation::Read, &Outcome::status(503), d, None), Decision::Retry { wait: 200 });
//! assert_eq!(s.waited(), 300);
//! assert_eq!(p.decide(&mut s, Operation::Read, &Outcome::status(503), d, None),
//!            Decision::Done(Verdict::GaveUp(GiveUp::Attempts)));
//! ```

use crate::backoff::{Draw, at_least, at_most};
use crate::classify::{Class, Operation, Outcome};
use crate::policy::{Policy, RetryAfterMode};
use crate::{GiveUp, Verdict};

/// One call's progress: `Copy`, a few words, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CallState {
    attempts: u32,
    waited: u64,
    last_wait: u64,
}

impl CallState {
    /// A call that has made no attempt.
    pub const fn new() -> Self {
        CallState { attempts: 0, waited: 0, last_wait: 0 }
    }

    /// Attempts decided so far.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Ticks waited so far.
    pub const fn waited(&self) -> u64 {
        self.waited
    }

    /// The last wait, in ticks.
    pub const fn last_wait(&self) -> u64 {
        self.last_wait
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Decision {
    /// The call is over.
    Done(Verdict),
    /// Wait this many ticks, then attempt again.
    Retry {
        /// The wait, in ticks.
        wait: u64,
    },
}

impl Policy {
    /// The operation of an HTTP request under this policy's table (see [`crate::Table::operation`]).
    pub fn operation(&self, method: &str, keyed: bool) -> Operation {
        self.table.operation(method, keyed)
    }

    /// The class of `outcome` for `op` under this policy's table.
    #[inline]
    pub const fn classify(&self, op: Operation, outcome: &Outcome) -> Class {
        self.table.classify(op, outcome)
    }

    /// The wait before the next attempt of a call whose last outcome was retryable, or why the
    /// call must stop. Does not change `state`; `elapsed` is the call's time so far (attempts
    /// and waits), when a clock is available, for the deadline.
    #[inline]
    pub const fn next_wait(
        &self,
        state: &CallState,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<u64>,
    ) -> Result<u64, GiveUp> {
        let k = state.attempts.saturating_add(1);
        if let Some(cap) = self.max_attempts {
            if k >= cap {
                return Err(GiveUp::Attempts);
            }
        }
        // Ticks a wait may take before the next attempt could no longer end by the deadline.
        let deadline_left = match (self.deadline, elapsed) {
            (Some(d), Some(e)) => match d.checked_sub(e) {
                Some(rest) => match rest.checked_sub(self.min_attempt) {
                    Some(left) => Some(left),
                    // Past the deadline even with no wait: not even a zero wait may start.
                    None => return Err(GiveUp::Deadline),
                },
                None => return Err(GiveUp::Deadline),
            },
            _ => None,
        };
        let backoff = self.backoff.wait(k, state.last_wait, draw);
        let left = self.budget.saturating_sub(state.waited);
        let wait = match outcome.retry_after() {
            None => backoff,
            Some(secs) => {
                let asked = self.secs_to_ticks(secs);
                // A server that asks for longer than the call can afford gets an answer now,
                // with what it asked, so the caller can reschedule instead of holding the run.
                let too_long = asked > left
                    || match self.max_retry_after {
                        Some(m) => asked > m,
                        None => false,
                    }
                    || match deadline_left {
                        Some(d) => asked > d,
                        None => false,
                    };
                if too_long {
                    return Err(GiveUp::RetryAfterTooLong { asked });
                }
                let raised = match self.retry_after_mode {
                    RetryAfterMode::Max => asked,
                    RetryAfterMode::Spread => {
                        // The spread past the server's value is ours: trimmed to what the call can
                        // still wait, so it never turns a Retry-After that fits into a give-up.
                        let room = match deadline_left {
                            Some(d) => at_most(left, d),
                            None => left,
                        };
                        at_most(asked.saturating_add(draw.scale(self.backoff.ceiling(k))), room)
                    }
                };
                at_least(raised, backoff)
            }
        };
        if wait > left {
            return Err(GiveUp::Budget);
        }
        if let Some(d) = deadline_left {
            // Don't start a sleep the caller won't wait out.
            if wait > d {
                return Err(GiveUp::Deadline);
            }
        }
        Ok(wait)
    }

    /// Decides after an attempt and records it in `state`: the verdict, or the wait before the
    /// next attempt. `draw` is used only if the call retries.
    #[inline]
    pub const fn decide(
        &self,
        state: &mut CallState,
        op: Operation,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<u64>,
    ) -> Decision {
        self.decide_class(state, self.classify(op, outcome), outcome, draw, elapsed)
    }

    /// One attempt's whole decision as the runner makes it: classify, charge the fleet budget
    /// for a failure that says the server or the path is in trouble (or refund it on success),
    /// decide, and turn a retry the fleet refuses into `gave_up` (throttled). The cost is taken
    /// now, before any wait, so a retry waiting in backoff already holds it.
    #[inline]
    pub fn decide_with_fleet(
        &self,
        state: &mut CallState,
        op: Operation,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<u64>,
        fleet: Option<&crate::FleetBudget>,
    ) -> (Class, Decision) {
        let class = self.classify(op, outcome);
        let allowed = match (class, fleet) {
            (Class::Ok, Some(f)) => {
                f.on_success();
                true
            }
            (Class::Retry | Class::Unknown, Some(f)) => f.on_failure(),
            _ => true,
        };
        let decision = match self.decide_class(state, class, outcome, draw, elapsed) {
            Decision::Retry { .. } if !allowed => Decision::Done(Verdict::GaveUp(GiveUp::Throttled)),
            d => d,
        };
        (class, decision)
    }

    /// [`Policy::decide`] for an outcome already classified (by [`Policy::classify`] for the
    /// same operation), so a caller that needs the class too classifies once.
    #[inline]
    pub const fn decide_class(
        &self,
        state: &mut CallState,
        class: Class,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<u64>,
    ) -> Decision {
        let verdict = match class {
            Class::Ok => Verdict::Ok,
            Class::Failed => Verdict::Failed,
            Class::Unknown => Verdict::Unknown,
            Class::Cancelled => Verdict::Cancelled,
            Class::Retry => match self.next_wait(state, outcome, draw, elapsed) {
                Ok(wait) => {
                    state.attempts = state.attempts.saturating_add(1);
                    state.waited = state.waited.saturating_add(wait);
                    state.last_wait = wait;
                    return Decision::Retry { wait };
                }
                Err(why) => Verdict::GaveUp(why),
            },
        };
        state.attempts = state.attempts.saturating_add(1);
        Decision::Done(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preset;

    fn decide_all(p: &Policy, op: Operation, outcomes: &[Outcome]) -> (Vec<u64>, Verdict) {
        let mut s = CallState::new();
        let mut waits = Vec::new();
        for o in outcomes {
            match p.decide(&mut s, op, o, Draw::ZERO, None) {
                Decision::Retry { wait } => waits.push(wait),
                Decision::Done(v) => return (waits, v),
            }
        }
        (waits, Verdict::GaveUp(GiveUp::OutcomesExhausted))
    }

    #[test]
    fn waits_that_add_up_to_the_budget_exactly_fit_then_the_attempt_cap_ends_the_call() {
        // 100 + 200 ms = 300 ms fits a 300 ms budget exactly: no float error stops it early.
        let p = Policy::builder(Preset::Strict).max_attempts(10).build().unwrap();
        let o = [Outcome::ResponseTimeout; 4];
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![100, 200], Verdict::GaveUp(GiveUp::Budget)));
        let p = Policy::builder(Preset::Strict).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![100, 200], Verdict::GaveUp(GiveUp::Attempts)));
    }

    #[test]
    fn a_retry_after_past_the_budget_stops_before_any_wait() {
        let p = Policy::builder(Preset::Strict).budget(500).build().unwrap();
        let o = [Outcome::status_after(503, 2), Outcome::Ok];
        assert_eq!(
            decide_all(&p, Operation::Read, &o),
            (vec![], Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: 2000 }))
        );
    }

    #[test]
    fn strict_posts_and_bad_data_are_not_retried() {
        let p = Policy::builder(Preset::Strict).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Write, &[Outcome::ResponseTimeout]), (vec![], Verdict::Unknown));
        assert_eq!(decide_all(&p, Operation::Write, &[Outcome::status(429)]), (vec![], Verdict::Failed));
        assert_eq!(decide_all(&p, Operation::Read, &[Outcome::BadBody]), (vec![], Verdict::Failed));
    }

    #[test]
    fn a_retry_after_past_max_retry_after_fails_at_once() {
        // max_delay 20 s, Retry-After 120 s: no sleep at all.
        let p = Policy::builder(Preset::Default).max_attempts(5).max_retry_after(20_000).build().unwrap();
        let o = [Outcome::status_after(429, 120), Outcome::Ok];
        assert_eq!(
            decide_all(&p, Operation::Read, &o),
            (vec![], Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: 120_000 }))
        );
    }

    #[test]
    fn deadline_counts_attempt_time() {
        let p = Policy::builder(Preset::Exercise)
            .tick_hz(1)
            .base(2)
            .cap(60)
            .budget(120)
            .deadline(10)
            .min_attempt(3)
            .build()
            .unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        // 4 ticks elapsed, wait 1, then an attempt of at least 3: ends at 8 ≤ 10.
        assert_eq!(p.decide(&mut s, Operation::Read, &o, Draw::ZERO, Some(4)), Decision::Retry { wait: 1 });
        // 6 elapsed, wait 2 + attempt 3 = 11 > 10: not started.
        assert_eq!(
            p.decide(&mut s, Operation::Read, &o, Draw::ZERO, Some(6)),
            Decision::Done(Verdict::GaveUp(GiveUp::Deadline))
        );
    }

    #[test]
    fn no_wait_starts_once_the_deadline_has_passed() {
        let p = Policy::builder(Preset::Default)
            .jitter(crate::Jitter::Full)
            .max_attempts(5)
            .deadline(100)
            .build()
            .unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        // A draw of 0 makes a wait of 0, which must not slip past a deadline already gone.
        assert_eq!(
            p.decide(&mut s, Operation::Read, &o, Draw::ZERO, Some(150)),
            Decision::Done(Verdict::GaveUp(GiveUp::Deadline))
        );
        let mut s = CallState::new();
        assert_eq!(p.decide(&mut s, Operation::Read, &o, Draw::ZERO, Some(100)), Decision::Retry { wait: 0 });
    }

    #[test]
    fn the_spread_never_turns_a_retry_after_that_fits_into_a_give_up() {
        // Budget 2,050 ms: the server's 2 s fits; its spread (up to the 100 ms ceiling) is trimmed.
        let p = Policy::builder(Preset::Default).budget(2_050).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status_after(429, 2);
        assert_eq!(p.next_wait(&s, &o, Draw::unit(u32::MAX), None), Ok(2_050));
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, None), Ok(2_000));
        // Past the budget the server's own value still gives up at once.
        let p = Policy::builder(Preset::Default).budget(1_999).build().unwrap();
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, None), Err(GiveUp::RetryAfterTooLong { asked: 2_000 }));
    }

    #[test]
    fn a_huge_retry_after_never_overflows_and_gives_up_now() {
        use crate::retry_after::Rules;
        for value in [&b"1e400"[..], b"99999999999999999999", b"18446744073709551615.5", b"+1e30"] {
            let secs = Rules::LENIENT.read([value], None, None).unwrap().unwrap();
            assert_eq!(secs, u64::MAX, "{value:?}");
            for preset in [Preset::Default, Preset::Exercise] {
                let p = Policy::builder(preset).build().unwrap();
                let mut s = CallState::new();
                let o = Outcome::status_after(503, secs);
                // Seconds to ticks saturates; the wait is never started.
                assert_eq!(
                    p.decide(&mut s, Operation::Read, &o, Draw::unit(u32::MAX), Some(0)),
                    Decision::Done(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: u64::MAX }))
                );
                assert_eq!(s.waited(), 0);
            }
        }
    }

    #[test]
    fn a_loose_retry_after_is_waited_out_in_full() {
        // "1.5" asks for at least 1.5 s: the call waits 2 s, not the backoff's 100 ms.
        let p = Policy::builder(Preset::Exercise).build().unwrap();
        let secs = crate::retry_after::Rules::LENIENT.read([b"1.5".as_slice()], None, None).unwrap();
        let o = Outcome::Status { code: 429, retry_after: secs };
        assert_eq!(p.next_wait(&CallState::new(), &o, Draw::ZERO, None), Ok(2_000));
    }

    #[test]
    fn spread_retry_after_is_never_below_the_server_value() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status_after(429, 2);
        let low = p.next_wait(&s, &o, Draw::ZERO, None).unwrap();
        let high = p.next_wait(&s, &o, Draw::unit(u32::MAX), None).unwrap();
        assert_eq!(low, 2000);
        assert!(high > low && high < 2000 + 100, "{high}");
    }

    /// Seconds as ticks (`tick_hz(1)`), `max` Retry-After mode: every number below is exact.
    fn exact() -> crate::PolicyBuilder {
        Policy::builder(Preset::Exercise).tick_hz(1).base(2).cap(60).budget(120)
    }

    fn wait_for(p: &Policy, retry_after: u64, elapsed: Option<u64>) -> Result<u64, GiveUp> {
        p.next_wait(&CallState::new(), &Outcome::status_after(429, retry_after), Draw::ZERO, elapsed)
    }

    #[test]
    fn a_retry_after_equal_to_the_budget_left_is_waited_one_more_is_too_long() {
        let p = exact().build().unwrap();
        assert_eq!(wait_for(&p, 120, None), Ok(120));
        assert_eq!(wait_for(&p, 121, None), Err(GiveUp::RetryAfterTooLong { asked: 121 }));
        assert_eq!(wait_for(&p, 0, None), Ok(1), "a Retry-After of 0 never lowers the backoff");
        // What is left, not the whole budget: after 100 of 120, 20 fits and 21 does not.
        let mut s = CallState::new();
        let o = Outcome::status_after(429, 100);
        assert_eq!(p.decide(&mut s, Operation::Read, &o, Draw::ZERO, None), Decision::Retry { wait: 100 });
        let next = |ra| p.next_wait(&s, &Outcome::status_after(429, ra), Draw::ZERO, None);
        assert_eq!(next(20), Ok(20));
        assert_eq!(next(21), Err(GiveUp::RetryAfterTooLong { asked: 21 }));
    }

    #[test]
    fn a_backoff_wait_equal_to_the_budget_left_is_waited_one_more_gives_up() {
        // Ceilings 2, 4, 8 with no jitter: budget 14 holds all three exactly, 13 only two.
        let p = exact().jitter(crate::Jitter::None).budget(14).build().unwrap();
        let o = [Outcome::status(503); 5];
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![2, 4, 8], Verdict::GaveUp(GiveUp::Budget)));
        let p = exact().jitter(crate::Jitter::None).budget(13).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![2, 4], Verdict::GaveUp(GiveUp::Budget)));
    }

    #[test]
    fn max_retry_after_allows_its_own_value_and_refuses_one_more() {
        let p = exact().max_retry_after(30).build().unwrap();
        assert_eq!(wait_for(&p, 29, None), Ok(29));
        assert_eq!(wait_for(&p, 30, None), Ok(30));
        assert_eq!(wait_for(&p, 31, None), Err(GiveUp::RetryAfterTooLong { asked: 31 }));
        // The budget still holds 31: the limit alone refused it.
        assert_eq!(wait_for(&exact().build().unwrap(), 31, None), Ok(31));
        // Without a Retry-After the limit does not apply to the backoff's own waits.
        let p = exact().max_retry_after(0).jitter(crate::Jitter::None).build().unwrap();
        assert_eq!(p.next_wait(&CallState::new(), &Outcome::status(503), Draw::ZERO, None), Ok(2));
        assert_eq!(wait_for(&p, 1, None), Err(GiveUp::RetryAfterTooLong { asked: 1 }));
        assert_eq!(wait_for(&p, 0, None), Ok(2));
    }

    #[test]
    fn a_retry_after_past_the_deadline_is_too_long_at_once() {
        // Deadline 100, 10 elapsed, attempts take at least 5: a wait of 85 ends the next attempt
        // exactly at the deadline; 86 would not.
        let p = exact().budget(1_000).deadline(100).min_attempt(5).build().unwrap();
        assert_eq!(wait_for(&p, 85, Some(10)), Ok(85));
        assert_eq!(wait_for(&p, 86, Some(10)), Err(GiveUp::RetryAfterTooLong { asked: 86 }));
        // The budget could hold it; only the deadline refused it.
        assert_eq!(wait_for(&p, 86, Some(0)), Ok(86));
        // The backoff's own wait against the deadline: equal fits, past it gives up.
        let p = exact().jitter(crate::Jitter::None).budget(1_000).deadline(100).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status(503);
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, Some(98)), Ok(2));
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, Some(99)), Err(GiveUp::Deadline));
        // Exactly at the deadline with no attempt time, a zero wait is still not past it.
        let p = exact().base(1).cap(1).max_attempts(3).budget(1_000).deadline(100).build().unwrap();
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, Some(100)), Ok(0));
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, Some(101)), Err(GiveUp::Deadline));
        let p = exact().budget(1_000).deadline(100).min_attempt(5).build().unwrap();
        assert_eq!(p.next_wait(&s, &o, Draw::ZERO, Some(96)), Err(GiveUp::Deadline));
        // Without a clock the deadline cannot be checked: only the budget applies.
        assert_eq!(wait_for(&p, 500, None), Ok(500));
    }

    #[test]
    fn the_spread_is_trimmed_to_the_budget_and_to_the_deadline_never_past_either() {
        // Spread mode, in exact ticks: the ceiling of retry 1 is 10, a top draw adds 9.
        let spread = || Policy::builder(Preset::Default).tick_hz(1).base(10).cap(10).budget(1_000);
        let top = Draw::unit(u32::MAX);
        let at = |p: &Policy, ra: u64, elapsed| {
            p.next_wait(&CallState::new(), &Outcome::status_after(429, ra), top, elapsed)
        };
        let p = spread().build().unwrap();
        assert_eq!(at(&p, 50, None), Ok(59), "room to spare: the whole spread");
        // Trimmed to the budget left.
        let p = spread().budget(55).build().unwrap();
        assert_eq!(at(&p, 50, None), Ok(55));
        assert_eq!(at(&p, 55, None), Ok(55));
        // Trimmed to the deadline (100, nothing elapsed), even with budget to spare.
        let p = spread().deadline(100).build().unwrap();
        assert_eq!(at(&p, 95, Some(0)), Ok(100));
        assert_eq!(at(&p, 100, Some(0)), Ok(100));
        assert_eq!(at(&p, 50, Some(0)), Ok(59));
        assert_eq!(at(&p, 101, Some(0)), Err(GiveUp::RetryAfterTooLong { asked: 101 }));
        // Whichever is nearer: the deadline's 40 left, then the budget's 30.
        let p = spread().budget(30).deadline(100).build().unwrap();
        assert_eq!(at(&p, 25, Some(60)), Ok(30));
        let p = spread().budget(50).deadline(100).build().unwrap();
        assert_eq!(at(&p, 35, Some(60)), Ok(40));
    }

    #[test]
    fn the_attempt_cap_counts_the_first_attempt() {
        let p = exact().max_attempts(2).build().unwrap();
        let o = [Outcome::status(503); 4];
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![1], Verdict::GaveUp(GiveUp::Attempts)));
        let p = exact().max_attempts(1).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Read, &o), (vec![], Verdict::GaveUp(GiveUp::Attempts)));
    }

    #[test]
    fn state_records_attempts_waits_and_the_last_wait() {
        let p = exact().jitter(crate::Jitter::None).build().unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        for _ in 0..3 {
            p.decide(&mut s, Operation::Read, &o, Draw::ZERO, None);
        }
        assert_eq!((s.attempts(), s.waited(), s.last_wait()), (3, 14, 8));
        assert_eq!(
            p.decide(&mut s, Operation::Read, &Outcome::Ok, Draw::ZERO, None),
            Decision::Done(Verdict::Ok)
        );
        assert_eq!((s.attempts(), s.waited(), s.last_wait()), (4, 14, 8));
        // Decorrelated jitter grows from the last wait the state holds.
        let p = exact().jitter(crate::Jitter::Decorrelated).build().unwrap();
        let mut s = CallState::new();
        let top = Draw::unit(u32::MAX);
        assert_eq!(p.decide(&mut s, Operation::Read, &o, top, None), Decision::Retry { wait: 5 });
        assert_eq!(p.decide(&mut s, Operation::Read, &o, top, None), Decision::Retry { wait: 14 });
    }

    #[test]
    fn the_fleet_charges_failures_refunds_successes_and_throttles_retries() {
        let fleet = crate::FleetBudget::new(4, 1000).unwrap();
        let p = exact().build().unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        let (c, d) = p.decide_with_fleet(&mut s, Operation::Read, &o, Draw::ZERO, None, Some(&fleet));
        assert_eq!((c, d), (Class::Retry, Decision::Retry { wait: 1 }));
        assert_eq!(fleet.tokens_milli(), 3000);
        let (_, d) = p.decide_with_fleet(&mut s, Operation::Read, &o, Draw::ZERO, None, Some(&fleet));
        assert_eq!(d, Decision::Done(Verdict::GaveUp(GiveUp::Throttled)));
        assert_eq!(fleet.tokens_milli(), 2000);
        let mut s = CallState::new();
        let (c, d) =
            p.decide_with_fleet(&mut s, Operation::Read, &Outcome::Ok, Draw::ZERO, None, Some(&fleet));
        assert_eq!((c, d), (Class::Ok, Decision::Done(Verdict::Ok)));
        assert_eq!(fleet.tokens_milli(), 3000);
        // An unknown write costs a token too (the server may be in trouble); a 400 does not.
        let mut s = CallState::new();
        let (c, _) = p.decide_with_fleet(&mut s, Operation::Write, &o, Draw::ZERO, None, Some(&fleet));
        assert_eq!((c, fleet.tokens_milli()), (Class::Unknown, 2000));
        let mut s = CallState::new();
        let (c, _) = p.decide_with_fleet(
            &mut s,
            Operation::Read,
            &Outcome::status(400),
            Draw::ZERO,
            None,
            Some(&fleet),
        );
        assert_eq!((c, fleet.tokens_milli()), (Class::Failed, 2000));
        // With no fleet, nothing throttles.
        let mut s = CallState::new();
        let (_, d) = p.decide_with_fleet(&mut s, Operation::Read, &o, Draw::ZERO, None, None);
        assert_eq!(d, Decision::Retry { wait: 1 });
    }
}
