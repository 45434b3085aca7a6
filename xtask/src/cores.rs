//! The conformance check on three cores under QEMU, from `cargo xtask qemu`: the same
//! `wary-conformance` crate (firmware/conformance) on a Cortex-M0 (thumbv6m, `-M microbit`,
//! where the fleet budget runs on a critical section), the Cortex-M4 (thumbv7em, mps2-an386,
//! the firmware workspace's `conformance` binary) and a Cortex-M33 (thumbv8m.main,
//! `-M mps2-an505`). The M0 and M33 binaries are their own cargo workspaces under boards/, each
//! with its target, memory map and critical section, built from their own folder like the
//! nRF52840-DK.

use std::env;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::{describe_exit, run_firmware_cargo, start_qemu_on, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// One core the check runs on.
struct Core {
    /// The core, in the pass line.
    name: &'static str,
    target: &'static str,
    /// The cargo workspace that builds it, from the repository root.
    dir: &'static str,
    bin: &'static str,
    /// QEMU's machine and CPU arguments.
    machine: &'static [&'static str],
}

const CORES: [Core; 3] = [
    Core {
        name: "Cortex-M0",
        target: "thumbv6m-none-eabi",
        dir: "firmware/conformance-cores",
        bin: "wary-qemu-cores",
        machine: &["-machine", "microbit"],
    },
    Core {
        name: "Cortex-M4",
        target: crate::harness::TARGET,
        dir: crate::harness::QEMU_BOARD,
        bin: "conformance",
        machine: &["-machine", "mps2-an386", "-cpu", "cortex-m4"],
    },
    Core {
        name: "Cortex-M33",
        target: "thumbv8m.main-none-eabihf",
        dir: "firmware/conformance-cores",
        bin: "wary-qemu-cores",
        machine: &["-machine", "mps2-an505", "-cpu", "cortex-m33"],
    },
];

/// A wedged guest must never hold CI: a healthy run takes well under a second.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Builds each core's binary (release, `--locked`, from its own workspace; the M4's comes from
/// the firmware workspace, built already by `cargo xtask qemu`), runs it under QEMU with its
/// defmt log decoded, and prints one pass line per core. Fails on a non-zero exit, a missing or
/// failing tally, an undecodable log or a timeout.
pub(crate) fn conformance_on_cores(root: &Path) -> Result<()> {
    let targets: Vec<&str> = CORES.iter().map(|c| c.target).collect();
    ensure_targets(&targets)?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let mut lines = Vec::new();
    for core in &CORES {
        let dir = root.join(core.dir);
        let elf = elf_path(&dir, core.target, core.bin);
        if core.dir == crate::harness::QEMU_BOARD {
            if !elf.exists() {
                crate::harness::build(&dir)?;
            }
        } else {
            build(&dir, core)?;
        }
        let passed = run(core, &elf)?;
        let short = core.target.split('-').next().unwrap_or(core.target);
        let machine = core.machine.get(1).copied().unwrap_or("?");
        lines.push(format!("conformance on {} ({short}, {machine}): {passed} passed", core.name));
    }
    step("conformance on three cores");
    for line in &lines {
        println!("{line}");
    }
    Ok(())
}

/// `cargo build --release --locked --target <core's>` in a board's workspace, without the
/// caller's RUSTFLAGS (they would replace its .cargo/config.toml's, and with them the linker
/// scripts).
fn build(dir: &Path, core: &Core) -> Result<()> {
    step(&format!("building the conformance check for the {} ({}, release)", core.name, core.target));
    let started = Instant::now();
    let args = ["build", "--release", "--locked", "--target", core.target];
    run_firmware_cargo(dir, core.dir, &args, &[]).with_context(|| {
        format!(
            "if {}/Cargo.lock is out of date, run `cargo build --release` there once and commit the lock",
            core.dir
        )
    })?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn elf_path(dir: &Path, target: &str, bin: &str) -> PathBuf {
    let target_dir =
        env::var_os("CARGO_TARGET_DIR").map(|d| dir.join(d)).unwrap_or_else(|| dir.join("target"));
    target_dir.join(target).join("release").join(bin)
}

/// Runs one core's ELF under QEMU, its stdout (defmt frames over semihosting) piped into
/// `defmt-print`, and returns how many checks passed.
fn run(core: &Core, elf: &Path) -> Result<u32> {
    let name = format!("conformance on the {}", core.name);
    step(&format!("running {name} under QEMU (timeout {} s)", TIMEOUT.as_secs()));
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let started = Instant::now();
    // No serial port: nothing but the defmt frames reaches stdout.
    let (mut qemu, mut printer) =
        start_qemu_on(core.machine, elf_arg, &["-serial", "none"], Stdio::piped(), Stdio::piped())?;
    let mut qemu_stderr = qemu.stderr.take().context("qemu stderr")?;
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = qemu_stderr.read_to_string(&mut text);
        text
    });
    let mut log = printer.stdout.take().context("defmt-print stdout")?;
    let log_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = log.read_to_string(&mut text);
        text
    });

    let qemu_status = wait_with_timeout(&mut qemu, TIMEOUT)?;
    // defmt-print ends when QEMU's stdout closes.
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let log = log_reader.join().unwrap_or_default();
    print!("{log}");
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if !qemu_stderr.trim().is_empty() {
        eprintln!("    qemu stderr:\n{}", qemu_stderr.trim_end());
    }
    match qemu_status {
        None => bail!("{name}: QEMU still running after {} s; killed", TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("{name} failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => {
            bail!("{name}: defmt-print could not decode the log ({printer_status})")
        }
        Some(_) => {}
    }
    match tally(&log) {
        Some((passed, 0)) if passed > 0 => {
            eprintln!("    {name} passed in {:.1} s", started.elapsed().as_secs_f64());
            Ok(passed)
        }
        Some((passed, failed)) => bail!("{name}: exit 0 but its tally says {passed} passed, {failed} failed"),
        None => bail!("{name}: exit 0 but no `N passed, M failed` line in its log"),
    }
}

/// The last `N passed, M failed` line of a decoded log (the binaries' closing tally), with or
/// without defmt-print's timestamp and level in front.
fn tally(log: &str) -> Option<(u32, u32)> {
    log.lines().rev().find_map(|line| {
        let (before, after) = line.split_once(" passed, ")?;
        let passed = before.split_whitespace().last()?.parse().ok()?;
        let failed = after.strip_suffix(" failed")?.trim().parse().ok()?;
        Some((passed, failed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_closing_tally_with_or_without_a_timestamp() {
        let m4 = "0.004 INFO  pass: a 400 fails at once\n0.009 INFO  26 passed, 0 failed\n";
        assert_eq!(tally(m4), Some((26, 0)));
        let m0 =
            "INFO  pass: a 400 fails at once\nERROR FAIL: a 401 fails at once\nINFO  25 passed, 1 failed\n";
        assert_eq!(tally(m0), Some((25, 1)));
    }

    #[test]
    fn a_log_without_a_tally_has_none() {
        assert_eq!(tally("INFO  pass: a 400 fails at once\n"), None);
        assert_eq!(tally(""), None);
        // A check's name that happens to contain the words is not a tally.
        assert_eq!(tally("INFO  pass: it passed, then failed twice\n"), None);
    }
}
