//! The uplink application under QEMU: a sensor task fills a fixed-capacity outbox, the uplink
//! sends each reading as a keyed write through the wary runner over the modem on UART0 (the
//! `wary-modem` emulator on QEMU's chardev socket), then prints a summary and exits 0 only if
//! every reading landed.
//!
//! The jitter seed comes from the host, per run: `AT+SEED?` to the modem emulator. QEMU has no
//! non-volatile memory and no RNG, so the boot field of the keys is a per-boot nonce derived
//! from that seed ([`boot_nonce`]): a new run (a "reboot") gets new keys, as on real hardware.

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use embassy_time::Duration;
use mps2_an386::{exit, exit_code};
use wary::ledger::Ledger;
use wary_uplink::{Config, FLEET, Modem, Outbox, POLICY, SplitMix64, sense, uplink};

/// Readings the sensor makes; the run ends when all have settled.
const READINGS: u32 = 20;
/// Small on purpose, so a burst of readings meets the full-outbox policy.
const OUTBOX: usize = 4;
/// This device's id in every key.
const DEVICE: u32 = 0x0a38_6001;
/// Seed used only if the modem does not answer `AT+SEED?` (logged as a warning).
const FALLBACK_SEED: u64 = 0x5eed_0a38_6001;

/// The boot field of the keys: the host's per-run seed through SplitMix64's finalizer (a
/// bijection, so distinct seeds rarely share their high 32 bits), kept apart from the jitter
/// stream; unique per run with high probability.
fn boot_nonce(seed: u64) -> u32 {
    let mut z = seed ^ 0xb007_b007_b007_b007;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 32) as u32
}

static OUTBOX_CELL: Outbox<OUTBOX> = Outbox::new();

#[embassy_executor::task]
async fn sensor(outbox: &'static Outbox<OUTBOX>) {
    sense(outbox, READINGS, Duration::from_millis(40)).await;
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let board = mps2_an386::init();
    let (tx, rx) = board.uart0.split();
    // Generous: guest time runs slow on a busy host, and the modem's own HTTP timeout is 1.5 s.
    let mut modem = Modem::new(rx, tx, Duration::from_millis(3_000));

    let seed = match modem.seed().await {
        Some(seed) => {
            defmt::info!("jitter seed {=u64} from the host (AT+SEED?)", seed);
            seed
        }
        None => {
            defmt::warn!("no seed from the modem: using the fallback seed");
            FALLBACK_SEED
        }
    };

    match sensor(&OUTBOX_CELL) {
        Ok(token) => spawner.spawn(token),
        Err(_) => {
            defmt::error!("could not spawn the sensor task");
            exit(exit_code::FAIL)
        }
    }

    let boot = boot_nonce(seed);
    defmt::info!("device {=u32:08x}, boot nonce {=u32:08x}", DEVICE, boot);
    let config = Config::new(DEVICE, boot, READINGS);
    let mut ledger = Ledger::<32>::new();
    let s =
        uplink(&config, &POLICY, &FLEET, SplitMix64::new(seed), &mut modem, &OUTBOX_CELL, &mut ledger).await;

    s.log(READINGS, OUTBOX_CELL.refused(), modem.noise(), modem.lost_answers());
    if s.all_landed(READINGS) {
        exit(exit_code::PASS)
    } else {
        defmt::error!("{=u32} of {=u32} readings did not land", READINGS - s.landed, READINGS);
        exit(exit_code::FAIL)
    }
}
