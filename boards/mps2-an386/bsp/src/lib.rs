//! Board support for QEMU's `mps2-an386` (Cortex-M4F, 25 MHz): everything a test or an
//! application needs to run there and report back.
//!
//! - [`init`] starts the SysTick time driver (1 kHz, for `embassy-time`) and hands out UART0.
//! - [`uart`]: the CMSDK APB UART0 as `embedded-io-async` `Read`/`Write`, RX interrupt-driven.
//! - [`eth`]: the LAN9118 Ethernet controller as an `embassy-net` driver.
//! - [`net`]: the network bring-up every binary shares: the LAN9118 and embassy-net with DHCP.
//! - [`flash`]: a NOR flash emulated in PSRAM that survives a guest reset, and [`flash::reset`].
//! - [`exit`] ends the QEMU process with a code through semihosting; a panic, a HardFault or an
//!   interrupt nobody expected exit non-zero (see [`exit_code`]) so a run can never hang.
//! - defmt frames go to QEMU's stdout over semihosting; decode them with `defmt-print -e <elf>`.

#![no_std]
#![deny(missing_docs)]

pub mod eth;
pub mod flash;
pub mod net;
pub mod time_driver;
pub mod uart;

use core::panic::PanicInfo;

use cortex_m_rt::{ExceptionFrame, exception};
// The single-core critical section and the defmt transport are linked in from here.
use cortex_m as _;
use defmt_semihosting as _;

pub use uart::Uart0;

/// Process exit codes seen by the shell that started QEMU.
pub mod exit_code {
    /// Every check passed.
    pub const PASS: i32 = 0;
    /// At least one check failed; the log names which.
    pub const FAIL: i32 = 1;
    /// A panic (the log has its message).
    pub const PANIC: i32 = 101;
    /// A HardFault (the log has the faulting PC).
    pub const HARD_FAULT: i32 = 102;
    /// An exception or interrupt without a handler.
    pub const UNEXPECTED_INTERRUPT: i32 = 103;
}

/// The core clock QEMU gives mps2-an386; SysTick and UART0's baud divider derive from it.
pub const SYSCLK_HZ: u32 = 25_000_000;

/// The board's peripherals once [`init`] has run.
#[non_exhaustive]
pub struct Board {
    /// UART0 (QEMU's first `-serial`).
    pub uart0: Uart0,
    /// The LAN9118 Ethernet controller; bring it up with [`eth::new`].
    pub eth: eth::Lan9118,
}

/// Starts the time driver and enables UART0. Call once, first thing in `main`.
///
/// # Panics
///
/// When called a second time: the core peripherals have already been taken.
#[must_use]
pub fn init() -> Board {
    let mut cp = cortex_m::Peripherals::take().expect("mps2_an386::init called twice");
    time_driver::start(&mut cp.SYST);
    Board { uart0: uart::Uart0::new(&mut cp.NVIC), eth: eth::Lan9118::claim(&mut cp.NVIC) }
}

/// Ends the QEMU process with `code` (semihosting `SYS_EXIT_EXTENDED`, so any code survives).
pub fn exit(code: i32) -> ! {
    semihosting::process::exit(code)
}

/// NVIC interrupt numbers used on this board.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
#[repr(u16)]
pub enum Interrupt {
    /// UART0 receive.
    Uart0Rx = 0,
    /// UART0 transmit.
    Uart0Tx = 1,
    /// The LAN9118 Ethernet controller.
    Eth = 13,
}

// SAFETY: the discriminants are the board's NVIC line numbers (QEMU hw/arm/mps2.c).
unsafe impl cortex_m::interrupt::InterruptNumber for Interrupt {
    fn number(self) -> u16 {
        self as u16
    }
}

/// mps2-an386 wires 32 external interrupts to the NVIC.
const IRQ_COUNT: usize = 32;

/// The device part of the vector table, which cortex-m-rt's `device` feature expects us to
/// supply. Only UART0 and the Ethernet controller are served; everything else lands in
/// `DefaultHandler`.
#[unsafe(link_section = ".vector_table.interrupts")]
#[unsafe(no_mangle)]
#[used]
static __INTERRUPTS: [unsafe extern "C" fn(); IRQ_COUNT] = {
    let mut table = [unexpected_interrupt as unsafe extern "C" fn(); IRQ_COUNT];
    table[Interrupt::Uart0Rx as usize] = uart::on_rx_interrupt;
    table[Interrupt::Uart0Tx as usize] = uart::on_tx_interrupt;
    table[Interrupt::Eth as usize] = eth::on_interrupt;
    table
};

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    // The default handler loops forever, and QEMU would sit there until the CI timeout.
    defmt::error!("HardFault at pc={=u32:#010x} lr={=u32:#010x}", frame.pc(), frame.lr());
    exit(exit_code::HARD_FAULT)
}

/// Any device interrupt without a driver: exit rather than return into an interrupt that
/// nothing will ever clear.
unsafe extern "C" fn unexpected_interrupt() {
    let irqn = match cortex_m::peripheral::SCB::vect_active() {
        cortex_m::peripheral::scb::VectActive::Interrupt { irqn } => i16::from(irqn),
        _ => -1,
    };
    defmt::error!("unexpected interrupt {=i16}", irqn);
    exit(exit_code::UNEXPECTED_INTERRUPT)
}

#[exception]
unsafe fn DefaultHandler(irqn: i16) {
    defmt::error!("unexpected exception or interrupt {=i16}", irqn);
    exit(exit_code::UNEXPECTED_INTERRUPT)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    defmt::error!("panic: {}", defmt::Display2Format(info));
    exit(exit_code::PANIC)
}
