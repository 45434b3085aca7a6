//! Instructions per decision under callgrind: wary's decision path and backon's exponential
//! backoff with jitter on the same inputs, in one run. `cargo xtask bench` divides each count
//! by the decisions it made and prints the ratio.

// The harness macros generate undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;

use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use wary_bench::decision::{
    CALLS, backon_builder, backon_calls, bench_fleet, bench_policy, classify_calls, harness_calls, wary_calls,
};

// classify + backoff + per-call budget, as `Policy::decide` does.
#[library_benchmark]
#[bench::calls(bench_policy())]
fn wary_decide(policy: wary::Policy) -> u64 {
    black_box(wary_calls(black_box(&policy), None, black_box(CALLS)))
}

// The same, with the fleet budget charged and refunded as the runner does.
#[library_benchmark]
#[bench::calls((bench_policy(), bench_fleet()))]
fn wary_decide_fleet(input: (wary::Policy, wary::FleetBudget)) -> u64 {
    let (policy, fleet) = input;
    black_box(wary_calls(black_box(&policy), Some(black_box(&fleet)), black_box(CALLS)))
}

// The baseline: backon, a backoff built per call, one `next()` per failure.
#[library_benchmark]
#[bench::calls(backon_builder())]
fn backon_exponential_jitter(builder: backon::ExponentialBuilder) -> u64 {
    black_box(backon_calls(black_box(builder), black_box(CALLS)))
}

// The harness alone (loops, generator, outcomes handed over): what every wary figure carries.
#[library_benchmark]
#[bench::calls(CALLS)]
fn wary_harness(calls: u32) -> u64 {
    black_box(harness_calls(black_box(calls)))
}

// The harness and the classification `decide` starts with, for the classification's share.
#[library_benchmark]
#[bench::calls(bench_policy())]
fn wary_classify(policy: wary::Policy) -> u64 {
    black_box(classify_calls(black_box(&policy), black_box(CALLS)))
}

library_benchmark_group!(
    name = decision;
    benchmarks = wary_decide, wary_decide_fleet, backon_exponential_jitter, wary_harness, wary_classify
);
main!(library_benchmark_groups = decision);
