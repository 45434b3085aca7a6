//! `cargo xtask net`: the device's network stack under QEMU. The `nettest` firmware brings up
//! the LAN9118, takes a DHCP lease from QEMU's user-mode network and makes one HTTP exchange
//! per scripted fault against the network-fault server (`wary_fixtures::faults`), which the
//! guest reaches as 10.0.2.2. The firmware checks how each exchange was classified; the server
//! checks that every request it got was well-formed HTTP/1.1 and that each scripted fault was
//! served exactly once.
//!
//! The guest learns the server's port, a closed port and a seed from semihosting's command
//! line: QEMU passes `-append` there when no `-semihosting-config arg=` is given.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use wary_fixtures::faults;
use wary_fixtures::server::closed_port;

use crate::harness::{TARGET, build, describe_exit, elf_path, start_qemu, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// A wedged guest must never hold CI: a healthy run takes a few seconds.
const NET_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the firmware, starts the fixture and runs `nettest` under QEMU with a user-mode
/// LAN9118; fails unless the firmware exits 0 and the fixture saw each scripted request once,
/// well-formed.
pub fn nettest(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;

    let fixture = faults::start()?;
    let closed = closed_port().context("finding a free TCP port")?;
    // TCP sequence numbers and local ports differ per run, as after a real reboot.
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let append = format!("port={} closed={closed} seed={seed}", fixture.port);
    step(&format!(
        "running nettest under QEMU mps2-an386, user-mode LAN9118 (timeout {} s)",
        NET_TIMEOUT.as_secs()
    ));
    let elf = elf_path(&firmware, "nettest");
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let started = Instant::now();
    let extra = ["-nic", "user,model=lan9118", "-serial", "none", "-append", append.as_str()];
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::piped(), Stdio::inherit())?;
    let mut qemu_stderr = qemu.stderr.take().context("qemu stderr")?;
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = qemu_stderr.read_to_string(&mut text);
        text
    });
    let qemu_status = wait_with_timeout(&mut qemu, NET_TIMEOUT)?;
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let elapsed = started.elapsed().as_secs_f64();
    let served = fixture.stop();
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if !qemu_stderr.trim().is_empty() {
        eprintln!("    qemu stderr:\n{}", qemu_stderr.trim_end());
    }
    match qemu_status {
        None => bail!("nettest: QEMU still running after {} s; killed", NET_TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("nettest failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => bail!("nettest: defmt-print could not decode the log"),
        Some(_) => {}
    }
    let summary = faults::check_served(&served)?;
    eprintln!("    fixture: {summary}");
    eprintln!("    nettest passed in {elapsed:.1} s");
    Ok(())
}
