//! The runner's decision path with the fleet budget (as `wary_fleet`), and before each attempt a
//! `Breaker` and a `Pace` asked, and after it both told: the delta against `wary_fleet` is what
//! the adaptive rate and the breaker cost in flash.
#![no_std]
#![no_main]

use core::hint::black_box;

use wary::{
    Attempts, Breaker, BreakerSettings, CallState, Draw, Duration, FleetBudget, Instant, Operation, Outcome,
    Pace, PaceSettings, Policy,
};

static FLEET: FleetBudget = match FleetBudget::new(10, 100) {
    Ok(b) => b,
    Err(_) => panic!(),
};

const PACE: Pace = match Pace::new(PaceSettings::DEVICE) {
    Ok(p) => p,
    Err(_) => panic!(),
};

const BREAKER: Breaker = match Breaker::new(BreakerSettings::DEVICE) {
    Ok(b) => b,
    Err(_) => panic!(),
};

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    // Plain state, as a device task holds it.
    let (mut pace, mut breaker) = (PACE, BREAKER);
    wary_bench_size::run(|i| {
        let policy: &Policy = black_box(&wary_bench_size::POLICY);
        let fleet = black_box(&FLEET);
        let mut state = CallState::new();
        for _ in 0..i[1] {
            let now = Instant::from_millis(u64::from(i[3]));
            if breaker.admit(now).is_err() || pace.acquire(now).is_err() {
                continue;
            }
            let outcome: Outcome = black_box(Outcome::status(i[0] as u16));
            let draw = Draw::unit(i[2]);
            Attempts::report(Some(&mut pace), Some(&mut breaker), &outcome, draw, now);
            let elapsed = Some(Duration::from_millis(u64::from(i[3])));
            black_box(policy.decide_with_fleet(&mut state, Operation::Read, &outcome, draw, elapsed, fleet));
        }
        u64::from(state.waited().as_millis())
    })
}
