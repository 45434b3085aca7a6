//! The board's SMSC LAN9118 Ethernet controller (at `0x4020_0000`, NVIC line 13) as an
//! `embassy-net` driver.
//!
//! No LAN9118 driver exists as a crate, so this one is written here, in the shape
//! `embassy-net-driver-channel` gives network drivers: [`new`] brings the chip up and returns a
//! [`Device`] for `embassy_net::new` and a [`Runner`] whose [`run`](Runner::run) moves frames
//! between the chip's FIFOs and the channel. It must run in its own task on the same executor
//! as the stack.
//!
//! - **Receiving** is interrupt-driven: the chip raises its line when the RX status FIFO holds
//!   a frame; the handler masks that source and wakes the runner, which drains the FIFO and
//!   unmasks it again. Masking (rather than only clearing the status bit) keeps a level source
//!   on real silicon from re-entering the handler while frames wait.
//! - **Sending** copies a frame into the TX data FIFO behind its two command words. The chip
//!   may drop TX status words (`TXSAO`): nobody reads them, and a full status FIFO would
//!   otherwise stop the transmitter.
//! - **Checksums** stay in software (smoltcp's default): the chip offloads none.
//! - **Every wait on the chip is bounded**: a register that never settles ends bring-up with
//!   an [`EthError`], a TX FIFO that never drains drops the frame (counted in [`counters`]).
//! - **Link state** follows the PHY's link bit, read at start and once a second.
//! - **MAC address**: the chip's (QEMU loads one from its emulated EEPROM); if that is unset
//!   or not a unicast address, [`FALLBACK_MAC`] is programmed instead.
//!
//! ```ignore
//! static STATE: StaticCell<eth::State<4, 4>> = StaticCell::new();
//! let (device, runner) = eth::new(board.eth, STATE.init(eth::State::new()))?;
//! spawner.spawn(eth_task(runner)?);   // async fn eth_task(r: eth::Runner<'static>) -> ! { r.run().await }
//! let (stack, net_runner) = embassy_net::new(device, config, resources, seed);
//! ```

use core::future::poll_fn;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, Ordering};
use core::task::Poll;

use cortex_m::peripheral::NVIC;
use embassy_futures::select::{Either3, select3};
use embassy_net_driver_channel as ch;
use embassy_net_driver_channel::driver::{HardwareAddress, LinkState};
use embassy_sync::waitqueue::AtomicWaker;
use embassy_time::{Duration, Ticker};

use crate::Interrupt;

/// The largest Ethernet frame handed to or taken from the stack: 14 bytes of header and a
/// 1500-byte payload (the chip strips or adds the 4-byte FCS itself).
pub const MTU: usize = 1514;

/// The address used when the chip has none: locally administered (bit 1 of the first byte
/// set), unicast, and fixed, so DHCP leases stay stable across runs.
pub const FALLBACK_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0x38, 0x60, 0x01];

/// Frame buffers shared by the driver and the stack: `N_RX` received frames waiting for the
/// stack, `N_TX` frames waiting for the chip, each [`MTU`] bytes.
pub type State<const N_RX: usize, const N_TX: usize> = ch::State<MTU, N_RX, N_TX>;

/// The stack's side of the driver: pass it to `embassy_net::new`.
pub type Device<'d> = ch::Device<'d, MTU>;

const BASE: usize = 0x4020_0000;
const RX_DATA_FIFO: usize = BASE;
const TX_DATA_FIFO: usize = BASE + 0x20;
const RX_STATUS_FIFO: usize = BASE + 0x40;
const ID_REV: usize = BASE + 0x50;
const IRQ_CFG: usize = BASE + 0x54;
const INT_STS: usize = BASE + 0x58;
const INT_EN: usize = BASE + 0x5C;
const BYTE_TEST: usize = BASE + 0x64;
const FIFO_INT: usize = BASE + 0x68;
const RX_CFG: usize = BASE + 0x6C;
const TX_CFG: usize = BASE + 0x70;
const HW_CFG: usize = BASE + 0x74;
const RX_FIFO_INF: usize = BASE + 0x7C;
const TX_FIFO_INF: usize = BASE + 0x80;
const PMT_CTRL: usize = BASE + 0x84;
const MAC_CSR_CMD: usize = BASE + 0xA4;
const MAC_CSR_DATA: usize = BASE + 0xA8;

