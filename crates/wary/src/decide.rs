//! The decision after each attempt, and how a call ends: `Policy`'s decision (`impl Policy`
//! here holds `decide`, `decide_with_fleet`, `may_resend` and every stop rule, written once).
//!
//! A call's whole state is a [`CallState`] of twelve bytes: the attempts made, the time waited
//! and the last wait. After each attempt, [`Policy::decide`] classifies the outcome and either
//! ends the call with a [`Verdict`] or returns the wait before the next attempt, having checked
//! every stop rule: the attempt cap, a Retry-After longer than the call can afford, the wait
//! budget and the deadline. [`Policy::decide_with_fleet`] does the same with a fleet retry
//! budget. Waits are integer milliseconds, so `.1 + .2` s fits a `.3` s budget exactly (in
//! floating point it would not).
//!
//! ```
//! use wary::{CallState, Decision, Draw, Duration, GiveUp, Operation, Outcome, Policy, Preset, Verdict};
//! let p = Policy::builder(Preset::Strict).build().unwrap();
//! let mut s = CallState::new();
//! let (d, o) = (Draw::ZERO, Outcome::status(503));
//! let ms = Duration::from_millis;
//! assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, d, None), Decision::Retry { wait: ms(100) });
//! assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, d, None), Decision::Retry { wait: ms(200) });
//! assert_eq!(s.waited(), ms(300));
//! assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, d, None), Decision::Done(Verdict::GaveUp(GiveUp::Attempts)));
//! ```

use crate::backoff::Draw;
use crate::classify::{Class, Operation, Outcome};
use crate::policy::{Policy, RetryAfterMode};
use crate::throttle::FleetBudget;
use crate::time::Duration;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Verdict {
    /// The operation succeeded.
    Ok,
    /// The operation failed in a way a resend cannot fix (a 400, a TLS error, a bad body).
    Failed,
    /// A write without an idempotency key may have landed; it was not resent. A probe or a
    /// person resolves it, never a blind resend: a payment recorded twice costs more than one
    /// left for a person to check.
    Unknown,
    /// A stop rule ended the call while it was still failing.
    GaveUp(GiveUp),
    /// The caller cancelled the call.
    Cancelled,
}

impl Verdict {
    /// Every verdict's name, in a fixed order (for metrics that list each one).
    pub const NAMES: [&'static str; 5] = ["ok", "failed", "unknown", "gave_up", "cancelled"];

    /// The verdict's name as `wary plan` and the ledgers spell it (`gave_up` for any reason).
    pub const fn name(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed => "failed",
            Verdict::Unknown => "unknown",
            Verdict::GaveUp(_) => "gave_up",
            Verdict::Cancelled => "cancelled",
        }
    }

    /// Parses [`Verdict::name`] back; `gave_up` needs its reason.
    pub fn from_name(name: &str, reason: Option<GiveUp>) -> Option<Self> {
        Some(match (name, reason) {
            ("ok", None) => Verdict::Ok,
            ("failed", None) => Verdict::Failed,
            ("unknown", None) => Verdict::Unknown,
            ("cancelled", None) => Verdict::Cancelled,
            ("gave_up", Some(g)) => Verdict::GaveUp(g),
            _ => return None,
        })
    }
}

impl core::fmt::Display for Verdict {
    /// `ok`, `failed`, `unknown`, `cancelled`, or `gave_up (reason)`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Verdict::GaveUp(g) => write!(f, "gave_up ({g})"),
            v => f.write_str(v.name()),
        }
    }
}

/// Why a call gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum GiveUp {
    /// The next wait would take the call's total waiting past its wait budget.
    Budget,
    /// The next attempt could not finish before the call's deadline.
    Deadline,
    /// The attempt cap was reached.
    Attempts,
    /// The server asked for a longer wait than the call can afford; `asked` is that wait, so the
    /// caller can reschedule the work for later.
    RetryAfterTooLong {
        /// The wait the server asked for ([`Duration::MAX`] if longer than wary counts).
        asked: Duration,
    },
    /// The fleet retry budget refused the retry.
    Throttled,
    /// The recorded outcomes ran out while the call was still failing (plans only).
    OutcomesExhausted,
    /// The endpoint's circuit breaker ([`crate::Breaker`]) was open: the call ended at once,
    /// without an attempt. Nothing was sent, so an outbox keeps the reading pending.
    CircuitOpen,
}

impl GiveUp {
    /// Every reason's name, in a fixed order.
    pub const NAMES: [&'static str; 7] = [
        "budget",
        "deadline",
        "attempts",
        "retry_after_too_long",
        "throttled",
        "outcomes_exhausted",
        "circuit_open",
    ];

