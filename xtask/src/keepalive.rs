//! The device's kept connections under QEMU: `idle-close` (the cloud closes idle connections
//! at random; every reading lands once and each write onto a closed connection is classified)
//! and `drain` (a backlog after an outage, measured on the wire from a pcap, with one connection
//! per request, with keep-alive, and with batches of 16 (docs/batches.md), direct to the cloud
//! and through the gateway with the device's credential). Figures go to the output and
//! target/bench/results.json (`device_drain`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::device::{self, Extra, Route, Scenario};
use crate::util::step;

/// The cloud closes every idle connection after a reply: 30 to 120 ms of idling (the sensor
/// makes a reading every 60 ms, so many closes come before the device's next write), and half
/// of the closes that the next request would beat fire as it arrives instead, resetting the
/// connection with the request unread (the race of a write meeting the server's idle timer).
pub const IDLE_CLOSE: Scenario = Scenario {
    name: "idle-close",
    faults: "idle_close=1:min=30:max=120:race=0.5,seed=5",
    readings: 40,
    plan: "",
    resets: &[],
    route: Route::Direct,
};

/// `idle-close` over TLS: the cloud behind a TLS 1.3 terminator, so each idle close reaches
/// the device as the server's `close_notify` and FIN, and a close racing a request as a
/// connection dropped with the request unanswered. Every close costs the device a full
/// handshake, during which readings queue and go out back to back (no idle gap to close in),
/// so the closes come sooner (2 to 40 ms of idling) and fewer of them race: both the closes
/// seen before a write and the writes onto a closed session happen.
pub const IDLE_CLOSE_TLS: Scenario = Scenario {
    name: "idle-close-tls",
    faults: "idle_close=1:min=2:max=40:race=0.2,seed=5",
    readings: 40,
    plan: "",
    resets: &[],
    route: Route::TlsTerminator,
};

/// The readings queued during the drain's outage: 200 (a reading every 60 ms, so 12 s of
/// outage; the outbox holds them with room to spare).
const DRAIN_READINGS: u32 = 200;
/// The cloud answers 503 from the start until this long after QEMU starts (DHCP and 200
/// readings fit before).
const OUTAGE: Duration = Duration::from_secs(15);

/// The drain: the cloud is down (503 to everything) while the readings queue, then well.
pub const DRAIN: Scenario = Scenario {
    name: "drain",
    faults: "503=1,seed=1",
    readings: DRAIN_READINGS,
    plan: "",
    resets: &[],
    route: Route::Direct,
};

/// The drain through the gateway (plain HTTP, the device's credential checked).
pub const DRAIN_GATEWAY: Scenario = Scenario { route: Route::Gateway, ..DRAIN };

/// Readings in one batch in the drain's batch runs.
const BATCH: u32 = 16;

/// Bytes on the wire per delivered reading with batches of 16 through the gateway (the
/// device's credential on), at most.
const BATCH_BYTES_TARGET: f64 = 110.0;

/// Handshakes per delivered reading with keep-alive, at most.
const SYN_TARGET: f64 = 0.02;
/// Bytes on the wire per delivered reading with keep-alive, at most this share of those with
/// one connection per request. (A reading on a kept connection is two frames, request and
/// reply, about 500 B with the credential and the cloud's headers: under 400 B needs batches.)
const BYTES_SHARE: f64 = 0.6;

/// The key=value fields of the device's `HTTP` line.
pub(crate) fn http_counts(lines: &[String]) -> Result<BTreeMap<String, u64>> {
    let line = lines
        .iter()
        .rev()
        .find_map(|l| l.find("HTTP connects=").map(|at| &l[at + 5..]))
        .context("the firmware printed no HTTP line")?;
    Ok(line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect())
}

/// `idle-close`: every reading lands exactly once (the device scenario's own check) and the
/// device wrote at least 3 requests onto connections the cloud had already closed.
pub fn idle_close(root: &Path) -> Result<String> {
    idle_close_on(root, &IDLE_CLOSE)
}

/// [`idle_close`] over TLS ([`IDLE_CLOSE_TLS`]): every reading lands exactly once, and the
/// same counts, the handshakes included (one per connection).
pub fn idle_close_tls(root: &Path) -> Result<String> {
    idle_close_on(root, &IDLE_CLOSE_TLS)
}

fn idle_close_on(root: &Path, scenario: &Scenario) -> Result<String> {
    let run = device::run_with(root, scenario, &Extra::default())?;
    let c = http_counts(&run.lines)?;
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    let writes = get("stale_unsent") + get("stale_maybe_landed");
    let text = format!(
        "{}\nkept connections: {} connects for {} exchanges ({} reused); closed by the cloud and seen before a write {}; \
         writes onto a connection the cloud had closed {writes}: {} failed before the whole request left (never sent, resent), \
         {} left with no reply (may have landed, resent with the key)",
        run.report,
        get("connects"),
        get("exchanges"),
        get("reused"),
        get("stale_before_write"),
        get("stale_unsent"),
        get("stale_maybe_landed"),
    );
    if writes < 3 {
        bail!("{text}\n{}: only {writes} writes onto closed connections, at least 3 needed", scenario.name);
    }
    Ok(text)
}

