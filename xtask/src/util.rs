//! Small helpers shared by the verbs: running commands loudly, installing what is missing.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Prints a step header so a log reader sees what is happening and why.
pub fn step(what: &str) {
    eprintln!("\n==> {what}");
}

/// Runs `cmd` in `dir`, inheriting stdio; fails with the command line if it exits non-zero.
pub fn run(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    run_env(dir, program, args, &[])
}

/// Like [`run`], with extra environment variables.
pub fn run_env(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    eprintln!("    $ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

/// Captures stdout of a command, or `None` if it cannot be run or fails.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Adds the rustup targets in `targets` that are not installed yet, saying so.
pub fn ensure_targets(targets: &[&str]) -> Result<()> {
    let installed = output("rustup", &["target", "list", "--installed"]).unwrap_or_default();
    for t in targets {
        if !installed.lines().any(|l| l.trim() == *t) {
            step(&format!("installing missing rustup target {t}"));
            run(Path::new("."), "rustup", &["target", "add", t])?;
        }
    }
    Ok(())
}

/// True if `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program} >/dev/null 2>&1")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Installs a Debian package when `program` is missing (we run as root on CI machines).
pub fn ensure_apt(program: &str, package: &str) -> Result<()> {
    if have(program) {
        return Ok(());
    }
    step(&format!("{program} is missing: installing Debian package {package}"));
    run(Path::new("."), "apt-get", &["update", "-qq"])?;
    run_env(
        Path::new("."),
        "apt-get",
        &["install", "-y", "-qq", package],
        &[("DEBIAN_FRONTEND", "noninteractive")],
    )
}

/// Where Debian's nginx package puts the binary (`/usr/sbin` is not on every user's PATH).
pub const NGINX: &str = "/usr/sbin/nginx";

/// Installs Debian's `nginx` when it is missing: the gateway's scale-out test runs three
/// replicas behind it, and `cargo xtask bench` measures the gateway against it. Only the
/// binary is used (the tests and the bench start it with their own config on loopback); the
/// package's own service is stopped if its install started one.
pub fn ensure_nginx() -> Result<()> {
    if Path::new(NGINX).exists() || have("nginx") {
        return Ok(());
    }
    step("nginx is missing (the gateway's replica test and bench use it): installing Debian package nginx");
    run(Path::new("."), "apt-get", &["update", "-qq"])?;
    run_env(
        Path::new("."),
        "apt-get",
        &["install", "-y", "-qq", "--no-install-recommends", "nginx"],
        &[("DEBIAN_FRONTEND", "noninteractive")],
    )?;
    // A package install may start the default site on port 80; nothing here needs it.
    let _ = Command::new(NGINX).args(["-s", "stop"]).status();
    Ok(())
}

/// Installs Debian's `mosquitto` (the broker, `mosquitto_passwd`) and `mosquitto-clients`
/// (`mosquitto_sub`, `mosquitto_pub`) when missing: the MQTT scenarios and the gateway's MQTT
/// ingress tests start their own broker on loopback (`wary_fixtures::mosquitto`). The package's
/// own service, if its install started one, is stopped: nothing here uses port 1883.
pub fn ensure_mosquitto() -> Result<()> {
    let broker = Path::new(wary_fixtures::mosquitto::MOSQUITTO).exists();
    if broker && have("mosquitto_sub") && have("mosquitto_pub") {
        return Ok(());
    }
    step(
        "mosquitto is missing (the MQTT scenarios and tests use it): installing Debian packages mosquitto, mosquitto-clients",
    );
    run(Path::new("."), "apt-get", &["update", "-qq"])?;
    run_env(
        Path::new("."),
        "apt-get",
        &["install", "-y", "-qq", "--no-install-recommends", "mosquitto", "mosquitto-clients"],
        &[("DEBIAN_FRONTEND", "noninteractive")],
    )?;
    let _ = Command::new("pkill").args(["-x", "mosquitto"]).status();
    Ok(())
}

/// Installs a cargo tool when `program` is missing.
pub fn ensure_cargo_install(program: &str, krate: &str, extra: &[&str]) -> Result<()> {
    if have(program) {
        return Ok(());
    }
    step(&format!("{program} is missing: cargo install {krate} (takes a few minutes once)"));
    let mut args = vec!["install", krate, "--locked"];
    args.extend_from_slice(extra);
    run(Path::new("."), "cargo", &args)
}
