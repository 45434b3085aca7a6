//! What the outbox costs: flash writes and erases per delivered reading on an nRF52840-like
//! part (4-byte words, 4 KiB pages), and its RAM. Run with `--nocapture` to see the tables.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(clippy::arithmetic_side_effects)]
// Dropping an outbox is how these tests reset the device.
#![allow(clippy::drop_non_drop)]

mod common;

use core::mem::size_of_val;
use std::cell::Cell;

use common::Reading;
use embassy_futures::block_on;
use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use wary_outbox::sim::{FlashStats, SimError, SimFlash};
use wary_outbox::{Config, Counters, OpenReport, Outbox, Record, RecordId, Settlement};

const PAGE: u32 = 4096;
type Part<'m> = SimFlash<'m, 4, 4096>;
/// Two pages of boot counter, eight of queue.
const CONFIG: Config =
    Config { boot_range: 0..2 * PAGE, queue_range: 2 * PAGE..10 * PAGE, dead_range: 10 * PAGE..12 * PAGE };

/// The part, with its tally readable while an outbox holds it.
struct Watched<'f, 'm> {
    flash: &'f mut Part<'m>,
    stats: &'f Cell<FlashStats>,
}

impl ErrorType for Watched<'_, '_> {
    type Error = SimError;
}

impl ReadNorFlash for Watched<'_, '_> {
    const READ_SIZE: usize = 1;
    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), SimError> {
        let result = self.flash.read(offset, bytes).await;
        self.stats.set(self.flash.stats());
        result
    }
    fn capacity(&self) -> usize {
        self.flash.capacity()
    }
}

impl NorFlash for Watched<'_, '_> {
    const WRITE_SIZE: usize = 4;
    const ERASE_SIZE: usize = 4096;
    async fn erase(&mut self, from: u32, to: u32) -> Result<(), SimError> {
        let result = self.flash.erase(from, to).await;
        self.stats.set(self.flash.stats());
        result
    }
    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), SimError> {
        let result = self.flash.write(offset, bytes).await;
        self.stats.set(self.flash.stats());
        result
    }
}

impl MultiwriteNorFlash for Watched<'_, '_> {}

fn diff(after: FlashStats, before: FlashStats) -> FlashStats {
    FlashStats {
        reads: after.reads - before.reads,
        bytes_read: after.bytes_read - before.bytes_read,
        writes: after.writes - before.writes,
        bytes_written: after.bytes_written - before.bytes_written,
        pages_erased: after.pages_erased - before.pages_erased,
        bytes_erased: after.bytes_erased - before.bytes_erased,
        bits_not_set: after.bits_not_set - before.bits_not_set,
    }
}

/// Writes, bytes written, pages erased, bytes erased, reads, bytes read: each per reading.
fn per(stats: FlashStats, readings: u64) -> [f64; 6] {
    let r = readings as f64;
    [
        stats.writes as f64 / r,
        stats.bytes_written as f64 / r,
        stats.pages_erased as f64 / r,
        stats.bytes_erased as f64 / r,
        stats.reads as f64 / r,
        stats.bytes_read as f64 / r,
    ]
}

fn print(label: &str, v: [f64; 6]) {
    println!(
        "{label:<34} {:>7.2} {:>9.2} {:>8.4} {:>9.1} {:>8.1} {:>9.1}",
        v[0], v[1], v[2], v[3], v[4], v[5]
    );
}

