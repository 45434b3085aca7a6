//! Proves the durable outbox across real guest resets: readings pushed before a `SYSRESETREQ`
//! are pending after it with the ids they were made under, settled ones stay gone, and the boot
//! counter goes up by one per boot. Runs four boots of one QEMU process (do not pass
//! `-no-reboot`); the phase is counted in a PSRAM word that survives the resets.
//!
//! 1. Fresh QEMU: PSRAM holds zeros, which the outbox must treat as foreign. Push 3, reset.
//! 2. The 3 are pending as (1,0), (1,1), (1,2). Settle (1,1), push 2, reset.
//! 3. (1,0), (1,2), (2,0), (2,1) are pending. Settle all but (2,1), push 1, reset.
//! 4. (2,1) and (3,0) are pending; boot 4. Exit 0.

#![no_std]
#![no_main]

use embassy_futures::block_on;
use mps2_an386::flash::{self, PsramFlash, SurvivingWord};
use wary_outbox::{Config, Entry, OpenReport, Outbox, RecordId, Settlement};
use wary_qemu::Tally;

/// Boot counter in the first two pages, the queue in the next eight.
const CONFIG: Config =
    Config { boot_range: 0..0x2000, queue_range: 0x2000..0xA000, dead_range: 0xA000..0xC000 };
/// Marks the surviving word as ours (the top half); the phase is the bottom half.
const PHASE_MAGIC: u32 = 0xF1A5_0000;
/// Phases before the final one; each ends in a reset.
const LAST_PHASE: u32 = 3;

/// A reading as the test makes it: the n-th reading of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
struct Reading {
    n: u32,
    milli_celsius: i32,
}

impl Reading {
    fn nth(n: u32) -> Self {
        Reading { n, milli_celsius: 20_000 + (n as i32) * 125 }
    }
}

impl Entry for Reading {
    const TAG: u8 = 0x51;
    const MAX_SIZE: usize = 8;

    fn encode(&self, buf: &mut [u8]) -> usize {
        let mut bytes = [0u8; 8];
        let (n, c) = bytes.split_at_mut(4);
        n.copy_from_slice(&self.n.to_le_bytes());
        c.copy_from_slice(&self.milli_celsius.to_le_bytes());
        match buf.get_mut(..8) {
            Some(out) => {
                out.copy_from_slice(&bytes);
                8
            }
            None => 0,
        }
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; 8] = bytes.try_into().ok()?;
        let [n0, n1, n2, n3, c0, c1, c2, c3] = *bytes;
        Some(Reading {
            n: u32::from_le_bytes([n0, n1, n2, n3]),
            milli_celsius: i32::from_le_bytes([c0, c1, c2, c3]),
        })
    }
}

const fn id(boot: u32, seq: u32) -> RecordId {
    RecordId { boot, seq }
}

type Box = Outbox<PsramFlash, Reading>;

#[cortex_m_rt::entry]
fn main() -> ! {
    let word = SurvivingWord::new();
    let phase = match word.get() {
        w if w & 0xFFFF_0000 == PHASE_MAGIC => w & 0xFFFF,
        // Whatever a fresh QEMU holds there: the first boot.
        _ => 0,
    };
    defmt::info!("flashtest: phase {=u32}", phase);
    let mut checks = Checks { tally: Tally::new(), failed: false };
    let Some(flash) = flash::take() else {
        checks.check("the emulated flash is handed out once", false);
        checks.tally.finish()
    };
    block_on(run(phase, flash, &mut checks));
    // A failure ends the run at once rather than resetting into the next phase.
    if checks.failed || phase >= LAST_PHASE {
        checks.tally.finish()
    }
    word.set(PHASE_MAGIC | (phase + 1));
    defmt::info!("phase {=u32} done: resetting the guest", phase);
    flash::reset()
}

/// The tally of this boot's checks, and whether any failed.
struct Checks {
    tally: Tally,
    failed: bool,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool) {
        self.failed |= !ok;
        self.tally.check(name, ok);
    }
}

