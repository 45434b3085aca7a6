//! The durable outbox under QEMU: the `flashtest` firmware pushes readings into the outbox on
//! the PSRAM-emulated flash, resets the guest through `SYSRESETREQ` three times and checks after
//! each reset that the readings, their ids and the boot counter survived. QEMU runs without
//! `-no-reboot`, so a reset restarts the guest in the same process instead of ending it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::{TARGET, build, describe_exit, elf_path, start_qemu, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// Must match `boards/mps2-an386/app/src/bin/flashtest.rs`: the boots it runs (phases 0 to 3).
const BOOTS: u32 = 4;
/// A guest that resets forever (a phase word that does not survive) must not hold CI: a healthy
/// run takes well under a second.
const FLASH_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the firmware and runs `flashtest` under QEMU; fails unless it exits 0 in time after
/// booting [`BOOTS`] times in one QEMU process.
pub(crate) fn flashtest(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    let elf = elf_path(&firmware, "flashtest");
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    step(&format!(
        "running flashtest under QEMU mps2-an386: {BOOTS} boots across guest resets (timeout {} s)",
        FLASH_TIMEOUT.as_secs()
    ));
    let started = Instant::now();
    // No UART peer: this test only uses the emulated flash.
    let (mut qemu, mut printer) =
        start_qemu(elf_arg, &["-serial", "none"], Stdio::inherit(), Stdio::piped())?;
    let log = printer.stdout.take().context("defmt-print stdout")?;
    let reader = thread::spawn(move || {
        let mut lines = vec![];
        for line in BufReader::new(log).lines().map_while(Result::ok) {
            println!("    {line}");
            lines.push(line);
        }
        lines
    });
    let status = wait_with_timeout(&mut qemu, FLASH_TIMEOUT)?;
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let lines = reader.join().unwrap_or_default();
    match status {
        None => bail!("flashtest: QEMU still running after {} s; killed", FLASH_TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("flashtest failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => {
            bail!("flashtest: defmt-print could not decode the log ({printer_status})")
        }
        Some(_) => {}
    }
    let phases = phases_seen(&lines);
    let expected: Vec<u32> = (0..BOOTS).collect();
    if phases != expected {
        bail!("flashtest exited 0 but booted through phases {phases:?}, expected {expected:?}");
    }
    eprintln!("    flashtest passed in {:.1} s ({BOOTS} boots)", started.elapsed().as_secs_f64());
    Ok(())
}

/// The phases the firmware announced (`flashtest: phase N`), in order: one per boot.
fn phases_seen(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter_map(|line| line.split("flashtest: phase ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_phases_from_the_log() {
        let log: Vec<String> = [
            "0.000 INFO  flashtest: phase 0",
            "0.000 INFO  pass: a push returns the next id of this boot",
            "0.000 INFO  phase 0 done: resetting the guest",
            "0.000 INFO  flashtest: phase 1",
            "0.000 INFO  flashtest: phase x",
            "0.000 INFO  flashtest: phase 2 (after a reset)",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(phases_seen(&log), vec![0, 1, 2]);
        assert!(phases_seen(&[]).is_empty());
    }
}
