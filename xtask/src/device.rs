//! The device scenarios of `cargo xtask qemu` and the demo: the `uplink` firmware under QEMU
//! (mps2-an386) sends its readings as HTTP/1.1 POSTs over the LAN9118 (`-nic
//! user,model=lan9118`) straight to the test cloud on the host's 127.0.0.1, which injects
//! HTTP- and TCP-level faults. Nothing sits between the device and the cloud.
//!
//! Every reading the firmware accepted into its outbox is logged with its id (`ACCEPTED
//! boot=… seq=…`); at the end the cloud's own report must show each of those keys applied
//! exactly once, no other key applied, and no key applied twice. A scenario may plan resets
//! (`SYSRESETREQ` from the firmware at a chosen point); each planned reset must happen, in the
//! boot it was planned for, and the run must still deliver everything.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::{TARGET, build, describe_exit, elf_path, start_qemu, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// The device id the firmware is given on its command line (`device=`), in every key. Its low
/// 32 bits are those of the id the firmware used before ids were 64 bits wide.
const DEVICE: u64 = 0x5741_5259_0a38_6001;
/// The credential the firmware is given (`token=`): a test value, no device's. The firmware
/// sends it as `Authorization: Bearer <token>` on every attempt (the test cloud ignores it); the
/// run fails if any line of the device's log shows any part of it.
const TOKEN: &str = "3c5e0f6a1d7b48c29e0a4f81b6d3572c0e9f1a2b3c4d5e6f708192a3b4c5d6e7";
/// A wedged guest must never hold CI; healthy runs take 5 to 40 s.
const TIMEOUT: Duration = Duration::from_secs(240);

/// One device run: the cloud's faults and what the firmware is told.
pub struct Scenario {
    /// A name for the output.
    pub name: &'static str,
    /// The cloud's fault script (`wary-cloud --faults`).
    pub faults: &'static str,
    /// Readings the sensor makes per boot.
    pub readings: u32,
    /// The planned resets, as the firmware's arguments, and the kinds in the order they must
    /// happen.
    pub plan: &'static str,
    /// `RESET <kind>` lines expected, in order, with the boot each must happen in.
    pub resets: &'static [(&'static str, u32)],
}

/// A storm at the HTTP and TCP level, no resets: 503s, 429s with Retry-After in seconds and as
/// an HTTP-date, writes applied and then the connection reset, replies held past the attempt's
/// time limit, replies cut short, garbage status lines, header blocks too large for the
/// device's buffer, and a window in which the listener is closed (connections refused).
pub const STORM: Scenario = Scenario {
    name: "storm",
    faults: "503=0.12,429=0.05:ra=1,429=0.04:ra=date+2,reset_after_effect=0.06,\
             stall=0.04:ms=6000,truncated_reply=0.06,garbage_status=0.04,huge_header=0.06,\
             refuse_at=8:ms=1500,seed=7",
    readings: 20,
    plan: "",
    resets: &[],
};

/// The same kind of storm, and three resets: in boot 1 power fails part-way through a flash
/// write; in boot 2 the device resets while the reply to an applied write is outstanding (the
/// cloud holds replies of a share of writes for 2.5 s after applying them); in boot 3 it resets
/// half-way through a retry wait. Boot 4 delivers what is left.
pub const RESETS: Scenario = Scenario {
    name: "resets",
    faults: "503=0.12,429=0.05:ra=1,reset_after_effect=0.05,stall=0.1:ms=2500,\
             truncated_reply=0.04,garbage_status=0.03,huge_header=0.03,seed=11",
    readings: 6,
    plan: "cut_write=1:5 reset_in_reply=2 reset_in_backoff=3",
    resets: &[("flash-write", 1), ("reply", 2), ("backoff", 3)],
};

