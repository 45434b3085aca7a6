//! The stack's high-water mark: paint the free stack once with a pattern, later find the
//! lowest word that no longer holds it.
//!
//! Futures of async tasks live in the executor's static task storage (counted in `.bss`);
//! the stack holds only what runs synchronously: interrupt frames and, for TLS, the
//! elliptic-curve and hash work of the handshake.

use core::ptr::{addr_of, read_volatile, write_volatile};

/// The word painted into unused stack.
const PAINT: u32 = 0x5EED_CAFE;
/// Left unpainted below the stack pointer: the painting code's own frame.
const MARGIN: usize = 256;

unsafe extern "C" {
    // cortex-m-rt's link.x: the stack grows down from `_stack_start` to `_stack_end` (the
    // end of `.bss`/`.uninit`).
    static _stack_start: u32;
    static _stack_end: u32;
}

fn bounds() -> (usize, usize) {
    // Only the symbols' addresses are taken, never their contents.
    let (top, bottom) = (addr_of!(_stack_start) as usize, addr_of!(_stack_end) as usize);
    (top, bottom.next_multiple_of(4))
}

/// Paints everything between the end of static memory and just below the current stack
/// pointer. Call once, early; interrupts are masked meanwhile, so no handler's frame is
/// overwritten.
pub fn paint() {
    cortex_m::interrupt::free(|_| {
        let (_, bottom) = bounds();
        let sp = cortex_m::register::msp::read() as usize;
        let end = sp.saturating_sub(MARGIN) & !3;
        let mut at = bottom;
        while at < end {
            // SAFETY: [bottom, sp - MARGIN) is RAM below every live frame and above all
            // statics (link.x), and nothing can push a frame there while interrupts are
            // masked.
            unsafe { write_volatile(at as *mut u32, PAINT) };
            at += 4;
        }
    });
}

/// The most stack used since [`paint`], in bytes: from the top of the stack to the lowest
/// word that lost its paint.
pub fn high_water() -> usize {
    let (top, bottom) = bounds();
    let mut at = bottom;
    // SAFETY: reads of RAM between the end of the statics and the top of the stack.
    while at < top && unsafe { read_volatile(at as *const u32) } == PAINT {
        at += 4;
    }
    top.saturating_sub(at)
}
