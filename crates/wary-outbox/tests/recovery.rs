//! Bad flash at open (zeros, garbage, another format, an older record version, dirt in an
//! erased page), a full queue, flash errors, and settling out of order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(clippy::arithmetic_side_effects)]
// Dropping an outbox is how these tests reset the device.
#![allow(clippy::drop_non_drop)]

mod common;

use std::cell::Cell;

use common::{CONFIG, Flash, PAGE, Reading, SIZE, blank, open, pending};
use embassy_futures::block_on;
use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use proptest::prelude::*;
use sequential_storage::cache::Cache;
use sequential_storage::queue::{QueueConfig, QueueStorage};
use wary_outbox::sim::{Faults, SimError, SimFlash};
use wary_outbox::{Damage, Error, FlashFault, Outbox, PushError, RecordId, Settlement};

/// Pushes raw items into the queue range with the flash library directly, as another firmware
/// with another format would have.
fn push_raw(flash: &mut Flash<'_>, items: &[&[u8]]) {
    let mut queue = QueueStorage::new(flash, QueueConfig::new(CONFIG.queue_range), Cache::new_uncached());
    block_on(async {
        for item in items {
            queue.push(item, false).await.unwrap();
        }
    });
}

fn xorshift(seed: &mut u64) -> u8 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 24) as u8
}

/// After a recovery the outbox works: push, reopen, read back, settle.
fn works_after(flash: &mut Flash<'_>) {
    let (mut outbox, _) = open(flash);
    let id = block_on(outbox.push(Reading::nth(42))).unwrap();
    drop(outbox);
    let (mut outbox, report) = open(flash);
    assert!(report.is_clean(), "{report:?}");
    let found = pending(&mut outbox);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].id, found[0].entry), (id, Reading::nth(42)));
    assert!(block_on(outbox.settle(id, Settlement::Landed)).unwrap());
}

#[test]
fn a_zeroed_flash_is_recognised_erased_and_reported() {
    // What a fresh QEMU holds outside the ELF.
    let mut memory = vec![0u8; SIZE];
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.boot, 1);
    assert_eq!(report.pending, 0);
    assert!(report.boot_range_reset.is_some(), "{report:?}");
    assert!(report.queue_range_reset.is_some(), "{report:?}");
    assert!(report.dead_range_reset.is_some(), "{report:?}");
    assert_eq!(outbox.counters().regions_reset, 3);
    assert!(pending(&mut outbox).is_empty());
    drop(outbox);
    works_after(&mut flash);
}

#[test]
fn garbage_is_recognised_and_never_returned_as_a_reading() {
    for seed in 1..=20u64 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut memory: Vec<u8> = (0..SIZE).map(|_| xorshift(&mut state)).collect();
        let mut flash = Flash::new(&mut memory);
        let (mut outbox, report) = open(&mut flash);
        assert!(!report.is_clean(), "seed {seed}: {report:?}");
        assert_eq!(report.boot, 1, "seed {seed}");
        assert!(pending(&mut outbox).is_empty(), "seed {seed}");
        drop(outbox);
        works_after(&mut flash);
    }
}

#[test]
fn a_queue_of_another_format_is_erased_as_foreign() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    push_raw(&mut flash, &[b"temperature=21.5", b"{\"seq\":1}", &[0xFF; 14]]);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.queue_range_reset, Some(Damage::Foreign), "{report:?}");
    assert_eq!(report.boot_range_reset, None, "a blank counter range is not damage");
    assert_eq!(report.pending, 0);
    assert!(pending(&mut outbox).is_empty());
    drop(outbox);
    works_after(&mut flash);
}

#[test]
fn foreign_and_older_records_among_ours_are_discarded_one_by_one() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let first = block_on(outbox.push(Reading::nth(1))).unwrap();
    drop(outbox);
    // An older outbox's record (same magic, version 0, otherwise well formed) and one of
    // another format, behind ours in the same queue.
    let older = [
        b'W', b'O', 0, 0x21, 14, 1, 0, 0, 0, 9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xC3,
    ];
    push_raw(&mut flash, &[&older, b"not ours"]);

    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.foreign_discarded, 2, "{report:?}");
    assert_eq!(report.queue_range_reset, None, "our records are kept: {report:?}");
    assert_eq!(report.pending, 1);
    assert_eq!(outbox.counters().foreign_discarded, 2);
    let second = block_on(outbox.push(Reading::nth(2))).unwrap();
    drop(outbox);

    let (mut outbox, again) = open(&mut flash);
    assert!(again.is_clean(), "discarded for good: {again:?}");
    let found = pending(&mut outbox);
    assert_eq!(
        found.iter().map(|r| (r.id, r.entry)).collect::<Vec<_>>(),
        vec![(first, Reading::nth(1)), (second, Reading::nth(2))]
    );
}