/// Runs the scenario called `name` and prints its report.
pub fn run_named(root: &Path, name: &str) -> Result<()> {
    let keepalive = match name {
        "idle-close" => Some(crate::keepalive::idle_close(root)?),
        "drain" => Some(crate::keepalive::drain(root)?),
        _ => None,
    };
    if let Some(text) = keepalive {
        step(&format!("device scenario `{name}` passed"));
        println!("{text}");
        return Ok(());
    }
    let Some(scenario) = [&STORM, &RESETS].into_iter().find(|s| s.name == name) else {
        bail!("no device scenario `{name}` (storm, resets, idle-close, drain)");
    };
    let summary = run(root, scenario)?;
    step(&format!("device scenario `{}` passed", scenario.name));
    println!("{summary}");
    Ok(())
}

/// Runs `scenario` and returns its report; the first line is `uplink: key=value …` (readings,
/// landed, gave_up, mean, p95, resets), which the demo shows.
pub fn run(root: &Path, scenario: &Scenario) -> Result<String> {
    Ok(run_with(root, scenario, &Extra::default())?.report)
}

/// What a run adds to a [`Scenario`].
#[derive(Default)]
pub struct Extra<'a> {
    /// Appended to the firmware's command line.
    pub append: &'a str,
    /// Dumps the guest's wire here (QEMU's `filter-dump`, a classic pcap).
    pub pcap: Option<&'a Path>,
    /// After this long from the start of QEMU, puts this fault script in force.
    pub switch: Option<(Duration, &'a str)>,
}

/// A run's report, the device's log lines, and when the fault script was switched.
pub struct Run {
    pub report: String,
    pub lines: Vec<String>,
    pub switched_at: Option<std::time::SystemTime>,
}

/// [`run`] with [`Extra`].
pub fn run_with(root: &Path, scenario: &Scenario, more: &Extra<'_>) -> Result<Run> {
    let pcap = more.pcap;
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    step("building the test cloud (wary-cloud)");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "-p", "wary-cloud"])
        .current_dir(root)
        .status()
        .context("cargo")?;
    if !status.success() {
        bail!("`cargo build -p wary-cloud` failed with {status}");
    }
    let target_dir = env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |d| root.join(d));
    let cloud_bin = target_dir.join("debug").join("wary-cloud");

    step(&format!("device scenario `{}`: cloud faults `{}`", scenario.name, scenario.faults));
    let mut cloud = Cloud::start(&cloud_bin, scenario.faults)?;
    let seed = std::process::id();
    let append = format!(
        "device={DEVICE:016x} token={TOKEN} port={} seed={seed} readings={} {}",
        cloud.port, scenario.readings, scenario.plan
    );
    let elf = elf_path(&firmware, "uplink");
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let started = Instant::now();
    let append = format!("{} {}", append.trim(), more.append);
    let dump = match pcap {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            Some(format!(
                "filter-dump,id=f0,netdev=n0,file={}",
                path.to_str().context("pcap path is not UTF-8")?
            ))
        }
        None => None,
    };
    let mut extra = match &dump {
        Some(dump) => {
            vec!["-netdev", "user,id=n0", "-net", "nic,netdev=n0,model=lan9118", "-object", dump.as_str()]
        }
        None => vec!["-nic", "user,model=lan9118"],
    };
    extra.extend(["-serial", "none", "-append", append.trim()]);
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::inherit(), Stdio::piped())?;
    let switcher = more.switch.map(|(after, faults)| {
        let (port, faults) = (cloud.port, faults.to_owned());
        thread::spawn(move || {
            thread::sleep(after);
            let at = std::time::SystemTime::now();
            put_faults(port, &faults).map(|()| at)
        })
    });
    let log = printer.stdout.take().context("defmt-print stdout")?;
    let reader = thread::spawn(move || {
        let mut lines = vec![];
        for line in BufReader::new(log).lines().map_while(Result::ok) {
            // The per-exchange debug lines would drown the rest.
            if !line.contains(" http: ") {
                println!("    {line}");
            }
            lines.push(line);
        }
        lines
    });
    let status = wait_with_timeout(&mut qemu, TIMEOUT)?;
    let _ = printer.wait();
    let lines = reader.join().unwrap_or_default();
    let report = cloud.stop()?;
    let elapsed = started.elapsed().as_secs_f64();
    match status {
        None => bail!("{}: QEMU still running after {} s; killed", scenario.name, TIMEOUT.as_secs()),
        Some(status) if !status.success() => {
            bail!("{}: the uplink failed under QEMU: {}", scenario.name, describe_exit(status))
        }
        Some(_) => {}
    }
    if let Some(line) = lines.iter().find(|line| shows_token(line)) {
        bail!(
            "{}: a device log line shows part of its credential: {:?}",
            scenario.name,
            line.replace(TOKEN, "…")
        );
    }
    let switched_at = match switcher {
        Some(handle) => Some(handle.join().map_err(|_| anyhow::anyhow!("the fault switch panicked"))??),
        None => None,
    };
    let log = Log::read(&lines);
    let text = check(scenario, &log, &report)?;
    Ok(Run { report: format!("{text}\nwall time {elapsed:.1} s"), lines, switched_at })
}

