//! The runner's decision path: `Policy::decide` plus the fleet budget it charges and refunds.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::{CallState, Draw, Duration, FleetBudget, Operation, Outcome, Policy};

static FLEET: FleetBudget = match FleetBudget::new(10, 100) {
    Ok(b) => b,
    Err(_) => panic!(),
};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        let fleet = black_box(&FLEET);
        let mut state = CallState::new();
        for _ in 0..i[1] {
            let outcome: Outcome = black_box(Outcome::status(i[0] as u16));
            let elapsed = Some(Duration::from_millis(u64::from(i[3])));
            black_box(policy.decide_with_fleet(
                &mut state,
                Operation::Idempotent,
                &outcome,
                Draw::unit(i[2]),
                elapsed,
                fleet,
            ));
        }
        u64::from(state.waited().as_millis())
    })
}