#[test]
fn dirt_in_an_erased_page_is_scrubbed_before_it_is_written_over() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let id = block_on(outbox.push(Reading::nth(1))).unwrap();
    drop(outbox);
    // The queue's third page is still erased; a stray write lands in its middle.
    let dirt = (CONFIG.queue_range.start + 2 * PAGE) as usize + 100;
    flash.memory()[dirt] = 0x00;
    let (outbox, report) = open(&mut flash);
    assert_eq!(report.pages_scrubbed, 1, "{report:?}");
    drop(outbox);
    assert_eq!(flash.memory()[dirt], 0xFF);
    // Fill past that page: every record reads back.
    let (mut outbox, _) = open(&mut flash);
    let mut ids = vec![id];
    for n in 2..16 {
        ids.push(block_on(outbox.push(Reading::nth(n))).unwrap());
    }
    let found: Vec<RecordId> = pending(&mut outbox).iter().map(|r| r.id).collect();
    assert_eq!(found, ids);
}

#[test]
fn a_damaged_counter_range_restarts_above_the_newest_queued_record() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let mut last = None;
    for n in 0..7 {
        let (mut outbox, _) = open(&mut flash);
        last = Some(block_on(outbox.push(Reading::nth(n))).unwrap());
    }
    let last = last.unwrap();
    assert_eq!(last.boot, 7);
    flash.memory()[..2 * PAGE as usize].fill(0x5A);
    let (mut outbox, report) = open(&mut flash);
    assert!(report.boot_range_reset.is_some(), "{report:?}");
    assert_eq!(report.boot, 8, "above the newest record's boot");
    assert_eq!(report.pending, 7, "the queue is kept");
    assert_eq!(pending(&mut outbox).last().map(|r| r.id), Some(last));
}

#[test]
fn a_full_queue_refuses_hands_the_entry_back_and_counts() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let mut ids = vec![];
    let refused = loop {
        let n = ids.len() as u32;
        match block_on(outbox.push(Reading::nth(n))) {
            Ok(id) => ids.push(id),
            Err(PushError::Full(entry)) => break entry,
            Err(other) => panic!("{other:?}"),
        }
        assert!(ids.len() < 1000);
    };
    // Four 256-byte pages of six 36-byte records; the page being filled must wrap onto a page
    // with pending records, so at least three pages' worth fit.
    assert!(ids.len() >= 18 && ids.len() <= 24, "{}", ids.len());
    assert_eq!(refused, Reading::nth(ids.len() as u32));
    assert!(matches!(block_on(outbox.push(Reading::nth(99))), Err(PushError::Full(_))));
    assert_eq!(outbox.counters().refused, 2);
    assert_eq!(outbox.counters().accepted, ids.len() as u32);
    assert_eq!(outbox.len(), ids.len() as u32);

    // Settling a record on the oldest page is not enough while its neighbours are pending...
    assert!(block_on(outbox.settle(ids[1], Settlement::Landed)).unwrap());
    assert!(matches!(block_on(outbox.push(Reading::nth(99))), Err(PushError::Full(_))));
    // ...settling the whole page frees it.
    for id in &ids[..6] {
        let _ = block_on(outbox.settle(*id, Settlement::Failed)).unwrap();
    }
    let next = block_on(outbox.push(Reading::nth(100))).unwrap();
    assert_eq!(outbox.counters().failed, 5);
    assert_eq!(outbox.counters().landed, 1);
    assert_eq!(outbox.counters().settled(), 6);
    let found: Vec<RecordId> = pending(&mut outbox).iter().map(|r| r.id).collect();
    let mut expected: Vec<RecordId> = ids[6..].to_vec();
    expected.push(next);
    assert_eq!(found, expected, "nothing dropped, oldest first");
}

