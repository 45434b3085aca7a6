//! The CoAP device scenarios: the uplink built with feature `coap` under QEMU sends each reading
//! as a confirmable `POST` to `/r/<key>` over UDP (`wary_uplink::coap`), the retransmissions
//! decided by wary's CoAP policy.
//!
//! - `coap`: against libcoap's `coap-server` (Debian's `libcoap3-bin`, installed when missing;
//!   Debian names the binary `coap-server-notls`), on 127.0.0.1 only, with `-d` so that each
//!   `POST` to a new path creates a resource holding its body. A server we did not write: the
//!   check reads the resources back with `coap-client` (`.well-known/core`, then a `GET` of each
//!   key) and must find every accepted reading's key once, with its body, and no other. Then
//!   the breaker's hold against the same server, down while the device boots
//!   (`crate::coap_breaker`).
//!
//! - `coap-storm`: against our CoAP fault server (`wary_fixtures::coap_fault`), which loses ACKs
//!   after the effect, answers 5.03 and 4.29 with Max-Age, sends responses twice and restarts
//!   forgetting the message IDs it answered; it applies each key once and counts, and the check
//!   reads its counts.
//!
//! Both report in the device scenarios' terms (`crate::device::check`): every accepted reading
//! applied exactly once ("duplicates 0, lost 0").

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::device::{Extra, Log, Route, Scenario, check};
use crate::harness::{TARGET, build, build_uplink_variant, elf_path, uplink_exited};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, have, step};

/// The libcoap run: 12 readings, no resets, no faults of ours (the server is libcoap's).
pub const COAP: Scenario = Scenario {
    name: "coap",
    faults: "none (libcoap's coap-server)",
    readings: 12,
    plan: "",
    resets: &[],
    route: Route::Direct,
};

/// The storm: 20 readings against the fault server.
pub const COAP_STORM: Scenario = Scenario {
    name: "coap-storm",
    faults: "lost_ack=0.15 503=0.10:max_age=2 429=0.06:max_age=2 duplicate=0.12 slow=0.06:ms=1500 restart=0.05 seed=13",
    readings: 20,
    // Without the pace, as for the HTTP storm (its 5.03s and 4.29s are at random, not load).
    plan: "pacing=off",
    resets: &[],
    route: Route::Direct,
};

/// [`COAP_STORM`]'s faults for the fault server (rates per 1,000 messages). It opens with the
/// hardest case: the first reading's ACK is lost after the effect, and the server restarts as its
/// retransmission arrives, so only the key keeps the effect single; the second reading's answer
/// comes 1.5 s late, after the device stopped listening (1 s), and must be taken during the
/// runner's wait instead of a retransmission.
fn storm_plan() -> wary_fixtures::coap_fault::Plan {
    use wary_fixtures::coap_fault::Fault;
    wary_fixtures::coap_fault::Plan {
        script: vec![Fault::LostAck, Fault::Restart, Fault::Slow],
        lost_ack: 150,
        unavailable: 100,
        too_many: 60,
        duplicate: 120,
        slow: 60,
        slow_ms: 1500,
        restart: 50,
        max_age: 2,
        seed: 13,
    }
}

/// Dynamic resources libcoap may create (`-d`): beyond it, it answers 4.06. Far above a run's
/// readings.
const DYNAMIC: &str = "1000";

/// Builds the uplink and `coaptest` with feature `coap`, runs `coaptest` under QEMU (the CoAP
/// transport's outcome table, on target), and keeps the uplink's ELF in `dir`.
pub(crate) fn build_coap_uplink(root: &Path, dir: &Path) -> Result<PathBuf> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    step("building the uplink with `--features coap`");
    let elf = dir.join("uplink-coap");
    build_uplink_variant(&firmware, "wary-qemu/coap", &["coaptest"], &[], &elf)?;
    // The transport's outcome table, on target, first.
    crate::qemu::run_under_qemu(&elf_path(&firmware, "coaptest"), "coaptest")?;
    // The plain build puts its own ELF back in place for the other scenarios.
    build(&firmware)?;
    record_size(root, &elf, &elf_path(&firmware, "uplink"))?;
    Ok(elf)
}

