//! The skeleton every size binary shares; only the closure passed to [`run`] differs.
#![no_std]

use core::hint::black_box;

use wary::{Policy, Preset};

/// wary's default policy, in flash as a device keeps one; a binary that never names it links
/// none of it.
pub static POLICY: Policy = match Policy::builder(Preset::Default).build() {
    Ok(p) => p,
    Err(_) => panic!(),
};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Feeds opaque inputs to `work` forever and keeps its output, so nothing folds away.
pub fn run(mut work: impl FnMut([u32; 4]) -> u64) -> ! {
    loop {
        let input = black_box([0u32; 4]);
        black_box(work(input));
    }
}
