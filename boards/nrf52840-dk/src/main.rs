//! The uplink application on the nRF52840-DK: the same uplink as the QEMU app
//! (`firmware/qemu/src/bin/uplink.rs`), on real hardware.
//!
//! - **Modem**: UARTE0 as a `BufferedUarte` at 115200 baud, TX on P0.06 and RX on P0.08 (the
//!   DK's VCOM pins), speaking the AT protocol of `wary-modem-proto`. Other pins: change
//!   `modem_tx`/`modem_rx` in `main` (firmware/README.md lists the DK's free pins).
//! - **Jitter seed**: 8 bytes from the hardware RNG (bias correction on), per boot.
//! - **Device id**: FICR DEVICEID[0], the low 32 bits of the factory-programmed 64-bit id.
//! - **Boot field of the keys**: a 32-bit nonce from the hardware RNG, drawn at every boot, so
//!   a rebooted board does not reuse its earlier keys (the cloud would replay, not apply, a
//!   reading with a reused key). Unique per boot with high probability only: two boots collide
//!   with probability 2^-32 per pair (about 1 in 86 000 over 100 boots of one board). For a
//!   guarantee, persist a boot counter instead: a flash page reserved at the end of FLASH in
//!   `memory.x` (4 KiB at `0x000F_F000`), incremented at boot through
//!   `embassy_nrf::nvmc::Nvmc` before the first reading (firmware/README.md).
//! - **Readings**: the on-die temperature sensor (`TEMP`), one every [`PERIOD`].
//!
//! Logs over defmt-rtt (`cargo run --release` prints them through probe-rs); a panic is
//! reported by panic-probe.

#![no_std]
#![no_main]

use defmt_rtt as _;
use embassy_executor::Spawner;
use embassy_nrf::buffered_uarte::{self, BufferedUarte};
use embassy_nrf::config::{HfclkSource, LfclkSource};
use embassy_nrf::temp::{self, Temp};
use embassy_nrf::{bind_interrupts, peripherals, rng, uarte};
use embassy_time::{Duration, Timer};
use panic_probe as _;
use wary::ledger::Ledger;
use wary_uplink::{Config, FLEET, Modem, Outbox, POLICY, Reading, SplitMix64, uplink};

/// Readings the sensor makes; the run ends when all have settled.
const READINGS: u32 = 20;
/// Small on purpose, as under QEMU: a modem slower than the sensor meets the full-outbox policy.
const OUTBOX: usize = 4;
/// Time between temperature readings.
const PERIOD: Duration = Duration::from_secs(1);
/// An answer not complete within this is a response timeout: a cellular modem's HTTP request
/// can take seconds (attach, DNS, TLS), far longer than the emulator under QEMU.
const MODEM_TIMEOUT: Duration = Duration::from_secs(15);

static OUTBOX_CELL: Outbox<OUTBOX> = Outbox::new();

bind_interrupts!(struct Irqs {
    UARTE0 => buffered_uarte::InterruptHandler<peripherals::UARTE0>;
    RNG => rng::InterruptHandler<peripherals::RNG>;
    TEMP => temp::InterruptHandler;
});

/// Reads the on-die temperature sensor `count` times, one every `period`, and offers each
/// reading until the outbox takes it (every refusal is counted by the outbox).
#[embassy_executor::task]
async fn sensor(mut temp: Temp<'static>, outbox: &'static Outbox<OUTBOX>, count: u32, period: Duration) {
    for seq in 0..count {
        // Quarter degrees Celsius.
        let quarters = temp.read().await.to_bits();
        let reading = Reading { seq, milli_celsius: quarters.saturating_mul(250) };
        defmt::debug!("reading {}", reading);
        while !outbox.offer(reading) {
            defmt::warn!("outbox full: reading {=u32} refused, offered again later", seq);
            Timer::after(period).await;
        }
        Timer::after(period).await;
    }
}

/// FICR DEVICEID[0]: the low 32 bits of the factory-programmed, per-chip 64-bit id.
fn device_id() -> u32 {
    nrf_pac::FICR.deviceid(0).read()
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let mut config = embassy_nrf::config::Config::default();
    // The DK has both crystals; the UART's baud rate is more accurate on the HFXO.
    config.hfclk_source = HfclkSource::ExternalXtal;
    config.lfclk_source = LfclkSource::ExternalXtal;
    let p = embassy_nrf::init(config);

    let device = device_id();
    // 8 bytes of jitter seed, then 4 of boot nonce (the keys' boot field), all from the
    // hardware RNG with bias correction: fresh at every boot.
    let (seed, boot) = {
        let mut rng = rng::Rng::new(p.RNG, Irqs);
        rng.set_bias_correction(true);
        let mut bytes = [0u8; 12];
        rng.fill_bytes(&mut bytes).await;
        let [s0, s1, s2, s3, s4, s5, s6, s7, b0, b1, b2, b3] = bytes;
        (u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]), u32::from_le_bytes([b0, b1, b2, b3]))
    };
    defmt::info!(
        "wary uplink on nRF52840-DK: device {=u32:08x}, boot nonce {=u32:08x}, jitter seed {=u64:016x}",
        device,
        boot,
        seed
    );

    // The modem's pins: TX P0.06, RX P0.08, the DK's VCOM pins (also wired to the on-board
    // J-Link's USB serial port). Any free GPIO works; firmware/README.md lists the free ones.
    let (modem_tx, modem_rx) = (p.P0_06, p.P0_08);
    let mut uart_config = uarte::Config::default();
    uart_config.baudrate = uarte::Baudrate::Baud115200;
    let mut rx_buffer = [0u8; 256];
    let mut tx_buffer = [0u8; 256];
    let uart = BufferedUarte::new(
        p.UARTE0,
        p.TIMER1,
        p.PPI_CH0,
        p.PPI_CH1,
        p.PPI_GROUP0,
        modem_rx,
        modem_tx,
        Irqs,
        uart_config,
        &mut rx_buffer,
        &mut tx_buffer,
    );
    let (rx, tx) = uart.split();
    let mut modem = Modem::new(rx, tx, MODEM_TIMEOUT);

    match sensor(Temp::new(p.TEMP, Irqs), &OUTBOX_CELL, READINGS, PERIOD) {
        Ok(token) => spawner.spawn(token),
        Err(_) => panic!("could not spawn the sensor task"),
    }

    let config = Config::new(device, boot, READINGS);
    let mut ledger = Ledger::<32>::new();
    let s =
        uplink(&config, &POLICY, &FLEET, SplitMix64::new(seed), &mut modem, &OUTBOX_CELL, &mut ledger).await;

    s.log(READINGS, OUTBOX_CELL.refused(), modem.noise(), modem.lost_answers());
    if s.all_landed(READINGS) {
        defmt::info!("every reading landed; idle");
    } else {
        defmt::error!("{=u32} of {=u32} readings did not land; idle", READINGS - s.landed, READINGS);
    }
}
