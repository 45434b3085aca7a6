//! The fleet simulation's row with the pace and the breaker (`wary + pace + breaker`) over many
//! seeds: the worst peak, drain and requests per reading in each of the four worlds, and the
//! seed each came from. `cargo xtask bench --only fleet` runs one seed; the targets must hold
//! for any, so docs/pacing.md quotes the worst over a range.
//!
//! `cargo run --release -p wary-bench --example fleet_seeds -- 2011..=2020` (the default range);
//! a range or a comma-separated list of seeds, then optionally the outage's length in seconds
//! (60 by default, the targets' world). About a second a seed on one core.

use std::ops::RangeInclusive;

use wary_bench::recovery::{Cell, OutageMode, Row, World, figures, run};

/// The worst of one figure and its seed.
#[derive(Default, Clone, Copy)]
struct Worst {
    value: f64,
    seed: u64,
}

impl Worst {
    fn see(&mut self, value: f64, seed: u64) {
        if value > self.value {
            *self = Worst { value, seed };
        }
    }
}

fn seeds(arg: Option<String>) -> Result<Vec<u64>, String> {
    let arg = arg.unwrap_or_else(|| "2011..=2020".into());
    if let Some((a, b)) = arg.split_once("..=") {
        let range: RangeInclusive<u64> = a.parse().map_err(|_| format!("not a seed: {a}"))?
            ..=b.parse().map_err(|_| format!("not a seed: {b}"))?;
        return Ok(range.collect());
    }
    arg.split(',').map(|s| s.trim().parse().map_err(|_| format!("not a seed: {s}"))).collect()
}

fn main() -> Result<(), String> {
    let seeds = seeds(std::env::args().nth(1))?;
    let outage_s: u64 = match std::env::args().nth(2) {
        Some(s) => s.parse().map_err(|_| format!("not a length in seconds: {s}"))?,
        None => 60,
    };
    if seeds.is_empty() {
        return Err("no seed to run".into());
    }
    println!(
        "wary + pace + breaker, worst over {} seeds ({}–{}):",
        seeds.len(),
        seeds[0],
        seeds[seeds.len() - 1]
    );
    println!("{:<34} {:>16} {:>16} {:>18}", "world", "peak × capacity", "drain × ideal", "requests/reading");
    for spread in [false, true] {
        for outage in [OutageMode::Unavailable, OutageMode::Refused] {
            let (mut peak, mut drain, mut requests) = (Worst::default(), Worst::default(), Worst::default());
            for &seed in &seeds {
                let world = World { outage_ms: outage_s * 1000, ..World::standard(outage, spread, seed) };
                let row = Row::WaryPaceBreaker;
                let (p, d, r, _) = figures(&Cell { world, row, stats: run(row, &world) });
                peak.see(p, seed);
                drain.see(d, seed);
                requests.see(r, seed);
            }
            let world = format!(
                "{} outage, {}",
                outage.label(),
                if spread { "spread Retry-After" } else { "no Retry-After" }
            );
            let cell = |w: Worst| format!("{:.3} ({})", w.value, w.seed);
            println!("{world:<34} {:>16} {:>16} {:>18}", cell(peak), cell(drain), cell(requests));
        }
    }
    Ok(())
}
