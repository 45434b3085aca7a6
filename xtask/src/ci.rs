//! `cargo xtask ci`: everything a change must pass.

use std::path::Path;

use anyhow::Result;

use crate::util::{ensure_targets, run, step};

const THUMB: [&str; 2] = ["thumbv7em-none-eabihf", "thumbv6m-none-eabi"];

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
        step(&format!("core for {target}, no default features and with defmt"));
        run(root, "cargo", &["build", "-p", "wary", "--target", target, "--no-default-features"])?;
        run(
            root,
            "cargo",
            &["build", "-p", "wary", "--target", target, "--no-default-features", "--features", "defmt"],
        )?;
    }

    step("host tests");
    run(root, "cargo", &["test", "--workspace"])?;

    crate::bench::no_panic(root)?;

    // A short pass over every fuzz target where a nightly toolchain exists; skipped, with a
    // notice, where it does not.
    crate::fuzz::fuzz(root, 20, false)?;

    step("firmware: on-target tests under QEMU");
    crate::qemu::qemu(root)?;
    Ok(())
}
