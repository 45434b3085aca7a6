//! `plan` over the decision path: a whole schedule into a fixed-capacity wait array, on outcomes,
//! draws and a policy the compiler cannot see.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::plan::plan;
use wary::{Draw, Operation, Outcome, Policy};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        // Built in place and handed over by reference, as a caller's own arrays are: plan
        // reads them where they are.
        let outcomes = [Outcome::status(i[0] as u16); 8];
        let draws = [Draw::unit(i[2]); 8];
        let (outcomes, draws) = black_box((&outcomes, &draws));
        match plan::<16>(policy, Operation::Idempotent, outcomes, draws) {
            Ok(p) => p.waits.iter().map(|w| u64::from(w.as_millis())).sum(),
            Err(_) => 0,
        }
    })
}