    /// A short stable name for logs and ledgers.
    pub const fn name(&self) -> &'static str {
        match self {
            GiveUp::Budget => "budget",
            GiveUp::Deadline => "deadline",
            GiveUp::Attempts => "attempts",
            GiveUp::RetryAfterTooLong { .. } => "retry_after_too_long",
            GiveUp::Throttled => "throttled",
            GiveUp::OutcomesExhausted => "outcomes_exhausted",
            GiveUp::CircuitOpen => "circuit_open",
        }
    }

    /// Parses [`GiveUp::name`] back; `asked` is used by `retry_after_too_long` only.
    pub fn from_name(name: &str, asked: Duration) -> Option<Self> {
        Some(match name {
            "budget" => GiveUp::Budget,
            "deadline" => GiveUp::Deadline,
            "attempts" => GiveUp::Attempts,
            "retry_after_too_long" => GiveUp::RetryAfterTooLong { asked },
            "throttled" => GiveUp::Throttled,
            "outcomes_exhausted" => GiveUp::OutcomesExhausted,
            "circuit_open" => GiveUp::CircuitOpen,
            _ => return None,
        })
    }
}

impl core::fmt::Display for GiveUp {
    /// The name, and what a server asked for when that was too long.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GiveUp::RetryAfterTooLong { asked } if asked.is_max() => {
                f.write_str("retry_after_too_long, asked longer than 49 days")
            }
            GiveUp::RetryAfterTooLong { asked } => write!(f, "retry_after_too_long, asked {asked}"),
            g => f.write_str(g.name()),
        }
    }
}

/// One call's progress: `Copy`, twelve bytes, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CallState {
    attempts: u32,
    waited: Duration,
    last_wait: Duration,
}

impl CallState {
    /// A call that has made no attempt.
    pub const fn new() -> Self {
        CallState { attempts: 0, waited: Duration::ZERO, last_wait: Duration::ZERO }
    }

    /// Attempts decided so far.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time waited so far.
    pub const fn waited(&self) -> Duration {
        self.waited
    }