/// What BYTE_TEST reads on a LAN9118 wired for 32-bit little-endian access.
const BYTE_TEST_VALUE: u32 = 0x8765_4321;

const IRQ_CFG_TYPE_PUSH_PULL: u32 = 1 << 0;
const IRQ_CFG_POL_HIGH: u32 = 1 << 4;
const IRQ_CFG_EN: u32 = 1 << 8;
const INT_RSFL: u32 = 1 << 3;
const HW_CFG_SRST: u32 = 1 << 0;
const PMT_CTRL_READY: u32 = 1 << 0;
const TX_CFG_TX_ON: u32 = 1 << 1;
const TX_CFG_TXSAO: u32 = 1 << 2;
/// Interrupt as soon as the RX status FIFO holds one entry; TX levels at their reset value.
const FIFO_INT_VALUE: u32 = 0x4800_0000;

const MAC_CSR_BUSY: u32 = 1 << 31;
const MAC_CSR_READ: u32 = 1 << 30;
const MAC_CR: u32 = 1;
const MAC_ADDRH: u32 = 2;
const MAC_ADDRL: u32 = 3;
const MAC_MII_ACC: u32 = 6;
const MAC_MII_DATA: u32 = 7;
const MAC_CR_RXEN: u32 = 1 << 2;
const MAC_CR_TXEN: u32 = 1 << 3;
const MAC_CR_FDPX: u32 = 1 << 20;
const MII_BUSY: u32 = 1 << 0;
/// The internal PHY answers at address 1.
const PHY_ADDR: u32 = 1;
const PHY_BASIC_STATUS: u32 = 1;
const PHY_LINK_UP: u32 = 1 << 2;

const RX_STS_ERROR: u32 = 1 << 15;
const RX_STS_FILTER_FAIL: u32 = 1 << 30;
const FCS_LEN: usize = 4;
const ETH_HEADER_LEN: usize = 14;

const TX_CMD_A_FIRST_SEG: u32 = 1 << 13;
const TX_CMD_A_LAST_SEG: u32 = 1 << 12;

/// Register polls before a wait on the chip is given up. The emulated chip settles at once; a
/// real one within microseconds: this only keeps a wedged chip from hanging the device.
const POLL_LIMIT: u32 = 100_000;
/// How often the PHY's link bit is read.
const LINK_POLL: Duration = Duration::from_secs(1);

static RX_WAKER: AtomicWaker = AtomicWaker::new();
static RX_FRAMES: AtomicU32 = AtomicU32::new(0);
static RX_DROPPED: AtomicU32 = AtomicU32::new(0);
static TX_FRAMES: AtomicU32 = AtomicU32::new(0);
static TX_DROPPED: AtomicU32 = AtomicU32::new(0);

fn reg(addr: usize) -> u32 {
    // SAFETY: `addr` is one of the LAN9118's word-aligned registers, always mapped on this
    // board; FIFO reads have side effects only on the chip.
    unsafe { read_volatile(addr as *const u32) }
}

