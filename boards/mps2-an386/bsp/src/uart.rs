//! UART0, a CMSDK APB UART: one byte each way, no FIFO.
//!
//! Receiving is interrupt-driven into a small ring, so bytes that arrive while no task is
//! reading are kept. When the ring is full the byte stays in the DATA register; QEMU then holds
//! back the next one, so nothing is dropped, and the next read moves it over. Sending waits for
//! the TX interrupt only when the register is still full.

use core::cell::RefCell;
use core::convert::Infallible;
use core::future::poll_fn;
use core::ptr::{read_volatile, write_volatile};
use core::task::Poll;

use cortex_m::peripheral::NVIC;
use critical_section::{CriticalSection, Mutex};
use embassy_sync::waitqueue::AtomicWaker;
use heapless::Deque;

use crate::{Interrupt, SYSCLK_HZ};

const BASE: usize = 0x4000_4000;
const DATA: usize = BASE;
const STATE: usize = BASE + 0x04;
const CTRL: usize = BASE + 0x08;
const INTSTATUS: usize = BASE + 0x0C;
const BAUDDIV: usize = BASE + 0x10;

const STATE_TXFULL: u32 = 1 << 0;
const STATE_RXFULL: u32 = 1 << 1;
const CTRL_TX_EN: u32 = 1 << 0;
const CTRL_RX_EN: u32 = 1 << 1;
const CTRL_TX_INTEN: u32 = 1 << 2;
const CTRL_RX_INTEN: u32 = 1 << 3;
const INT_TX: u32 = 1 << 0;
const INT_RX: u32 = 1 << 1;

/// The baud rate set; QEMU ignores it, a model of real hardware would not.
pub const BAUD: u32 = 115_200;
/// Bytes kept between the RX interrupt and a reader.
pub const RX_CAPACITY: usize = 64;

static RX_RING: Mutex<RefCell<Deque<u8, RX_CAPACITY>>> = Mutex::new(RefCell::new(Deque::new()));
static RX_WAKER: AtomicWaker = AtomicWaker::new();
static TX_WAKER: AtomicWaker = AtomicWaker::new();

fn reg(addr: usize) -> u32 {
    // SAFETY: `addr` is one of UART0's word-aligned registers, always mapped on this board.
    unsafe { read_volatile(addr as *const u32) }
}

