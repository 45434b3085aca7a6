//! The device scenario `mqtt-tls`: the QEMU uplink built with its `mqtt` and `tls` features
//! publishes its readings (MQTT 5, QoS 1, the key as the `Idempotency-Key` user property) over
//! TLS 1.3 to a real mosquitto, the broker's certificate issued for this run by a CA pinned in
//! the firmware, the device logged in with its id and token. The broker is restarted half-way
//! through, so the device connects (TCP, a full handshake, `CONNECT`) a second time.
//!
//! A checker on the broker's plain loopback listener (`mosquitto_sub` as the gateway login,
//! MQTT 5, a persistent session) prints every message's user properties and payload. The run
//! passes when every accepted reading's key reached the checker with one payload (`lost 0`),
//! no key reached it with two payloads or that no reading of the run had (`duplicates 0`), the
//! session was kept across readings (at most [`MAX_CONNECTS`] connects for the run), and the
//! device's wire, in QEMU's pcap, holds neither its token nor its topic nor a key in clear.
//!
//! Then the same firmware against a broker whose certificate names the same server but comes
//! from another CA: the handshake is refused on the device, the reading fails without a resend
//! (a TLS refusal is definitive), and the broker logs no client and delivers nothing.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wary_fixtures::mosquitto::{Broker, GATEWAY_USER, Login, READINGS_FILTER, Settings};
use wary_fixtures::tls::{SERVER_NAME, TestChain};

use crate::device::{DEVICE, Extra, TOKEN, run_uplink};
use crate::harness::{TARGET, build_uplink_variant, uplink_exited};
use crate::mqtt::{GATEWAY_PASSWORD, Tally, accepted_keys, read_pcap, restart_when, wire_row, write_figures};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_mosquitto, ensure_targets, step};

/// Readings the sensor makes.
const READINGS: u32 = 20;
/// A wedged guest must never hold CI.
const TIMEOUT: Duration = Duration::from_secs(240);
/// Connects (each a TLS handshake) the run may take: one per broker life, and one spare for a
/// connect that raced the restart. A transport that connected per reading would take 20.
const MAX_CONNECTS: u32 = 3;

/// `cargo xtask device mqtt-tls`: see the module docs. Returns the report.
pub fn run(root: &Path) -> Result<String> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    ensure_mosquitto()?;
    let dir = std::env::temp_dir().join(format!("wary-mqtt-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = run_in(root, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(root: &Path, dir: &Path) -> Result<String> {
    let chain = TestChain::new()?;
    let ca = dir.join("pinned-ca.der");
    std::fs::write(&ca, chain.root.der())?;
    let (cert, key) = chain.leaf_pem(SERVER_NAME)?;
    let files = (dir.join("broker.pem"), dir.join("broker.key"));
    std::fs::write(&files.0, cert)?;
    std::fs::write(&files.1, key)?;
    let (cert, key) = chain.rogue_leaf_pem(SERVER_NAME)?;
    let rogue = (dir.join("rogue.pem"), dir.join("rogue.key"));
    std::fs::write(&rogue.0, cert)?;
    std::fs::write(&rogue.1, key)?;

    step("building the uplink with `--features mqtt,tls`, a CA made for this run pinned in it");
    let firmware = root.join(crate::harness::QEMU_BOARD);
    let ca_arg = ca.to_str().context("temp path is not UTF-8")?;
    let elf = dir.join("uplink-mqtt-tls");
    build_uplink_variant(
        &firmware,
        "wary-qemu/mqtt,wary-qemu/tls",
        &[],
        &[("WARY_CA_DER", ca_arg), ("WARY_SERVER_NAME", SERVER_NAME)],
        &elf,
    )?;
    let kept = scenario(root, dir, &elf, files)?;
    let refused = wrong_ca(dir, &elf, rogue)?;
    let size = size(root, &elf)?;
    Ok(format!("{kept}\n{refused}\n{size}"))
}

/// A checker subscribed as the gateway login on the broker's plain port: its lines, and how
/// many it has read so far.
struct Checker {
    child: std::process::Child,
    read: Arc<AtomicUsize>,
    lines: thread::JoinHandle<Vec<String>>,
}

impl Checker {
    fn start(port: u16, client_id: &str) -> Result<Checker> {
        let mut child = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv5", "-q", "1"])
            .args(["-u", GATEWAY_USER, "-P", GATEWAY_PASSWORD, "-t", READINGS_FILTER])
            .args(["-c", "-i", client_id, "-x", "3600", "-F", "%P|%p"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mosquitto_sub")?;
        let out = child.stdout.take().context("mosquitto_sub stdout")?;
        let read = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&read);
        let lines = thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .inspect(|_| {
                    counter.fetch_add(1, Ordering::Relaxed);
                })
                .collect::<Vec<_>>()
        });
        thread::sleep(Duration::from_millis(500));
        Ok(Checker { child, read, lines })
    }

    fn stop(mut self) -> Result<Vec<String>> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines.join().map_err(|_| anyhow::anyhow!("the checker's reader panicked"))
    }
}