/// What a pcap shows of one run, split at the moment the cloud came back.
#[derive(Debug, Default, Clone, Copy)]
struct Wire {
    /// SYNs from the device during the outage, and frames and bytes then.
    outage_syns: u64,
    outage_frames: u64,
    outage_bytes: u64,
    /// From the moment the cloud came back: SYNs, frames, bytes on the wire (Ethernet frames).
    syns: u64,
    frames: u64,
    bytes: u64,
    /// From the moment the cloud came back to the last frame carrying data from it, in ms.
    drain_ms: u64,
}

/// Reads a classic pcap of Ethernet frames and splits it where the cloud came back: at the
/// device's first SYN or request after the last 503 reply (or batch answer with a 503 item). (QEMU's `filter-dump` stamps frames with the guest's virtual
/// clock from a start time in whole seconds, so the host's clock cannot place the switch; the
/// wire itself does.) The device's wait between the switch and its next attempt is not in the
/// drain time.
fn read_pcap(path: &Path) -> Result<Wire> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let magic = data.get(..4).context("pcap too short")?;
    let (le, nanos) = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => (true, false),
        [0x4d, 0x3c, 0xb2, 0xa1] => (true, true),
        [0xa1, 0xb2, 0xc3, 0xd4] => (false, false),
        [0xa1, 0xb2, 0x3c, 0x4d] => (false, true),
        _ => bail!("{} is not a classic pcap", path.display()),
    };
    let u32_at = |at: usize| -> Option<u64> {
        let b: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        Some(u64::from(if le { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }))
    };
    // (time in µs, bytes on the wire, TCP view) of every frame.
    let mut frames = vec![];
    let mut at = 24;
    while let (Some(sec), Some(frac), Some(incl), Some(orig)) =
        (u32_at(at), u32_at(at + 4), u32_at(at + 8), u32_at(at + 12))
    {
        let us = sec * 1_000_000 + if nanos { frac / 1000 } else { frac };
        let start = at + 16;
        let Some(frame) = data.get(start..start + incl as usize) else { break };
        at = start + incl as usize;
        frames.push((us, orig, tcp_of(frame)));
    }
    let last_503 = frames
        .iter()
        .rposition(|(_, _, tcp)| {
            tcp.is_some_and(|t| !t.from_device && (t.status == Some(503) || t.batch_503))
        })
        .map_or(0, |last| last + 1);
    // The device's first try after it: a SYN or a request (the outage's teardown and the
    // device's pause before its next round are the outage's).
    let back = frames
        .iter()
        .skip(last_503)
        .position(|(_, _, tcp)| tcp.is_some_and(|t| t.from_device && (t.payload > 0 || (t.syn && !t.ack))))
        .map_or(frames.len(), |first| last_503 + first);
    let back_us = frames.get(back).map_or(0, |f| f.0);
    let mut wire = Wire::default();
    let mut last_data_us = back_us;
    for (i, (us, orig, tcp)) in frames.iter().enumerate() {
        let syn_from_device = tcp.is_some_and(|t| t.syn && !t.ack && t.from_device);
        if i < back {
            wire.outage_frames += 1;
            wire.outage_bytes += orig;
            wire.outage_syns += u64::from(syn_from_device);
        } else {
            wire.frames += 1;
            wire.bytes += orig;
            wire.syns += u64::from(syn_from_device);
            if tcp.is_some_and(|t| !t.from_device && t.payload > 0) {
                last_data_us = *us;
            }
        }
    }
    wire.drain_ms = last_data_us.saturating_sub(back_us) / 1000;
    Ok(wire)
}

/// The device's wire in a pcap from its first SYN or request on: SYNs from the device, frames
/// and bytes (Ethernet frames), whatever the payloads (TLS hides the statuses the drain reads).
pub(crate) fn wire_totals(path: &Path) -> Result<(u64, u64, u64)> {
    let wire = read_pcap(path)?;
    Ok((wire.syns, wire.frames, wire.bytes))
}

#[derive(Clone, Copy)]
struct Tcp {
    syn: bool,
    ack: bool,
    from_device: bool,
    payload: usize,
    /// The status of an HTTP/1.1 reply starting in this segment.
    status: Option<u16>,
    /// A batch answer in this segment answers an item 503 (`[503,` or `503,`/`503]` in its
    /// body, which starts with `[`; a single reply's body is an object).
    batch_503: bool,
}

