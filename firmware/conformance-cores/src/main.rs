//! wary's conformance check (`wary-conformance`) on a Cortex-M0 (thumbv6m-none-eabi, QEMU
//! microbit) or a Cortex-M33 (thumbv8m.main-none-eabihf, QEMU mps2-an505), whichever it is built
//! for. Defmt frames go to QEMU's stdout over semihosting; the exit code says how it
//! went: 0 every check passed, 1 one failed, 101 a panic, 102 a HardFault, 103 an unexpected
//! exception. No time driver: the check is pure decisions.

#![no_std]
#![no_main]

use core::panic::PanicInfo;

use cortex_m_rt::{ExceptionFrame, entry, exception};
// thumbv6m has no compare-and-swap: wary's fleet budget takes portable-atomic's critical-section
// fallback, and cortex-m's single-core implementation (masking interrupts) supplies it. The
// Cortex-M33 has compare-and-swap and never calls it.
use cortex_m as _;
use defmt_semihosting as _;

const PASS: i32 = 0;
const FAIL: i32 = 1;
const PANIC: i32 = 101;
const HARD_FAULT: i32 = 102;
const UNEXPECTED: i32 = 103;

#[entry]
fn main() -> ! {
    let (mut passed, mut failed) = (0u32, 0u32);
    wary_conformance::run(&mut |name, ok| {
        if ok {
            passed = passed.saturating_add(1);
            defmt::info!("pass: {=str}", name);
        } else {
            failed = failed.saturating_add(1);
            defmt::error!("FAIL: {=str}", name);
        }
    });
    defmt::info!("{=u32} passed, {=u32} failed", passed, failed);
    exit(if failed == 0 && passed > 0 { PASS } else { FAIL })
}

/// Ends the QEMU process with `code` (semihosting `SYS_EXIT_EXTENDED`, so any code survives).
fn exit(code: i32) -> ! {
    semihosting::process::exit(code)
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    // The default handler loops forever, and QEMU would sit there until the runner's timeout.
    defmt::error!("HardFault at pc={=u32:#010x} lr={=u32:#010x}", frame.pc(), frame.lr());
    exit(HARD_FAULT)
}

#[exception]
unsafe fn DefaultHandler(irqn: i16) {
    defmt::error!("unexpected exception or interrupt {=i16}", irqn);
    exit(UNEXPECTED)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    defmt::error!("panic: {}", defmt::Display2Format(info));
    exit(PANIC)
}