fn logins() -> [Login; 2] {
    [Login::new(format!("{DEVICE:016x}"), TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)]
}

fn scenario(
    root: &Path,
    dir: &Path,
    elf: &Path,
    tls: (std::path::PathBuf, std::path::PathBuf),
) -> Result<String> {
    let settings = Settings { tls: Some(tls), ..Settings::default() };
    let broker = Broker::start(&dir.join("broker"), &logins(), &settings)?;
    let tls_port = broker.tls_port().context("the broker has no TLS listener")?;
    step(&format!(
        "device scenario `mqtt-tls`: {READINGS} readings over MQTT 5 and TLS 1.3 to mosquitto on 127.0.0.1:{tls_port}, restarted half-way"
    ));
    let checker = Checker::start(broker.port(), "wary-mqtt-tls-checker")?;
    let restarter = {
        let read = Arc::clone(&checker.read);
        restart_when(broker, move || read.load(Ordering::Relaxed) >= READINGS as usize / 2)
    };
    let pcap = root.join("target/bench/mqtt-tls.pcap");
    std::fs::create_dir_all(root.join("target/bench"))?;
    let extra = Extra { append: "", pcap: Some(&pcap), switch: None };
    let started = Instant::now();
    let run = run_uplink(elf, tls_port, TOKEN, READINGS, "", TIMEOUT, &extra);
    let elapsed = started.elapsed().as_secs_f64();
    let restart = restarter.join().map_err(|_| anyhow::anyhow!("the restart thread panicked"))?;
    // What the broker still holds for the checker reaches it within moments.
    thread::sleep(Duration::from_secs(2));
    let seen = checker.stop()?;
    let (broker, restarted) = restart?;
    drop(broker);
    let (status, lines) = run?;
    uplink_exited("mqtt-tls", status, TIMEOUT)?;
    let mut problems = vec![];
    if let Some(line) = lines.iter().find(|l| l.contains(&TOKEN[..16]) || l.contains(&TOKEN[48..])) {
        problems
            .push(format!("a device log line shows part of its credential: {:?}", line.replace(TOKEN, "…")));
    }
    if !restarted {
        problems.push(format!("the broker was never restarted (fewer than {} messages)", READINGS / 2));
    }
    let accepted = accepted_keys(&lines);
    if accepted.len() != READINGS as usize {
        problems.push(format!("{} readings accepted, {READINGS} expected", accepted.len()));
    }
    let tally = Tally::of(&seen);
    let lost: Vec<&String> = accepted.iter().filter(|k| !tally.payloads.contains_key(*k)).collect();
    let foreign: Vec<&String> = tally.payloads.keys().filter(|k| !accepted.contains(*k)).collect();
    let mixed: Vec<&String> = tally.payloads.iter().filter(|(_, p)| p.len() > 1).map(|(k, _)| k).collect();
    if !lost.is_empty() {
        problems.push(format!("lost: {lost:?}"));
    }
    if !foreign.is_empty() || !mixed.is_empty() {
        problems.push(format!("keys no reading had: {foreign:?}; keys with two payloads: {mixed:?}"));
    }
    let mqtt_line = lines.iter().rev().find(|l| l.contains("MQTT connacks=")).cloned().unwrap_or_default();
    let field = |name: &str| -> u32 {
        mqtt_line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u32::MAX)
    };
    let connacks = field("connacks=");
    if connacks == 0 || connacks > MAX_CONNECTS {
        problems.push(format!(
            "{connacks} connects for {READINGS} readings: the session was not kept (at most {MAX_CONNECTS})"
        ));
    }
    // Encrypted: nothing the device knows in clear is on its wire.
    let wire_bytes = std::fs::read(&pcap).with_context(|| format!("reading {}", pcap.display()))?;
    let topic = format!("wary/{DEVICE:016x}/readings");
    let in_clear: Vec<&str> = [TOKEN, topic.as_str(), "Idempotency-Key"]
        .into_iter()
        .chain(accepted.iter().map(String::as_str).take(1))
        .filter(|needle| wire_bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .collect();
    if !in_clear.is_empty() {
        problems.push(format!("in clear on the device's wire: {in_clear:?}"));
    }
    let wire = read_pcap(&pcap)?;
    let text = [
        format!(
            "mqtt-tls: duplicates {}, lost {} ({} readings accepted, {} keys delivered, {} raw redeliveries absorbed by the key)",
            foreign.len() + mixed.len(),
            lost.len(),
            accepted.len(),
            tally.payloads.len(),
            tally.messages.saturating_sub(tally.payloads.len() + tally.keyless),
        ),
        format!(
            "TLS sessions: {connacks} connects, each a full handshake, for {READINGS} readings and one broker restart ({:.3} per reading); {} SYNs on the wire",
            f64::from(connacks) / f64::from(READINGS),
            wire.syns
        ),
        format!("device: {}", mqtt_line.split("MQTT ").nth(1).unwrap_or("(no MQTT line)")),
        format!(
            "wire (pcap, the whole run with its restart): {} frames, {} B: {:.1} frames and {:.0} B per delivered reading; token, topic and keys never in clear",
            wire.frames,
            wire.bytes,
            wire.frames as f64 / f64::from(READINGS),
            wire.bytes as f64 / f64::from(READINGS)
        ),
        format!("wall time {elapsed:.1} s"),
    ];
    if !problems.is_empty() {
        bail!("{}\nmqtt-tls failed: {}", text.join("\n"), problems.join("; "));
    }
    let mut row = wire_row(&wire, READINGS, "MQTT 5 over TLS 1.3, the broker restarted once");
    row["connects"] = serde_json::json!(connacks);
    write_figures(root, "tls", row)?;
    Ok(text.join("\n"))
}

