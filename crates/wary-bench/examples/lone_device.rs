//! One device alone under a cloud that fails a share of every device's requests, paced by the
//! core's `Pace` and `Breaker` with the device settings: how long it takes to drain 20 readings.
//! The answer mix is the QEMU `storm` scenario's (`xtask/src/device.rs`): 503 12 %, 429 with a
//! Retry-After of 1 s 5 % and of 2 s 4 %, resets 6 %, stalls past the attempt's 5 s limit 4 %,
//! cut, garbage or oversized replies 16 %, the rest served. Every failed answer is sent again
//! (after 200 ms, or the Retry-After), as the outbox would in its next round.
//!
//! `cargo run --release -p wary-bench --example lone_device` prints, per setting, the median,
//! 90th percentile and longest drain over 200 seeds, and how many runs drained within 240 s (the
//! scenario's limit). docs/pacing.md reads it.

use wary::{
    Attempts, Breaker, BreakerSettings, Draw, Duration, Failure, Instant, Outcome, Pace, PaceSettings,
};

/// xorshift64: enough for a model.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn draw(&mut self) -> Draw {
        Draw::Unit((self.0 >> 32) as u32)
    }
}

/// Milliseconds to drain 20 readings (capped at an hour).
fn drain(settings: PaceSettings, seed: u64) -> u64 {
    let mut rng = Rng(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    let (Ok(mut pace), Ok(mut breaker)) = (Pace::new(settings), Breaker::new(BreakerSettings::DEVICE)) else {
        return u64::MAX;
    };
    let (mut t, mut left, mut pause) = (0u64, 20u32, 0u64);
    while left > 0 && t < 3_600_000 {
        t += pause;
        pause = 0;
        if let Err(wait) = breaker.admit(Instant::from_millis(t)) {
            t += u64::from(wait.as_millis());
            continue;
        }
        let asked = Instant::from_millis(t);
        t += u64::from(pace.view(asked).wait().as_millis());
        pace.take(asked);
        let x = rng.unit();
        let (outcome, took): (Outcome, u64) = match x {
            x if x < 0.12 => (Outcome::status(503), 30),
            x if x < 0.17 => (Outcome::status_after(429, Duration::from_secs(1)), 30),
            x if x < 0.21 => (Outcome::status_after(429, Duration::from_secs(2)), 30),
            x if x < 0.27 => (Failure::Reset.into(), 30),
            x if x < 0.31 => (Failure::ResponseTimeout.into(), 5_000),
            x if x < 0.47 => (Failure::BadBody.into(), 30),
            _ => (Outcome::Ok, 30),
        };
        t += took;
        let now = Instant::from_millis(t);
        // The pace and the breaker hear the answer as the uplink's runner tells them.
        Attempts::report(Some(&mut pace), Some(&mut breaker), &outcome, rng.draw(), now);
        match outcome {
            Outcome::Ok => left -= 1,
            Outcome::Failure(Failure::Reset | Failure::ResponseTimeout) => pause = 200,
            Outcome::Failure(Failure::Status { retry_after: Some(asked), .. }) => {
                pause = u64::from(asked.as_millis());
            }
            Outcome::Failure(_) => pause = 200,
        }
    }
    t
}

fn main() {
    let device = PaceSettings::DEVICE;
    for (name, settings) in [
        ("device defaults", device),
        ("floor 0.05/s", PaceSettings { floor_milli: 50, ..device }),
        ("start 0.5/s, floor 0.05/s", PaceSettings { start_milli: 500, floor_milli: 50, ..device }),
    ] {
        let mut runs: Vec<u64> = (0..200).map(|seed| drain(settings, seed)).collect();
        runs.sort_unstable();
        let within = runs.iter().filter(|ms| **ms <= 240_000).count();
        let s = |i: usize| runs.get(i).map_or(0.0, |ms| *ms as f64 / 1000.0);
        println!(
            "{name:28} median {:6.1} s  p90 {:6.1} s  longest {:6.1} s  within 240 s: {within}/200",
            s(100),
            s(180),
            s(199)
        );
    }
}
