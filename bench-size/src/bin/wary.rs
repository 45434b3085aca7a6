//! `Policy::decide` on a policy and outcomes the compiler cannot see: every class, jitter and
//! stop rule stays in. The draw comes from the caller's RNG, outside this figure.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::{CallState, Draw, Duration, Operation, Outcome, Policy};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        let mut state = CallState::new();
        for _ in 0..i[1] {
            let outcome: Outcome = black_box(Outcome::status(i[0] as u16));
            black_box(policy.decide(
                &mut state,
                Operation::Idempotent,
                &outcome,
                Draw::unit(i[2]),
                Some(Duration::from_millis(u64::from(i[3]))),
            ));
        }
        u64::from(state.waited().as_millis())
    })
}
