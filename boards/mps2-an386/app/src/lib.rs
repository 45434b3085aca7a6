//! Shared pieces of the on-target test binaries: a tally of checks and the exit that
//! reports it.

#![no_std]
#![deny(missing_docs)]

use core::fmt::Write as _;

use mps2_an386::{exit, exit_code};

/// Counts checks; each failure is logged where it happens, with what was expected.
#[derive(Default)]
pub struct Tally {
    passed: u32,
    failed: u32,
}

impl Tally {
    /// An empty tally.
    pub const fn new() -> Self {
        Self { passed: 0, failed: 0 }
    }

    /// Records one check named `name`.
    pub fn check(&mut self, name: &str, ok: bool) {
        if ok {
            self.passed += 1;
            defmt::info!("pass: {=str}", name);
        } else {
            self.failed += 1;
            defmt::error!("FAIL: {=str}", name);
        }
    }

    /// Logs the totals and ends the QEMU process: exit 0 only if every check passed and at
    /// least one ran.
    pub fn finish(&self) -> ! {
        defmt::info!("{=u32} passed, {=u32} failed", self.passed, self.failed);
        if self.failed == 0 && self.passed > 0 { exit(exit_code::PASS) } else { exit(exit_code::FAIL) }
    }
}

/// A distinct idempotency key per test case, in wary's 32-hex-digit form (the test device's
/// id, then the case number).
pub fn key(case: usize) -> heapless::String<32> {
    let mut s = heapless::String::new();
    let _ = write!(s, "{:08x}{:024x}", 0x0a38_6001u32, case);
    s
}

/// A reading's JSON body for a test case: `{"seq":<case>,"mC":21000}`.
pub fn body(case: usize) -> heapless::String<48> {
    let mut s = heapless::String::new();
    let _ = write!(s, "{{\"seq\":{case},\"mC\":21000}}");
    s
}
