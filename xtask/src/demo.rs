//! `cargo xtask demo`, the main job: a device's firmware under QEMU sending through the modem
//! emulator to the test cloud, then the test cloud, two gateways and a simulated sensor fleet
//! through a scripted fault storm, all on 127.0.0.1. Prints a summary whose last two lines are
//! `duplicates: <n>` and `lost: <n>`, and writes `target/demo/timeline.svg`.

use std::path::Path;

use anyhow::{Result, bail};

use crate::util::{run, run_env, step};

/// Runs the demo from the workspace `root`.
pub fn demo(root: &Path) -> Result<()> {
    // Installs what it needs (thumb target, qemu-system-arm, defmt-print) and fails unless
    // every reading reached the cloud exactly once.
    step("device leg: the uplink firmware under QEMU (mps2-an386), its modem's far side on the test cloud");
    let device = crate::qemu::uplink_scenario(root, crate::qemu::UPLINK_FAULTS)?;
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
