//! Shared helpers for wary's cross-crate tests: the basic policy of the conformance cases, one
//! unit of a case as one millisecond (as `wary plan` reads them: the formula rounds in the
//! case's own unit, and the core's in whole milliseconds).

use wary::{Draw, Duration, Operation, Outcome, Policy, Preset, plan::Plan};

/// One unit of a case: a millisecond.
pub fn unit(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The basic policy `{"base": 2, "cap": 60, "budget": 120}`.
pub fn basic_policy() -> Policy {
    basic_with(2, 60, 120)
}

/// The basic preset with the given base, cap and budget, in case units.
pub fn basic_with(base: u64, cap: u64, budget: u64) -> Policy {
    match Policy::builder(Preset::Basic).base(unit(base)).cap(unit(cap)).budget(unit(budget)).build() {
        Ok(p) => p,
        Err(e) => unreachable!("the basic policy is valid: {e}"),
    }
}

/// Percent draws.
pub fn pct(draws: &[u8]) -> Vec<Draw> {
    draws.iter().map(|d| Draw::percent(*d).unwrap_or(Draw::ZERO)).collect()
}

/// Waits as case units.
pub fn units(waits: &[Duration]) -> Vec<u64> {
    waits.iter().map(|w| u64::from(w.as_millis())).collect()
}

/// Runs the core's plan with a generous capacity.
pub fn plan_percent(outcomes: &[Outcome], op: Operation, policy: &Policy, draws: &[u8]) -> Plan<64> {
    match wary::plan::plan::<64>(policy, op, outcomes, &pct(draws)) {
        Ok(p) => p,
        Err(e) => unreachable!("plan failed: {e}"),
    }
}