#[test]
fn settling_marks_only_ok_and_failed_and_walks_past_kept_records() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let ids: Vec<RecordId> = (0..5).map(|n| block_on(outbox.push(Reading::nth(n))).unwrap()).collect();
    // A round: 0 lands, 1 gives up (kept), 2 fails, 3 is unknown (kept), 4 lands.
    let mut cursor = None;
    let mut seen = vec![];
    while let Some(record) = block_on(outbox.next_after(cursor)).unwrap() {
        seen.push(record.id);
        match record.id.seq {
            0 | 4 => assert!(block_on(outbox.settle(record.id, Settlement::Landed)).unwrap()),
            2 => assert!(block_on(outbox.settle(record.id, Settlement::Failed)).unwrap()),
            _ => {}
        }
        cursor = Some(record.id);
    }
    assert_eq!(seen, ids);
    let kept: Vec<RecordId> = pending(&mut outbox).iter().map(|r| r.id).collect();
    assert_eq!(kept, vec![ids[1], ids[3]]);
    assert_eq!(block_on(outbox.oldest()).unwrap().map(|r| r.id), Some(ids[1]));
    assert!(!block_on(outbox.settle(ids[0], Settlement::Landed)).unwrap(), "settled already");
    assert!(!block_on(outbox.settle(RecordId { boot: 9, seq: 0 }, Settlement::Landed)).unwrap());
    assert_eq!(outbox.len(), 2);
}

/// A flash whose faults a test switches while an outbox holds it.
struct Switched<'f, 'm> {
    flash: &'f mut Flash<'m>,
    faults: &'f Cell<Faults>,
}

impl ErrorType for Switched<'_, '_> {
    type Error = SimError;
}

impl ReadNorFlash for Switched<'_, '_> {
    const READ_SIZE: usize = 1;
    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), SimError> {
        self.flash.fail(self.faults.get());
        self.flash.read(offset, bytes).await
    }
    fn capacity(&self) -> usize {
        self.flash.capacity()
    }
}

impl NorFlash for Switched<'_, '_> {
    const WRITE_SIZE: usize = 4;
    const ERASE_SIZE: usize = 256;
    async fn erase(&mut self, from: u32, to: u32) -> Result<(), SimError> {
        self.flash.fail(self.faults.get());
        self.flash.erase(from, to).await
    }
    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), SimError> {
        self.flash.fail(self.faults.get());
        self.flash.write(offset, bytes).await
    }
}

impl MultiwriteNorFlash for Switched<'_, '_> {}

const WRITES_FAIL: Faults = Faults { reads: false, writes: true, erases: true };
const READS_FAIL: Faults = Faults { reads: true, writes: false, erases: false };

#[test]
fn a_failing_flash_makes_open_fail_typed_and_hands_the_flash_back() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let id = block_on(outbox.push(Reading::nth(1))).unwrap();
    drop(outbox);

    for faults in [WRITES_FAIL, READS_FAIL] {
        flash.fail(faults);
        let e = block_on(Outbox::<_, Reading>::open(&mut flash, CONFIG)).err().expect("open fails");
        assert_eq!(e.error, Error::Flash(FlashFault::Other), "{faults:?}");
        // The flash came back: clear the fault and open it.
        e.flash.fail(Faults::default());
        let (mut outbox, report) = open(e.flash);
        assert!(report.is_clean(), "a failed open damaged nothing: {report:?}");
        assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![id]);
    }
}

