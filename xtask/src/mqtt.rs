//! The device scenario `mqtt`: the QEMU uplink built with its `mqtt` feature publishes its
//! readings (MQTT 5, QoS 1, the key as the `Idempotency-Key` user property) through the fault
//! proxy (`wary_fixtures::mqtt_fault`) to a real mosquitto (`wary_fixtures::mosquitto`, the
//! device logged in with its id and token, the ACL letting it publish only under its own
//! topic). The proxy answers some publishes with PUBACK 0x10 and 0x97, kicks the device with
//! DISCONNECT 0x89, 0x97, 0x9C and 0x9F after the message reached the broker, kicks it once
//! between readings (PUBACK, then DISCONNECT 0x89), and drops the connection after a PUBLISH
//! reached the broker and before its PUBACK; the broker is restarted half-way through.
//!
//! A checker subscribed as the gateway login (`mosquitto_sub`, MQTT 5, a persistent session so
//! the restart loses nothing queued to it) prints every message's user properties and payload.
//! The run passes when the uplink exits with every reading landed, every accepted reading's key
//! reached the checker at least once with one payload (`lost 0`), no key reached it with two
//! different payloads or that no reading of the run had (`duplicates 0`), and every scripted
//! fault was used. Raw redeliveries (a message the broker took before the device lost its
//! PUBACK, sent again with the same key) are counted: the key is what absorbs them.
//!
//! Then the breaker's hold against the same broker ([`crate::mqtt_breaker`]), and the figures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wary_fixtures::mosquitto::{Broker, GATEWAY_USER, Login, READINGS_FILTER, Settings};
use wary_fixtures::mqtt_fault::{Fault, Proxy};

use crate::device::{DEVICE, Extra, TOKEN, key_hex, run_uplink};
use crate::harness::{TARGET, build, build_uplink_variant, describe_exit, elf_path, uplink_exited};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_mosquitto, ensure_targets, step};

/// Readings the sensor makes.
const READINGS: u32 = 40;
/// A wedged guest must never hold CI.
const TIMEOUT: Duration = Duration::from_secs(240);
/// The checker's password on the broker (a test value).
pub(crate) const GATEWAY_PASSWORD: &str = "6761746577617920636865636b657220706173737764206f6e6c7920666f7220";

/// The proxy's script: each entry is used by the next PUBLISH (retries included), then every
/// PUBLISH passes. The failing PUBACK codes (0x87, 0x90, 0x99) end a reading `failed` by
/// design, so they are checked by the on-target tests, not here.
const SCRIPT: [Fault; 17] = [
    Fault::Pass,
    Fault::Puback(0x10),
    Fault::Pass,
    Fault::Puback(0x97),
    Fault::Pass,
    Fault::Disconnect(0x89),
    Fault::Pass,
    Fault::Drop,
    Fault::Pass,
    Fault::Disconnect(0x97),
    Fault::Pass,
    Fault::Disconnect(0x9C),
    Fault::Pass,
    Fault::Disconnect(0x9F),
    Fault::Puback(0x10),
    Fault::Drop,
    Fault::Kick(0x89),
];

/// Builds the uplink with `--features mqtt` and keeps its ELF apart (the plain build of the
/// next `build` puts its own back in place).
pub(crate) fn build_mqtt(firmware: &Path, keep: &Path) -> Result<(PathBuf, PathBuf)> {
    step("building the uplink and mqtttest with `--features mqtt`");
    let elf = keep.join("uplink-mqtt");
    build_uplink_variant(firmware, "wary-qemu/mqtt", &["mqtttest"], &[], &elf)?;
    Ok((elf, elf_path(firmware, "mqtttest")))
}

/// `mqtttest`'s script, in the order of its cases: three refused CONNECTs, then per PUBLISH.
const REFUSED_CONNECTS: [u8; 3] = [0x86, 0x89, 0x97];
const TEST_SCRIPT: [Fault; 15] = [
    Fault::Pass,
    Fault::Puback(0x10),
    Fault::Puback(0x97),
    Fault::Puback(0x87),
    Fault::Puback(0x90),
    Fault::Puback(0x99),
    Fault::Drop,
    Fault::Pass,
    Fault::Disconnect(0x89),
    Fault::Disconnect(0x9C),
    Fault::Disconnect(0x97),
    Fault::Disconnect(0x9F),
    Fault::Pass,
    Fault::Kick(0x89),
    Fault::Pass,
];

