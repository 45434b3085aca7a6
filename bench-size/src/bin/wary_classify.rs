//! `Policy::classify` alone, on the same policy and outcomes as `wary`: the flash of the
//! classification `decide` starts with (its code and the policy's table), for the share of
//! `decide`'s figure that is classification.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::{Operation, Outcome, Policy};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        let mut total = 0u64;
        for _ in 0..i[1] {
            let outcome: Outcome = black_box(Outcome::status(i[0] as u16));
            total = total.wrapping_add(black_box(policy.classify(Operation::Idempotent, &outcome)) as u64);
        }
        total
    })
}
