//! [`wary::plan::plan_into`]: the same schedule as `wary_plan`, written into a plan the caller keeps
//! in place (a `static`-free stack slot here), so nothing is moved or copied.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::plan::{Plan, plan_into};
use wary::{Draw, Operation, Outcome, Policy};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        let outcomes = [Outcome::status(i[0] as u16); 8];
        let draws = [Draw::unit(i[2]); 8];
        let (outcomes, draws) = black_box((&outcomes, &draws));
        let mut plan = Plan::<16>::new();
        match plan_into(&mut plan, policy, Operation::Idempotent, outcomes, draws) {
            Ok(()) => plan.waits.iter().map(|w| u64::from(w.as_millis())).sum(),
            Err(_) => 0,
        }
    })
}
