//! `cargo xtask tls`: what TLS 1.3 costs the device, measured under QEMU.
//!
//! Makes a throwaway certificate chain for the run (`wary_fixtures::tls`), builds the
//! `tls-probe` firmware with the root compiled in as its pinned CA, and serves each of the
//! probe's cases from its own TLS 1.3 server on 127.0.0.1 (the guest reaches them as
//! 10.0.2.2). It runs the plain-HTTP twin `plain-probe` against a plain server first, then the
//! TLS probe, checks on the host side what each server saw, and prints the timings and peak
//! stack the firmware measured and the flash and RAM of both binaries.
//!
//! The private keys live in this process's memory only and die with it; only the root CA's
//! certificate touches the disk, for the firmware build to embed.

use std::collections::BTreeMap;
use std::env;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use wary_fixtures::tls::{self, Conn, TestChain};

use crate::harness::{
    TARGET, describe_exit, elf_path, llvm_size, run_firmware_cargo, size_of, start_qemu, wait_with_timeout,
};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// A wedged guest must never hold CI: a healthy run takes a few seconds.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const PACKAGE: &str = "wary-tls-probe";

/// Builds both probes, runs them under QEMU against their servers, checks what the servers
/// saw, and prints the measurements.
pub fn tls_probe(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let llvm_size = llvm_size()?;
    let firmware = root.join(crate::harness::QEMU_BOARD);

    step("making a throwaway CA chain for this run (P-256, ECDSA)");
    let chain = TestChain::new()?;
    let dir = probe_dir(&firmware);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_path = dir.join("pinned-ca.der");
    std::fs::write(&ca_path, chain.root.der()).with_context(|| format!("writing {}", ca_path.display()))?;
    build_probes(&firmware, &ca_path)?;

    let seed = run_seed();
    let (plain_log, tls_log) = round(&firmware, &chain, &seed, Clock::Real)?;
    let (plain_count, tls_count) = round(&firmware, &chain, &seed, Clock::Instructions)?;

    step("measurements in guest time under QEMU (not a real board's: QEMU does not model cycles)");
    print_measurements(&plain_log, &tls_log, "ms");
    step("the same counted in instructions (QEMU -icount shift=0: one guest ns per instruction)");
    print_measurements(&plain_count, &tls_count, "M instr");
    step("flash and RAM (flash = text + data, RAM = data + bss; the stack is not counted)");
    let plain_elf = elf_path(&firmware, "plain-probe");
    let tls_elf = elf_path(&firmware, "tls-probe");
    let plain_size = size_of(&llvm_size, &plain_elf)?;
    let tls_size = size_of(&llvm_size, &tls_elf)?;
    println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}", "binary", "flash", "RAM", "text", "data", "bss");
    for (name, (text, data, bss)) in [("plain-probe", plain_size), ("tls-probe", tls_size)] {
        println!("{name:<16} {:>9} {:>9} {text:>9} {data:>9} {bss:>9}", text + data, data + bss);
    }
    let flash = |(t, d, _): (u64, u64, u64)| (t + d) as i64;
    let ram = |(_, d, b): (u64, u64, u64)| (d + b) as i64;
    println!(
        "{:<16} {:>+9} {:>+9}",
        "TLS adds",
        flash(tls_size) - flash(plain_size),
        ram(tls_size) - ram(plain_size)
    );
    step("the TLS probe's flash by crate (symbols; LTO inlines across crates, so approximate)");
    crate::shares::by_crate_table(&llvm_size.with_file_name("llvm-nm"), &tls_elf, &plain_elf)
}

/// How QEMU keeps the guest's time in a round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Clock {
    /// The host's time, as every other QEMU run here.
    Real,
    /// One guest nanosecond per instruction executed (`-icount shift=0,align=off`): the
    /// firmware's microseconds read as thousands of instructions, whatever the host's load.
    Instructions,
}

/// Runs the plain probe and then the TLS probe, each against fresh servers, and checks what
/// the servers saw; returns both logs.
fn round(firmware: &Path, chain: &TestChain, seed: &str, clock: Clock) -> Result<(Vec<String>, Vec<String>)> {
    let icount: &[&str] = match clock {
        Clock::Real => &[],
        Clock::Instructions => &["-icount", "shift=0,align=off"],
    };
    let plain = tls::start(None, 0)?;
    let plain_log = run_probe(firmware, "plain-probe", &format!("seed={seed} port={}", plain.port), icount)?;
    tls::check_plain(&plain.stop())?;

    let mut servers = vec![];
    for (name, config, body) in chain.server_configs()? {
        servers.push((name, tls::start(Some(Arc::new(config)), body)?));
    }
    let mut append = format!("seed={seed}");
    for (name, server) in &servers {
        append.push_str(&format!(" {name}={}", server.port));
    }
    let tls_log = run_probe(firmware, "tls-probe", &append, icount)?;
    let seen: Vec<(&str, Vec<Conn>)> = servers.into_iter().map(|(name, s)| (name, s.stop())).collect();
    let summary = tls::check_tls(&seen)?;
    eprintln!("    servers: {summary}");
    Ok((plain_log, tls_log))
}