fn set_reg(addr: usize, value: u32) {
    // SAFETY: as in `reg`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

/// Polls `done` on a register up to [`POLL_LIMIT`] times.
fn wait_for(addr: usize, done: impl Fn(u32) -> bool) -> bool {
    (0..POLL_LIMIT).any(|_| done(reg(addr)))
}

/// Why the chip could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
#[non_exhaustive]
pub enum EthError {
    /// BYTE_TEST did not read back its fixed pattern: no LAN9118 here, or the bus is wired
    /// differently (QEMU without `-nic …,model=lan9118` still maps the chip).
    NotFound {
        /// What BYTE_TEST read.
        byte_test: u32,
    },
    /// The soft reset did not complete.
    ResetTimeout,
    /// A MAC or PHY register access stayed busy.
    RegisterTimeout,
}

/// Frame counters since boot, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, defmt::Format)]
pub struct Counters {
    /// Frames handed to the stack.
    pub rx_frames: u32,
    /// Received frames dropped: receive errors, runts, or longer than [`MTU`].
    pub rx_dropped: u32,
    /// Frames written to the TX FIFO.
    pub tx_frames: u32,
    /// Frames dropped because they were empty, too long, or the TX FIFO never had room.
    pub tx_dropped: u32,
}

/// The frame counters.
pub fn counters() -> Counters {
    Counters {
        rx_frames: RX_FRAMES.load(Ordering::Relaxed),
        rx_dropped: RX_DROPPED.load(Ordering::Relaxed),
        tx_frames: TX_FRAMES.load(Ordering::Relaxed),
        tx_dropped: TX_DROPPED.load(Ordering::Relaxed),
    }
}

fn count(counter: &AtomicU32) {
    // Wraps after 2^32 frames, which a counter for logs can afford.
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Ownership of the chip, handed out once by [`crate::init`].
pub struct Lan9118 {
    _private: (),
}

impl Lan9118 {
    /// Takes the chip's interrupt line: masked until [`new`] has configured the chip (its line
    /// idles high until then, which the NVIC would take for a pending interrupt).
    pub(crate) fn claim(nvic: &mut NVIC) -> Self {
        NVIC::mask(Interrupt::Eth);
        // SAFETY: the line stays masked here; the handler touches only the chip's interrupt
        // registers and a waker.
        unsafe { nvic.set_priority(Interrupt::Eth, 0x80) };
        Self { _private: () }
    }
}

/// Moves frames between the chip and the stack; see [`Runner::run`].
pub struct Runner<'d> {
    ch: ch::Runner<'d, MTU>,
}

/// Resets and configures the chip, enables its receive interrupt, and returns the stack's
/// device and the runner.
///
/// # Errors
///
/// [`EthError`] when the chip is missing or does not settle.
pub fn new<'d, const N_RX: usize, const N_TX: usize>(
    chip: Lan9118,
    state: &'d mut State<N_RX, N_TX>,
) -> Result<(Device<'d>, Runner<'d>), EthError> {
    let Lan9118 { _private: () } = chip;
    let mac = bring_up()?;
    defmt::info!("lan9118: id {=u32:#010x}, mac {=[u8]:02x}", reg(ID_REV), &mac[..]);
    let (runner, device) = ch::new(state, HardwareAddress::Ethernet(mac));
    // The chip's line is now active-high and quiet; forget what it pended while it idled high.
    NVIC::unpend(Interrupt::Eth);
    // SAFETY: `on_interrupt` is in the vector table and touches only INT_EN, INT_STS and the
    // RX waker.
    unsafe { NVIC::unmask(Interrupt::Eth) };
    Ok((device, Runner { ch: runner }))
}

fn bring_up() -> Result<[u8; 6], EthError> {
    let byte_test = reg(BYTE_TEST);
    if byte_test != BYTE_TEST_VALUE {
        return Err(EthError::NotFound { byte_test });
    }
    set_reg(HW_CFG, HW_CFG_SRST);
    if !wait_for(HW_CFG, |v| v & HW_CFG_SRST == 0) || !wait_for(PMT_CTRL, |v| v & PMT_CTRL_READY != 0) {
        return Err(EthError::ResetTimeout);
    }
    set_reg(INT_EN, 0);
    set_reg(INT_STS, u32::MAX);
    // HW_CFG keeps its reset value: a 5 KiB TX FIFO, the rest for receiving.

    let mac = match chip_mac()? {
        Some(mac) => mac,
        None => {
            let [a, b, c, d, e, f] = FALLBACK_MAC;
            mac_write(MAC_ADDRL, u32::from_le_bytes([a, b, c, d]))?;
            mac_write(MAC_ADDRH, u32::from_le_bytes([e, f, 0, 0]))?;
            FALLBACK_MAC
        }
    };
    // Exact-match and broadcast filtering (the reset value is promiscuous).
    mac_write(MAC_CR, MAC_CR_TXEN | MAC_CR_RXEN | MAC_CR_FDPX)?;
    set_reg(TX_CFG, TX_CFG_TX_ON | TX_CFG_TXSAO);
    // No data offset, 4-byte end alignment: a frame is exactly ceil(len / 4) words.
    set_reg(RX_CFG, 0);
    set_reg(FIFO_INT, FIFO_INT_VALUE);
    // Active-high push-pull: QEMU's model drives the line inverted unless both bits are set.
    set_reg(IRQ_CFG, IRQ_CFG_EN | IRQ_CFG_POL_HIGH | IRQ_CFG_TYPE_PUSH_PULL);
    set_reg(INT_EN, INT_RSFL);
    Ok(mac)
}