    /// The last wait.
    pub const fn last_wait(&self) -> Duration {
        self.last_wait
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Decision {
    /// The call is over.
    Done(Verdict),
    /// Wait this long, then attempt again.
    Retry {
        /// The wait.
        wait: Duration,
    },
}

impl Policy {
    /// The operation of an HTTP request under this policy's table (see [`crate::Table::operation`]).
    pub fn operation(&self, method: &str, keyed: bool) -> Operation {
        self.table.operation(method, keyed)
    }

    /// The class of `outcome` for `op` under this policy's table.
    #[inline]
    pub fn classify(&self, op: Operation, outcome: &Outcome) -> Class {
        self.table.classify(op, outcome)
    }

    /// Decides after an attempt and records it in `state`: the verdict, or the wait before the
    /// next attempt. `draw` is used only if the call retries. `elapsed` is the call's time so far
    /// (attempts and waits) when a clock is available, for the deadline; without it only the
    /// budget bounds the waits.
    #[inline]
    pub fn decide(
        &self,
        state: &mut CallState,
        op: Operation,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<Duration>,
    ) -> Decision {
        self.decide_class(state, self.classify(op, outcome), outcome, draw, elapsed)
    }

    /// [`Policy::decide`] with a fleet retry budget, as a runner makes it: a failure that says
    /// the server or the path is in trouble (retry or unknown) costs a token, a success refunds
    /// some, and a retry the fleet refuses ends `gave_up` (throttled). The cost is taken now,
    /// before any wait, so a retry waiting in backoff already holds it.
    #[inline]
    pub fn decide_with_fleet(
        &self,
        state: &mut CallState,
        op: Operation,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<Duration>,
        fleet: &FleetBudget,
    ) -> Decision {
        let class = self.classify(op, outcome);
        let allowed = match class {
            Class::Ok => {
                fleet.on_success();
                true
            }
            Class::Retry | Class::Unknown => fleet.on_failure(),
            Class::Failed | Class::Cancelled => true,
        };
        match self.decide_class(state, class, outcome, draw, elapsed) {
            Decision::Retry { .. } if !allowed => Decision::Done(Verdict::GaveUp(GiveUp::Throttled)),
            d => d,
        }
    }

    /// The ceiling of retry `k` ≥ 1, as [`crate::Backoff::ceiling`] gives it, from the doubling
    /// at which it reaches the cap, found when the policy was built.
    #[inline]
    pub(crate) const fn ceiling(&self, k: u32) -> Duration {
        let shift = k.saturating_sub(1);
        if shift < self.cap_shift {
            // Below the cap shift the doubled base is below the cap, so it fits 32 bits (the
            // shift is below 32 unless the base is 0, which stays 0).
            Duration::from_millis(self.backoff.base.as_millis().wrapping_shl(shift) as u64)
        } else {
            self.backoff.cap
        }
    }

    /// The decision for an outcome already classified.
    #[inline]
    pub(crate) fn decide_class(
        &self,
        state: &mut CallState,
        class: Class,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<Duration>,
    ) -> Decision {
        state.attempts = state.attempts.saturating_add(1);
        let verdict = match class {
            Class::Ok => Verdict::Ok,
            Class::Failed => Verdict::Failed,
            Class::Unknown => Verdict::Unknown,
            Class::Cancelled => Verdict::Cancelled,
            Class::Retry => match self.next_wait(state.attempts, state, outcome, draw, elapsed) {
                Ok(wait) => {
                    // A wait fits what is left of the budget, so the sum never passes the
                    // budget (or stays where it was, if a state from another policy is past it).
                    state.waited =
                        Duration::from_millis(state.waited.as_millis().wrapping_add(wait.as_millis()) as u64);
                    state.last_wait = wait;
                    return Decision::Retry { wait };
                }
                Err(why) => Verdict::GaveUp(why),
            },
        };
        Decision::Done(verdict)
    }

    /// The stop rules that hold before any wait, after attempt `k`: the attempt cap, and the
    /// deadline for an attempt started with no wait. Otherwise, what is left of the wait
    /// budget, and how long a wait may be (that, and what the deadline leaves).
    #[inline]
    fn room(
        &self,
        k: u32,
        state: &CallState,
        elapsed: Option<Duration>,
    ) -> Result<(Duration, Duration), GiveUp> {
        // No cap is u32::MAX, which a call's count reaches only when it can count no further.
        if k >= self.max_attempts {
            return Err(GiveUp::Attempts);
        }
        let left = self.budget.saturating_sub(state.waited);
        // What a wait may take before the next attempt could no longer end by the deadline
        // (no deadline is `Duration::MAX`).
        let room = match elapsed {
            Some(e) if !self.deadline.is_max() => match self.deadline.checked_sub(e) {
                Some(rest) => match rest.checked_sub(self.min_attempt) {
                    Some(until) => until.min(left),
                    // Past the deadline even with no wait: not even a zero wait may start.
                    None => return Err(GiveUp::Deadline),
                },
                None => return Err(GiveUp::Deadline),
            },
            _ => left,
        };
        Ok((left, room))
    }

    /// Charges a wait before the next attempt that is not the backoff's (the send rate's,
    /// [`crate::Pace`]) to the call, under the stop rules a retry's wait obeys: the attempt cap,
    /// the wait budget (the wait counts toward it) and the deadline (`elapsed` is the call's
    /// time now). A wait that does not fit is refused with the reason, and nothing is charged:
    /// the call ends rather than sleep past what it may spend. A replay charges the waits a
    /// ledger recorded ([`crate::ledger::Admission`]) with it.
    pub fn charge_wait(
        &self,
        state: &mut CallState,
        wait: Duration,
        elapsed: Option<Duration>,
    ) -> Result<(), GiveUp> {
        let (left, room) = self.room(state.attempts, state, elapsed)?;
        if wait > room {
            return Err(if wait > left { GiveUp::Budget } else { GiveUp::Deadline });
        }
        state.waited = state.waited.saturating_add(wait);
        Ok(())
    }

    /// True if a call whose last outcome was `unknown` may send once more now, with no wait:
    /// a write a probe found not landed. The resend counts as a retry, so it obeys the stop
    /// rules a retry does: the attempt cap, the deadline (`elapsed` counts the probe's time)
    /// and the fleet budget, which already holds the unknown attempt's cost.
    pub fn may_resend(&self, state: &CallState, elapsed: Duration, fleet: Option<&FleetBudget>) -> bool {
        self.room(state.attempts, state, Some(elapsed)).is_ok() && fleet.is_none_or(FleetBudget::allows_retry)
    }

    /// The wait before retry `k` (the attempt just made was attempt `k`) of a call whose last
    /// outcome was retryable, or why the call must stop. Does not change `state`.
    #[inline]
    pub(crate) fn next_wait(
        &self,
        k: u32,
        state: &CallState,
        outcome: &Outcome,
        draw: Draw,
        elapsed: Option<Duration>,
    ) -> Result<Duration, GiveUp> {
        let (left, room) = self.room(k, state, elapsed)?;
        let ceiling = self.ceiling(k);
        let backoff = self.backoff.wait_under(ceiling, state.last_wait, draw);
        let wait = match outcome.retry_after() {
            None => backoff,
            Some(asked) => {
                // A server that asks for longer than the call can afford, or than the policy
                // accepts (no limit is `Duration::MAX`), gets an answer now, with what it
                // asked, so the caller can reschedule instead of holding the run.
                if asked > room.min(self.max_retry_after) {
                    return Err(GiveUp::RetryAfterTooLong { asked });
                }
                // The spread past the server's value is ours: trimmed to what the call can
                // still wait, so it never turns a Retry-After that fits into a give-up. In
                // `max` mode there is none, and what the server asked already fits.
                let spread = match self.retry_after_mode {
                    RetryAfterMode::Max => Duration::ZERO,
                    RetryAfterMode::Spread => draw.scale(ceiling),
                };
                asked.saturating_add(spread).min(room).max(backoff)
            }
        };
        if wait > room {
            // Don't start a sleep the budget cannot pay for, or the caller won't wait out.
            return Err(if wait > left { GiveUp::Budget } else { GiveUp::Deadline });
        }
        Ok(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Failure, Preset};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn too_long(asked: u64) -> GiveUp {
        GiveUp::RetryAfterTooLong { asked: ms(asked) }
    }

    /// [`Policy::next_wait`] for the next retry of `s`, in milliseconds, `elapsed` in ms too.
    fn nw(p: &Policy, s: &CallState, o: &Outcome, d: Draw, elapsed: Option<u64>) -> Result<u32, GiveUp> {
        p.next_wait(s.attempts().saturating_add(1), s, o, d, elapsed.map(ms)).map(Duration::as_millis)
    }

    fn retry(wait: u64) -> Decision {
        Decision::Retry { wait: ms(wait) }
    }

    fn decide_all(p: &Policy, op: Operation, outcomes: &[Outcome]) -> (Vec<u32>, Verdict) {
        let mut s = CallState::new();
        let mut waits = Vec::new();
        for o in outcomes {
            match p.decide(&mut s, op, o, Draw::ZERO, None) {
                Decision::Retry { wait } => waits.push(wait.as_millis()),
                Decision::Done(v) => return (waits, v),
            }
        }
        (waits, Verdict::GaveUp(GiveUp::OutcomesExhausted))
    }

    #[test]
    fn waits_that_add_up_to_the_budget_exactly_fit_then_the_attempt_cap_ends_the_call() {
        // 100 + 200 ms = 300 ms fits a 300 ms budget exactly: no float error stops it early.
        let p = Policy::builder(Preset::Strict).max_attempts(10).build().unwrap();
        let o = [Outcome::Failure(Failure::ResponseTimeout); 4];
        assert_eq!(
            decide_all(&p, Operation::Idempotent, &o),
            (vec![100, 200], Verdict::GaveUp(GiveUp::Budget))
        );
        let p = Policy::builder(Preset::Strict).build().unwrap();
        assert_eq!(
            decide_all(&p, Operation::Idempotent, &o),
            (vec![100, 200], Verdict::GaveUp(GiveUp::Attempts))
        );
    }

    #[test]
    fn a_retry_after_past_the_budget_stops_before_any_wait() {
        let p = Policy::builder(Preset::Strict).budget(ms(500)).build().unwrap();
        let o = [Outcome::status_after(503, secs(2)), Outcome::Ok];
        assert_eq!(decide_all(&p, Operation::Idempotent, &o), (vec![], Verdict::GaveUp(too_long(2000))));
    }

    #[test]
    fn strict_posts_and_bad_data_are_not_retried() {
        let p = Policy::builder(Preset::Strict).build().unwrap();
        assert_eq!(
            decide_all(&p, Operation::Write, &[Outcome::Failure(Failure::ResponseTimeout)]),
            (vec![], Verdict::Unknown)
        );
        assert_eq!(decide_all(&p, Operation::Write, &[Outcome::status(429)]), (vec![], Verdict::Failed));
        assert_eq!(
            decide_all(&p, Operation::Idempotent, &[Outcome::Failure(Failure::BadBody)]),
            (vec![], Verdict::Failed)
        );
    }

    #[test]
    fn a_retry_after_past_max_retry_after_fails_at_once() {
        // max_delay 20 s, Retry-After 120 s: no sleep at all.
        let p = Policy::builder(Preset::Default).max_attempts(5).max_retry_after(secs(20)).build().unwrap();
        let o = [Outcome::status_after(429, secs(120)), Outcome::Ok];
        assert_eq!(decide_all(&p, Operation::Idempotent, &o), (vec![], Verdict::GaveUp(too_long(120_000))));
    }

    #[test]
    fn deadline_counts_attempt_time() {
        let p = exact().deadline(ms(10)).min_attempt(ms(3)).build().unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        // 4 ms elapsed, wait 1, then an attempt of at least 3: ends at 8 ≤ 10.
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, Some(ms(4))), retry(1));
        // 6 elapsed, wait 2 + attempt 3 = 11 > 10: not started.
        assert_eq!(
            p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, Some(ms(6))),
            Decision::Done(Verdict::GaveUp(GiveUp::Deadline))
        );
    }

