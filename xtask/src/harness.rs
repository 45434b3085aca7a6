//! The QEMU toolkit the device verbs share: building the firmware workspaces (each with its own
//! `.cargo/config.toml`, so cargo runs from their folder), where their ELFs land, starting QEMU
//! with its defmt stream piped into `defmt-print`, waiting with a limit, naming the firmware's
//! exit codes, and reading sizes with rustup's `llvm-size`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util::{output, step};

/// The QEMU board's cargo workspace (its binaries, with the firmware libraries in firmware/).
pub(crate) const QEMU_BOARD: &str = "boards/mps2-an386";
/// The firmware's target: Cortex-M4F (mps2-an386, nRF52840).
pub(crate) const TARGET: &str = "thumbv7em-none-eabihf";

pub(crate) fn build(firmware: &Path) -> Result<()> {
    step("building the firmware (release, thumbv7em-none-eabihf)");
    let started = Instant::now();
    run_firmware_cargo(firmware, QEMU_BOARD, &["build", "--release", "--locked", "--bins"], &[]).context(
        "if boards/mps2-an386/Cargo.lock is out of date (a dependency of crates/wary changed), run \
         `cargo build --release` in boards/mps2-an386/ once and commit the lock",
    )?;
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Builds the QEMU board's `uplink` (and the other binaries in `bins`) with the board crate's
/// `features` and the environment `vars`, the whole workspace's features resolved as one (so
/// nothing else rebuilds), and keeps the uplink's ELF as `keep` (the plain build of the next
/// [`build`] puts its own back in place).
pub(crate) fn build_uplink_variant(
    firmware: &Path,
    features: &str,
    bins: &[&str],
    vars: &[(&str, &str)],
    keep: &Path,
) -> Result<()> {
    let mut args = vec!["build", "--release", "--locked", "--workspace", "--bin", "uplink"];
    for bin in bins {
        args.extend(["--bin", bin]);
    }
    args.extend(["--features", features]);
    run_firmware_cargo(firmware, QEMU_BOARD, &args, vars)?;
    if let Some(dir) = keep.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::copy(elf_path(firmware, "uplink"), keep)
        .with_context(|| format!("keeping the uplink's ELF built with {features}"))?;
    Ok(())
}

/// Runs cargo in `dir` (a board's folder, `label` in messages) without the
/// caller's RUSTFLAGS: they would replace the `rustflags` of its .cargo/config.toml, and with
/// them the linker scripts. Arguments that start with a toolchain (`+1.91.0`) go to rustup's
/// `cargo`, the others to the cargo running xtask.
pub(crate) fn run_firmware_cargo(
    dir: &Path,
    label: &str,
    args: &[&str],
    vars: &[(&str, &str)],
) -> Result<()> {
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"] {
        if env::var_os(var).is_some() {
            eprintln!("    note: {var} is set; not passing it to the firmware build");
        }
    }
    let shown: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("    $ (cd {label} && {}cargo {})", shown.concat(), args.join(" "));
    let cargo = match args.first() {
        Some(first) if first.starts_with('+') => "cargo".into(),
        _ => env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
    };
    let status = Command::new(cargo)
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

/// Fails unless the uplink under QEMU ran to a clean exit: `status` `None` (killed at
/// `timeout`) or a failing exit is an error named by `label`.
pub(crate) fn uplink_exited(
    label: &str,
    status: Option<ExitStatus>,
    timeout: std::time::Duration,
) -> Result<()> {
    match status {
        None => bail!("{label}: QEMU still running after {} s; killed", timeout.as_secs()),
        Some(s) if !s.success() => bail!("{label}: the uplink failed under QEMU: {}", describe_exit(s)),
        Some(_) => Ok(()),
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

/// Flash sections of `elf` from `llvm-size`: text, data, bss.
pub(crate) fn size_of(llvm_size: &Path, elf: &Path) -> Result<(u64, u64, u64)> {
    let out = Command::new(llvm_size)
        .arg(elf)
        .output()
        .with_context(|| format!("running {}", llvm_size.display()))?;
    if !out.status.success() {
        bail!("llvm-size {} failed: {}", elf.display(), String::from_utf8_lossy(&out.stderr));
    }
    parse_berkeley(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("reading llvm-size output for {}", elf.display()))
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