fn set_reg(addr: usize, value: u32) {
    // SAFETY: as in `reg`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

/// Moves bytes from the DATA register into the ring while there is room.
fn drain_rx(cs: CriticalSection<'_>) {
    let mut ring = RX_RING.borrow_ref_mut(cs);
    while !ring.is_full() && reg(STATE) & STATE_RXFULL != 0 {
        // Truncation keeps the low byte, which is the received one.
        let byte = reg(DATA) as u8;
        let _ = ring.push_back(byte);
    }
}

pub(crate) unsafe extern "C" fn on_rx_interrupt() {
    // Clear first: a byte arriving after the clear raises the interrupt again.
    set_reg(INTSTATUS, INT_RX);
    critical_section::with(drain_rx);
    RX_WAKER.wake();
}

pub(crate) unsafe extern "C" fn on_tx_interrupt() {
    set_reg(INTSTATUS, INT_TX);
    critical_section::with(|_| set_reg(CTRL, reg(CTRL) & !CTRL_TX_INTEN));
    TX_WAKER.wake();
}

/// UART0; [`split`](Uart0::split) it to read and write from different tasks.
pub struct Uart0 {
    rx: Uart0Rx,
    tx: Uart0Tx,
}

/// The receiving half of [`Uart0`].
pub struct Uart0Rx {
    _private: (),
}

/// The sending half of [`Uart0`].
pub struct Uart0Tx {
    _private: (),
}

impl Uart0 {
    pub(crate) fn new(nvic: &mut NVIC) -> Self {
        set_reg(CTRL, 0);
        set_reg(BAUDDIV, SYSCLK_HZ / BAUD);
        set_reg(INTSTATUS, INT_TX | INT_RX);
        set_reg(CTRL, CTRL_TX_EN | CTRL_RX_EN | CTRL_RX_INTEN);
        NVIC::unpend(Interrupt::Uart0Rx);
        NVIC::unpend(Interrupt::Uart0Tx);
        // SAFETY: both handlers are in the vector table and touch only UART0 state, which
        // they guard with critical sections.
        unsafe {
            nvic.set_priority(Interrupt::Uart0Rx, 0x80);
            nvic.set_priority(Interrupt::Uart0Tx, 0x80);
            NVIC::unmask(Interrupt::Uart0Rx);
            NVIC::unmask(Interrupt::Uart0Tx);
        }
        Self { rx: Uart0Rx { _private: () }, tx: Uart0Tx { _private: () } }
    }

    /// The two halves, to be moved into separate tasks.
    #[must_use]
    pub fn split(self) -> (Uart0Tx, Uart0Rx) {
        (self.tx, self.rx)
    }
}

impl Uart0Rx {
    async fn read_some(&mut self, buf: &mut [u8]) -> usize {
        if buf.is_empty() {
            return 0;
        }
        poll_fn(|cx| {
            RX_WAKER.register(cx.waker());
            critical_section::with(|cs| {
                // Picks up a byte left in DATA while the ring was full.
                drain_rx(cs);
                let mut ring = RX_RING.borrow_ref_mut(cs);
                let mut n = 0;
                for slot in buf.iter_mut() {
                    match ring.pop_front() {
                        Some(byte) => *slot = byte,
                        None => break,
                    }
                    n += 1;
                }
                drop(ring);
                drain_rx(cs);
                if n == 0 { Poll::Pending } else { Poll::Ready(n) }
            })
        })
        .await
    }
}

impl Uart0Tx {
    async fn write_some(&mut self, buf: &[u8]) -> usize {
        if buf.is_empty() {
            return 0;
        }
        poll_fn(|cx| {
            let mut n = 0;
            for &byte in buf {
                if reg(STATE) & STATE_TXFULL != 0 {
                    break;
                }
                set_reg(DATA, u32::from(byte));
                n += 1;
            }
            if n > 0 {
                return Poll::Ready(n);
            }
            wait_tx_room(cx)
        })
        .await
    }

    async fn wait_idle(&mut self) {
        poll_fn(|cx| if reg(STATE) & STATE_TXFULL == 0 { Poll::Ready(0) } else { wait_tx_room(cx) }).await;
    }
}

/// Arms the TX interrupt, then looks again so a byte that left meanwhile is not waited for.
fn wait_tx_room(cx: &mut core::task::Context<'_>) -> Poll<usize> {
    TX_WAKER.register(cx.waker());
    critical_section::with(|_| set_reg(CTRL, reg(CTRL) | CTRL_TX_INTEN));
    if reg(STATE) & STATE_TXFULL == 0 {
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

// QEMU never overruns (it holds bytes back while RXFULL is set), so no error can happen.
impl embedded_io::ErrorType for Uart0 {
    type Error = Infallible;
}
impl embedded_io::ErrorType for Uart0Rx {
    type Error = Infallible;
}
impl embedded_io::ErrorType for Uart0Tx {
    type Error = Infallible;
}

impl embedded_io_async::Read for Uart0Rx {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        Ok(self.read_some(buf).await)
    }
}

impl embedded_io_async::Write for Uart0Tx {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        Ok(self.write_some(buf).await)
    }

    async fn flush(&mut self) -> Result<(), Infallible> {
        self.wait_idle().await;
        Ok(())
    }
}

impl embedded_io_async::Read for Uart0 {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        Ok(self.rx.read_some(buf).await)
    }
}

impl embedded_io_async::Write for Uart0 {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        Ok(self.tx.write_some(buf).await)
    }

    async fn flush(&mut self) -> Result<(), Infallible> {
        self.tx.wait_idle().await;
        Ok(())
    }
}
