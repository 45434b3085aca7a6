//! The runner's decision path: `Policy::decide` plus the fleet budget it charges and refunds.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::{
    CallState, Class, Decision, Draw, FleetBudget, GiveUp, Operation, Outcome, Policy, Preset, Verdict,
};

static POLICY: Policy = match Policy::builder(Preset::Default).build() {
    Ok(p) => p,
    Err(_) => panic!(),
};

static FLEET: FleetBudget = match FleetBudget::new(10, 100) {
    Ok(b) => b,
    Err(_) => panic!(),
};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&POLICY);
        let fleet = black_box(&FLEET);
        let mut state = CallState::new();
        for _ in 0..i[1] {
            let outcome: Outcome = black_box(Outcome::status(i[0] as u16));
            let allows = match policy.classify(Operation::Read, &outcome) {
                Class::Ok => {
                    fleet.on_success();
                    true
                }
                Class::Retry | Class::Unknown => fleet.on_failure(),
                _ => true,
            };
            let mut d =
                policy.decide(&mut state, Operation::Read, &outcome, Draw::unit(i[2]), Some(u64::from(i[3])));
            if matches!(d, Decision::Retry { .. }) && !allows {
                d = Decision::Done(Verdict::GaveUp(GiveUp::Throttled));
            }
            black_box(d);
        }
        state.waited()
    })
}
