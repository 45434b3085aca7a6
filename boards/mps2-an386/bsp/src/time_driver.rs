//! An `embassy-time` driver on SysTick: a 1 kHz tick counts time and expires the timer queue.
//!
//! A periodic tick is the simplest driver that works on any Cortex-M: timers fire on the first
//! tick at or after their deadline, so up to one millisecond late, which is all a retry
//! schedule in milliseconds needs. The price is an interrupt every millisecond while idle.

use core::cell::{Cell, RefCell};
use core::task::Waker;

use cortex_m::peripheral::SYST;
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::exception;
use critical_section::Mutex;
use embassy_time_driver::Driver;
use embassy_time_queue_utils::Queue;

/// Ticks per second; must match the `tick-hz-1_000` feature of `embassy-time-driver`.
pub const TICK_HZ: u32 = 1_000;

struct SysTickDriver {
    /// Ticks since [`start`]. A u64 because Cortex-M4 has no 64-bit atomics and a u32 of
    /// milliseconds wraps after 49 days.
    ticks: Mutex<Cell<u64>>,
    /// The earliest deadline in `queue`; `u64::MAX` when it is empty.
    next_expiry: Mutex<Cell<u64>>,
    queue: Mutex<RefCell<Queue>>,
}

embassy_time_driver::time_driver_impl!(static DRIVER: SysTickDriver = SysTickDriver {
    ticks: Mutex::new(Cell::new(0)),
    next_expiry: Mutex::new(Cell::new(u64::MAX)),
    queue: Mutex::new(RefCell::new(Queue::new())),
});

impl Driver for SysTickDriver {
    fn now(&self) -> u64 {
        critical_section::with(|cs| self.ticks.borrow(cs).get())
    }

    fn schedule_wake(&self, at: u64, waker: &Waker) {
        critical_section::with(|cs| {
            let mut queue = self.queue.borrow_ref_mut(cs);
            if queue.schedule_wake(at, waker) {
                // Also wakes at once anything already due, so a deadline in the past works.
                let now = self.ticks.borrow(cs).get();
                self.next_expiry.borrow(cs).set(queue.next_expiration(now));
            }
        });
    }
}

impl SysTickDriver {
    fn on_tick(&self) {
        critical_section::with(|cs| {
            let ticks = self.ticks.borrow(cs);
            let now = ticks.get().saturating_add(1);
            ticks.set(now);
            let next = self.next_expiry.borrow(cs);
            if now >= next.get() {
                next.set(self.queue.borrow_ref_mut(cs).next_expiration(now));
            }
        });
    }
}

/// Starts SysTick from the core clock at [`TICK_HZ`].
pub(crate) fn start(syst: &mut SYST) {
    syst.disable_counter();
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(crate::SYSCLK_HZ / TICK_HZ - 1);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

#[exception]
fn SysTick() {
    DRIVER.on_tick();
}