/// Flash (text + data) and RAM (data + bss, no stack) of the CoAP uplink and of the plain
/// (HTTP/1.1 keep-alive) one, from `llvm-size`, printed and written to
/// target/bench/results.json (`device_coap.size`).
fn record_size(root: &Path, coap: &Path, http: &Path) -> Result<()> {
    let llvm_size = crate::harness::llvm_size()?;
    let mut row = serde_json::Map::new();
    for (label, elf) in [("coap", coap), ("http", http)] {
        let (text, data, bss) = crate::harness::size_of(&llvm_size, elf)?;
        eprintln!("    uplink ({label}): flash {} B, RAM {} B", text + data, data + bss);
        row.insert(label.to_owned(), serde_json::json!({ "flash": text + data, "ram": data + bss }));
    }
    update_results(root, "size", serde_json::Value::Object(row))
}

/// Puts `value` at `device_coap.<label>` in target/bench/results.json, keeping the rest.
fn update_results(root: &Path, label: &str, value: serde_json::Value) -> Result<()> {
    let dir = root.join("target").join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let results = dir.join("results.json");
    let mut all = std::fs::read_to_string(&results)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    if !all["device_coap"].is_object() {
        all["device_coap"] = serde_json::json!({});
    }
    all["device_coap"][label] = value;
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))
}

/// libcoap's programs: Debian's `libcoap3-bin` installs them with a suffix naming the TLS
/// library (`-notls` here: no DTLS is used).
fn libcoap(program: &str) -> Result<String> {
    for name in [program.to_owned(), format!("{program}-notls")] {
        if have(&name) {
            return Ok(name);
        }
    }
    ensure_apt(&format!("{program}-notls"), "libcoap3-bin")?;
    Ok(format!("{program}-notls"))
}

/// A free UDP port on 127.0.0.1 (bound, read, released).
pub(crate) fn free_udp_port() -> Result<u16> {
    let socket = UdpSocket::bind("127.0.0.1:0").context("binding a UDP port")?;
    Ok(socket.local_addr()?.port())
}

/// `coap-server` on 127.0.0.1, killed on drop.
pub(crate) struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Result<Server> {
        Server::start_on(free_udp_port()?)
    }

    /// The server on `port`, once it answers.
    pub(crate) fn start_on(port: u16) -> Result<Server> {
        let program = libcoap("coap-server")?;
        let child = Command::new(&program)
            .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", DYNAMIC])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let server = Server { child, port };
        // Up when it answers a GET of its resource list.
        let started = Instant::now();
        while get(port, ".well-known/core").is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("{program} did not answer on 127.0.0.1:{port} within 10 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `coap-client -m get coap://127.0.0.1:<port>/<path>`: the payload, or an error for a 4.xx or
/// 5.xx (the client prints the code on stderr and nothing else) or no answer.
fn get(port: u16, path: &str) -> Result<String> {
    let client = libcoap("coap-client")?;
    let out = Command::new(&client)
        .args(["-m", "get", "-B", "5", &format!("coap://127.0.0.1:{port}/{path}")])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {client}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("4.0") || err.contains("5.0") {
        bail!("GET /{path}: {} {}", out.status, err.trim());
    }
    Ok(text)
}

/// The keys of `/r/<32 hex>` resources in a link-format list, with how often each is listed.
fn listed_keys(links: &str) -> BTreeMap<String, u64> {
    let mut keys = BTreeMap::new();
    for link in links.split(',') {
        let Some(target) = link.trim().strip_prefix("</r/").and_then(|rest| rest.split_once('>')) else {
            continue;
        };
        *keys.entry(target.0.to_owned()).or_insert(0) += 1;
    }
    keys
}

/// Runs `coap`: the uplink against libcoap's server. Its report, checked.
pub fn coap(root: &Path) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("wary-coap-{}", std::process::id()));
    let elf = build_coap_uplink(root, &dir)?;
    let server = Server::start()?;
    step(&format!("device scenario `coap`: libcoap's coap-server on 127.0.0.1:{} (UDP)", server.port));
    let started = Instant::now();
    let pcap = dir.join("coap.pcap");
    let more = Extra { pcap: Some(&pcap), ..Extra::default() };
    let result = crate::device::run_uplink_elf(&elf, server.port, COAP.readings, COAP.plan, &more);
    let elapsed = started.elapsed().as_secs_f64();
    let wire = wire(&pcap, server.port);
    // The breaker's hold against the same server, with the same build.
    let held = crate::coap_breaker::run(&elf);
    let _ = std::fs::remove_dir_all(&dir);
    let (status, lines) = result?;
    let wire = wire?;
    uplink_exited("coap", status, crate::device::TIMEOUT)?;
    let (report, listed) = read_back(server.port)?;
    let log = Log::read(&lines);
    let text = check(&COAP, &log, &report)?;
    let figures = record(root, "calm", &wire, log_accepted(&lines))?;
    let coap_line = lines.iter().find_map(|l| l.split_once("COAP ").map(|(_, rest)| rest.to_owned()));
    Ok(format!(
        "{text}\nserver: libcoap coap-server, {listed} resources under /r read back, each once with a JSON body\ndevice: {}\n{figures}\nwall time {elapsed:.1} s\n{}",
        coap_line.unwrap_or_default(),
        held?,
    ))
}

