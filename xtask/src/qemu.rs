//! `cargo xtask qemu` runs the firmware's on-target tests under QEMU (mps2-an386, Cortex-M4F),
//! the network and flash tests, then the device scenarios (`crate::device`): the `uplink`
//! firmware posting over its LAN9118 straight to the faulty test cloud, with and without resets; `cargo xtask size` prints what
//! the firmware binaries take of flash and RAM, and the wary core's share. Both also build the
//! nRF52840-DK application ([`board`]), which needs the board to run, so it is only compiled.
//!
//! The firmware is its own cargo workspace with its own `.cargo/config.toml` (target, linker
//! scripts), so cargo runs with `firmware/` as its current directory; the board is another
//! (`boards/nrf52840-dk/`), built the same way from its own folder.

use std::env;
use std::io::Read;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, output, step};

pub(crate) const TARGET: &str = "thumbv7em-none-eabihf";
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
    let firmware = root.join("firmware");
    build(&firmware)?;
    for bin in TEST_BINS {
        run_under_qemu(&elf_path(&firmware, bin), bin)?;
    }
    crate::cores::conformance_on_cores(root)?;
    crate::net::nettest(root)?;
    crate::flash::flashtest(root)?;
    for scenario in [&crate::device::STORM, &crate::device::RESETS] {
        let summary = crate::device::run(root, scenario)?;
        step(&format!("device scenario `{}` passed", scenario.name));
        println!("{summary}");
    }
    board(root)
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

    step("building it again with `--features tls` (TLS 1.3, a CA pinned at build time)");
    let ca_dir = env::temp_dir().join(format!("wary-board-ca-{}", std::process::id()));
    std::fs::create_dir_all(&ca_dir)?;
    let ca = ca_dir.join("ca.der");
    std::fs::write(&ca, crate::tls::throwaway_ca_der()?)?;
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
    let firmware = root.join("firmware");
    build(&firmware)?;
    step("firmware size (flash = text + data, RAM = data + bss; the stack is not counted)");
    let bins: Vec<_> = ALL_BINS.iter().map(|bin| (*bin, elf_path(&firmware, bin))).collect();
    size_table(&llvm_size, &bins)?;
    shares_table(&llvm_size.with_file_name("llvm-nm"), &bins[..1])?;
    board(root)
}