    #[test]
    fn no_wait_starts_once_the_deadline_has_passed() {
        let p = Policy::builder(Preset::Default)
            .jitter(crate::Jitter::Full)
            .max_attempts(5)
            .deadline(ms(100))
            .build()
            .unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        // A draw of 0 makes a wait of 0, which must not slip past a deadline already gone.
        assert_eq!(
            p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, Some(ms(150))),
            Decision::Done(Verdict::GaveUp(GiveUp::Deadline))
        );
        let mut s = CallState::new();
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, Some(ms(100))), retry(0));
    }

    #[test]
    fn the_spread_never_turns_a_retry_after_that_fits_into_a_give_up() {
        // Budget 2,050 ms: the server's 2 s fits; its spread (up to the 100 ms ceiling) is trimmed.
        let p = Policy::builder(Preset::Default).budget(ms(2_050)).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status_after(429, secs(2));
        assert_eq!(nw(&p, &s, &o, Draw::TOP, None), Ok(2_050));
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, None), Ok(2_000));
        // Past the budget the server's own value still gives up at once.
        let p = Policy::builder(Preset::Default).budget(ms(1_999)).build().unwrap();
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, None), Err(too_long(2_000)));
    }

    #[test]
    fn a_huge_retry_after_never_overflows_and_gives_up_now() {
        use crate::retry_after::Rules;
        for value in [&b"1e400"[..], b"99999999999999999999", b"18446744073709551615.5", b"+1e30", b"4294968"]
        {
            let (o, _) = Outcome::from_response(503, [value], None, None, &Rules::LENIENT);
            assert_eq!(o.retry_after(), Some(Duration::MAX), "{value:?}");
            for preset in [Preset::Default, Preset::Basic] {
                let p = Policy::builder(preset).build().unwrap();
                let mut s = CallState::new();
                // Seconds to milliseconds saturates; the wait is never started.
                assert_eq!(
                    p.decide(&mut s, Operation::Idempotent, &o, Draw::TOP, Some(ms(0))),
                    Decision::Done(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: Duration::MAX }))
                );
                assert_eq!(s.waited(), Duration::ZERO);
            }
        }
    }

    #[test]
    fn a_loose_retry_after_is_waited_out_in_full() {
        // "1.5" asks for at least 1.5 s: the call waits 2 s, not the backoff's 100 ms.
        let p = Policy::builder(Preset::Basic).build().unwrap();
        let (o, _) =
            Outcome::from_response(429, [b"1.5".as_slice()], None, None, &crate::retry_after::Rules::LENIENT);
        assert_eq!(nw(&p, &CallState::new(), &o, Draw::ZERO, None), Ok(2_000));
    }

    #[test]
    fn spread_retry_after_is_never_below_the_server_value() {
        let p = Policy::builder(Preset::Default).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status_after(429, secs(2));
        let low = nw(&p, &s, &o, Draw::ZERO, None).unwrap();
        let high = nw(&p, &s, &o, Draw::TOP, None).unwrap();
        assert_eq!(low, 2000);
        assert!(high > low && high < 2000 + 100, "{high}");
    }

    /// Small numbers of milliseconds, `max` Retry-After mode: every number below is exact.
    fn exact() -> crate::PolicyBuilder {
        Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120))
    }

    fn wait_for(p: &Policy, retry_after: u64, elapsed: Option<u64>) -> Result<u32, GiveUp> {
        nw(p, &CallState::new(), &Outcome::status_after(429, ms(retry_after)), Draw::ZERO, elapsed)
    }

    #[test]
    fn a_retry_after_equal_to_the_budget_left_is_waited_one_more_is_too_long() {
        let p = exact().build().unwrap();
        assert_eq!(wait_for(&p, 120, None), Ok(120));
        assert_eq!(wait_for(&p, 121, None), Err(too_long(121)));
        assert_eq!(wait_for(&p, 0, None), Ok(1), "a Retry-After of 0 never lowers the backoff");
        // What is left, not the whole budget: after 100 of 120, 20 fits and 21 does not.
        let mut s = CallState::new();
        let o = Outcome::status_after(429, ms(100));
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, None), retry(100));
        let next = |ra| nw(&p, &s, &Outcome::status_after(429, ms(ra)), Draw::ZERO, None);
        assert_eq!(next(20), Ok(20));
        assert_eq!(next(21), Err(too_long(21)));
    }

    #[test]
    fn a_backoff_wait_equal_to_the_budget_left_is_waited_one_more_gives_up() {
        // Ceilings 2, 4, 8 with no jitter: budget 14 holds all three exactly, 13 only two.
        let p = exact().jitter(crate::Jitter::None).budget(ms(14)).build().unwrap();
        let o = [Outcome::status(503); 5];
        assert_eq!(
            decide_all(&p, Operation::Idempotent, &o),
            (vec![2, 4, 8], Verdict::GaveUp(GiveUp::Budget))
        );
        let p = exact().jitter(crate::Jitter::None).budget(ms(13)).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Idempotent, &o), (vec![2, 4], Verdict::GaveUp(GiveUp::Budget)));
    }

    #[test]
    fn max_retry_after_allows_its_own_value_and_refuses_one_more() {
        let p = exact().max_retry_after(ms(30)).build().unwrap();
        assert_eq!(wait_for(&p, 29, None), Ok(29));
        assert_eq!(wait_for(&p, 30, None), Ok(30));
        assert_eq!(wait_for(&p, 31, None), Err(too_long(31)));
        // The budget still holds 31: the limit alone refused it.
        assert_eq!(wait_for(&exact().build().unwrap(), 31, None), Ok(31));
        // Without a Retry-After the limit does not apply to the backoff's own waits.
        let p = exact().max_retry_after(ms(0)).jitter(crate::Jitter::None).build().unwrap();
        assert_eq!(nw(&p, &CallState::new(), &Outcome::status(503), Draw::ZERO, None), Ok(2));
        assert_eq!(wait_for(&p, 1, None), Err(too_long(1)));
        assert_eq!(wait_for(&p, 0, None), Ok(2));
    }

    #[test]
    fn a_retry_after_past_the_deadline_is_too_long_at_once() {
        // Deadline 100, 10 elapsed, attempts take at least 5: a wait of 85 ends the next attempt
        // exactly at the deadline; 86 would not.
        let p = exact().budget(ms(1_000)).deadline(ms(100)).min_attempt(ms(5)).build().unwrap();
        assert_eq!(wait_for(&p, 85, Some(10)), Ok(85));
        assert_eq!(wait_for(&p, 86, Some(10)), Err(too_long(86)));
        // The budget could hold it; only the deadline refused it.
        assert_eq!(wait_for(&p, 86, Some(0)), Ok(86));
        // The backoff's own wait against the deadline: equal fits, past it gives up.
        let p = exact().jitter(crate::Jitter::None).budget(ms(1_000)).deadline(ms(100)).build().unwrap();
        let s = CallState::new();
        let o = Outcome::status(503);
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(98)), Ok(2));
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(99)), Err(GiveUp::Deadline));
        // Exactly at the deadline with no attempt time, a zero wait is still not past it.
        let p = exact()
            .base(ms(1))
            .cap(ms(1))
            .max_attempts(3)
            .budget(ms(1_000))
            .deadline(ms(100))
            .build()
            .unwrap();
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(100)), Ok(0));
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(101)), Err(GiveUp::Deadline));
        let p = exact().budget(ms(1_000)).deadline(ms(100)).min_attempt(ms(5)).build().unwrap();
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(96)), Err(GiveUp::Deadline));
        // A wait equal to the budget left but past the deadline's room gives up on the deadline:
        // the budget could still pay for it.
        let p = exact().jitter(crate::Jitter::None).budget(ms(2)).deadline(ms(100)).build().unwrap();
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(98)), Ok(2));
        assert_eq!(nw(&p, &s, &o, Draw::ZERO, Some(99)), Err(GiveUp::Deadline));
        let p =
            exact().jitter(crate::Jitter::None).budget(ms(1)).base(ms(1)).deadline(ms(100)).build().unwrap();
        let two = CallState { attempts: 1, waited: ms(0), last_wait: ms(0) };
        assert_eq!(nw(&p, &two, &o, Draw::ZERO, Some(0)), Err(GiveUp::Budget));
        let p = exact().budget(ms(1_000)).deadline(ms(100)).min_attempt(ms(5)).build().unwrap();
        // Without a clock the deadline cannot be checked: only the budget applies.
        assert_eq!(wait_for(&p, 500, None), Ok(500));
        // Without a deadline, however long the call has run, only the budget applies.
        let p = exact().budget(ms(1_000)).min_attempt(ms(5)).build().unwrap();
        assert_eq!(wait_for(&p, 500, Some(u64::from(u32::MAX) - 10)), Ok(500));
        assert_eq!(wait_for(&p, 500, Some(u64::from(u32::MAX))), Ok(500));
    }

    #[test]
    fn the_spread_is_trimmed_to_the_budget_and_to_the_deadline_never_past_either() {
        // Spread mode, in exact milliseconds: the ceiling of retry 1 is 10, a top draw adds 9.
        let spread = || Policy::builder(Preset::Default).base(ms(10)).cap(ms(10)).budget(ms(1_000));
        let top = Draw::TOP;
        let at = |p: &Policy, ra: u64, elapsed| {
            nw(p, &CallState::new(), &Outcome::status_after(429, ms(ra)), top, elapsed)
        };
        let p = spread().build().unwrap();
        assert_eq!(at(&p, 50, None), Ok(59), "room to spare: the whole spread");
        // Trimmed to the budget left.
        let p = spread().budget(ms(55)).build().unwrap();
        assert_eq!(at(&p, 50, None), Ok(55));
        assert_eq!(at(&p, 55, None), Ok(55));
        // Trimmed to the deadline (100, nothing elapsed), even with budget to spare.
        let p = spread().deadline(ms(100)).build().unwrap();
        assert_eq!(at(&p, 95, Some(0)), Ok(100));
        assert_eq!(at(&p, 100, Some(0)), Ok(100));
        assert_eq!(at(&p, 50, Some(0)), Ok(59));
        assert_eq!(at(&p, 101, Some(0)), Err(too_long(101)));
        // Whichever is nearer: the deadline's 40 left, then the budget's 30.
        let p = spread().budget(ms(30)).deadline(ms(100)).build().unwrap();
        assert_eq!(at(&p, 25, Some(60)), Ok(30));
        let p = spread().budget(ms(50)).deadline(ms(100)).build().unwrap();
        assert_eq!(at(&p, 35, Some(60)), Ok(40));
    }

    #[test]
    fn the_attempt_cap_counts_the_first_attempt() {
        let p = exact().max_attempts(2).build().unwrap();
        let o = [Outcome::status(503); 4];
        assert_eq!(decide_all(&p, Operation::Idempotent, &o), (vec![1], Verdict::GaveUp(GiveUp::Attempts)));
        let p = exact().max_attempts(1).build().unwrap();
        assert_eq!(decide_all(&p, Operation::Idempotent, &o), (vec![], Verdict::GaveUp(GiveUp::Attempts)));
    }

    #[test]
    fn state_records_attempts_waits_and_the_last_wait() {
        let p = exact().jitter(crate::Jitter::None).build().unwrap();
        let mut s = CallState::new();
        let o = Outcome::status(503);
        for _ in 0..3 {
            p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, None);
        }
        assert_eq!((s.attempts(), s.waited(), s.last_wait()), (3, ms(14), ms(8)));
        assert_eq!(
            p.decide(&mut s, Operation::Idempotent, &Outcome::Ok, Draw::ZERO, None),
            Decision::Done(Verdict::Ok)
        );
        assert_eq!((s.attempts(), s.waited(), s.last_wait()), (4, ms(14), ms(8)));
        // Decorrelated jitter grows from the last wait the state holds.
        let p = exact().jitter(crate::Jitter::Decorrelated).build().unwrap();
        let mut s = CallState::new();
        let top = Draw::TOP;
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, top, None), retry(5));
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, top, None), retry(14));
    }

    #[test]
    fn the_fleet_charges_failures_refunds_successes_and_throttles_retries() {
        let fleet = crate::FleetBudget::new(4, 1000).unwrap();
        let p = exact().build().unwrap();
        let o = Outcome::status(503);
        let decide =
            |op, o: &Outcome, s: &mut CallState| p.decide_with_fleet(s, op, o, Draw::ZERO, None, &fleet);
        let mut s = CallState::new();
        assert_eq!(decide(Operation::Idempotent, &o, &mut s), retry(1));
        assert_eq!(fleet.tokens_milli(), 3000);
        assert_eq!(
            decide(Operation::Idempotent, &o, &mut s),
            Decision::Done(Verdict::GaveUp(GiveUp::Throttled))
        );
        assert_eq!(fleet.tokens_milli(), 2000);
        let mut s = CallState::new();
        assert_eq!(decide(Operation::Idempotent, &Outcome::Ok, &mut s), Decision::Done(Verdict::Ok));
        assert_eq!(fleet.tokens_milli(), 3000);
        // An unknown write costs a token too (the server may be in trouble); a 400 does not.
        let mut s = CallState::new();
        assert_eq!(decide(Operation::Write, &o, &mut s), Decision::Done(Verdict::Unknown));
        assert_eq!(fleet.tokens_milli(), 2000);
        let mut s = CallState::new();
        assert_eq!(
            decide(Operation::Idempotent, &Outcome::status(400), &mut s),
            Decision::Done(Verdict::Failed)
        );
        assert_eq!(fleet.tokens_milli(), 2000);
        // Nor does a cancel.
        let mut s = CallState::new();
        let cancelled = Outcome::Failure(Failure::Cancelled);
        assert_eq!(decide(Operation::Idempotent, &cancelled, &mut s), Decision::Done(Verdict::Cancelled));
        assert_eq!(fleet.tokens_milli(), 2000);
        // With no fleet, nothing throttles.
        let mut s = CallState::new();
        assert_eq!(p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, None), retry(1));
    }

    #[test]
    fn verdicts_and_reasons_have_names_and_text() {
        for g in [
            GiveUp::Budget,
            GiveUp::Deadline,
            GiveUp::Attempts,
            GiveUp::RetryAfterTooLong { asked: ms(5) },
            GiveUp::Throttled,
            GiveUp::OutcomesExhausted,
            GiveUp::CircuitOpen,
        ] {
            assert_eq!(GiveUp::from_name(g.name(), ms(5)), Some(g));
            assert!(GiveUp::NAMES.contains(&g.name()));
            assert_eq!(Verdict::from_name("gave_up", Some(g)), Some(Verdict::GaveUp(g)));
        }
        for v in [Verdict::Ok, Verdict::Failed, Verdict::Unknown, Verdict::Cancelled] {
            assert_eq!(Verdict::from_name(v.name(), None), Some(v));
            assert_eq!(Verdict::from_name(v.name(), Some(GiveUp::Budget)), None);
            assert_eq!(format!("{v}"), v.name());
            assert!(Verdict::NAMES.contains(&v.name()));
        }
        assert_eq!(Verdict::from_name("gave_up", None), None);
        assert!(Verdict::NAMES.contains(&Verdict::GaveUp(GiveUp::Budget).name()));
        assert_eq!(GiveUp::from_name("soon", ms(1)), None);
        assert_eq!(format!("{}", Verdict::GaveUp(GiveUp::Budget)), "gave_up (budget)");
        assert_eq!(
            format!("{}", GiveUp::RetryAfterTooLong { asked: secs(5) }),
            "retry_after_too_long, asked 5000 ms"
        );
        assert_eq!(
            format!("{}", GiveUp::RetryAfterTooLong { asked: Duration::MAX }),
            "retry_after_too_long, asked longer than 49 days"
        );
    }

    #[test]
    fn the_ceiling_from_the_cap_shift_is_the_backoffs_for_every_base_cap_and_retry() {
        // Unchecked settings too (a base of 0, a cap below the base), as a plan meets them.
        let edges = [0, 1, 2, 3, 5, 100, 10_000, 1 << 20, (1 << 31) - 1, 1 << 31, 3 << 30, u32::MAX - 1];
        let mut ks: Vec<u32> = (0..=40).collect();
        ks.extend([255, 256, 1_000, u32::MAX - 1, u32::MAX]);
        for base in edges {
            for cap in edges.iter().copied().chain([base.saturating_mul(2), base.saturating_add(1)]) {
                let p = Policy::builder(Preset::Basic)
                    .base(ms(u64::from(base)))
                    .cap(ms(u64::from(cap)))
                    .p
                    .with_cap_shift();
                for &k in &ks {
                    // Retry 0 is never asked for; retry 1 onwards is.
                    let k = k.max(1);
                    assert_eq!(p.ceiling(k), p.backoff.ceiling(k), "base {base}, cap {cap}, retry {k}");
                }
            }
        }
    }

    #[test]
    fn every_jitter_draws_between_its_floor_and_its_ceiling_as_the_formula_says() {
        let b = |j| crate::Backoff::new(ms(10), ms(1_000), j);
        for c in [0u32, 1, 2, 3, 99, 100, 1_000, u32::MAX - 1] {
            let c = ms(u64::from(c));
            let x = c.as_millis();
            for (draw, f) in
                [(Draw::ZERO, 0u64), (Draw::unit(1 << 31), 1 << 31), (Draw::TOP, u64::from(u32::MAX))]
            {
                let scaled = |span: u32| ((u64::from(span) * f) >> 32) as u32;
                let wait = |j| b(j).wait_under(c, Duration::ZERO, draw).as_millis();
                assert_eq!(wait(crate::Jitter::None), x);
                assert_eq!(wait(crate::Jitter::Full), scaled(x));
                assert_eq!(wait(crate::Jitter::Equal), x / 2 + scaled(x - x / 2));
            }
        }
    }

    #[test]
    fn the_per_call_state_is_twelve_bytes() {
        assert_eq!(core::mem::size_of::<CallState>(), 12);
    }
}
