//! The runner with every effect injected, as the firmware uses it, on std: a blocking delay, a
//! clock, a seeded draw source, a cancel token, a static fleet budget and a ledger ring,
//! driven by `embassy_futures::block_on`. The attempts follow a script: no server.
//!
//! `cargo run -p wary-host --example runner`

use std::time::Instant;

use wary::ledger::Ledger;
use wary::run::{CancelToken, Clock, Runner};
use wary::{FleetBudget, Key, Operation, Outcome, Policy, Preset};
use wary_host::time::StdDelay;

/// Milliseconds since start, as a board's timer would count them.
struct Millis(Instant);

impl Clock for Millis {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

static FLEET: FleetBudget = match FleetBudget::new(10, 100) {
    Ok(f) => f,
    Err(_) => panic!("a valid fleet budget"),
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::builder(Preset::Default).base(20).cap(80).budget(2_000).build()?;
    let cancel = CancelToken::new();
    let mut ledger = Ledger::<16>::new();
    let script = [Outcome::status(503), Outcome::ResponseTimeout, Outcome::status_after(429, 0), Outcome::Ok];

    let mut runner = Runner::new(&policy, StdDelay, Millis(Instant::now()), wary_host::draw::seeded(7))
        .cancel(&cancel)
        .fleet(&FLEET)
        .ledger(&mut ledger);
    let key = Key::from_parts(0x0d15_ea5e, 3, 41);
    let got = embassy_futures::block_on(runner.call(Operation::KeyedWrite, key, |a| {
        let step = script.get(a.number as usize - 1).copied().unwrap_or(Outcome::Ok);
        std::future::ready(if step == Outcome::Ok { Ok(a.number) } else { Err(step) })
    }));
    for r in ledger.records() {
        println!(
            "attempt {} {:?} → {} wait {} ms, verdict {:?}",
            r.attempt,
            r.outcome,
            r.class.name(),
            r.wait,
            r.verdict
        );
    }
    println!("fleet tokens: {} of {} thousandths", FLEET.tokens_milli(), FLEET.max_milli());
    match got {
        Ok(4) => Ok(()),
        other => Err(format!("expected success on attempt 4, got {other:?}").into()),
    }
}
