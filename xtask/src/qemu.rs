//! `cargo xtask qemu` runs the firmware's on-target tests under QEMU (mps2-an386, Cortex-M4F),
//! the network and flash tests, then the device scenarios (`crate::device`): the `uplink`
//! firmware posting over its LAN9118 straight to the faulty test cloud, with and without resets,
//! and over TLS through the gateway (with a right and a wrong token); `cargo xtask size` prints what
//! the firmware binaries take of flash and RAM, and the wary core's share. Both also build the
//! nRF52840-DK application ([`board`]), which needs the board to run, so it is only compiled,
//! and both read every image's panic sites ([`crate::panic_sites`]).
//!
//! The firmware is its own cargo workspace with its own `.cargo/config.toml` (target, linker
//! scripts), so cargo runs with `boards/mps2-an386/` as its current directory; the board is another
//! (`boards/nrf52840-dk/`), built the same way from its own folder.

use std::env;
use std::io::Read;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::{
    TARGET, build, describe_exit, elf_path, llvm_size, run_firmware_cargo, size_of, start_qemu,
    wait_with_timeout,
};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// The on-target test binaries, run in this order; each exits 0 only if all its checks passed.
const TEST_BINS: &[&str] = &["selftest", "conformance", "uplinktest"];
/// Every firmware binary, for `size`; `uplink` is the application.
const ALL_BINS: &[&str] = &["uplink", "selftest", "conformance", "uplinktest", "nettest", "flashtest"];
/// The nRF52840-DK application: its cargo workspace (from the repository root) and binary.
const BOARD_DIR: &str = "boards/nrf52840-dk";
const BOARD_BIN: &str = "wary-nrf52840-dk";
/// A wedged guest must never hold CI: a healthy run takes about a second.
const QEMU_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the firmware and runs each on-target test binary under QEMU, failing on the first
/// non-zero exit, decode failure or timeout.
pub fn qemu(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    panic_sites(root, &firmware)?;
    for bin in TEST_BINS {
        run_under_qemu(&elf_path(&firmware, bin), bin)?;
    }
    crate::cores::conformance_on_cores(root)?;
    crate::net::nettest(root)?;
    crate::flash::flashtest(root)?;
    for scenario in SCENARIOS {
        run_scenario(root, scenario)?;
    }
    let crash_loop = crate::crash_loop::run(root)?;
    step("device scenario `crash-loop` passed");
    println!("{crash_loop}");
    crate::device::run_named(root, "breaker-hold")?;
    keep_alive_scenarios(root)?;
    for name in ["coap", "coap-storm"] {
        crate::device::run_named(root, name)?;
    }
    let mqtt = crate::mqtt::run(root)?;
    step("device scenario `mqtt` passed");
    println!("{mqtt}");
    crate::device::run_named(root, "mqtt-tls")?;
    crate::device::run_named(root, "mqtt-gateway")?;
    board(root)
}

/// The kept connections' scenarios: `idle-close` (plain and over TLS) and `drain` (see
/// xtask/src/keepalive.rs).
fn keep_alive_scenarios(root: &Path) -> Result<()> {
    for (name, text) in [
        ("idle-close", crate::keepalive::idle_close(root)?),
        ("idle-close-tls", crate::keepalive::idle_close_tls(root)?),
        ("drain", crate::keepalive::drain(root)?),
    ] {
        step(&format!("device scenario `{name}` passed"));
        println!("{text}");
    }
    Ok(())
}

/// The device scenarios with a [`crate::device::Scenario`] of their own, in the order `qemu`
/// runs them.
const SCENARIOS: [&crate::device::Scenario; 4] = [
    &crate::device::STORM,
    &crate::device::RESETS,
    &crate::device::ENDPOINT_FAULT,
    &crate::device::GATEWAY_TLS,
];

/// `cargo xtask qemu --scenario <name>`: one device scenario alone.
pub fn scenario(root: &Path, name: &str) -> Result<()> {
    crate::device::run_named(root, name)
}

fn run_scenario(root: &Path, scenario: &crate::device::Scenario) -> Result<()> {
    let summary = crate::device::run(root, scenario)?;
    step(&format!("device scenario `{}` passed", scenario.name));
    println!("{summary}");
    Ok(())
}