/// The address in ADDRL/ADDRH, if it is a usable unicast one.
fn chip_mac() -> Result<Option<[u8; 6]>, EthError> {
    let [a, b, c, d] = mac_read(MAC_ADDRL)?.to_le_bytes();
    let [e, f, _, _] = mac_read(MAC_ADDRH)?.to_le_bytes();
    let mac = [a, b, c, d, e, f];
    let unset = mac == [0; 6] || mac == [0xff; 6];
    let multicast = a & 1 != 0;
    Ok(if unset || multicast { None } else { Some(mac) })
}

fn mac_read(index: u32) -> Result<u32, EthError> {
    if !wait_for(MAC_CSR_CMD, |v| v & MAC_CSR_BUSY == 0) {
        return Err(EthError::RegisterTimeout);
    }
    set_reg(MAC_CSR_CMD, MAC_CSR_BUSY | MAC_CSR_READ | index);
    if !wait_for(MAC_CSR_CMD, |v| v & MAC_CSR_BUSY == 0) {
        return Err(EthError::RegisterTimeout);
    }
    Ok(reg(MAC_CSR_DATA))
}

fn mac_write(index: u32, value: u32) -> Result<(), EthError> {
    if !wait_for(MAC_CSR_CMD, |v| v & MAC_CSR_BUSY == 0) {
        return Err(EthError::RegisterTimeout);
    }
    set_reg(MAC_CSR_DATA, value);
    set_reg(MAC_CSR_CMD, MAC_CSR_BUSY | index);
    if wait_for(MAC_CSR_CMD, |v| v & MAC_CSR_BUSY == 0) { Ok(()) } else { Err(EthError::RegisterTimeout) }
}

/// The PHY's link bit, through the MAC's MII registers.
fn phy_link() -> Result<bool, EthError> {
    if !wait_for_mii_idle()? {
        return Err(EthError::RegisterTimeout);
    }
    mac_write(MAC_MII_ACC, (PHY_ADDR << 11) | (PHY_BASIC_STATUS << 6) | MII_BUSY)?;
    if !wait_for_mii_idle()? {
        return Err(EthError::RegisterTimeout);
    }
    Ok(mac_read(MAC_MII_DATA)? & PHY_LINK_UP != 0)
}

