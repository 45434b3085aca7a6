//! `cargo xtask ci`: everything a change must pass.

use std::path::Path;

use anyhow::Result;

use crate::util::{ensure_targets, run, step};

/// Cortex-M4F/M7F, Cortex-M0/M0+ (no compare-and-swap), Cortex-M33 (Armv8-M).
const THUMB: [&str; 3] = ["thumbv7em-none-eabihf", "thumbv6m-none-eabi", "thumbv8m.main-none-eabihf"];

/// Runs the full check.
pub fn run_all(root: &Path) -> Result<()> {
    ensure_targets(&THUMB)?;

    step("format check");
    run(root, "cargo", &["fmt", "--all", "--", "--check"])?;

    step("clippy on the host, warnings denied");
    run(root, "cargo", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;

    step("clippy on the core for thumbv7em-none-eabihf");
    run(
        root,
        "cargo",
        &[
            "clippy",
            "-p",
            "wary",
            "--target",
            THUMB[0],
            "--no-default-features",
            "--features",
            "defmt",
            "--",
            "-D",
            "warnings",
        ],
    )?;

    for target in THUMB {
        step(&format!("core for {target}: no features, then each feature on its own, then all"));
        for features in ["", "defmt", "embassy-time", "defmt,embassy-time"] {
            let mut args = vec!["build", "-p", "wary", "--target", target, "--no-default-features"];
            if !features.is_empty() {
                args.extend(["--features", features]);
            }
            run(root, "cargo", &args)?;
        }
    }

    step("host tests");
    crate::util::ensure_nginx()?;
    run(root, "cargo", &["test", "--workspace"])?;

    crate::bench::no_panic(root)?;

    // A short pass over every fuzz target where a nightly toolchain exists; skipped, with a
    // notice, where it does not. A fixed seed, so a pass repeats its inputs rather than
    // landing or not by chance; `cargo xtask fuzz` explores with fresh seeds.
    crate::fuzz::fuzz(root, 20, false, Some(20_261_130))?;

    step("firmware: on-target tests under QEMU");
    crate::qemu::qemu(root)?;
    Ok(())
}