/// Builds the nRF52840-DK application (release, `--locked`) in its own workspace, plain and
/// with its `tls` feature (HTTPS against a CA pinned at build time: a throwaway one made here,
/// since only the size matters), and prints the flash and RAM of both and who owns the flash.
/// Flashing it needs the board: see firmware/README.md.
pub fn board(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    let llvm_size = llvm_size()?;
    let llvm_nm = llvm_size.with_file_name("llvm-nm");
    let dir = root.join(BOARD_DIR);
    step("building the nRF52840-DK application (release, thumbv7em-none-eabihf), plain HTTP");
    let started = Instant::now();
    let lock_hint = || {
        format!(
            "if {BOARD_DIR}/Cargo.lock is out of date, run `cargo build --release` there once and commit the lock"
        )
    };
    run_firmware_cargo(&dir, BOARD_DIR, &["build", "--release", "--locked"], &[]).with_context(lock_hint)?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    let plain = dir.join("target/wary-nrf52840-dk.plain.elf");
    copy_elf(&elf_path(&dir, BOARD_BIN), &plain)?;
    crate::panic_sites::check(root, &llvm_size, &plain)?;

    step("building it again with `--features tls` (TLS 1.3, a CA pinned at build time)");
    let ca_dir = env::temp_dir().join(format!("wary-board-ca-{}", std::process::id()));
    std::fs::create_dir_all(&ca_dir)?;
    let ca = ca_dir.join("ca.der");
    std::fs::write(&ca, wary_fixtures::tls::throwaway_ca_der()?)?;
    let ca_arg = ca.to_str().context("temp path is not UTF-8")?.to_owned();
    let started = Instant::now();
    let built = run_firmware_cargo(
        &dir,
        BOARD_DIR,
        &["build", "--release", "--locked", "--features", "tls"],
        &[("WARY_CA_DER", ca_arg.as_str())],
    );
    let _ = std::fs::remove_dir_all(&ca_dir);
    built.with_context(lock_hint)?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    let tls = dir.join("target/wary-nrf52840-dk.tls.elf");
    copy_elf(&elf_path(&dir, BOARD_BIN), &tls)?;

    step("nRF52840-DK application size (flash = text + data, RAM = data + bss; the stack is not counted)");
    let bins = [("nrf52840-dk", plain), ("nrf52840-dk+tls", tls)];
    size_table(&llvm_size, &bins)?;
    shares_table(&llvm_nm, &bins)
}

/// Keeps a copy of a build's ELF, since the next build with other features overwrites it.
fn copy_elf(elf: &Path, to: &Path) -> Result<()> {
    std::fs::copy(elf, to).with_context(|| format!("copying {} to {}", elf.display(), to.display()))?;
    Ok(())
}

/// Builds the firmware and prints flash and RAM use of each binary.
pub fn size(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    let llvm_size = llvm_size()?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    panic_sites(root, &firmware)?;
    step("firmware size (flash = text + data, RAM = data + bss; the stack is not counted)");
    let bins: Vec<_> = ALL_BINS.iter().map(|bin| (*bin, elf_path(&firmware, bin))).collect();
    size_table(&llvm_size, &bins)?;
    shares_table(&llvm_size.with_file_name("llvm-nm"), &bins[..1])?;
    transport_sizes(&firmware, &llvm_size)?;
    board(root)
}

/// Every firmware binary's panic sites in wary, wary-outbox and wary-dial: each must be an `async`
/// body's guard ([`crate::panic_sites`]).
fn panic_sites(root: &Path, firmware: &Path) -> Result<()> {
    step("panic sites: each one in wary, wary-outbox and wary-dial must be an async body's guard");
    let llvm = llvm_size()?;
    for bin in ALL_BINS {
        crate::panic_sites::check(root, &llvm, &elf_path(firmware, bin))?;
    }
    Ok(())
}

