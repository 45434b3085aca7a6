//! The breaker's hold against a broker we did not write, part of the device scenario `mqtt`:
//! the QEMU uplink built with its `mqtt` feature, its pace and circuit breaker on (a fielded
//! device's default), boots while mosquitto is down. Its first connection is refused by the
//! host's TCP, and so is its retry 100 ms later: the breaker opens. mosquitto comes back
//! [`DOWN`] after QEMU started, well before the breaker's first open time (15–30 s) is over.
//!
//! Checked from the device's own log as in `breaker-hold` (exactly one call met the open
//! breaker, the outbox was held once for the breaker's open time, nothing landed before the
//! instant the hold named, the probe landed after it: with the pace's next request, since the
//! pace reads the breaker's opening as an outage), and from the broker's side: a checker
//! subscribed as the gateway login from the moment the broker is back received every accepted
//! reading's key with one payload, and no other.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wary_fixtures::mosquitto::{Broker, GATEWAY_USER, Login, Settings};

use crate::device::{DEVICE, Extra, TOKEN, run_uplink};
use crate::harness::uplink_exited;
use crate::mqtt::{Checker, GATEWAY_PASSWORD, Tally, accepted_keys};
use crate::util::step;

/// Readings the sensor makes: the probe's, and one more sent at the pace's rate after it.
const READINGS: u32 = 2;
/// How long after QEMU starts the broker comes back: past the device's boot and its two refused
/// connections (under a second), well within the breaker's first open time.
const DOWN: Duration = Duration::from_secs(4);
/// A wedged guest must never hold CI.
const TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the hold against mosquitto (see the module docs) and returns its report.
pub fn run(dir: &Path, elf: &Path) -> Result<String> {
    let device = format!("{DEVICE:016x}");
    let logins = [Login::new(device, TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)];
    let mut broker = Broker::start(&dir.join("broker-breaker"), &logins, &Settings::default())?;
    let port = broker.port();
    broker.stop()?;
    step(&format!(
        "device scenario `mqtt` (breaker): {READINGS} readings over MQTT 5 to mosquitto on :{port}, down for the first {} s, the pace and breaker on",
        DOWN.as_secs()
    ));
    let started = Instant::now();
    let back = thread::spawn(move || -> Result<_> {
        thread::sleep(DOWN);
        broker.restart()?;
        Ok((broker, Checker::start(port, &[])?))
    });
    let (status, lines) = run_uplink(elf, port, TOKEN, READINGS, "pacing=on", TIMEOUT, &Extra::default())?;
    let elapsed = started.elapsed().as_secs_f64();
    let (broker, checker) = back.join().map_err(|_| anyhow::anyhow!("the broker's thread panicked"))??;
    let seen = checker.stop(Duration::from_secs(1))?;
    drop(broker);

    uplink_exited("mqtt (breaker)", status, TIMEOUT)?;
    let held = crate::breaker_hold::judge(&lines, "two refused connections").context("mqtt (breaker)")?;
    let accepted = accepted_keys(&lines);
    let tally = Tally::of(&seen);
    let lost = accepted.iter().filter(|k| !tally.payloads.contains_key(*k)).count();
    let foreign = tally.payloads.keys().filter(|k| !accepted.contains(*k)).count();
    let mixed = tally.payloads.values().filter(|p| p.len() > 1).count();
    if accepted.len() != READINGS as usize || lost + foreign + mixed + tally.keyless > 0 {
        bail!(
            "mqtt (breaker): {} readings accepted ({READINGS} expected); lost {lost}, keys no reading had {foreign}, keys with two payloads {mixed}, messages without a key {}",
            accepted.len(),
            tally.keyless
        );
    }
    Ok(format!(
        "mqtt (breaker): {held}; duplicates 0, lost 0 ({} readings, {} messages at the broker's checker); wall time {elapsed:.1} s",
        accepted.len(),
        tally.messages
    ))
}
