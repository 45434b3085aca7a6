//! Compiles the pinned CA certificate into the TLS probe.
//!
//! `cargo xtask tls` makes a throwaway CA for each run and names its DER file in
//! `WARY_TLS_PROBE_CA`; without it (a plain `cargo build`) the probe gets an empty CA and
//! refuses to run, so no build ever carries a CA nobody chose.

use std::{env, fs, path::PathBuf};

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("pinned-ca.der");
    println!("cargo:rerun-if-env-changed=WARY_TLS_PROBE_CA");
    println!("cargo:rerun-if-changed=build.rs");
    match env::var_os("WARY_TLS_PROBE_CA") {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo:rerun-if-changed={}", path.display());
            fs::copy(&path, &out)
                .unwrap_or_else(|err| panic!("reading the pinned CA {}: {err}", path.display()));
        }
        None => fs::write(&out, []).expect("write an empty pinned CA"),
    }
}