#[test]
fn flash_errors_under_an_open_outbox_are_counted_typed_and_give_the_entry_back() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let faults = Cell::new(Faults::default());
    let switched = Switched { flash: &mut flash, faults: &faults };
    let (mut outbox, _) =
        block_on(Outbox::<_, Reading>::open(switched, CONFIG)).map_err(|e| e.error).unwrap();
    let kept = block_on(outbox.push(Reading::nth(1))).unwrap();

    faults.set(WRITES_FAIL);
    match block_on(outbox.push(Reading::nth(2))) {
        Err(PushError::Failed(entry, Error::Flash(FlashFault::Other))) => assert_eq!(entry, Reading::nth(2)),
        other => panic!("{other:?}"),
    }
    assert_eq!(block_on(outbox.settle(kept, Settlement::Landed)), Err(Error::Flash(FlashFault::Other)));
    faults.set(READS_FAIL);
    assert_eq!(block_on(outbox.oldest()), Err(Error::Flash(FlashFault::Other)));
    let counters = outbox.counters();
    assert_eq!(counters.flash_errors, 3);
    assert_eq!((counters.accepted, counters.landed), (1, 0));

    // Once the flash works again nothing was lost, and the failed push left nothing behind.
    faults.set(Faults::default());
    let next = block_on(outbox.push(Reading::nth(3))).unwrap();
    assert_eq!(next.seq, kept.seq + 2, "the failed push spent its sequence number");
    drop(outbox);
    let (mut outbox, _) = open(&mut flash);
    assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![kept, next]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the flash holds, open never panics, reports it, hands back nothing that is
    /// not a reading, and the outbox works afterwards.
    #[test]
    fn any_flash_content_opens_to_a_working_outbox(
        content in proptest::collection::vec(any::<u8>(), SIZE),
        erased_pages in proptest::collection::vec(any::<bool>(), 6),
    ) {
        let mut memory = content;
        for (page, erased) in erased_pages.iter().enumerate() {
            if *erased {
                memory[page * PAGE as usize..(page + 1) * PAGE as usize].fill(0xFF);
            }
        }
        let mut flash = SimFlash::<4, 256>::new(&mut memory);
        let (mut outbox, report) = open(&mut flash);
        prop_assert_eq!(report.boot, 1);
        prop_assert!(pending(&mut outbox).is_empty());
        drop(outbox);
        works_after(&mut flash);
    }
}

#[test]
fn unchanged_history_writes_nothing_and_a_settled_mark_is_forgotten() {
    let mut memory = common::blank();
    let mut flash = common::Flash::new(&mut memory);
    let (mut outbox, report) = common::open(&mut flash);
    assert_eq!((report.unhealthy_boots, report.backoff), (0, None));
    let a = embassy_futures::block_on(outbox.push(common::Reading::nth(0))).unwrap();
    let mark = Some(wary_outbox::BackoffMark { id: a, step: 3 });
    embassy_futures::block_on(outbox.set_backoff(mark)).unwrap();
    assert_eq!(embassy_futures::block_on(outbox.mark_healthy()), Ok(true));
    drop(outbox);
    // The same boot without the calls that change nothing, on a copy of the flash.
    let mut copy = memory_of(&mut flash);
    let control = {
        let mut flash = common::Flash::new(&mut copy);
        {
            let (mut outbox, _) = common::open(&mut flash);
            assert_eq!(embassy_futures::block_on(outbox.mark_healthy()), Ok(true));
            embassy_futures::block_on(outbox.settle(a, wary_outbox::Settlement::Landed)).unwrap();
        }
        flash.stats()
    };
    let before = flash.stats();
    {
        let (mut outbox, report) = common::open(&mut flash);
        assert_eq!((report.unhealthy_boots, report.backoff), (0, mark));
        embassy_futures::block_on(outbox.set_backoff(mark)).unwrap();
        embassy_futures::block_on(outbox.set_dial_window(wary_outbox::DialWindow::default())).unwrap();
        embassy_futures::block_on(outbox.set_hold(None)).unwrap();
        assert_eq!(embassy_futures::block_on(outbox.mark_healthy()), Ok(true));
        assert_eq!(embassy_futures::block_on(outbox.mark_healthy()), Ok(false));
        embassy_futures::block_on(outbox.settle(a, wary_outbox::Settlement::Landed)).unwrap();
    }
    let after_first = flash.stats();
    // The open wrote its boot record, mark_healthy one more, the settle its record: the
    // unchanged mark, the unchanged dial window, the hold that was none already and the second
    // mark_healthy wrote nothing, so the flash saw what it saw without them.
    assert_eq!(after_first.writes - before.writes, control.writes, "{before:?} {after_first:?} {control:?}");
    assert_eq!(after_first.bytes_written - before.bytes_written, control.bytes_written);
    // The mark's reading has landed: the next boot has no mark, and was healthy before.
    let (outbox, report) = common::open(&mut flash);
    assert_eq!((report.unhealthy_boots, report.backoff), (0, None));
    assert_eq!(outbox.backoff(), None);
}

/// A copy of the flash's memory.
fn memory_of(flash: &mut Flash<'_>) -> Vec<u8> {
    flash.memory().to_vec()
}
