//! Feature `tls`: compiles the pinned CA certificate into the uplink.
//!
//! `cargo xtask qemu` makes a throwaway CA chain for each TLS run and names the root's DER file
//! in `WARY_CA_DER`, and the name the gateway's certificate carries in `WARY_SERVER_NAME`.
//! There is no default: a CA that someone else picked is not one to trust.

// A host program run by cargo: a failure stops the build with its message.
#![allow(clippy::expect_used, clippy::panic)]

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=WARY_CA_DER");
    println!("cargo:rerun-if-env-changed=WARY_SERVER_NAME");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_TLS").is_none() {
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("pinned-ca.der");
    let path = env::var_os("WARY_CA_DER")
        .expect("feature `tls`: set WARY_CA_DER to the path of the cloud's CA certificate (DER)");
    let der = fs::read(&path).unwrap_or_else(|e| panic!("WARY_CA_DER: cannot read {path:?}: {e}"));
    assert!(der.first() == Some(&0x30), "WARY_CA_DER: {path:?} is not a DER certificate");
    println!("cargo:rerun-if-changed={}", PathBuf::from(&path).display());
    fs::write(out, der).expect("write pinned-ca.der");
    assert!(
        env::var("WARY_SERVER_NAME").is_ok_and(|n| !n.is_empty()),
        "feature `tls`: set WARY_SERVER_NAME to the name the server's certificate carries"
    );
}