/// Puts `faults` in force on the cloud at 127.0.0.1:`port` (`POST /admin/faults`).
fn put_faults(port: u16, faults: &str) -> Result<()> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).context("connecting to the cloud")?;
    let request = format!(
        "POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{faults}",
        faults.len()
    );
    conn.write_all(request.as_bytes())?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    if !reply.starts_with("HTTP/1.1 200") {
        bail!("the cloud refused the fault script `{faults}`: {}", reply.lines().next().unwrap_or_default());
    }
    Ok(())
}

/// The test cloud as a child process: its address from its first line, its report (one JSON
/// line) when its standard input closes.
struct Cloud {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    out: Option<thread::JoinHandle<String>>,
}

impl Cloud {
    fn start(bin: &Path, faults: &str) -> Result<Cloud> {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--faults", faults, "--exit-on-stdin-close"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().context("cloud stdout")?);
        let mut first = String::new();
        out.read_line(&mut first).context("reading the cloud's address")?;
        let port = first
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("the cloud printed no address: {first:?}"))?;
        let out = thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            rest
        });
        Ok(Cloud { child, stdin, port, out: Some(out) })
    }

    /// Closes its standard input and reads its final report.
    fn stop(&mut self) -> Result<serde_json::Value> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let status = wait_with_timeout(&mut self.child, Duration::from_secs(15))?;
        let text = self.out.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        if !status.is_some_and(|s| s.success()) {
            bail!("the test cloud did not stop cleanly: {status:?}");
        }
        serde_json::from_str(text.trim())
            .with_context(|| format!("the cloud printed no JSON report: {text:?}"))
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the firmware's log says, across its boots.
#[derive(Debug, Default)]
struct Log {
    /// Boot numbers in the order they started.
    boots: Vec<u32>,
    /// Every reading accepted into the outbox, as (boot, seq).
    accepted: BTreeSet<(u32, u32)>,
    /// `RESET` lines: kind, boot, the rest of the line.
    resets: Vec<(String, u32, String)>,
    /// The last boot's `SUMMARY` fields.
    summary: Option<String>,
    /// Attempts of each call that reached a verdict, and calls cut off by a reset.
    calls: Vec<u32>,
    interrupted: u32,
    gave_up: u32,
}

impl Log {
    fn read(lines: &[String]) -> Log {
        let mut log = Log::default();
        let mut open: BTreeMap<String, u32> = BTreeMap::new();
        for line in lines {
            if let Some(rest) = after(line, "BOOT ") {
                let boot = rest.split(':').next().and_then(|b| b.trim().parse().ok()).unwrap_or(0);
                log.boots.push(boot);
                log.interrupted += u32::try_from(open.len()).unwrap_or(u32::MAX);
                open.clear();
            } else if let Some(rest) = after(line, "ACCEPTED ") {
                let field = |name: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(name));
                let boot = field("boot=").and_then(|b| u32::from_str_radix(b, 16).ok());
                let seq = field("seq=").and_then(|s| s.parse().ok());
                if let (Some(b), Some(s)) = (boot, seq) {
                    log.accepted.insert((b, s));
                }
            } else if let Some(rest) = after(line, "RESET ") {
                let kind = rest.split(':').next().unwrap_or_default().to_owned();
                log.resets.push((kind, log.boots.last().copied().unwrap_or(0), rest.to_owned()));
            } else if let Some(rest) = after(line, "SUMMARY ") {
                log.summary = Some(rest.to_owned());
            } else if line.contains(wary::ledger::DEVICE_TAG) {
                // The core writes the device line and reads it back: one format, one version.
                let Ok(record) = wary::ledger::parse_device_line(line) else {
                    continue;
                };
                let key = record.key.to_hex().as_str().to_owned();
                let n = open.entry(key.clone()).or_insert(0);
                *n += 1;
                if let Some(verdict) = record.verdict {
                    log.calls.push(*n);
                    if matches!(verdict, wary::Verdict::GaveUp(_)) {
                        log.gave_up += 1;
                    }
                    open.remove(&key);
                }
            }
        }
        log
    }
}