/// The TCP header flags and payload length of an Ethernet/IPv4 frame, if it is TCP. The
/// device is 10.0.2.15 (QEMU's user network gives it that lease).
fn tcp_of(frame: &[u8]) -> Option<Tcp> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if *ip.get(9)? != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    let from_device = ip.get(12..16)? == [10, 0, 2, 15];
    let tcp = ip.get(ihl..)?;
    let offset = usize::from(tcp.get(12)? >> 4) * 4;
    let flags = *tcp.get(13)?;
    let payload = total.saturating_sub(ihl + offset);
    let status = tcp
        .get(offset..offset + payload.min(12))
        .and_then(|p| p.strip_prefix(b"HTTP/1.1 "))
        .and_then(|code| std::str::from_utf8(code).ok()?.parse().ok());
    let data = tcp.get(offset..offset + payload).unwrap_or(&[]);
    let body = data.windows(4).position(|w| w == b"\r\n\r\n").and_then(|at| data.get(at + 4..));
    let batch_503 = status == Some(200)
        && body.is_some_and(|b| b.first() == Some(&b'[') && b.windows(3).any(|w| w == b"503"));
    Some(Tcp { syn: flags & 0x02 != 0, ack: flags & 0x10 != 0, from_device, payload, status, batch_503 })
}

/// `drain`, once with one connection per request (`keepalive=off`) and once with keep-alive:
/// SYNs and bytes per delivered reading and the time to drain, from the moment the cloud came
/// back; the outage's probes apart. Fails if keep-alive misses its targets.
pub fn drain(root: &Path) -> Result<String> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut rows = serde_json::Map::new();
    let mut text = vec![];
    let batch_arg = format!("batch={BATCH}");
    let runs: [(&str, &Scenario, &str); 5] = [
        ("per_request", &DRAIN, "keepalive=off"),
        ("keep_alive", &DRAIN, ""),
        ("keep_alive_gateway", &DRAIN_GATEWAY, ""),
        ("batch", &DRAIN, &batch_arg),
        ("batch_gateway", &DRAIN_GATEWAY, &batch_arg),
    ];
    for (label, scenario, append) in runs {
        step(&format!(
            "drain, {label}: {DRAIN_READINGS} readings queue while the cloud answers 503, then it is well"
        ));
        let pcap = dir.join(format!("drain-{label}.pcap"));
        // Without the device's pace: the drain measures the wire, and a paced device drains
        // its 200 readings at a herd's pace after the outage (docs/pacing.md).
        let append = format!("{append} pacing=off");
        let extra = Extra { append: &append, pcap: Some(&pcap), switch: Some((OUTAGE, "seed=1")) };
        let run = device::run_with(root, scenario, &extra)?;
        run.switched_at.context("the cloud was never switched back")?;
        let wire = read_pcap(&pcap)?;
        let n = f64::from(DRAIN_READINGS);
        let (syns, bytes) = (wire.syns as f64 / n, wire.bytes as f64 / n);
        text.push(format!(
            "drain {label}: {DRAIN_READINGS} readings; after the cloud came back {} SYNs ({syns:.3} per reading), \
             {} frames, {} B ({bytes:.0} B per reading), drained in {} ms; during the outage {} SYNs, {} frames, {} B",
            wire.syns, wire.frames, wire.bytes, wire.drain_ms, wire.outage_syns, wire.outage_frames, wire.outage_bytes
        ));
        let mut row = serde_json::json!({
            "outage_syns": wire.outage_syns,
            "outage_frames": wire.outage_frames,
            "outage_bytes": wire.outage_bytes,
            "syns": wire.syns,
            "frames": wire.frames,
            "bytes": wire.bytes,
            "drain_ms": wire.drain_ms,
        });
        row["readings"] = DRAIN_READINGS.into();
        row["route"] = if scenario.route == Route::Gateway { "gateway" } else { "direct" }.into();
        if append.starts_with("batch=") {
            row["batch"] = BATCH.into();
        }
        row["syns_per_reading"] = syns.into();
        row["bytes_per_reading"] = bytes.into();
        rows.insert(label.to_owned(), row);
        if label == "batch_gateway" && (syns > SYN_TARGET || bytes > BATCH_BYTES_TARGET) {
            bail!(
                "{}\ndrain: batches through the gateway missed their targets ({syns:.3} SYNs per reading, at most \
                 {SYN_TARGET}; {bytes:.0} B per reading, at most {BATCH_BYTES_TARGET})",
                text.join("\n")
            );
        }
        let per_request = rows.get("per_request").and_then(|r| r["bytes_per_reading"].as_f64());
        if label == "keep_alive"
            && (syns > SYN_TARGET || per_request.is_some_and(|before| bytes > before * BYTES_SHARE))
        {
            bail!(
                "{}\ndrain: keep-alive missed its targets ({syns:.3} SYNs per reading, at most {SYN_TARGET}; \
                 {bytes:.0} B per reading, at most {BYTES_SHARE} of one connection per request)",
                text.join("\n")
            );
        }
    }
    let results = dir.join("results.json");
    let mut all = match std::fs::read_to_string(&results) {
        Ok(t) => serde_json::from_str::<serde_json::Value>(&t).unwrap_or_else(|_| serde_json::json!({})),
        Err(_) => serde_json::json!({}),
    };
    if !all.is_object() {
        all = serde_json::json!({});
    }
    all["device_drain"] = serde_json::Value::Object(rows);
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))?;
    text.push(format!("drain figures added to {}", results.display()));
    Ok(text.join("\n"))
}