/// What libcoap's server holds, read back with `coap-client` in the device scenarios' report
/// form: each `/r/<key>` resource listed in `.well-known/core` is an effect of its key if its
/// body is a reading's JSON (a resource holds the last body posted to it). Also the count of
/// resources listed.
pub(crate) fn read_back(port: u16) -> Result<(serde_json::Value, usize)> {
    let links = get(port, ".well-known/core")?;
    let listed = listed_keys(&links);
    let mut keys = serde_json::Map::new();
    for (key, times) in &listed {
        let body = get(port, &format!("r/{key}"))?;
        let effects = if body.trim_start().starts_with('{') { *times } else { 0 };
        keys.insert(key.clone(), serde_json::json!({ "effects": effects, "replays": 0 }));
    }
    let duplicates = listed.values().filter(|n| **n > 1).count();
    let report = serde_json::json!({ "keys": keys, "cloud": { "duplicates": { "keys": duplicates } } });
    Ok((report, listed.len()))
}

/// Runs `coap-storm`: the uplink against the CoAP fault server. Its report, checked: every
/// accepted reading applied once, and every kind of fault dealt.
pub fn coap_storm(root: &Path) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("wary-coap-storm-{}", std::process::id()));
    let elf = build_coap_uplink(root, &dir)?;
    let server = wary_fixtures::coap_fault::CoapFault::start(storm_plan())?;
    step(&format!(
        "device scenario `coap-storm`: the CoAP fault server on 127.0.0.1:{} (UDP), faults `{}`",
        server.port, COAP_STORM.faults
    ));
    let started = Instant::now();
    let pcap = dir.join("coap-storm.pcap");
    let more = Extra { pcap: Some(&pcap), ..Extra::default() };
    let result =
        crate::device::run_uplink_elf(&elf, server.port, COAP_STORM.readings, COAP_STORM.plan, &more);
    let wire = wire(&pcap, server.port);
    let _ = std::fs::remove_dir_all(&dir);
    let seen = server.stop();
    let (status, lines) = result?;
    let wire = wire?;
    uplink_exited("coap-storm", status, crate::device::TIMEOUT)?;
    let report = seen.report();
    let log = Log::read(&lines);
    let text = check(&COAP_STORM, &log, &report)?;
    let figures = record(root, "storm", &wire, log_accepted(&lines))?;
    let missing: Vec<&str> = ["lost_ack", "503", "429", "duplicate", "slow", "restart"]
        .into_iter()
        .filter(|f| !seen.faults.contains_key(f))
        .collect();
    if !missing.is_empty() {
        bail!("coap-storm: faults never dealt: {missing:?} (dealt {:?})", seen.faults);
    }
    let replays: u64 = seen.keys.values().map(|k| k.replays).sum();
    if replays == 0 {
        bail!("coap-storm: no retransmission met a restarted server (no replay by key)");
    }
    // The server remembers message IDs: a retransmission it answers from memory carried the
    // same message ID as the transmission whose ACK was lost.
    if seen.remembered == 0 {
        bail!("coap-storm: no retransmission reused its message ID (none answered from the server's memory)");
    }
    // A slow answer was taken by the next attempt, which sent nothing.
    let late = lines
        .iter()
        .find_map(|l| l.split_once("COAP ").map(|(_, rest)| rest))
        .and_then(|rest| rest.split_whitespace().find_map(|kv| kv.strip_prefix("late=")))
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    if late == 0 {
        bail!("coap-storm: no answer was taken late (a slow response should be)");
    }
    let coap_line = lines.iter().find_map(|l| l.split_once("COAP ").map(|(_, rest)| rest.to_owned()));
    Ok(format!(
        "{text}\nserver: {} datagrams, faults {:?}, {} retransmissions answered from its message-ID memory, {replays} resends after a restart applied nothing by their key\ndevice: {}\n{figures}\nwall time {:.1} s",
        seen.datagrams,
        seen.faults,
        seen.remembered,
        coap_line.unwrap_or_default(),
        started.elapsed().as_secs_f64()
    ))
}