/// True if `line` holds any 16 consecutive hex digits of [`TOKEN`].
fn shows_token(line: &str) -> bool {
    (0..=TOKEN.len() - 16).any(|at| line.contains(&TOKEN[at..at + 16]))
}

fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).and_then(|at| line.get(at + marker.len()..))
}

fn key_hex(boot: u32, seq: u32) -> String {
    wary::Key::from_parts(DEVICE, boot, seq).to_hex().as_str().to_owned()
}

/// Checks the run against the cloud's report; returns the summary text.
fn check(scenario: &Scenario, log: &Log, report: &serde_json::Value) -> Result<String> {
    let summary = log.summary.as_deref().context("the firmware printed no SUMMARY line")?;
    let keys = report["keys"].as_object().context("no keys in the cloud's report")?;
    let mut errors = vec![];

    // Each planned reset happened, in its boot, in order; and nothing else reset the device.
    let kinds: Vec<(&str, u32)> = log.resets.iter().map(|(k, b, _)| (k.as_str(), *b)).collect();
    if kinds != scenario.resets {
        errors.push(format!("resets {kinds:?}, planned {:?}", scenario.resets));
    }
    let expected_boots = scenario.resets.len() + 1;
    if log.boots.len() != expected_boots {
        errors.push(format!("{} boots, expected {expected_boots}: {:?}", log.boots.len(), log.boots));
    }
    if log.boots.windows(2).any(|w| w[1] <= w[0]) {
        errors.push(format!("the boot counter did not go up at every boot: {:?}", log.boots));
    }

    // Every accepted reading applied exactly once; nothing else applied.
    let mut lost = vec![];
    let mut twice = vec![];
    let mut table = vec![];
    for &(boot, seq) in &log.accepted {
        let key = key_hex(boot, seq);
        let effects = keys.get(&key).and_then(|k| k["effects"].as_u64()).unwrap_or(0);
        let replays = keys.get(&key).and_then(|k| k["replays"].as_u64()).unwrap_or(0);
        match effects {
            0 => lost.push(format!("({boot},{seq})")),
            1 => {}
            _ => twice.push(format!("({boot},{seq}) ×{effects}")),
        }
        table.push(format!("({boot},{seq}) {effects}/{replays}"));
    }
    let accepted_keys: BTreeSet<String> = log.accepted.iter().map(|&(b, s)| key_hex(b, s)).collect();
    let strangers: Vec<&String> = keys.keys().filter(|k| !accepted_keys.contains(*k)).collect();
    let duplicates = report["cloud"]["duplicates"]["keys"].as_u64().unwrap_or(u64::MAX);
    if !lost.is_empty() {
        errors.push(format!("lost (never applied): {}", lost.join(" ")));
    }
    if !twice.is_empty() || duplicates != 0 {
        errors.push(format!("applied more than once: {} (cloud duplicates {duplicates})", twice.join(" ")));
    }
    if !strangers.is_empty() {
        errors.push(format!("the cloud applied keys the device never accepted: {strangers:?}"));
    }
    if log.accepted.len() != scenario.readings as usize * expected_boots {
        // A boot cut short by a reset makes fewer readings; only the last must make them all.
        let last = log.boots.last().copied().unwrap_or(0);
        let in_last = log.accepted.iter().filter(|(b, _)| *b == last).count();
        if in_last != scenario.readings as usize {
            errors.push(format!("the last boot accepted {in_last} readings, expected {}", scenario.readings));
        }
    }
    // A reset with a reply outstanding: that write had landed, and its resend was answered from
    // the cloud's record.
    let mut reset_lines = vec![];
    for (i, (kind, boot, rest)) in log.resets.iter().enumerate() {
        let mut line = format!("reset {} in boot {boot}: {rest}", i + 1);
        if kind == "reply" {
            let key = rest.split_whitespace().find_map(|kv| kv.strip_prefix("key=")).unwrap_or_default();
            let entry = &keys.get(key).cloned().unwrap_or_default();
            let (effects, replays) =
                (entry["effects"].as_u64().unwrap_or(0), entry["replays"].as_u64().unwrap_or(0));
            if effects != 1 || replays == 0 {
                errors.push(format!(
                    "the write cut off by the reset ({key}): {effects} effects, {replays} replays"
                ));
            }
            line.push_str(&format!(" → at the cloud: {effects} effect, {replays} replays of its resends"));
        }
        reset_lines.push(line);
    }
    if !errors.is_empty() {
        bail!("device scenario `{}` failed:\n  {}", scenario.name, errors.join("\n  "));
    }

    let mut calls = log.calls.clone();
    calls.sort_unstable();
    let n = calls.len().max(1);
    let attempts: u32 = calls.iter().sum();
    let mean = f64::from(attempts) / n as f64;
    let p95 = calls.get((n * 95).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0);
    let max = calls.last().copied().unwrap_or(0);
    let cloud = &report["cloud"];
    let first = format!(
        "uplink: readings={} landed={} gave_up={} mean={mean:.3} p95={p95} max={max} calls={} resets={}",
        log.accepted.len(),
        log.accepted.len() - lost.len(),
        log.gave_up,
        calls.len(),
        log.resets.len()
    );
    let mut out = vec![
        first,
        format!("last boot: {summary}"),
        format!(
            "boots {:?}; calls cut off by a reset {}; attempts per call mean {mean:.3}, p95 {p95}, max {max} over {} calls",
            log.boots,
            log.interrupted,
            calls.len()
        ),
    ];
    out.extend(reset_lines);
    out.push(format!(
        "cloud: requests {}, replays {}, faults {}, by status {}",
        cloud["requests"], cloud["replays"], cloud["faults_injected"], cloud["requests_by_status"]
    ));
    out.push(format!("per-key effects/replays (boot,seq): {}", table.join("  ")));
    out.push(format!(
        "{} keys of device {DEVICE:016x}, each applied exactly once: duplicates 0, lost 0",
        log.accepted.len()
    ));
    Ok(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    const RUN: &str = "\
0.009 INFO  BOOT 1: 0 pending, boot range reset Some(Corrupted)
0.016 INFO  ACCEPTED boot=00000001 seq=0
0.020 INFO  wary-ledger v3 574152590a3860010000000100000000 1 keyed_write reset 0 -1 retry unit 1 68 3 3 - - -1 1 0
0.040 INFO  RESET reply: no reply after 800 ms, key=574152590a3860010000000100000000
0.007 INFO  BOOT 2: 1 pending
0.013 INFO  ACCEPTED boot=00000002 seq=0
0.020 INFO  wary-ledger v3 574152590a3860010000000100000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1 0
0.030 INFO  wary-ledger v3 574152590a3860010000000200000000 1 keyed_write status 503 -1 retry unit 1 68 3 3 - - -1 1 0
0.040 INFO  wary-ledger v3 574152590a3860010000000200000000 2 keyed_write status 503 -1 retry unit 1 68 3 3 gave_up budget -1 1 0
0.041 INFO  wary-ledger v1 0a386001000000030000000000000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1
0.042 INFO  wary-ledger v2 0a386001000000030000000000000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1 0
0.050 INFO  SUMMARY device=574152590a386001 boot=2 landed=1";

    #[test]
    fn a_line_with_any_part_of_the_token_is_caught() {
        assert!(shows_token(&format!("0.1 INFO  http: Authorization: Bearer {TOKEN}")));
        assert!(shows_token(&format!("x{}y", &TOKEN[30..46])));
        assert!(!shows_token(&format!("x{}y", &TOKEN[30..45])));
        assert!(!RUN.lines().any(shows_token));
    }

    #[test]
    fn reads_boots_acceptances_resets_and_calls_across_boots() {
        let log = Log::read(&lines(RUN));
        assert_eq!(log.boots, vec![1, 2]);
        assert_eq!(log.accepted, BTreeSet::from([(1, 0), (2, 0)]));
        assert_eq!(log.resets.len(), 1);
        assert_eq!((log.resets[0].0.as_str(), log.resets[0].1), ("reply", 1));
        // The first key's first call was cut off by the reset, its second took one attempt, the
        // second key took two; lines of the older formats are not read as calls.
        assert_eq!(log.interrupted, 1);
        assert_eq!(log.calls, vec![1, 2]);
        assert_eq!(log.gave_up, 1);
        assert_eq!(log.summary.as_deref(), Some("device=574152590a386001 boot=2 landed=1"));
    }

    fn report(effects: &[((u32, u32), u64, u64)], duplicates: u64) -> serde_json::Value {
        let mut keys = serde_json::Map::new();
        for &((b, s), e, r) in effects {
            keys.insert(key_hex(b, s), serde_json::json!({"effects": e, "replays": r}));
        }
        serde_json::json!({"keys": keys, "cloud": {"duplicates": {"keys": duplicates}}})
    }

    const ONE_RESET: Scenario =
        Scenario { name: "t", faults: "", readings: 1, plan: "", resets: &[("reply", 1)] };

    fn log_with_reply_key(key: &str) -> Log {
        Log {
            boots: vec![1, 2],
            accepted: BTreeSet::from([(1, 0), (2, 0)]),
            resets: vec![("reply".into(), 1, format!("reply: no reply, key={key}"))],
            summary: Some("x".into()),
            calls: vec![1, 1],
            ..Log::default()
        }
    }

    #[test]
    fn exactly_once_passes_and_every_other_count_fails() {
        let log = log_with_reply_key(&key_hex(1, 0));
        let good = report(&[((1, 0), 1, 1), ((2, 0), 1, 0)], 0);
        let text = check(&ONE_RESET, &log, &good).unwrap();
        assert!(text.contains("duplicates 0, lost 0"), "{text}");
        assert!(text.starts_with("uplink: readings=2 landed=2"), "{text}");

        let lost = report(&[((1, 0), 1, 1)], 0);
        assert!(check(&ONE_RESET, &log, &lost).unwrap_err().to_string().contains("lost"));
        let twice = report(&[((1, 0), 2, 1), ((2, 0), 1, 0)], 1);
        assert!(check(&ONE_RESET, &log, &twice).unwrap_err().to_string().contains("more than once"));
        let stranger = report(&[((1, 0), 1, 1), ((2, 0), 1, 0), ((2, 7), 1, 0)], 0);
        assert!(check(&ONE_RESET, &log, &stranger).unwrap_err().to_string().contains("never accepted"));
        // The write cut off by the reset must have landed and had its resend replayed.
        let not_replayed = report(&[((1, 0), 1, 0), ((2, 0), 1, 0)], 0);
        assert!(check(&ONE_RESET, &log, &not_replayed).unwrap_err().to_string().contains("cut off"));
    }

    #[test]
    fn a_planned_reset_that_did_not_happen_fails() {
        let mut log = log_with_reply_key(&key_hex(1, 0));
        log.resets.clear();
        log.boots = vec![1];
        log.accepted = BTreeSet::from([(1, 0)]);
        let r = report(&[((1, 0), 1, 0)], 0);
        let err = check(&ONE_RESET, &log, &r).unwrap_err().to_string();
        assert!(err.contains("planned"), "{err}");
    }
}
