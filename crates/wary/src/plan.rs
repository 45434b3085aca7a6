//! A pure plan: the waits and verdict a policy gives a known sequence of outcomes and draws.
//!
//! Nothing sleeps and nothing is random, so a failing schedule reproduces exactly, and
//! `wary plan` is a line-by-line front end to it. The waits go into a fixed-capacity array;
//! where the policy bounds its retries, [`plan_static`] checks at compile time that the capacity
//! holds them.
//!
//! A plan is bounded by its outcomes, not by the policy, so [`PolicyBuilder::plan`] answers
//! settings that [`PolicyBuilder::build`] refuses for a running call: a budget of 0 (no wait is
//! allowed), a cap below the base (every ceiling is the cap), jitter that can wait 0 with no
//! attempt cap. The formula defines each of them; only a call with no list of outcomes to end it
//! could loop forever on them.
//!
//! ```
//! use wary::{Draw, Duration, Operation, Outcome, Policy, Preset, plan::plan};
//! let ms = Duration::from_millis;
//! let p = Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120)).build().unwrap();
//! let outcomes = [Outcome::status(503); 10];
//! let draws = [Draw::percent(99).unwrap(); 9];
//! let r = plan::<8>(&p, Operation::Idempotent, &outcomes, &draws).unwrap();
//! let waits: Vec<u32> = r.waits.iter().map(|w| w.as_millis()).collect();
//! assert_eq!(waits, [1, 3, 7, 15, 31, 59]);
//! assert_eq!(r.verdict.name(), "gave_up");
//! ```

use heapless::Vec;

use crate::backoff::Draw;
use crate::classify::{Class, Operation, Outcome};
use crate::decide::{CallState, Decision, GiveUp, Verdict};
pub use crate::error::PlanError;
use crate::policy::{Policy, PolicyBuilder, StaticPolicy};

/// The waits before each retry, in order, and how the call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Plan<const N: usize> {
    /// The wait before each retry.
    pub waits: Vec<crate::time::Duration, N>,
    /// The verdict.
    pub verdict: Verdict,
}

impl<const N: usize> Plan<N> {
    /// An empty plan: no waits, and the outcomes exhausted before any attempt.
    pub const fn new() -> Self {
        Plan { waits: Vec::new(), verdict: Verdict::GaveUp(GiveUp::OutcomesExhausted) }
    }
}

impl<const N: usize> Default for Plan<N> {
    fn default() -> Self {
        Plan::new()
    }
}

