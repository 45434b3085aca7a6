//! `cargo xtask ci`: everything a change must pass.

use std::path::Path;

use anyhow::Result;

use crate::util::{ensure_targets, run, run_env, step};

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
            "runner,payload-key,serde,defmt,embassy-time",
            "--",
            "-D",
            "warnings",
        ],
    )?;

    for target in THUMB {
        step(&format!("core for {target}: no features, then each feature on its own, then all"));
        for features in [
            "",
            "runner",
            "payload-key",
            "serde",
            "defmt",
            "embassy-time",
            "runner,payload-key,serde,defmt,embassy-time",
        ] {
            let mut args = vec!["build", "-p", "wary", "--target", target, "--no-default-features"];
            if !features.is_empty() {
                args.extend(["--features", features]);
            }
            run(root, "cargo", &args)?;
        }
    }

    step("host tests");
    crate::util::ensure_nginx()?;
    crate::util::ensure_mosquitto()?;
    run(root, "cargo", &["test", "--workspace"])?;

    examples(root)?;
    crate::msrv::agree(root)?;
    crate::msrv::build(root)?;
    docs(root)?;
    package_lists(root)?;

    crate::bench::no_panic(root)?;
    // The fleet simulation's targets (docs/pacing.md): a change to the pace or the breaker that
    // misses one fails here, not only in a results file.
    crate::bench::fleet(root, true)?;

    // A short pass over every fuzz target where a nightly toolchain exists; skipped, with a
    // notice, where it does not. A fixed seed, so a pass repeats its inputs rather than
    // landing or not by chance; `cargo xtask fuzz` explores with fresh seeds.
    crate::fuzz::fuzz(root, 20, false, Some(20_261_130))?;

    step("firmware: on-target tests under QEMU");
    crate::qemu::qemu(root)?;
    Ok(())
}

/// Every runnable example, as `(package, example)`: each starts the test cloud in-process on
/// 127.0.0.1 (or needs no server) and exits 0 only if its calls ended as they should.
const EXAMPLES: [(&str, &str); 5] = [
    ("wary-reqwest", "middleware"),
    ("wary-reqwest", "one_liner"),
    ("wary-host", "tower"),
    ("wary-host", "runner"),
    ("wary-cli", "explain"),
];

/// The crates meant for the registry.
const PUBLISHABLE: [&str; 3] = ["wary", "wary-host", "wary-reqwest"];

/// Runs each example (about 15 s in all once built, most of it the middleware example's
/// Retry-After waits; building them reuses the test build).
fn examples(root: &Path) -> Result<()> {
    step("examples: each runs against the in-process test cloud (or needs no server) and exits 0");
    for (package, example) in EXAMPLES {
        run(root, "cargo", &["run", "-q", "-p", package, "--example", example])?;
    }
    Ok(())
}

/// API docs of the publishable crates with rustdoc warnings denied (broken intra-doc links,
/// bad code blocks), in one invocation so the dependencies are checked once: about a minute
/// from cold, most of it checking the dependencies.
fn docs(root: &Path) -> Result<()> {
    step("docs: rustdoc of each publishable crate, all features, warnings denied");
    let mut args = vec!["doc", "--all-features", "--no-deps"];
    for krate in PUBLISHABLE {
        args.extend(["-p", krate]);
    }
    run_env(root, "cargo", &args, &[("RUSTDOCFLAGS", "-D warnings")])
}

/// What `cargo package` would upload for each publishable crate: fails on a path dependency
/// without a version or a manifest the registry refuses (a few seconds, no build).
fn package_lists(root: &Path) -> Result<()> {
    step("package: the file list of each publishable crate (cargo package --no-verify --list)");
    for krate in PUBLISHABLE {
        run(root, "cargo", &["package", "-p", krate, "--no-verify", "--list", "--allow-dirty"])?;
    }
    Ok(())
}
