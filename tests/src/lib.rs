//! Shared helpers for wary's cross-crate tests: the exercise policy in its own unit, seconds.

use wary::{Draw, Operation, Outcome, Policy, Preset, plan::Plan};

/// The exercise policy `{"base": 2, "cap": 60, "budget": 120}`, in seconds.
pub fn exercise_policy() -> Policy {
    exercise_with(2, 60, 120)
}

/// The exercise preset in seconds with the given base, cap and budget.
pub fn exercise_with(base: u64, cap: u64, budget: u64) -> Policy {
    match Policy::builder(Preset::Exercise).tick_hz(1).base(base).cap(cap).budget(budget).build() {
        Ok(p) => p,
        Err(e) => unreachable!("the exercise policy is valid: {e}"),
    }
}

/// Percent draws.
pub fn pct(draws: &[u8]) -> Vec<Draw> {
    draws.iter().map(|d| Draw::percent(*d).unwrap_or(Draw::ZERO)).collect()
}

/// Runs the core's plan with a generous capacity.
pub fn plan_percent(outcomes: &[Outcome], op: Operation, policy: &Policy, draws: &[u8]) -> Plan<64> {
    match wary::plan::plan::<64>(policy, op, outcomes, &pct(draws)) {
        Ok(p) => p,
        Err(e) => unreachable!("plan failed: {e}"),
    }
}