async fn run(phase: u32, flash: PsramFlash, checks: &mut Checks) {
    let (mut outbox, report) = match Box::open(flash, CONFIG).await {
        Ok(opened) => opened,
        Err(e) => {
            defmt::error!("open failed: {}", e.error);
            checks.check("the outbox opens", false);
            return;
        }
    };
    log_report(&report);
    if phase == 0 {
        // Futures are never polled here: their sizes are what a task holds while awaiting.
        let push = core::mem::size_of_val(&outbox.push(Reading::nth(0)));
        let settle = core::mem::size_of_val(&outbox.settle(id(0, 0), Settlement::Landed));
        defmt::info!(
            "RAM: outbox {=usize} bytes, push future {=usize} bytes, settle future {=usize} bytes",
            core::mem::size_of::<Box>(),
            push,
            settle
        );
    }
    checks.check("the boot counter is one more than the boot before", report.boot == phase + 1);
    match phase {
        0 => {
            checks.check(
                "a fresh QEMU's PSRAM is recognised as foreign and erased",
                report.boot_range_reset.is_some() && report.queue_range_reset.is_some(),
            );
            expect_pending(&mut outbox, &[], checks).await;
            push(&mut outbox, &[(0, id(1, 0)), (1, id(1, 1)), (2, id(1, 2))], checks).await;
        }
        1 => {
            checks.check("a reset is not damage", report.is_clean());
            expect_pending(&mut outbox, &[(0, id(1, 0)), (1, id(1, 1)), (2, id(1, 2))], checks).await;
            settle(&mut outbox, id(1, 1), checks).await;
            push(&mut outbox, &[(3, id(2, 0)), (4, id(2, 1))], checks).await;
        }
        2 => {
            checks.check("a reset is not damage", report.is_clean());
            let before = [(0, id(1, 0)), (2, id(1, 2)), (3, id(2, 0)), (4, id(2, 1))];
            expect_pending(&mut outbox, &before, checks).await;
            for settled in [id(1, 0), id(2, 0), id(1, 2)] {
                settle(&mut outbox, settled, checks).await;
            }
            push(&mut outbox, &[(5, id(3, 0))], checks).await;
        }
        _ => {
            checks.check("a reset is not damage", report.is_clean());
            expect_pending(&mut outbox, &[(4, id(2, 1)), (5, id(3, 0))], checks).await;
        }
    }
}

fn log_report(report: &OpenReport) {
    defmt::info!(
        "open: boot {=u32}, {=u32} pending, boot range reset {}, queue range reset {}, {=u32} foreign, {=u32} scrubbed",
        report.boot,
        report.pending,
        report.boot_range_reset,
        report.queue_range_reset,
        report.foreign_discarded,
        report.pages_scrubbed
    );
}

async fn push(outbox: &mut Box, readings: &[(u32, RecordId)], checks: &mut Checks) {
    for &(n, expected) in readings {
        let pushed = outbox.push(Reading::nth(n)).await;
        if let Ok(got) = pushed {
            defmt::info!("pushed reading {=u32} as {}", n, got);
        }
        checks.check("a push returns the next id of this boot", pushed == Ok(expected));
    }
}

async fn settle(outbox: &mut Box, settled: RecordId, checks: &mut Checks) {
    let removed = outbox.settle(settled, Settlement::Landed).await;
    defmt::info!("settled {}: {}", settled, removed);
    checks.check("a pending record settles", removed == Ok(true));
}

/// Checks the pending records, oldest first, against (reading, id) pairs.
async fn expect_pending(outbox: &mut Box, expected: &[(u32, RecordId)], checks: &mut Checks) {
    let mut seen = 0usize;
    let mut same = true;
    match outbox.pending().await {
        Ok(mut pending) => loop {
            match pending.next().await {
                Ok(Some(record)) => {
                    defmt::info!("pending {} {}", record.id, record.entry);
                    same &= expected
                        .get(seen)
                        .is_some_and(|&(n, id)| record.id == id && record.entry == Reading::nth(n));
                    seen += 1;
                }
                Ok(None) => break,
                Err(e) => {
                    defmt::error!("reading the queue: {}", e);
                    same = false;
                    break;
                }
            }
        },
        Err(e) => {
            defmt::error!("reading the queue: {}", e);
            same = false;
        }
    }
    same &= seen == expected.len();
    checks.check("the pending records survived the reset with their ids, oldest first", same);
    checks.check("the pending count agrees", outbox.len() as usize == expected.len());
}
