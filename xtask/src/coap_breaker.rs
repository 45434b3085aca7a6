//! The breaker's hold against a CoAP server we did not write, part of the device scenario
//! `coap`: the QEMU uplink built with its `coap` feature, its pace and circuit breaker on (a
//! fielded device's default), boots while libcoap's `coap-server` is down. Over UDP nothing
//! refuses: the first transmission of its first reading goes unanswered for the attempt's limit,
//! and so does the retransmission after the CoAP policy's wait (2 to 3 s). Two failures in a row
//! open the breaker. The server comes back [`DOWN`] after QEMU started, after the second
//! transmission and well before the breaker's first open time (15–30 s) is over.
//!
//! Checked from the device's own log as in `breaker-hold` (exactly one call met the open
//! breaker, the outbox was held once for the breaker's open time, nothing landed before the
//! instant the hold named, the probe landed after it: with the pace's next request, since the
//! pace reads the breaker's opening as an outage), and from the server's side: the resources
//! libcoap holds are every accepted reading's key, once each, with a JSON body, and no other.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::coap::{Server, free_udp_port, read_back};
use crate::device::{Extra, Log, Route, Scenario, TOKEN, check, run_uplink};
use crate::harness::uplink_exited;
use crate::util::step;

/// Two readings: the probe's, and one more sent at the slow start's pace.
const COAP_BREAKER: Scenario = Scenario {
    name: "coap (breaker)",
    faults: "none (libcoap's coap-server, down for the first 9 s)",
    readings: 2,
    plan: "pacing=on",
    resets: &[],
    route: Route::Direct,
};
/// How long after QEMU starts the server comes back: past the device's boot and its first
/// reading's two unanswered transmissions (about 5 s), well within the breaker's first open time.
const DOWN: Duration = Duration::from_secs(9);
/// A wedged guest must never hold CI.
const TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the hold against libcoap (see the module docs) and returns its report.
pub fn run(elf: &Path) -> Result<String> {
    let port = free_udp_port()?;
    step(&format!(
        "device scenario `coap` (breaker): {} readings to libcoap's coap-server on 127.0.0.1:{port}, down for the first {} s, the pace and breaker on",
        COAP_BREAKER.readings,
        DOWN.as_secs()
    ));
    let started = Instant::now();
    let back = thread::spawn(move || -> Result<Server> {
        thread::sleep(DOWN);
        Server::start_on(port)
    });
    let (status, lines) =
        run_uplink(elf, port, TOKEN, COAP_BREAKER.readings, COAP_BREAKER.plan, TIMEOUT, &Extra::default())?;
    let elapsed = started.elapsed().as_secs_f64();
    let server = back.join().map_err(|_| anyhow::anyhow!("the server's thread panicked"))??;
    uplink_exited("coap (breaker)", status, TIMEOUT)?;
    let held =
        crate::breaker_hold::judge(&lines, "two unanswered transmissions").context("coap (breaker)")?;
    let (report, listed) = read_back(port)?;
    drop(server);
    let text = check(&COAP_BREAKER, &Log::read(&lines), &report)?;
    Ok(format!(
        "coap (breaker): {held}\n{text}\nserver: {listed} resources under /r read back, each once with a JSON body\nwall time {elapsed:.1} s"
    ))
}