/// Plans a call: `outcomes[i]` is what attempt `i + 1` returns, `draws[k - 1]` the draw for
/// retry `k`. A draw is needed only for a retry the call actually reaches: a call that ends
/// first never asks for the rest.
pub fn plan<const N: usize>(
    policy: &Policy,
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<Plan<N>, PlanError> {
    plan_any(policy, op, outcomes, draws)
}

impl PolicyBuilder {
    /// Plans a call under these settings as the backoff formula defines them, including settings
    /// [`PolicyBuilder::build`] refuses because a running call could loop on them: a budget of
    /// 0, a cap below the base, a base of 0, jitter that can wait 0 with no attempt cap,
    /// durations that saturated (the arithmetic saturates too). The outcomes bound the plan.
    ///
    /// ```
    /// use wary::{Draw, Duration, Operation, Outcome, Policy, Preset};
    /// let ms = Duration::from_millis;
    /// // A budget of 0 allows no wait: the first retry gives up.
    /// let b = Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(0));
    /// assert!(b.build().is_err());
    /// let r = b.plan::<8>(Operation::Idempotent, &[Outcome::status(503), Outcome::Ok], &[Draw::ZERO]).unwrap();
    /// assert_eq!((r.waits.len(), r.verdict.name()), (0, "gave_up"));
    /// // A cap below the base: every ceiling is the cap.
    /// let b = Policy::builder(Preset::Basic).base(ms(10)).cap(ms(4)).budget(ms(120));
    /// let r = b.plan::<8>(Operation::Idempotent, &[Outcome::status(503); 4], &[Draw::ZERO; 3]).unwrap();
    /// assert_eq!(r.waits.as_slice(), &[ms(2), ms(2), ms(2)]);
    /// ```
    pub fn plan<const N: usize>(
        self,
        op: Operation,
        outcomes: &[Outcome],
        draws: &[Draw],
    ) -> Result<Plan<N>, PlanError> {
        plan_any(&self.p.with_cap_shift(), op, outcomes, draws)
    }
}

/// The plan of any policy value, checked or not: every step saturates, and the outcomes bound
/// the loop.
fn plan_any<const N: usize>(
    policy: &Policy,
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<Plan<N>, PlanError> {
    let mut plan = Plan::new();
    plan_into(&mut plan, policy, op, outcomes, draws)?;
    Ok(plan)
}

/// [`plan()`] into a plan the caller holds, emptied first: nothing is moved, so a device
/// keeping its plan in place links no memory-copy routine. On an error the plan holds the waits
/// decided before it.
///
/// ```
/// use wary::{Draw, Duration, Operation, Outcome, Policy, Preset, plan::{Plan, plan_into}};
/// let ms = Duration::from_millis;
/// let p = Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120)).build().unwrap();
/// let mut plan = Plan::<8>::new();
/// plan_into(&mut plan, &p, Operation::Idempotent, &[Outcome::status(503), Outcome::Ok], &[Draw::ZERO]).unwrap();
/// assert_eq!((plan.waits.as_slice(), plan.verdict.name()), (&[ms(1)][..], "ok"));
/// ```
pub fn plan_into<const N: usize>(
    plan: &mut Plan<N>,
    policy: &Policy,
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<(), PlanError> {
    plan.waits.clear();
    plan.verdict = Verdict::GaveUp(GiveUp::OutcomesExhausted);
    let mut state = CallState::new();
    let mut rest = outcomes.iter().peekable();
    while let Some(outcome) = rest.next() {
        let class = policy.classify(op, outcome);
        let draw = if class == Class::Retry {
            if rest.peek().is_none() {
                // No attempt left to wait for: the call ran out while still failing.
                return Ok(());
            }
            let retry = state.attempts().saturating_add(1);
            *draws.get(state.attempts() as usize).ok_or(PlanError::TooFewDraws { retry })?
        } else {
            Draw::ZERO
        };
        // With no clock, each attempt is taken to last the policy's shortest attempt time, so a
        // deadline ends a plan no later than `max_retries` counts (and `plan_static` holds).
        let attempts_so_far = state.attempts().saturating_add(1);
        let elapsed = policy
            .deadline()
            .map(|_| state.waited().saturating_add(policy.min_attempt().saturating_mul(attempts_so_far)));
        match policy.decide_class(&mut state, class, outcome, draw, elapsed) {
            Decision::Done(verdict) => {
                plan.verdict = verdict;
                return Ok(());
            }
            Decision::Retry { wait } => {
                plan.waits.push(wait).map_err(|_| PlanError::CapacityExceeded { capacity: N })?;
            }
        }
    }
    // No outcomes at all: nothing was attempted.
    Ok(())
}

/// [`plan()`] for a policy known at compile time, with a capacity the compiler has checked holds
/// every retry the policy can make: a plan from it never fails with
/// [`PlanError::CapacityExceeded`].
///
/// ```
/// use wary::{Draw, Duration, Operation, Outcome, Policy, Preset, StaticPolicy, plan::plan_static};
/// struct Basic;
/// impl StaticPolicy for Basic {
///     const POLICY: Policy = match Policy::builder(Preset::Basic)
///         .base(Duration::from_millis(2)).cap(Duration::from_millis(60)).budget(Duration::from_millis(120)).build()
///     {
///         Ok(p) => p,
///         Err(_) => panic!(),
///     };
/// }
/// let r = plan_static::<Basic, 7>(Operation::Idempotent, &[Outcome::status(500); 20], &[Draw::ZERO; 19]).unwrap();
/// let waits: Vec<u32> = r.waits.iter().map(|w| w.as_millis()).collect();
/// assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
/// ```
///
/// A capacity of 6 for the same policy does not compile:
///
/// ```compile_fail
/// # use wary::{Draw, Duration, Operation, Outcome, Policy, Preset, StaticPolicy, plan::plan_static};
/// # struct Basic;
/// # impl StaticPolicy for Basic {
/// #     const POLICY: Policy = match Policy::builder(Preset::Basic)
/// #         .base(Duration::from_millis(2)).cap(Duration::from_millis(60)).budget(Duration::from_millis(120)).build()
/// #     {
/// #         Ok(p) => p,
/// #         Err(_) => panic!(),
/// #     };
/// # }
/// let r = plan_static::<Basic, 6>(Operation::Idempotent, &[Outcome::status(500); 20], &[Draw::ZERO; 19]);
/// ```
pub fn plan_static<P: StaticPolicy, const N: usize>(
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<Plan<N>, PlanError> {
    const { assert!(P::MAX_RETRIES <= N, "plan capacity is smaller than the policy's most retries") };
    plan::<N>(&P::POLICY, op, outcomes, draws)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Duration, Preset};

    fn p() -> Policy {
        let ms = Duration::from_millis;
        Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120)).build().unwrap()
    }

    struct Basic;
    impl StaticPolicy for Basic {
        const POLICY: Policy = match Policy::builder(Preset::Basic)
            .base(Duration::from_millis(2))
            .cap(Duration::from_millis(60))
            .budget(Duration::from_millis(120))
            .build()
        {
            Ok(p) => p,
            Err(_) => panic!(),
        };
    }

    fn millis(waits: &[Duration]) -> std::vec::Vec<u32> {
        waits.iter().map(|w| w.as_millis()).collect()
    }

    #[test]
    fn every_way_to_plan_gives_the_same_schedule() {
        let (o, d) = ([Outcome::status(500); 20], [Draw::ZERO; 19]);
        let by_value = plan::<8>(&p(), Operation::Idempotent, &o, &d).unwrap();
        assert_eq!(millis(&by_value.waits), [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(by_value.verdict, Verdict::GaveUp(GiveUp::Budget));
        let fixed = plan_static::<Basic, 7>(Operation::Idempotent, &o, &d).unwrap();
        assert_eq!((millis(&fixed.waits), fixed.verdict), (millis(&by_value.waits), by_value.verdict));
        assert_eq!(p().to_builder().plan::<8>(Operation::Idempotent, &o, &d), Ok(by_value.clone()));
        // In place: a plan that held another schedule is emptied first.
        let mut kept =
            plan::<8>(&p(), Operation::Idempotent, &[Outcome::status(500), Outcome::Ok], &d).unwrap();
        assert_eq!((millis(&kept.waits), kept.verdict), (vec![1], Verdict::Ok));
        plan_into(&mut kept, &p(), Operation::Idempotent, &o, &d).unwrap();
        assert_eq!(kept, by_value);
    }

    #[test]
    fn a_builder_plans_settings_build_refuses_by_the_formula() {
        let ms = Duration::from_millis;
        let (o, d) = ([Outcome::status(503); 4], [Draw::ZERO; 3]);
        // A cap below the base: every ceiling is the cap.
        let b = Policy::builder(Preset::Basic).base(ms(10)).cap(ms(4)).budget(ms(120));
        assert!(b.build().is_err());
        assert_eq!(millis(&b.plan::<8>(Operation::Idempotent, &o, &d).unwrap().waits), [2, 2, 2]);
        // A base of 0 never grows, past the 32nd doubling too.
        let b = Policy::builder(Preset::Basic).base(ms(0)).cap(ms(60)).jitter(crate::Jitter::None);
        let r = b.plan::<64>(Operation::Idempotent, &[Outcome::status(503); 41], &[Draw::TOP; 40]).unwrap();
        assert_eq!((r.waits.len(), r.waits.iter().all(|w| w.as_millis() == 0)), (40, true));
    }

    #[test]
    fn errors_for_missing_draws_and_capacity() {
        let o = [Outcome::status(500); 4];
        assert_eq!(
            plan::<8>(&p(), Operation::Idempotent, &o, &[Draw::ZERO]),
            Err(PlanError::TooFewDraws { retry: 2 })
        );
        assert_eq!(
            plan::<1>(&p(), Operation::Idempotent, &o, &[Draw::ZERO; 3]),
            Err(PlanError::CapacityExceeded { capacity: 1 })
        );
        // The last outcome needs no draw: there is no attempt after it.
        assert!(plan::<8>(&p(), Operation::Idempotent, &o, &[Draw::ZERO; 3]).is_ok());
        assert_eq!(
            plan::<8>(&p(), Operation::Idempotent, &[], &[]).unwrap().verdict,
            Verdict::GaveUp(GiveUp::OutcomesExhausted)
        );
    }
}
