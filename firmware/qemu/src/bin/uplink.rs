//! The uplink application under QEMU: a sensor task fills a fixed-capacity outbox, the uplink
//! sends each reading as a keyed write through the wary runner over the modem on UART0 (the
//! `wary-modem` emulator on QEMU's chardev socket), then prints a summary and exits 0 only if
//! every reading landed.
//!
//! The jitter seed comes from the host, per run: `AT+SEED?` to the modem emulator. QEMU has no
//! non-volatile memory, so the boot count in the keys is fixed at [`BOOT`].

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use embassy_time::Duration;
use mps2_an386::{exit, exit_code};
use wary::ledger::Ledger;
use wary::{FleetBudget, Policy, Preset};
use wary_uplink::{Config, Modem, Outbox, SplitMix64, sense, uplink};

/// Readings the sensor makes; the run ends when all have settled.
const READINGS: u32 = 20;
/// Small on purpose, so a burst of readings meets the full-outbox policy.
const OUTBOX: usize = 4;
/// This device's id in every key.
const DEVICE: u32 = 0x0a38_6001;
/// Boot count in every key (no non-volatile memory under QEMU).
const BOOT: u32 = 1;
/// Seed used only if the modem does not answer `AT+SEED?` (logged as a warning).
const FALLBACK_SEED: u64 = 0x5eed_0a38_6001;

/// Milliseconds: 100 ms base, 2 s cap, 8 s of waits per call, at most 6 attempts.
static POLICY: Policy =
    match Policy::builder(Preset::Default).base(100).cap(2_000).budget(8_000).max_attempts(6).build() {
        Ok(p) => p,
        Err(_) => panic!("uplink policy refused"),
    };

/// The device-wide retry budget: 10 tokens, half a token back per success.
static FLEET: FleetBudget = match FleetBudget::new(10, 500) {
    Ok(f) => f,
    Err(_) => panic!("fleet budget refused"),
};

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

    let config = Config {
        device: DEVICE,
        boot: BOOT,
        readings: READINGS,
        round_pause: Duration::from_millis(500),
        max_rounds: 40,
    };
    let mut ledger = Ledger::<32>::new();
    let s =
        uplink(&config, &POLICY, &FLEET, SplitMix64::new(seed), &mut modem, &OUTBOX_CELL, &mut ledger).await;

    let mean = s.mean_milli;
    defmt::info!(
        "SUMMARY readings={=u32} landed={=u32} failed={=u32} gave_up={=u32} unknown={=u32} left={=u32} rounds={=u32} refused={=u32} noise={=u32} lost_answers={=u32} calls={=u32} attempts={=u64} mean={=u64}.{=u64:03} p95={=u32} max={=u32}",
        READINGS,
        s.landed,
        s.failed,
        s.gave_up,
        s.unknown,
        s.left,
        s.rounds,
        OUTBOX_CELL.refused(),
        modem.noise(),
        modem.lost_answers(),
        s.calls,
        s.attempts,
        mean / 1000,
        mean % 1000,
        s.p95,
        s.max
    );
    if s.landed == READINGS && s.failed == 0 && s.left == 0 {
        exit(exit_code::PASS)
    } else {
        defmt::error!("{=u32} of {=u32} readings did not land", READINGS - s.landed, READINGS);
        exit(exit_code::FAIL)
    }
}