/// The CoAP datagrams on the device's wire (QEMU's `filter-dump`): Ethernet frames of UDP
/// between the device (10.0.2.15) and the server's `port`, both ways.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Wire {
    frames: u64,
    bytes: u64,
}

/// Reads a classic little-endian pcap of Ethernet frames (what `filter-dump` writes) and counts
/// the CoAP ones (see [`Wire`]).
fn wire(path: &Path, port: u16) -> Result<Wire> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if data.get(..4) != Some(&[0xd4, 0xc3, 0xb2, 0xa1][..])
        && data.get(..4) != Some(&[0x4d, 0x3c, 0xb2, 0xa1][..])
    {
        bail!("{} is not a little-endian classic pcap", path.display());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(b)).ok()
    };
    let mut wire = Wire::default();
    let mut at = 24;
    while let (Some(incl), Some(orig)) = (u32_at(at + 8), u32_at(at + 12)) {
        let Some(frame) = data.get(at + 16..at + 16 + incl) else { break };
        at += 16 + incl;
        if coap_frame(frame, port) {
            wire.frames += 1;
            wire.bytes += orig as u64;
        }
    }
    Ok(wire)
}

/// Whether an Ethernet frame is IPv4 UDP between 10.0.2.15 and `port`.
fn coap_frame(frame: &[u8], port: u16) -> bool {
    let ipv4 = frame.get(12..14) == Some(&[0x08, 0x00][..]);
    let ip = frame.get(14..).unwrap_or(&[]);
    let ihl = usize::from(ip.first().map_or(0, |b| b & 0x0f)) * 4;
    let udp = ip.get(9) == Some(&17);
    let device = [10, 0, 2, 15];
    let ends = (ip.get(12..16), ip.get(16..20));
    let from_or_to = ends.0 == Some(&device[..]) || ends.1 == Some(&device[..]);
    let ports =
        ip.get(ihl..ihl + 4).map(|p| (u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])));
    ipv4 && udp && from_or_to && ports.is_some_and(|(src, dst)| src == port || dst == port)
}

/// Readings the device accepted, from its log.
fn log_accepted(lines: &[String]) -> u64 {
    lines.iter().filter(|l| l.contains("ACCEPTED ")).count() as u64
}

/// Writes a run's wire figures into target/bench/results.json (`device_coap.<label>`) and
/// returns them as a line.
fn record(root: &Path, label: &str, wire: &Wire, readings: u64) -> Result<String> {
    let per = |n: u64| n as f64 / readings.max(1) as f64;
    let line = format!(
        "wire ({label}, pcap): {} CoAP frames, {} B for {readings} readings: {:.2} packets and {:.0} B per delivered reading",
        wire.frames,
        wire.bytes,
        per(wire.frames),
        per(wire.bytes)
    );
    update_results(
        root,
        label,
        serde_json::json!({
            "readings": readings,
            "frames": wire.frames,
            "bytes": wire.bytes,
            "packets_per_reading": per(wire.frames),
            "bytes_per_reading": per(wire.bytes),
        }),
    )?;
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_format_keys_are_counted() {
        let links = "</>;title=\"General Info\";ct=0,</r/00aa>;ct=0;title=\"Dynamic\";obs,</time>;if=\"clock\",\
                     </r/00bb>;ct=0,</r/00aa>;ct=0";
        let keys = listed_keys(links);
        assert_eq!(keys.get("00aa"), Some(&2));
        assert_eq!(keys.get("00bb"), Some(&1));
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn only_udp_frames_of_the_device_and_the_port_count() {
        // Ethernet (IPv4), IPv4 header of 20 bytes, UDP 10.0.2.15:40000 -> 10.0.2.2:5683.
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2];
        ip.extend_from_slice(&[0x9c, 0x40, 0x16, 0x33, 0, 8, 0, 0]);
        frame.extend_from_slice(&ip);
        assert!(coap_frame(&frame, 5683));
        assert!(!coap_frame(&frame, 5684));
        // The same as TCP: not counted.
        let mut tcp = frame.clone();
        tcp[14 + 9] = 6;
        assert!(!coap_frame(&tcp, 5683));
        // Another host's datagram: not counted.
        let mut other = frame;
        other[14 + 12..14 + 16].copy_from_slice(&[10, 0, 2, 16]);
        other[14 + 16..14 + 20].copy_from_slice(&[10, 0, 2, 2]);
        assert!(!coap_frame(&other, 5683));
    }
}
