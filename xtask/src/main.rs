//! wary's one entry point for automation: `cargo xtask <verb>`.

mod bench;
mod breaker_hold;
mod ci;
mod coap;
mod coap_breaker;
mod cores;
mod crash_loop;
mod demo;
mod device;
mod flash;
mod fuzz;
mod harness;
mod keepalive;
mod mqtt;
mod mqtt_breaker;
mod mqtt_gateway;
mod mqtt_tls;
mod msrv;
mod mutants;
mod net;
mod panic_sites;
mod qemu;
mod shares;
mod tls;
mod util;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "wary automation", version)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Format check, clippy (host and thumb), all host tests, cross builds of the core.
    Ci,
    /// Decision cost (callgrind, wary vs backon), sizes, flash deltas, fleet simulation, the
    /// optimistic-concurrency model, the gateway under load against nginx; writes target/bench/.
    Bench {
        /// Run one part only: `gateway` (its load bench, about a minute) or `study` (the
        /// optimistic-concurrency model, seconds).
        #[arg(long)]
        only: Option<bench::Part>,
    },
    /// The main job: cloud, gateway, firmware under QEMU and a sensor fleet through a fault storm.
    Demo,
    /// Every cargo-fuzz target in fuzz/ (nightly) for a while each; fails on any crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Skip with a notice instead of failing when no nightly toolchain is installed.
        #[arg(long)]
        skip_without_nightly: bool,
    },
    /// cargo-mutants over the core's decision path with the tests that exercise it; fails on a survivor.
    Mutants {
        /// Only these source files (default: every file of the decision path).
        #[arg(long = "file")]
        files: Vec<String>,
        /// One slice of the mutants, `k/n` (cargo-mutants' `--shard`).
        #[arg(long)]
        shard: Option<String>,
        /// List the mutants instead of testing them.
        #[arg(long)]
        list: bool,
        /// Run only the core's own tests for each mutant (quick; the cross-crate suites are skipped).
        #[arg(long)]
        core_only: bool,
    },
    /// Build the firmware and run its on-target tests under QEMU (mps2-an386); build the nRF52840-DK app.
    Qemu {
        /// Run one device scenario only (any name `device` takes), nothing else.
        #[arg(long)]
        scenario: Option<String>,
    },
    /// The crash-loop device scenario alone under QEMU: eight boots that reset after their first
    /// exchange, the waits before each first attempt and the cloud's requests per boot.
    CrashLoop,
    /// Flash and RAM of the firmware binaries (QEMU and nRF52840-DK).
    Size,
    /// The device's network stack under QEMU: LAN9118, DHCP, one HTTP exchange per scripted fault.
    Net,
    /// TLS 1.3 from the device under QEMU against a pinned CA: checks, timings, flash and RAM.
    Tls,
    /// One device scenario of `cargo xtask qemu` by name (`storm`, `resets`, `endpoint-fault`,
    /// `gateway-tls`, `crash-loop`, `breaker-hold`, `idle-close`, `idle-close-tls`, `drain`, `coap`, `coap-storm`,
    /// `mqtt`, `mqtt-tls`, `mqtt-gateway`).
    Device {
        /// The scenario's name.
        name: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.verb {
        Verb::Ci => ci::run_all(&root),
        Verb::Bench { only } => bench::bench(&root, only),
        Verb::Demo => demo::demo(&root),
        Verb::Fuzz { seconds, skip_without_nightly } => {
            fuzz::fuzz(&root, seconds, !skip_without_nightly, None)
        }
        Verb::Mutants { files, shard, list, core_only } => {
            mutants::mutants(&root, &files, shard.as_deref(), list, core_only)
        }
        Verb::Qemu { scenario: None } => qemu::qemu(&root),
        Verb::Qemu { scenario: Some(name) } => qemu::scenario(&root, &name),
        Verb::CrashLoop => crash_loop::run(&root).map(|text| println!("{text}")),
        Verb::Size => qemu::size(&root),
        Verb::Net => net::nettest(&root),
        Verb::Tls => tls::tls_probe(&root),
        Verb::Device { name } => device::run_named(&root, &name),
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn project_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
