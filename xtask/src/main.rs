//! wary's one entry point for automation: `cargo xtask <verb>`.

mod ci;
mod qemu;
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
    /// Build the firmware and run its on-target tests under QEMU (mps2-an386).
    Qemu,
    /// Flash and RAM of the firmware binaries.
    Size,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.verb {
        Verb::Ci => ci::run_all(&root),
        Verb::Qemu => qemu::qemu(&root),
        Verb::Size => qemu::size(&root),
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn project_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