/// The on-target tests (`mqtttest`): one per row of the transport's outcome table, against the
/// proxy in front of a fresh mosquitto; the firmware checks each answer, this checks what
/// reached the broker.
fn on_target(dir: &Path, elf: &Path) -> Result<String> {
    let device = format!("{DEVICE:016x}");
    let logins = [Login::new(device, TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)];
    // A Server Keep Alive of 10 s (mosquitto's least) in every CONNACK: the last case idles
    // past three quarters of it, so the device pings before it publishes.
    let settings = Settings { max_keepalive: Some(10), ..Settings::default() };
    let broker = Broker::start(&dir.join("broker-test"), &logins, &settings)?;
    let proxy = Proxy::start(broker.port())?;
    proxy.refuse_connects(REFUSED_CONNECTS);
    proxy.script(TEST_SCRIPT);
    // A subscriber: with none, mosquitto itself answers every PUBLISH with PUBACK 0x10.
    let mut sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port().to_string(), "-V", "mqttv5", "-q", "1"])
        .args(["-u", GATEWAY_USER, "-P", GATEWAY_PASSWORD, "-t", READINGS_FILTER, "-F", "%P|%p"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting mosquitto_sub")?;
    thread::sleep(Duration::from_millis(500));
    step("running mqtttest under QEMU: one case per row of the MQTT outcome table");
    let run = run_uplink(elf, proxy.port(), TOKEN, 0, "", TIMEOUT, &Extra::default());
    let _ = sub.kill();
    let _ = sub.wait();
    let (status, lines) = run?;
    match status {
        None => bail!("mqtttest: QEMU still running after {} s; killed", TIMEOUT.as_secs()),
        Some(s) if !s.success() => bail!("mqtttest failed under QEMU: {}", describe_exit(s)),
        Some(_) => {}
    }
    let counts = proxy.counts();
    let key = |n: u32| wary::Key::from_parts(DEVICE, 0x7e57, n).to_hex().as_str().to_owned();
    // Cases 1-5 were answered by the proxy (not delivered); 6 was delivered, dropped, resent.
    let expected: Vec<String> = [0, 6, 6, 7, 8, 9, 10, 11, 12, 13, 14].into_iter().map(key).collect();
    if counts.keys_forwarded != expected || proxy.pending() > 0 || counts.connacks_refused.len() != 3 {
        bail!(
            "mqtttest: the broker got keys {:?}, expected {expected:?}; {} faults unused; refused CONNECTs {:?}",
            counts.keys_forwarded,
            proxy.pending(),
            counts.connacks_refused
        );
    }
    let passed = lines.iter().filter(|l| l.contains("pass: ")).count();
    Ok(format!(
        "mqtttest: {passed} on-target checks passed; the broker got the dropped reading's key twice (resent with the same key) and none of the five publishes the proxy answered with a PUBACK error"
    ))
}

/// `cargo xtask device mqtt`: see the module docs. Returns the report.
pub fn run(root: &Path) -> Result<String> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    ensure_mosquitto()?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    let dir = std::env::temp_dir().join(format!("wary-mqtt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (elf, test_elf) = build_mqtt(&firmware, &dir)?;
    let result = on_target(&dir, &test_elf).and_then(|tests| {
        let run = scenario(root, &dir, &elf)?;
        let held = crate::mqtt_breaker::run(&dir, &elf)?;
        let figures = figures(root, &dir, &elf)?;
        Ok(format!("{tests}\n{run}\n{held}\n{figures}"))
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn scenario(root: &Path, dir: &Path, elf: &Path) -> Result<String> {
    let device = format!("{DEVICE:016x}");
    let logins = [Login::new(device.clone(), TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)];
    let broker = Broker::start(&dir.join("broker"), &logins, &Settings::default())?;
    let broker_port = broker.port();
    let proxy = Arc::new(Proxy::start(broker_port)?);
    proxy.script(SCRIPT);
    step(&format!(
        "device scenario `mqtt`: {READINGS} readings over MQTT 5 through the fault proxy on 127.0.0.1:{} to mosquitto on :{broker_port}, restarted half-way",
        proxy.port()
    ));
    let checker = Checker::start(broker_port, &["-c", "-i", "wary-mqtt-checker", "-x", "3600"])?;

    // The broker's restart, once half of the readings' publishes went through the proxy.
    let restarter = {
        let proxy = Arc::clone(&proxy);
        restart_when(broker, move || proxy.counts().publishes >= READINGS / 2)
    };
    let pcap = root.join("target/bench/mqtt.pcap");
    std::fs::create_dir_all(root.join("target/bench"))?;
    let extra = Extra { append: "", pcap: Some(&pcap), switch: None };
    let started = Instant::now();
    // Without the device's pace: the proxy's quota and busy answers are a script, not load.
    let (status, lines) = run_uplink(elf, proxy.port(), TOKEN, READINGS, "pacing=off", TIMEOUT, &extra)?;
    let elapsed = started.elapsed().as_secs_f64();
    let (broker, restarted) =
        restarter.join().map_err(|_| anyhow::anyhow!("the restart thread panicked"))??;
    // What the broker still holds for the checker reaches it within moments.
    let seen = checker.stop(Duration::from_secs(2))?;
    drop(broker);

    uplink_exited("mqtt", status, TIMEOUT)?;
    if let Some(line) = lines.iter().find(|l| l.contains(&TOKEN[..16]) || l.contains(&TOKEN[48..])) {
        bail!("mqtt: a device log line shows part of its credential: {:?}", line.replace(TOKEN, "…"));
    }
    if !restarted {
        bail!("mqtt: the broker was never restarted (fewer than {} publishes)", READINGS / 2);
    }
    let accepted = accepted_keys(&lines);
    if accepted.len() != READINGS as usize {
        bail!("mqtt: {} readings accepted, {READINGS} expected", accepted.len());
    }
    let tally = Tally::of(&seen);
    let lost: Vec<&String> = accepted.iter().filter(|k| !tally.payloads.contains_key(*k)).collect();
    let foreign: Vec<&String> = tally.payloads.keys().filter(|k| !accepted.contains(*k)).collect();
    let mixed: Vec<&String> = tally.payloads.iter().filter(|(_, p)| p.len() > 1).map(|(k, _)| k).collect();
    let duplicates = foreign.len() + mixed.len();
    let counts = proxy.counts();
    let mqtt_line = lines.iter().rev().find(|l| l.contains("MQTT connacks=")).cloned().unwrap_or_default();
    let summary = lines.iter().rev().find_map(|l| l.find("SUMMARY ").map(|at| l[at + 8..].to_owned()));
    let wire = read_pcap(&pcap)?;
    let delivered = f64::from(READINGS);
    let mut text = vec![
        format!(
            "mqtt: duplicates {duplicates}, lost {} ({} readings accepted, {} keys delivered, {} raw redeliveries absorbed by the key, {} messages without a key)",
            lost.len(),
            accepted.len(),
            tally.payloads.len(),
            tally.messages.saturating_sub(tally.payloads.len() + tally.keyless),
            tally.keyless
        ),
        format!(
            "proxy: {} connections, {} CONNECTs, {} PUBLISHes ({} with DUP); PUBACK injected {}, passed {}; DISCONNECT injected {}; {} dropped after the PUBLISH reached the broker; broker restarted after {} publishes",
            counts.connections,
            counts.connects,
            counts.publishes,
            counts.dup_publishes,
            hex_map(&counts.pubacks_injected),
            hex_map(&counts.pubacks_passed),
            hex_map(&counts.disconnects_injected),
            counts.drops,
            READINGS / 2
        ),
        format!("device: {}", mqtt_line.split("MQTT ").nth(1).unwrap_or("(no MQTT line)")),
        format!("uplink: {}", summary.unwrap_or_default()),
        format!(
            "wire (pcap, whole run with its faults and reconnects): {} frames, {} B, {} SYNs; {:.1} frames and {:.0} B per delivered reading",
            wire.frames,
            wire.bytes,
            wire.syns,
            wire.frames as f64 / delivered,
            wire.bytes as f64 / delivered
        ),
        format!("wall time {elapsed:.1} s"),
    ];
    let mut problems = vec![];
    if !lost.is_empty() {
        problems.push(format!("lost: {lost:?}"));
    }
    if !foreign.is_empty() {
        problems.push(format!("keys no reading of the run had: {foreign:?}"));
    }
    if !mixed.is_empty() {
        problems.push(format!("keys delivered with two different payloads: {mixed:?}"));
    }
    if tally.keyless > 0 {
        problems.push(format!("{} messages without an Idempotency-Key", tally.keyless));
    }
    if proxy.pending() > 0 {
        problems.push(format!("{} scripted faults never used", proxy.pending()));
    }
    for code in [0x89u8, 0x97, 0x9C, 0x9F] {
        if !counts.disconnects_injected.contains_key(&code) {
            problems.push(format!("DISCONNECT {code:#04x} never sent"));
        }
    }
    if !problems.is_empty() {
        text.push(format!("mqtt failed: {}", problems.join("; ")));
        bail!("{}", text.join("\n"));
    }
    write_figures(
        root,
        "scenario",
        wire_row(
            &wire,
            READINGS,
            "the whole mqtt scenario: its faults, reconnects and the broker's restart included",
        ),
    )?;
    Ok(text.join("\n"))
}

/// Restarts `broker` (cleanly: it saves its sessions) from a thread once `due` says so, polling
/// it for at most [`TIMEOUT`]; the thread gives the broker back, and whether it restarted.
pub(crate) fn restart_when(
    mut broker: Broker,
    due: impl Fn() -> bool + Send + 'static,
) -> thread::JoinHandle<Result<(Broker, bool)>> {
    thread::spawn(move || {
        let end = Instant::now() + TIMEOUT;
        while Instant::now() < end {
            if due() {
                broker.restart()?;
                return Ok((broker, true));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok((broker, false))
    })
}

pub(crate) fn hex_map(m: &BTreeMap<u8, u32>) -> String {
    let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k:#04x}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

/// The keys of the readings the firmware accepted (`ACCEPTED boot=… seq=…`).
pub(crate) fn accepted_keys(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .filter_map(|l| l.find("ACCEPTED ").map(|at| &l[at + 9..]))
        .filter_map(|rest| {
            let field = |name: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(name));
            let boot = u32::from_str_radix(field("boot=")?, 16).ok()?;
            let seq = field("seq=")?.parse().ok()?;
            Some(key_hex(boot, seq))
        })
        .collect()
}

/// What the checker received: per key, the distinct payloads; all messages; those with no key.
#[derive(Default, Debug)]
pub(crate) struct Tally {
    pub(crate) payloads: BTreeMap<String, BTreeSet<String>>,
    pub(crate) messages: usize,
    pub(crate) keyless: usize,
}

impl Tally {
    /// Reads `mosquitto_sub -F '%P|%p'` lines: `name:value` user properties, `|`, the payload.
    pub(crate) fn of(lines: &[String]) -> Tally {
        let mut t = Tally::default();
        for line in lines {
            let Some((props, payload)) = line.split_once('|') else { continue };
            t.messages += 1;
            let key = props.split(' ').find_map(|p| p.strip_prefix("Idempotency-Key:"));
            match key {
                Some(key) => {
                    t.payloads.entry(key.to_owned()).or_default().insert(payload.to_owned());
                }
                None => t.keyless += 1,
            }
        }
        t
    }
}

/// A `mosquitto_sub` on a broker's port as the gateway login (MQTT 5, QoS 1), printing each
/// message's user properties and payload (`%P|%p`, read by [`Tally::of`]).
pub(crate) struct Checker {
    child: Child,
    lines: thread::JoinHandle<Vec<String>>,
}

impl Checker {
    /// Starts it on `port` with `extra` arguments, and returns once it has had time to subscribe.
    pub(crate) fn start(port: u16, extra: &[&str]) -> Result<Checker> {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv5", "-q", "1"])
            .args(["-u", GATEWAY_USER, "-P", GATEWAY_PASSWORD, "-t", READINGS_FILTER])
            .args(extra)
            .args(["-F", "%P|%p"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mosquitto_sub")?;
        let out = child.stdout.take().context("mosquitto_sub stdout")?;
        let lines =
            thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).collect::<Vec<_>>());
        thread::sleep(Duration::from_millis(500));
        Ok(Checker { child, lines })
    }

    /// What it printed, after `settle` for what the broker still holds for it to arrive.
    pub(crate) fn stop(mut self, settle: Duration) -> Result<Vec<String>> {
        thread::sleep(settle);
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines.join().map_err(|_| anyhow::anyhow!("the checker's reader panicked"))
    }
}

/// Frames, bytes and SYNs from the device in a classic pcap of Ethernet frames.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wire {
    pub(crate) frames: u64,
    pub(crate) bytes: u64,
    pub(crate) syns: u64,
}

pub(crate) fn read_pcap(path: &Path) -> Result<Wire> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut wire = Wire::default();
    let mut at = 24;
    while let Some(head) = data.get(at..at + 16) {
        let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let Some(frame) = data.get(at + 16..at + 16 + len) else { break };
        wire.frames += 1;
        wire.bytes += len as u64;
        // Ethernet, IPv4, TCP: a SYN without ACK is a connect.
        if frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&6) {
            let ihl = usize::from(frame.get(14).copied().unwrap_or(0) & 0x0f) * 4;
            if let Some(flags) = frame.get(14 + ihl + 13)
                && flags & 0x12 == 0x02
            {
                wire.syns += 1;
            }
        }
        at += 16 + len;
    }
    Ok(wire)
}

pub(crate) fn wire_row(wire: &Wire, readings: u32, note: &str) -> serde_json::Value {
    let n = f64::from(readings);
    serde_json::json!({
        "readings": readings,
        "frames": wire.frames,
        "bytes": wire.bytes,
        "syns": wire.syns,
        "frames_per_reading": wire.frames as f64 / n,
        "bytes_per_reading": wire.bytes as f64 / n,
        "note": note,
    })
}

/// Sets `device_mqtt.<name>` in target/bench/results.json.
pub(crate) fn write_figures(root: &Path, name: &str, row: serde_json::Value) -> Result<()> {
    let results = root.join("target/bench/results.json");
    let mut all = std::fs::read_to_string(&results)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    // The scenario's row comes first: a run starts the object afresh.
    if name == "scenario" || !all["device_mqtt"].is_object() {
        all["device_mqtt"] = serde_json::json!({});
    }
    all["device_mqtt"][name] = row;
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))
}

/// HTTP's side of the comparison: the plain uplink, the cloud answering every request 200.
const HTTP_CLEAN: crate::device::Scenario = crate::device::Scenario {
    name: "mqtt-vs-http",
    faults: "seed=1",
    readings: READINGS,
    plan: "",
    resets: &[],
    route: crate::device::Route::Direct,
};

/// The figures: bytes and frames on the device's wire per delivered reading, MQTT and HTTP,
/// each with no fault (same readings, same pcap method: QEMU's `filter-dump`); and flash and
/// RAM of the uplink built with and without `mqtt`.
fn figures(root: &Path, dir: &Path, mqtt_elf: &Path) -> Result<String> {
    let bench = root.join("target/bench");
    std::fs::create_dir_all(&bench)?;
    step(&format!(
        "figures: {READINGS} readings over MQTT with no fault, then over HTTP (keep-alive) with none"
    ));
    let device = format!("{DEVICE:016x}");
    let logins = [Login::new(device, TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)];
    let broker = Broker::start(&dir.join("broker-clean"), &logins, &Settings::default())?;
    let mut sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port().to_string(), "-V", "mqttv5", "-q", "1"])
        .args(["-u", GATEWAY_USER, "-P", GATEWAY_PASSWORD, "-t", READINGS_FILTER])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting mosquitto_sub")?;
    thread::sleep(Duration::from_millis(500));
    let pcap = bench.join("mqtt-clean.pcap");
    let extra = Extra { append: "", pcap: Some(&pcap), switch: None };
    let run = run_uplink(mqtt_elf, broker.port(), TOKEN, READINGS, "", TIMEOUT, &extra);
    let _ = sub.kill();
    let _ = sub.wait();
    drop(broker);
    let (status, lines) = run?;
    if !status.is_some_and(|s| s.success())
        || !lines.iter().any(|l| l.contains(&format!("landed={READINGS} dead_lettered=0 ")))
    {
        bail!("figures: the clean MQTT run did not land all {READINGS} readings");
    }
    let mqtt = read_pcap(&pcap)?;
    let pcap = bench.join("http-clean.pcap");
    crate::device::run_with(root, &HTTP_CLEAN, &Extra { append: "", pcap: Some(&pcap), switch: None })?;
    let http = read_pcap(&pcap)?;
    let llvm = crate::harness::llvm_size()?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    let (mt, md, mb) = crate::harness::size_of(&llvm, mqtt_elf)?;
    let (ht, hd, hb) = crate::harness::size_of(&llvm, &elf_path(&firmware, "uplink"))?;
    write_figures(
        root,
        "clean_mqtt",
        wire_row(&mqtt, READINGS, "MQTT 5 QoS 1, one connection, every PUBACK 0x00"),
    )?;
    write_figures(root, "clean_http", wire_row(&http, READINGS, "HTTP/1.1 keep-alive, every reply 200"))?;
    write_figures(
        root,
        "size",
        serde_json::json!({
            "uplink_mqtt": {"flash": mt + md, "ram": md + mb},
            "uplink_http": {"flash": ht + hd, "ram": hd + hb},
        }),
    )?;
    let n = f64::from(READINGS);
    Ok(format!(
        "figures, {READINGS} readings with no fault (pcap of the device's wire):\n  \
         MQTT: {} frames, {} B, {} SYNs: {:.1} frames and {:.0} B per delivered reading\n  \
         HTTP: {} frames, {} B, {} SYNs: {:.1} frames and {:.0} B per delivered reading\n\
         size of the uplink: mqtt {} B flash, {} B RAM; http {} B flash, {} B RAM\n\
         figures in target/bench/results.json (device_mqtt)",
        mqtt.frames,
        mqtt.bytes,
        mqtt.syns,
        mqtt.frames as f64 / n,
        mqtt.bytes as f64 / n,
        http.frames,
        http.bytes,
        http.syns,
        http.frames as f64 / n,
        http.bytes as f64 / n,
        mt + md,
        md + mb,
        ht + hd,
        hd + hb,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_groups_payloads_by_key_and_counts_keyless_messages() {
        let lines: Vec<String> = [
            "Idempotency-Key:aa|{\"v\":1}",
            "Idempotency-Key:aa|{\"v\":1}",
            "Idempotency-Key:bb|{\"v\":2}",
            "Idempotency-Key:bb|{\"v\":3}",
            "|{\"v\":4}",
            "not a message",
        ]
        .map(String::from)
        .to_vec();
        let t = Tally::of(&lines);
        assert_eq!(t.messages, 5);
        assert_eq!(t.keyless, 1);
        assert_eq!(t.payloads["aa"].len(), 1, "a redelivery of the same reading");
        assert_eq!(t.payloads["bb"].len(), 2, "one key, two readings: a duplicate");
    }

    #[test]
    fn accepted_readings_become_their_keys() {
        let lines = vec!["INFO ACCEPTED boot=2 seq=7 x".to_owned(), "ACCEPTED boot=zz seq=1".to_owned()];
        let keys = accepted_keys(&lines);
        assert_eq!(keys, BTreeSet::from([key_hex(2, 7)]));
    }
}
