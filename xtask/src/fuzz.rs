//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a fixed time each.
//!
//! libFuzzer needs a nightly toolchain. Without one, a CI run skips with a notice (the fuzz
//! workspace is extra assurance, not the gate) while an explicit run fails, so nobody mistakes a
//! skip for a pass.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{ensure_cargo_install, step};

/// Runs every fuzz target for `seconds`; fails on any crash. `required` turns a missing nightly
/// toolchain from a skip into an error.
pub fn fuzz(root: &Path, seconds: u64, required: bool, seed: Option<u32>) -> Result<()> {
    let dir = root.join("fuzz");
    // Checked first: without nightly there is no point installing cargo-fuzz.
    if !have_nightly() {
        let msg = "fuzzing needs a nightly toolchain: `rustup toolchain install nightly`";
        if required {
            bail!("{msg}");
        }
        eprintln!("skipped: {msg}");
        return Ok(());
    }
    ensure_cargo_install("cargo-fuzz", "cargo-fuzz", &[])?;

    let targets = list_targets(&dir)?;
    if targets.is_empty() {
        bail!("`cargo fuzz list` found no targets in {}", dir.display());
    }
    let time = format!("-max_total_time={seconds}");
    // A fixed seed makes a CI pass repeat the same inputs; an explicit run explores new ones.
    let seed_arg = seed.map(|s| format!("-seed={s}"));
    for t in &targets {
        step(&format!("fuzz {t} for {seconds} s"));
        // A target's dictionary, `fuzz/<target>.dict`, where it has one.
        let dict = dir.join(format!("{t}.dict"));
        let dict_arg = dict.is_file().then(|| format!("-dict={}", dict.display()));
        let mut args = vec!["run", t.as_str(), "--", time.as_str()];
        if let Some(s) = &seed_arg {
            args.push(s);
        }
        if let Some(d) = &dict_arg {
            args.push(d);
        }
        eprintln!("    $ cargo +nightly fuzz {}", args.join(" "));
        let status = fuzz_command(&dir).args(&args).status().context("starting `cargo fuzz run`")?;
        if !status.success() {
            bail!("fuzz target {t} failed ({status}): the crashing input is under fuzz/artifacts/{t}/");
        }
    }
    eprintln!("fuzzed {} targets for {seconds} s each, no crash", targets.len());
    Ok(())
}

/// `cargo +nightly fuzz` in `dir`, building into `fuzz/target`: sanitizer builds in a shared
/// target directory would only evict the workspace's own artifacts.
fn fuzz_command(dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.args(["+nightly", "fuzz"]).current_dir(dir).env_remove("CARGO_TARGET_DIR");
    c
}

fn have_nightly() -> bool {
    Command::new("rustc")
        .args(["+nightly", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The targets cargo-fuzz knows, so a new one is fuzzed without editing this file.
fn list_targets(dir: &Path) -> Result<Vec<String>> {
    let out = fuzz_command(dir).arg("list").output().context("starting `cargo fuzz list`")?;
    if !out.status.success() {
        bail!("`cargo fuzz list` failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}