fn wait_for_mii_idle() -> Result<bool, EthError> {
    for _ in 0..POLL_LIMIT {
        if mac_read(MAC_MII_ACC)? & MII_BUSY == 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

fn link_state(previous: LinkState) -> LinkState {
    match phy_link() {
        Ok(true) => LinkState::Up,
        Ok(false) => LinkState::Down,
        Err(err) => {
            defmt::warn!("lan9118: PHY status unreadable ({}), link state kept", err);
            previous
        }
    }
}

/// Frames waiting in the RX FIFO (its status FIFO's fill level).
fn rx_waiting() -> u32 {
    (reg(RX_FIFO_INF) >> 16) & 0xFF
}

/// Resolves when a frame is waiting. Registers first and unmasks the interrupt second, so a
/// frame that lands in between still raises the line and wakes us.
async fn rx_ready() {
    poll_fn(|cx| {
        RX_WAKER.register(cx.waker());
        if rx_waiting() > 0 {
            return Poll::Ready(());
        }
        set_reg(INT_EN, INT_RSFL);
        if rx_waiting() > 0 { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
}

/// The chip's interrupt: mask the source, acknowledge it, wake the runner.
pub(crate) unsafe extern "C" fn on_interrupt() {
    set_reg(INT_EN, 0);
    set_reg(INT_STS, INT_RSFL);
    RX_WAKER.wake();
}

/// Pops one frame from the RX FIFOs into `buf`; `None` when it was dropped.
fn receive(buf: &mut [u8]) -> Option<usize> {
    let status = reg(RX_STATUS_FIFO);
    let with_fcs = ((status >> 16) & 0x3FFF) as usize;
    let words = with_fcs.div_ceil(4);
    let len = with_fcs.saturating_sub(FCS_LEN);
    let bad = status & (RX_STS_ERROR | RX_STS_FILTER_FAIL) != 0;
    if bad || len < ETH_HEADER_LEN || len > buf.len() {
        // The frame's words must still leave the FIFO, or the next frame would start inside it.
        for _ in 0..words {
            let _ = reg(RX_DATA_FIFO);
        }
        count(&RX_DROPPED);
        return None;
    }
    let mut slots = buf.iter_mut().take(len);
    for _ in 0..words {
        let word = reg(RX_DATA_FIFO).to_le_bytes();
        // The FCS's bytes follow the frame's: read, and not kept.
        for (slot, byte) in slots.by_ref().take(4).zip(word) {
            *slot = byte;
        }
    }
    count(&RX_FRAMES);
    Some(len)
}

/// Writes one frame into the TX FIFO; the chip sends it once the last word is in.
fn transmit(frame: &[u8]) {
    let len = frame.len();
    // A frame, its two command words and up to 3 bytes of padding.
    let needed = len.saturating_add(8 + 3) as u32;
    if len == 0 || len > MTU || !wait_for(TX_FIFO_INF, |v| v & 0xFFFF >= needed) {
        count(&TX_DROPPED);
        return;
    }
    // `len` fits the 11-bit size fields: it is at most MTU.
    let size = len as u32;
    set_reg(TX_DATA_FIFO, TX_CMD_A_FIRST_SEG | TX_CMD_A_LAST_SEG | size);
    // The packet tag (upper half) only shows in TX status words, which are not read.
    set_reg(TX_DATA_FIFO, (size << 16) | size);
    for chunk in frame.chunks(4) {
        // The last word is padded with zeros; the chip sends only `len` bytes.
        let mut word = [0u8; 4];
        for (slot, byte) in word.iter_mut().zip(chunk) {
            *slot = *byte;
        }
        set_reg(TX_DATA_FIFO, u32::from_le_bytes(word));
    }
    count(&TX_FRAMES);
}

impl Runner<'_> {
    /// Serves the chip forever: received frames to the stack, the stack's frames to the chip,
    /// and the link state once a second.
    pub async fn run(self) -> ! {
        let (state, mut rx, mut tx) = self.ch.split();
        let mut link = link_state(LinkState::Down);
        state.set_link_state(link);
        let mut link_poll = Ticker::every(LINK_POLL);
        loop {
            let event = select3(
                async {
                    rx_ready().await;
                    rx.rx_buf().await
                },
                tx.tx_buf(),
                link_poll.next(),
            )
            .await;
            match event {
                Either3::First(buf) => {
                    if let Some(len) = receive(buf) {
                        rx.rx_done(len);
                    }
                }
                Either3::Second(frame) => {
                    transmit(frame);
                    tx.tx_done();
                }
                Either3::Third(()) => {
                    link = link_state(link);
                    state.set_link_state(link);
                }
            }
            // A flood of received frames must not starve sending: one queued frame goes out
            // after every event.
            if let Some(frame) = tx.try_tx_buf() {
                transmit(frame);
                tx.tx_done();
            }
        }
    }
}
