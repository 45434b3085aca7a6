//! The runner with every effect injected, as the firmware uses it, on std: a blocking delay, a
//! clock, a seeded draw source, a cancel token, a static fleet budget and a ledger ring,
//! driven by `embassy_futures::block_on`. The attempts follow a script: no server.
//!
//! `cargo run -p wary-host --example runner`

use wary::{
    CancelToken, Duration, Failure, FleetBudget, Instant, Key, Operation, Policy, Preset, Runner,
    ledger::Ledger,
};
use wary_host::time::StdDelay;

static FLEET: FleetBudget = match FleetBudget::new(10, 100) {
    Ok(f) => f,
    Err(_) => panic!("a valid fleet budget"),
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ms = Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(20)).cap(ms(80)).budget(ms(2_000)).build()?;
    let cancel = CancelToken::new();
    let mut ledger = Ledger::<16>::new();
    // Three failures, then a success.
    let script = [Failure::status(503), Failure::ResponseTimeout, Failure::status_after(429, Duration::ZERO)];
    // Milliseconds since start, as a board's timer would count them: any closure giving an
    // `Instant` is a clock.
    let start = std::time::Instant::now();
    let clock = move || Instant::from_millis(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX));

    let mut runner = Runner::new(&policy, StdDelay, clock, wary_host::draw::seeded(7))
        .cancel(&cancel)
        .fleet(&FLEET)
        .ledger(&mut ledger);
    let key = Key::from_parts(0x0d15_ea5e, 3, 41);
    let got = embassy_futures::block_on(runner.call(Operation::KeyedWrite, key, |a| {
        let step = script.get(a.number as usize - 1).copied();
        std::future::ready(match step {
            Some(failure) => Err(failure),
            None => Ok(a.number),
        })
    }));
    for r in ledger.records() {
        println!(
            "attempt {} {} → {} wait {}, verdict {}",
            r.attempt,
            r.outcome.name(),
            r.class.name(),
            r.wait,
            r.verdict.map_or_else(|| "-".to_owned(), |v| v.to_string())
        );
    }
    println!("fleet tokens: {} of {} thousandths", FLEET.tokens_milli(), FLEET.max_milli());
    match got {
        Ok(4) => Ok(()),
        other => Err(format!("expected success on attempt 4, got {other:?}").into()),
    }
}