/// Where the run's CA certificate goes: beside the firmware's build output.
fn probe_dir(firmware: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(|dir| firmware.join(dir))
        .unwrap_or_else(|| firmware.join("target"))
        .join("tls-probe")
}

/// The host hands the guest its randomness: QEMU's machine has no entropy source. A test
/// seed from the clock, different every run; a real device seeds from its hardware RNG.
fn run_seed() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos());
    let pid = u128::from(std::process::id());
    // Spread over 32 bytes; unpredictability does not matter for a test run.
    let a = nanos ^ (pid << 64);
    let b = a.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    format!("{a:032x}{b:032x}")
}

/// Builds both probe binaries (release, `--locked`) with `ca` as the pinned CA.
fn build_probes(firmware: &Path, ca: &Path) -> Result<()> {
    step("building the TLS probe and its plain twin (release, thumbv7em-none-eabihf)");
    let ca = ca.to_str().context("CA path is not UTF-8")?;
    let started = Instant::now();
    run_firmware_cargo(
        firmware,
        crate::harness::QEMU_BOARD,
        &["build", "--release", "--locked", "-p", PACKAGE, "--bins"],
        &[("WARY_TLS_PROBE_CA", ca)],
    )?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs one probe under QEMU with a user-mode LAN9118 and `append` as its command line;
/// returns its decoded log, failing unless it exits 0.
fn run_probe(firmware: &Path, bin: &str, append: &str, qemu_args: &[&str]) -> Result<Vec<String>> {
    step(&format!(
        "running {bin} under QEMU mps2-an386, user-mode LAN9118 (timeout {} s)",
        RUN_TIMEOUT.as_secs()
    ));
    let elf = elf_path(firmware, bin);
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let mut extra = vec!["-nic", "user,model=lan9118", "-serial", "none", "-append", append];
    extra.extend_from_slice(qemu_args);
    let started = Instant::now();
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::inherit(), Stdio::piped())?;
    let out = printer.stdout.take().context("defmt-print stdout")?;
    let reader = thread::spawn(move || {
        let mut lines = vec![];
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("    {line}");
            lines.push(line);
        }
        lines
    });
    let status = wait_with_timeout(&mut qemu, RUN_TIMEOUT)?;
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let lines = reader.join().unwrap_or_default();
    match status {
        None => bail!("{bin}: QEMU still running after {} s; killed", RUN_TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("{bin} failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => bail!("{bin}: defmt-print could not decode the log"),
        Some(_) => {}
    }
    eprintln!("    {bin} passed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(lines)
}

/// The `MEASURE` lines of both logs, as a table of microseconds / 1000 in `unit`.
fn print_measurements(plain: &[String], tls: &[String], unit: &str) {
    println!(
        "{:<26} {:>16} {:>16} {:>16}",
        "case",
        format!("connect {unit}"),
        format!("handshake {unit}"),
        format!("request {unit}")
    );
    let mut memory = vec![];
    for (bin, line) in plain.iter().map(|l| ("plain-probe", l)).chain(tls.iter().map(|l| ("tls-probe", l))) {
        let Some(fields) = line.split_once("MEASURE ").map(|(_, rest)| measure_fields(rest)) else {
            continue;
        };
        if let Some(case) = fields.get("case") {
            let ms = |key: &str| {
                fields
                    .get(key)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map_or("?".into(), |us| format!("{:.1}", us / 1000.0))
            };
            println!(
                "{case:<26} {:>16} {:>16} {:>16}",
                ms("connect_us"),
                ms("handshake_us"),
                ms("request_us")
            );
        } else {
            let text: Vec<String> =
                fields.iter().filter(|(k, _)| **k != "memory").map(|(k, v)| format!("{k}={v}")).collect();
            memory.push(format!("{bin}: {}", text.join(" ")));
        }
    }
    for line in memory {
        println!("{line}");
    }
}

/// `key=value` words of a `MEASURE` line; a word without `=` maps to itself.
fn measure_fields(rest: &str) -> BTreeMap<&str, &str> {
    rest.split_whitespace().map(|word| word.split_once('=').unwrap_or((word, word))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_measure_lines() {
        let fields = measure_fields("case=good connect_us=1200 handshake_us=95000 request_us=3000");
        assert_eq!(fields.get("case"), Some(&"good"));
        assert_eq!(fields.get("handshake_us"), Some(&"95000"));
        assert_eq!(measure_fields("memory stack_peak=9000").get("stack_peak"), Some(&"9000"));
    }
}
