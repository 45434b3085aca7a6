//! Puts `memory.x` on the linker's search path (found by cortex-m-rt's `link.x`), after checking
//! that its FLASH region ends where the outbox's pages begin (`src/layout.rs`): the linker then
//! keeps the program out of the pages the outbox erases.

// A host program run by cargo: a failure stops the build with its message.
#![allow(clippy::expect_used, clippy::panic)]

use std::{env, fs, path::PathBuf};

#[allow(dead_code)]
mod layout {
    include!("src/layout.rs");
}

fn main() {
    let memory = fs::read_to_string("memory.x").expect("read memory.x");
    let (origin, length) =
        flash_region(&memory).expect("memory.x: no `FLASH : ORIGIN = .., LENGTH = ..` line");
    assert!(
        origin.checked_add(length) == Some(layout::OUTBOX_START)
            && layout::DEAD_RANGE.start == layout::OUTBOX_START
            && layout::QUEUE_RANGE.end == layout::FLASH_SIZE,
        "memory.x gives the program {origin:#x}..{:#x}, but src/layout.rs puts the outbox at {:#x}..{:#x}",
        origin.saturating_add(length),
        layout::OUTBOX_START,
        layout::FLASH_SIZE,
    );

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::write(out.join("memory.x"), memory).expect("write memory.x");

    // HTTPS pins the cloud's CA: its certificate (DER) is compiled in. No default: a CA that
    // someone else picked is not one to trust.
    println!("cargo:rerun-if-env-changed=WARY_CA_DER");
    if env::var_os("CARGO_FEATURE_TLS").is_some() {
        let path = env::var_os("WARY_CA_DER")
            .expect("feature `tls`: set WARY_CA_DER to the path of the cloud's CA certificate (DER)");
        let der = fs::read(&path).unwrap_or_else(|e| panic!("WARY_CA_DER: cannot read {path:?}: {e}"));
        assert!(der.first() == Some(&0x30), "WARY_CA_DER: {path:?} is not a DER certificate");
        println!("cargo:rerun-if-changed={}", PathBuf::from(&path).display());
        fs::write(out.join("pinned-ca.der"), der).expect("write pinned-ca.der");
    }
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=src/layout.rs");
    println!("cargo:rerun-if-changed=build.rs");
}

/// ORIGIN and LENGTH of the `FLASH` line, outside comments.
fn flash_region(memory: &str) -> Option<(u32, u32)> {
    let line = strip_comments(memory).lines().find(|l| l.trim_start().starts_with("FLASH"))?.to_owned();
    let value = |name: &str| {
        let rest = line.split_once(name)?.1.trim_start().strip_prefix('=')?;
        number(rest.split(',').next()?.trim())
    };
    Some((value("ORIGIN")?, value("LENGTH")?))
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once("/*") {
        out.push_str(before);
        rest = after.split_once("*/").map_or("", |(_, tail)| tail);
    }
    out.push_str(rest);
    out
}

/// `0x..`, decimal, with an optional `K` or `M` suffix, as the linker reads them.
fn number(text: &str) -> Option<u32> {
    let (digits, scale) = match text.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1024),
        None => match text.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1024 * 1024),
            None => (text, 1),
        },
    };
    let value = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    value.checked_mul(scale)
}