/// The QEMU uplink built once per transport (HTTP/1.1, HTTPS, CoAP, MQTT, MQTT over TLS): its
/// flash and RAM with each. The TLS builds pin a CA made for the purpose (the size does not
/// depend on which).
fn transport_sizes(firmware: &Path, llvm_size: &Path) -> Result<()> {
    step("the uplink per transport: each feature build's flash and RAM");
    let dir = std::env::temp_dir().join(format!("wary-size-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = dir.join("ca.der");
    std::fs::write(&ca, wary_fixtures::tls::TestChain::new()?.root.der())?;
    let ca_arg = ca.to_str().context("temp path is not UTF-8")?;
    let tls_env = [("WARY_CA_DER", ca_arg), ("WARY_SERVER_NAME", wary_fixtures::tls::SERVER_NAME)];
    let mut bins = vec![("uplink", elf_path(firmware, "uplink"))];
    for (name, features, env) in [
        ("uplink+tls", "wary-qemu/tls", &tls_env[..]),
        ("uplink+coap", "wary-qemu/coap", &[][..]),
        ("uplink+mqtt", "wary-qemu/mqtt", &[][..]),
        ("uplink+mqtt+tls", "wary-qemu/mqtt,wary-qemu/tls", &tls_env[..]),
    ] {
        let keep = dir.join(name);
        crate::harness::build_uplink_variant(firmware, features, &[], env, &keep)?;
        bins.push((name, keep));
    }
    // Each variant's build put its ELF where the plain uplink's was: build that one again.
    build(firmware)?;
    let result = size_table(llvm_size, &bins);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Prints flash and RAM of each ELF in `bins` (name, path) from `llvm-size`.
fn size_table(llvm_size: &Path, bins: &[(&str, PathBuf)]) -> Result<()> {
    println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}", "binary", "flash", "RAM", "text", "data", "bss");
    for (bin, elf) in bins {
        let (text, data, bss) = size_of(llvm_size, elf)?;
        println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}", bin, text + data, data + bss, text, data, bss);
    }
    Ok(())
}

/// Who owns each binary's flash, by crate group (`crate::shares`): lower bounds, since LTO
/// inlines code into its callers.
fn shares_table(llvm_nm: &Path, bins: &[(&str, PathBuf)]) -> Result<()> {
    step(
        "flash by crate (sized symbols; code inlined by LTO counts toward its caller, so each is a lower bound)",
    );
    for (bin, elf) in bins {
        let shares = crate::shares::shares(llvm_nm, elf)?;
        let all: u64 = shares.iter().map(|(_, n)| n).sum();
        let row: Vec<String> = shares
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n} ({:.1}%)", 100.0 * *n as f64 / all.max(1) as f64))
            .collect();
        println!("{bin}: {all} B in sized symbols: {}", row.join(", "));
    }
    Ok(())
}

/// Runs one ELF under QEMU with its stdout (defmt frames over semihosting) piped into
/// `defmt-print`, and fails unless QEMU itself exits 0 in time.
pub(crate) fn run_under_qemu(elf: &Path, name: &str) -> Result<()> {
    step(&format!("running {name} under QEMU mps2-an386 (timeout {} s)", QEMU_TIMEOUT.as_secs()));
    let port = free_udp_port()?;
    // UART0 talks to itself over a UDP socket, so the UART test needs no peer process.
    let serial = format!("udp:127.0.0.1:{port}@127.0.0.1:{port}");
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let started = Instant::now();
    let (mut qemu, mut printer) =
        start_qemu(elf_arg, &["-serial", &serial], Stdio::piped(), Stdio::inherit())?;
    let mut qemu_stderr = qemu.stderr.take().context("qemu stderr")?;
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = qemu_stderr.read_to_string(&mut text);
        text
    });

    let qemu_status = wait_with_timeout(&mut qemu, QEMU_TIMEOUT)?;
    // defmt-print ends when QEMU's stdout closes.
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if !qemu_stderr.trim().is_empty() {
        eprintln!("    qemu stderr:\n{}", qemu_stderr.trim_end());
    }
    let elapsed = started.elapsed().as_secs_f64();
    match qemu_status {
        None => bail!("{name}: QEMU still running after {} s; killed", QEMU_TIMEOUT.as_secs()),
        Some(status) if !status.success() => {
            bail!("{name} failed under QEMU: {}", describe_exit(status))
        }
        Some(_) if !printer_status.success() => {
            bail!("{name}: defmt-print could not decode the log ({printer_status})")
        }
        Some(_) => {
            eprintln!("    {name} passed in {elapsed:.1} s");
            Ok(())
        }
    }
}

/// A UDP port free right now; the small race with other processes is acceptable for a test.
fn free_udp_port() -> Result<u16> {
    let socket = UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
    Ok(socket.local_addr()?.port())
}
