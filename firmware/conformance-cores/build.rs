//! Puts the memory map of the target's QEMU machine (`memory/<target>.x`) on the linker's search
//! path as `memory.x`, where cortex-m-rt's `link.x` finds it.

use std::{env, fs, path::PathBuf};

fn main() {
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=OUT_DIR is not set");
        std::process::exit(1);
    };
    let target = env::var("TARGET").unwrap_or_default();
    let map = format!("memory/{target}.x");
    if let Err(e) = fs::copy(&map, out.join("memory.x")) {
        println!(
            "cargo:warning=no memory map for target `{target}` ({map}: {e}); build with --target thumbv6m-none-eabi or thumbv8m.main-none-eabihf"
        );
        std::process::exit(1);
    }
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory");
    println!("cargo:rerun-if-changed=build.rs");
}