/// The same firmware against a broker whose certificate names the same server but comes from
/// a CA the device does not pin.
fn wrong_ca(dir: &Path, elf: &Path, rogue: (std::path::PathBuf, std::path::PathBuf)) -> Result<String> {
    step("device scenario `mqtt-tls`, second run: a broker whose certificate no pinned CA vouches for");
    let settings = Settings { tls: Some(rogue), ..Settings::default() };
    let broker = Broker::start(&dir.join("broker-rogue"), &logins(), &settings)?;
    let tls_port = broker.tls_port().context("the broker has no TLS listener")?;
    let checker = Checker::start(broker.port(), "wary-mqtt-tls-rogue-checker")?;
    // Three rounds on a short hold: each is one refused handshake, and the reading stays.
    let plan = "rounds=3 hold_base=1000 hold_cap=2000";
    let run = run_uplink(elf, tls_port, TOKEN, 1, plan, Duration::from_secs(120), &Extra::default());
    thread::sleep(Duration::from_secs(1));
    let seen = checker.stop()?;
    let log = std::fs::read_to_string(broker.dir().join("mosquitto.log")).unwrap_or_default();
    drop(broker);
    let (status, lines) = run?;
    let summary = lines.iter().rev().find_map(|l| l.find("SUMMARY ").map(|at| l[at + 8..].to_owned()));
    let summary = summary.unwrap_or_default();
    let mut errors = vec![];
    if status.is_none_or(|s| s.success()) {
        errors.push(format!(
            "the uplink should stop after its rounds with its reading kept, it ended {status:?}"
        ));
    }
    if !summary.contains("landed=0 dead_lettered=0 ") || !summary.contains(" left=1 ") {
        errors.push(format!("expected landed=0 dead_lettered=0 left=1: {summary}"));
    }
    let held = lines.iter().filter(|l| l.contains("HELD reason=")).count();
    if held != 3 {
        errors.push(format!("expected the outbox held after each of 3 refused probes, {held} HELD lines"));
    }
    if !lines.iter().any(|l| l.contains("the TLS handshake failed")) {
        errors.push("the device never logged a refused handshake".to_owned());
    }
    if !seen.is_empty() {
        errors.push(format!("the broker delivered {} messages", seen.len()));
    }
    let device_client = format!("wary-{DEVICE:016x}");
    if log.lines().any(|l| l.contains("New client connected") && l.contains(&device_client)) {
        errors.push("the device logged in to the rogue broker".to_owned());
    }
    if !errors.is_empty() {
        bail!("device scenario `mqtt-tls` (wrong CA) failed:\n  {}", errors.join("\n  "));
    }
    Ok("wrong CA: the handshake refused on the device in each of 3 rounds, the outbox held between them and its one reading kept (not deleted, not dead-lettered), the broker logged no client and delivered nothing".to_owned())
}

/// Flash and RAM of the MQTT-over-TLS uplink.
fn size(root: &Path, elf: &Path) -> Result<String> {
    let llvm = crate::harness::llvm_size()?;
    let (text, data, bss) = crate::harness::size_of(&llvm, elf)?;
    write_figures(
        root,
        "size_tls",
        serde_json::json!({"uplink_mqtt_tls": {"flash": text + data, "ram": data + bss}}),
    )?;
    Ok(format!("size of the uplink over MQTT and TLS: {} B flash, {} B RAM", text + data, data + bss))
}
