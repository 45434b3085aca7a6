//! Puts `memory.x` on the linker's search path, where cortex-m-rt's `link.x` finds it.

use std::{env, fs, path::PathBuf};

fn main() {
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=OUT_DIR is not set");
        std::process::exit(1);
    };
    if let Err(e) = fs::copy("memory.x", out.join("memory.x")) {
        println!("cargo:warning=copying memory.x: {e}");
        std::process::exit(1);
    }
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
}
