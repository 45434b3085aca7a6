//! The breaker-hold scenario: the uplink firmware under QEMU, its pace and circuit breaker on (a
//! fielded device's default), each reading on a connection of its own (`keepalive=off`), against
//! a test cloud that closes its listener for 3 s when the second request arrives. The next
//! reading's connection is refused, and so is its retry 100 ms later: the breaker opens.
//!
//! Checked from the device's own log: exactly one call met the open breaker (the round ended
//! there instead of offering each of its other readings to it), the outbox was held once, and
//! nothing landed before the instant the hold named (the breaker's open time, 15–30 s), and a
//! reading landed after it (the probe, which goes with the pace's next request: the pace reads
//! the breaker's opening as an outage, about a minute); every accepted reading is applied
//! exactly once (the device scenario's own check).

use std::path::Path;

use anyhow::{Result, bail};

use crate::device::{Log, Route, Scenario, check, run_device};

/// The scenario: four readings, the listener closed for 3 s at the second request.
pub const BREAKER_HOLD: Scenario = Scenario {
    name: "breaker-hold",
    faults: "refuse_at=2:ms=3000,seed=5",
    readings: 4,
    plan: "keepalive=off",
    resets: &[],
    route: Route::Direct,
};

/// Runs the scenario, checks it and returns its report.
pub fn run(root: &Path) -> Result<String> {
    let (lines, report, elapsed) = run_device(root, &BREAKER_HOLD)?;
    let log = Log::read(&lines);
    let summary = check(&BREAKER_HOLD, &log, &report)?;
    let text = judge(&lines, "two refused connections")?;
    Ok(format!("{text}\n{summary}\nwall time {elapsed:.1} s"))
}

/// A log line's guest time, in milliseconds (defmt's timestamp, seconds, first on the line).
fn at_ms(line: &str) -> Option<u64> {
    let secs: f64 = line.split_whitespace().next()?.parse().ok()?;
    Some((secs * 1000.0).round() as u64)
}

/// The breaker opened once, one call met it, the outbox was held until the instant the hold
/// named, and the first reading to land after the hold landed at or after it. `opened_by` says
/// what opened it, for the report.
pub(crate) fn judge(lines: &[String], opened_by: &str) -> Result<String> {
    let met: Vec<u64> =
        lines.iter().filter(|l| l.contains("GaveUp(CircuitOpen)")).filter_map(|l| at_ms(l)).collect();
    let holds: Vec<(u64, u64)> = lines
        .iter()
        .filter(|l| l.contains("outbox held while the breaker is open, until "))
        .filter_map(|l| {
            let until = l.rsplit("until ").next()?.split_whitespace().next()?.parse().ok()?;
            Some((at_ms(l)?, until))
        })
        .collect();
    let landed: Vec<u64> = lines.iter().filter(|l| l.contains(" LANDED ")).filter_map(|l| at_ms(l)).collect();
    let mut errors = vec![];
    if met.len() != 1 {
        errors.push(format!(
            "{} calls met the open breaker (at {met:?} ms), expected one: the round goes on offering readings to it",
            met.len()
        ));
    }
    let Some(&(held_at, until)) = holds.first() else {
        bail!(
            "breaker-hold: the outbox was never held while the breaker was open\n  {}",
            errors.join("\n  ")
        );
    };
    if holds.len() != 1 {
        errors.push(format!("the outbox was held {} times, expected once: {holds:?}", holds.len()));
    }
    if met.first().is_some_and(|m| *m > held_at) {
        errors.push(format!("held at {held_at} ms, before the call that met the breaker at {met:?} ms"));
    }
    // The breaker's first open time is 15–30 s from the second refusal.
    let open = until.saturating_sub(met.first().copied().unwrap_or(held_at));
    if !(14_000..=30_500).contains(&open) {
        errors.push(format!("held until {until} ms, {open} ms after the breaker opened: not its 15–30 s"));
    }
    let early: Vec<u64> = landed.iter().copied().filter(|t| *t > held_at && *t < until).collect();
    if !early.is_empty() {
        errors.push(format!("readings landed at {early:?} ms, during the hold until {until} ms"));
    }
    let after = landed.iter().copied().find(|t| *t >= until);
    if after.is_none() {
        errors.push(format!("nothing landed after the hold until {until} ms"));
    }
    if !errors.is_empty() {
        bail!("breaker-hold failed:\n  {}", errors.join("\n  "));
    }
    Ok(format!(
        "breaker: opened by {opened_by}; one call met it at {} ms, the outbox held until {until} ms ({:.1} s), the probe landed at {} ms",
        met.first().copied().unwrap_or(0),
        open as f64 / 1000.0,
        after.unwrap_or(0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()).collect()
    }

    const HELD: &str = "
        0.035 INFO  LANDED boot=00000001 seq=0
        0.074 INFO  LANDED boot=00000001 seq=1
        0.726 WARN  reading RecordId { boot: 1, seq: 2 } GaveUp(CircuitOpen): kept for a later round
        0.727 INFO  round 3 kept 1: next round in 386 ms
        1.113 INFO  outbox held while the breaker is open, until 18941 ms
        19.029 INFO  LANDED boot=00000001 seq=2
        35.733 INFO  LANDED boot=00000001 seq=3
    ";

    #[test]
    fn a_round_that_ends_at_the_breaker_and_a_hold_until_its_probe_pass() {
        let text = judge(&lines(HELD), "two refused connections").unwrap();
        assert!(text.contains("until 18941 ms (18.2 s)") && text.contains("landed at 19029 ms"), "{text}");
    }

    #[test]
    fn rounds_that_offer_every_reading_to_the_open_breaker_fail() {
        // The uplink before the hold: each round's readings met the breaker, on the round pause.
        let old = "
            0.074 INFO  LANDED boot=00000001 seq=1
            0.726 WARN  reading RecordId { boot: 1, seq: 2 } GaveUp(CircuitOpen): kept for a later round
            0.727 INFO  round 3 kept 1: next round in 420 ms
            1.149 WARN  reading RecordId { boot: 1, seq: 2 } GaveUp(CircuitOpen): kept for a later round
            1.149 WARN  reading RecordId { boot: 1, seq: 3 } GaveUp(CircuitOpen): kept for a later round
            24.289 INFO  LANDED boot=00000001 seq=2
        ";
        let err = judge(&lines(old), "").unwrap_err().to_string();
        assert!(err.contains("never held"), "{err}");
        // A hold that a reading does not honour fails too.
        let early = HELD.replace("19.029 INFO  LANDED", "12.000 INFO  LANDED");
        let err = judge(&lines(&early), "").unwrap_err().to_string();
        assert!(err.contains("during the hold"), "{err}");
        // So does a second call meeting the breaker.
        let twice = HELD.replace(
            "1.113 INFO",
            "0.900 WARN  reading RecordId { boot: 1, seq: 3 } GaveUp(CircuitOpen): kept\n 1.113 INFO",
        );
        let err = judge(&lines(&twice), "").unwrap_err().to_string();
        assert!(err.contains("2 calls met the open breaker"), "{err}");
    }
}
