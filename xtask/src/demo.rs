//! `cargo xtask demo`, the main job: a device's firmware under QEMU posting over its Ethernet
//! controller straight to the test cloud, reset three times on the way, then the test cloud, two gateways and a simulated sensor fleet
//! through a scripted fault storm, all on 127.0.0.1. Prints a summary whose last two lines are
//! `duplicates: <n>` and `lost: <n>`, and writes `target/demo/timeline.svg`.

use std::path::Path;

use anyhow::{Result, bail};

use crate::util::{run, run_env, step};

/// Runs the demo from the workspace `root`.
pub fn demo(root: &Path) -> Result<()> {
    // Installs what it needs (thumb target, qemu-system-arm, defmt-print) and fails unless
    // every reading reached the cloud exactly once.
    step(
        "device leg: the uplink firmware under QEMU (mps2-an386), HTTP over its LAN9118 to the test cloud, reset three times",
    );
    let device = crate::device::run(root, &crate::device::RESETS)?;
    println!("{device}");
    // The first line holds the device's counts (`uplink: readings=20 landed=20 …`).
    let device_counts = device.lines().next().unwrap_or_default().to_owned();

    step("fleet leg: cloud + gateways + 60 sensors through calm, 503 storm, 429, drops, outage, recovery");
    run(root, "cargo", &["build", "--release", "--quiet", "-p", "wary-demo"])?;
    let out = root.join("target/demo/timeline.svg");
    let out_s = out.to_string_lossy().into_owned();
    let bin = root.join("target/release/wary-demo");
    run_env(root, &bin.to_string_lossy(), &[out_s.as_str()], &[("WARY_DEMO_DEVICE", &device_counts)])?;
    if !out.exists() {
        bail!("the demo did not write {out_s}");
    }
    Ok(())
}
