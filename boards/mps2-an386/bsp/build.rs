//! Puts `memory.x` and an empty `device.x` on the linker's search path, so any binary that
//! depends on this crate links for mps2-an386 without its own copies.

use std::{env, fs, path::PathBuf};

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::copy("memory.x", out.join("memory.x")).expect("copy memory.x");
    // cortex-m-rt's `device` feature INCLUDEs device.x; the vector table is defined in Rust
    // (`__INTERRUPTS` in lib.rs), so nothing needs PROVIDE-ing here.
    fs::write(out.join("device.x"), "").expect("write device.x");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
}