#[test]
fn flash_wear_per_delivered_reading() {
    let mut memory = vec![0xFFu8; 12 * PAGE as usize];
    let mut part = Part::new(&mut memory);
    let stats = Cell::new(FlashStats::default());
    let flash = Watched { flash: &mut part, stats: &stats };
    let (mut outbox, _) = block_on(Outbox::<_, Reading>::open(flash, CONFIG)).map_err(|e| e.error).unwrap();
    let first_open = stats.get();
    println!(
        "{:<34} {:>7} {:>9} {:>8} {:>9} {:>8} {:>9}",
        "per delivered 14-byte reading", "writes", "B written", "erases", "B erased", "reads", "B read"
    );

    // Delivered as soon as made: push, then settle. Several passes over the queue's pages.
    const STEADY: u32 = 2_000;
    for n in 0..STEADY {
        let id = block_on(outbox.push(Reading::nth(n))).unwrap();
        assert!(block_on(outbox.settle(id, Settlement::Landed)).unwrap());
    }
    let v = per(diff(stats.get(), first_open), u64::from(STEADY));
    print("push + settle at once", v);
    // A 36-byte push (8-byte item header, 28-byte record) and an 8-byte settle, plus a page
    // marker or two per page: 44 bytes and change, in three writes and change.
    assert!(v[1] >= 44.0 && v[1] < 46.0, "bytes written per reading: {}", v[1]);
    assert!(v[0] >= 3.0 && v[0] < 3.1, "write operations per reading: {}", v[0]);
    // About 110 records fill a 4 KiB page, and each page is erased once per pass.
    assert!(v[2] > 1.0 / 130.0 && v[2] < 1.0 / 90.0, "pages erased per reading: {}", v[2]);

    // An outage: 100 readings queue up, then all are delivered, oldest first.
    let before = stats.get();
    let mut delivered = 0u64;
    for round in 0..10 {
        let ids: Vec<RecordId> =
            (0..100).map(|n| block_on(outbox.push(Reading::nth(round * 100 + n))).unwrap()).collect();
        for id in ids {
            assert!(block_on(outbox.settle(id, Settlement::Landed)).unwrap());
            delivered += 1;
        }
    }
    let v = per(diff(stats.get(), before), delivered);
    print("100 queued, then delivered", v);
    assert!(v[1] >= 44.0 && v[1] < 46.0, "bytes written per reading: {}", v[1]);
    drop(outbox);

    // A boot with an empty queue: one boot record (and, every few dozen boots, a page erase
    // of the counter's range).
    let before = stats.get();
    let flash = Watched { flash: &mut part, stats: &stats };
    let (outbox, _) = block_on(Outbox::<_, Reading>::open(flash, CONFIG)).map_err(|e| e.error).unwrap();
    drop(outbox);
    let boot = diff(stats.get(), before);
    print("one open (a boot), empty queue", per(boot, 1));
    // The 50-byte boot record (count, queue range, the last boots' history, the hold and the
    // dead letters' drop count) and the map's 8-byte item header, padded to whole words.
    assert!(boot.bytes_written > 0 && boot.bytes_written <= 60 && boot.pages_erased == 0, "{boot:?}");

    // Readings the server refuses: pushed, then moved to the dead letters. Once the region's two
    // pages are full, each letter costs a drop too: one boot record (the count) and the old
    // letter's header rewritten.
    let flash = Watched { flash: &mut part, stats: &stats };
    let (mut outbox, _) = block_on(Outbox::<_, Reading>::open(flash, CONFIG)).map_err(|e| e.error).unwrap();
    const FILL: u32 = 400;
    for n in 0..FILL {
        let id = block_on(outbox.push(Reading::nth(n))).unwrap();
        assert!(block_on(outbox.dead_letter(id, 422)).unwrap());
    }
    assert!(outbox.dead_dropped() > 0, "the region filled");
    let before = stats.get();
    const REFUSED: u32 = 1_000;
    for n in 0..REFUSED {
        let id = block_on(outbox.push(Reading::nth(n))).unwrap();
        assert!(block_on(outbox.dead_letter(id, 422)).unwrap());
    }
    let v = per(diff(stats.get(), before), u64::from(REFUSED));
    print("pushed, then dead-lettered (full)", v);
    // The push (36 bytes) and its removal (8), the 40-byte letter, and per drop a 60-byte boot
    // record and an 8-byte removal: about 152 bytes, with the map's page moves on top.
    assert!(v[1] > 140.0 && v[1] < 200.0, "bytes written per dead letter: {}", v[1]);
    drop(outbox);
    assert_eq!(part.stats().bits_not_set, 0, "never asked NOR to set a bit");
}

#[test]
fn ram_footprint() {
    let mut memory = vec![0xFFu8; 12 * PAGE as usize];
    let mut flash = Part::new(&mut memory);
    let (mut outbox, _) =
        block_on(Outbox::<_, Reading>::open(&mut flash, CONFIG)).map_err(|e| e.error).unwrap();
    let outbox_size = size_of_val(&outbox);
    let buffer = Outbox::<&mut Part<'_>, Reading>::BUFFER_SIZE;
    let push = size_of_val(&outbox.push(Reading::nth(0)));
    let settle = size_of_val(&outbox.settle(RecordId { boot: 1, seq: 0 }, Settlement::Landed));
    let next = size_of_val(&outbox.next_after(None));
    let dead_letter = size_of_val(&outbox.dead_letter(RecordId { boot: 1, seq: 0 }, 422));
    let open = {
        let mut other = vec![0xFFu8; 12 * PAGE as usize];
        let mut other_flash = Part::new(&mut other);
        size_of_val(&Outbox::<_, Reading>::open(&mut other_flash, CONFIG))
    };
    println!("Outbox<&mut flash, Reading>      {outbox_size:>5} bytes (of which the record buffer {buffer})");
    println!("Counters                         {:>5} bytes", core::mem::size_of::<Counters>());
    println!("OpenReport                       {:>5} bytes", core::mem::size_of::<OpenReport>());
    println!("Record<Reading>                  {:>5} bytes", core::mem::size_of::<Record<Reading>>());
    println!("future of open                   {open:>5} bytes");
    println!("future of push                   {push:>5} bytes");
    println!("future of settle                 {settle:>5} bytes");
    println!("future of next_after             {next:>5} bytes");
    println!("future of dead_letter            {dead_letter:>5} bytes");
    // The buffer is the bulk of the struct; the rest is a few words, the three ranges and the
    // boot record's history (unhealthy boots, backoff mark, dial window, hold, drops).
    assert!(outbox_size >= buffer && outbox_size <= buffer + 160, "{outbox_size}");
    assert_eq!(buffer, 96);
}