/// Prints flash and RAM of each ELF in `bins` (name, path) from `llvm-size`.
fn size_table(llvm_size: &Path, bins: &[(&str, PathBuf)]) -> Result<()> {
    println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}", "binary", "flash", "RAM", "text", "data", "bss");
    for (bin, elf) in bins {
        let out = Command::new(llvm_size)
            .arg(elf)
            .output()
            .with_context(|| format!("running {}", llvm_size.display()))?;
        if !out.status.success() {
            bail!("llvm-size {} failed: {}", elf.display(), String::from_utf8_lossy(&out.stderr));
        }
        let (text, data, bss) = parse_berkeley(&String::from_utf8_lossy(&out.stdout))
            .with_context(|| format!("reading llvm-size output for {bin}"))?;
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

pub(crate) fn build(firmware: &Path) -> Result<()> {
    step("building the firmware (release, thumbv7em-none-eabihf)");
    let started = Instant::now();
    run_firmware_cargo(firmware, "firmware", &["build", "--release", "--locked", "--bins"], &[]).context(
        "if firmware/Cargo.lock is out of date (a dependency of crates/wary changed), run \
         `cargo build --release` in firmware/ once and commit the lock",
    )?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs cargo in `dir` (`firmware/` or a board's folder, `label` in messages) without the
/// caller's RUSTFLAGS: they would replace the `rustflags` of its .cargo/config.toml, and with
/// them the linker scripts.
fn run_firmware_cargo(dir: &Path, label: &str, args: &[&str], vars: &[(&str, &str)]) -> Result<()> {
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"] {
        if env::var_os(var).is_some() {
            eprintln!("    note: {var} is set; not passing it to the firmware build");
        }
    }
    eprintln!("    $ (cd {label} && cargo {})", args.join(" "));
    let status = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .envs(vars.iter().copied())
        .status()
        .context("starting cargo")?;
    if !status.success() {
        bail!("`cargo {}` in {label}/ failed with {status}", args.join(" "));
    }
    Ok(())
}

pub(crate) fn elf_path(firmware: &Path, bin: &str) -> PathBuf {
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(|dir| firmware.join(dir))
        .unwrap_or_else(|| firmware.join("target"));
    target_dir.join(TARGET).join("release").join(bin)
}

/// Runs one ELF under QEMU with its stdout (defmt frames over semihosting) piped into
/// `defmt-print`, and fails unless QEMU itself exits 0 in time.
fn run_under_qemu(elf: &Path, name: &str) -> Result<()> {
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

/// Starts QEMU's mps2-an386 on `elf` with `serial` as UART0's backend, its stdout (defmt frames
/// over semihosting) piped into `defmt-print`.
pub(crate) fn start_qemu(
    elf: &str,
    serial: &[&str],
    qemu_stderr: Stdio,
    printer_stdout: Stdio,
) -> Result<(Child, Child)> {
    start_qemu_on(&["-cpu", "cortex-m4", "-machine", "mps2-an386"], elf, serial, qemu_stderr, printer_stdout)
}

/// [`start_qemu`] on another machine (`machine`: QEMU's `-cpu`/`-machine` arguments).
pub(crate) fn start_qemu_on(
    machine: &[&str],
    elf: &str,
    serial: &[&str],
    qemu_stderr: Stdio,
    printer_stdout: Stdio,
) -> Result<(Child, Child)> {
    // Without `-monitor none` the monitor's banner lands in the defmt stream.
    let mut args: Vec<&str> = machine.to_vec();
    args.extend(["-nographic", "-monitor", "none"]);
    args.extend_from_slice(serial);
    args.extend(["-semihosting-config", "enable=on,target=native", "-kernel", elf]);
    // A device credential on the command line (`token=`) is a secret: never echoed.
    let shown: Vec<String> = args
        .iter()
        .map(|arg| {
            arg.split(' ')
                .map(|word| if word.starts_with("token=") { "token=<redacted>" } else { word })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    eprintln!("    $ qemu-system-arm {} | defmt-print -e {elf}", shown.join(" "));
    let mut qemu = Command::new("qemu-system-arm")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(qemu_stderr)
        .spawn()
        .context("starting qemu-system-arm")?;
    let frames = qemu.stdout.take().context("qemu stdout")?;
    let printer = Command::new("defmt-print")
        .args(["-e", elf])
        .stdin(Stdio::from(frames))
        .stdout(printer_stdout)
        .spawn();
    match printer {
        Ok(printer) => Ok((qemu, printer)),
        Err(err) => {
            let _ = qemu.kill();
            let _ = qemu.wait();
            Err(err).context("starting defmt-print")
        }
    }
}

/// Waits for `child`, killing it after `limit`; `None` means it was killed.
pub(crate) fn wait_with_timeout(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().context("waiting for qemu-system-arm")? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The firmware's exit codes (mps2-an386 crate, `exit_code`) in words.
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    match status.code() {
        Some(1) => "exit 1: a check failed (see the log above)".into(),
        Some(101) => "exit 101: panic".into(),
        Some(102) => "exit 102: HardFault".into(),
        Some(103) => "exit 103: unexpected interrupt".into(),
        Some(code) => format!("exit {code}"),
        None => format!("{status}"),
    }
}

/// A UDP port free right now; the small race with other processes is acceptable for a test.
fn free_udp_port() -> Result<u16> {
    let socket = UdpSocket::bind("127.0.0.1:0").context("finding a free UDP port")?;
    Ok(socket.local_addr()?.port())
}

/// `llvm-size` from rustup's `llvm-tools` component, installed when missing.
pub(crate) fn llvm_size() -> Result<PathBuf> {
    let sysroot = output("rustc", &["--print", "sysroot"]).context("rustc --print sysroot")?;
    let version = output("rustc", &["-vV"]).context("rustc -vV")?;
    let host =
        version.lines().find_map(|line| line.strip_prefix("host: ")).context("no host line in rustc -vV")?;
    let path = Path::new(sysroot.trim()).join("lib/rustlib").join(host).join("bin/llvm-size");
    if !path.exists() {
        step("llvm-size is missing: installing rustup component llvm-tools");
        crate::util::run(Path::new("."), "rustup", &["component", "add", "llvm-tools"])?;
    }
    if !path.exists() {
        bail!("llvm-tools installed but {} is still missing", path.display());
    }
    Ok(path)
}

/// Parses the Berkeley-format line of `llvm-size <elf>`: text, data, bss.
pub(crate) fn parse_berkeley(out: &str) -> Option<(u64, u64, u64)> {
    let line = out.lines().nth(1)?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??, fields.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llvm_size_berkeley_output() {
        let out = "   text\t   data\t    bss\t    dec\t    hex\tfilename\n  12208\t      0\t   1096\t  13304\t   33f8\tconformance\n";
        assert_eq!(parse_berkeley(out), Some((12208, 0, 1096)));
        assert_eq!(parse_berkeley("text data bss\n"), None);
    }

    #[test]
    fn a_process_past_its_limit_is_killed() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        assert_eq!(wait_with_timeout(&mut child, Duration::from_millis(200)).unwrap(), None);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(child.try_wait().unwrap().is_some(), "the child was reaped");
    }

    #[test]
    fn a_process_within_its_limit_reports_its_status() {
        let mut child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let status = wait_with_timeout(&mut child, Duration::from_secs(10)).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(3));
    }
}
