//! The decision path, as benchmarked and as the fleet simulation drives it.
//!
//! Both sides of the comparison get the same inputs: base 5 ms, cap 2 s (the AWS study's
//! numbers), the same number of failed attempts per call, jitter from the same generator
//! (fastrand's wyrand, which backon uses inside) seeded with the same value.

use backon::{BackoffBuilder, ExponentialBuilder};
use wary::{
    CallState, Decision, Draw, Duration, Failure, FleetBudget, Operation, Outcome, Policy, Preset, Verdict,
};

/// The AWS study's base, in ms.
pub const BASE: u64 = 5;
/// The AWS study's cap, in ms.
pub const CAP: u64 = 2000;
/// Failed attempts per benchmarked call; each is one retry decision.
pub const RETRIES: usize = 10;
/// Calls per benchmark run: enough that per-run overhead is a small fraction of a decision.
pub const CALLS: u32 = 50;
/// The seed both sides start from.
pub const SEED: u64 = 0x5eed_0004;

/// Retryable outcomes a read meets, in the order each benchmarked call meets them: a mix, so
/// the classifier walks its table as in the field rather than hitting one cached branch.
pub const FAILURES: [Outcome; RETRIES] = [
    Outcome::status(503),
    Outcome::Failure(Failure::ResponseTimeout),
    Outcome::status(429),
    Outcome::Failure(Failure::Reset),
    Outcome::status(502),
    Outcome::Failure(Failure::ConnectTimeout),
    Outcome::status(500),
    Outcome::status(504),
    Outcome::Failure(Failure::Refused),
    Outcome::status(408),
];

/// wary with the AWS study's base and cap, full jitter like backon's, and enough attempts and
/// budget that no stop rule ends a benchmarked call early.
pub fn bench_policy() -> Policy {
    Policy::builder(Preset::Default)
        .base(Duration::from_millis(BASE))
        .cap(Duration::from_millis(CAP))
        .jitter(wary::Jitter::Full)
        .max_attempts(RETRIES as u32 + 2)
        .budget(Duration::from_millis(CAP * (RETRIES as u64 + 1)))
        .build()
        .unwrap_or_else(|e| panic!("benchmark policy refused: {e:?}"))
}

/// A fleet budget large enough that the benchmarked calls are never throttled: the measured
/// path is the bucket's update, not an early exit.
pub fn bench_fleet() -> FleetBudget {
    FleetBudget::new(1000, 1000).unwrap_or_else(|e| panic!("benchmark fleet budget refused: {e:?}"))
}

/// `calls` calls through wary's decision path: each meets [`FAILURES`], one retry decision
/// per failure, then succeeds (one more decision). Returns the total wait so nothing is
/// optimised away.
pub fn wary_calls(policy: &Policy, fleet: Option<&FleetBudget>, calls: u32) -> u64 {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut total = 0u64;
    for _ in 0..calls {
        let mut state = CallState::new();
        for outcome in &ONE_CALL {
            let draw = Draw::unit(rng.u32(..));
            let decision = match fleet {
                Some(f) => {
                    policy.decide_with_fleet(&mut state, Operation::Idempotent, outcome, draw, None, f)
                }
                None => policy.decide(&mut state, Operation::Idempotent, outcome, draw, None),
            };
            total = total.wrapping_add(match decision {
                Decision::Retry { wait } => u64::from(wait.as_millis()),
                Decision::Done(v) => u64::from(v == Verdict::Ok),
            });
        }
    }
    total
}

/// The harness of [`wary_calls`] alone, for the share of its count that is not the decision:
/// the same loops, the same generator drawing once per attempt, each outcome handed over where
/// the decision would take it.
pub fn harness_calls(calls: u32) -> u64 {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut total = 0u64;
    for _ in 0..calls {
        for outcome in &ONE_CALL {
            std::hint::black_box(outcome);
            total = total.wrapping_add(u64::from(rng.u32(..)));
        }
    }
    total
}

/// [`harness_calls`] with each outcome classified, as [`Policy::decide`] classifies it first:
/// the classification's share of the decision is this count less the harness's.
pub fn classify_calls(policy: &Policy, calls: u32) -> u64 {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut total = 0u64;
    for _ in 0..calls {
        for outcome in &ONE_CALL {
            let draw = u64::from(rng.u32(..));
            total = total.wrapping_add(draw ^ policy.classify(Operation::Idempotent, outcome) as u64);
        }
    }
    total
}

/// What one benchmarked call meets: [`FAILURES`], then a success.
const ONE_CALL: [Outcome; RETRIES + 1] = {
    let mut all = [Outcome::Ok; RETRIES + 1];
    let mut i = 0;
    while i < RETRIES {
        all[i] = FAILURES[i];
        i += 1;
    }
    all
};

/// backon's exponential backoff with jitter, built as its docs show, with the same base, cap
/// and retries.
pub fn backon_builder() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(core::time::Duration::from_millis(BASE))
        .with_max_delay(core::time::Duration::from_millis(CAP))
        .with_max_times(RETRIES)
        .with_jitter()
        .with_jitter_seed(SEED)
}

/// `calls` calls through backon: a backoff built per call, one `next()` per failure.
pub fn backon_calls(builder: ExponentialBuilder, calls: u32) -> u64 {
    let mut total = 0u64;
    for _ in 0..calls {
        let mut backoff = builder.build();
        for _ in 0..RETRIES {
            if let Some(d) = backoff.next() {
                total = total.wrapping_add(d.as_millis() as u64);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_benchmarked_failure_is_retried_and_the_call_then_succeeds() {
        let p = bench_policy();
        let fleet = bench_fleet();
        let mut rng = fastrand::Rng::with_seed(SEED);
        for _ in 0..CALLS {
            let mut s = CallState::new();
            for o in &FAILURES {
                let d = p.decide_with_fleet(
                    &mut s,
                    Operation::Idempotent,
                    o,
                    Draw::unit(rng.u32(..)),
                    None,
                    &fleet,
                );
                assert!(matches!(d, Decision::Retry { .. }), "{o:?} gave {d:?}");
            }
            let d =
                p.decide_with_fleet(&mut s, Operation::Idempotent, &Outcome::Ok, Draw::ZERO, None, &fleet);
            assert_eq!(d, Decision::Done(Verdict::Ok));
        }
    }

    #[test]
    fn backon_yields_one_wait_per_failure() {
        let mut b = backon_builder().build();
        assert_eq!(b.by_ref().take(RETRIES).count(), RETRIES);
        assert_eq!(b.next(), None);
    }
}
