//! The dead-letter region and the hold mark: a round trip, a reopen, a full region dropping
//! its oldest letters (counted, and the count kept over a reset), a move cut between its two
//! steps, damage in the region, and the hold surviving a reset until it is cleared.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(clippy::arithmetic_side_effects)]
// Dropping an outbox is how these tests reset the device.
#![allow(clippy::drop_non_drop)]

mod common;

use common::{Box, CONFIG, Flash, PAGE, Reading, blank, open, pending};
use embassy_futures::block_on;
use sequential_storage::cache::Cache;
use sequential_storage::queue::{QueueConfig, QueueStorage};
use wary_outbox::{
    BackoffMark, Config, ConfigError, Damage, DeadLetter, Entry, Error, HoldMark, OpenError, Outbox,
    RecordId, Settlement,
};

/// Every dead letter, by id.
fn dead(outbox: &mut Box<'_, '_>) -> Vec<DeadLetter<Reading>> {
    block_on(async {
        let mut all: Vec<DeadLetter<Reading>> = vec![];
        let mut after = None;
        while let Some(letter) = outbox.next_dead_after(after).await.unwrap() {
            after = Some(letter.id);
            all.push(letter);
        }
        all
    })
}

fn ids_of(letters: &[DeadLetter<Reading>]) -> Vec<RecordId> {
    letters.iter().map(|letter| letter.id).collect()
}

/// A dead letter as the outbox lays it out on 4-byte words (see `src/dead_letter.rs`).
fn raw_letter(id: RecordId, reason: u16, reading: &Reading) -> Vec<u8> {
    let mut body = [0u8; 14];
    assert_eq!(reading.encode(&mut body), 14);
    let mut out = vec![b'W', b'D', 1, Reading::TAG, 14];
    out.extend_from_slice(&id.boot.to_le_bytes());
    out.extend_from_slice(&id.seq.to_le_bytes());
    out.extend_from_slice(&reason.to_le_bytes());
    out.extend_from_slice(&body);
    while out.len() % 4 != 3 {
        out.push(0);
    }
    out.push(0xC3);
    out
}

/// Pushes raw items into the dead-letter range with the flash library directly.
fn push_raw_dead(flash: &mut Flash<'_>, items: &[&[u8]]) {
    let mut queue = QueueStorage::new(flash, QueueConfig::new(CONFIG.dead_range), Cache::new_uncached());
    block_on(async {
        for item in items {
            queue.push(item, false).await.unwrap();
        }
    });
}

#[test]
fn a_dead_letter_round_trips() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!((report.dead_letters, report.dead_dropped, report.dead_settled), (0, 0, 0));
    assert!(report.is_clean(), "{report:?}");
    let ids: Vec<RecordId> = (0..4).map(|n| block_on(outbox.push(Reading::nth(n))).unwrap()).collect();

    // Out of order, as a server refuses them.
    assert_eq!(block_on(outbox.dead_letter(ids[2], 422)), Ok(true));
    assert_eq!(block_on(outbox.dead_letter(ids[0], 400)), Ok(true));
    // Not pending any more, or never pushed: nothing happens.
    assert_eq!(block_on(outbox.dead_letter(ids[2], 422)), Ok(false));
    assert_eq!(block_on(outbox.dead_letter(RecordId { boot: 9, seq: 9 }, 400)), Ok(false));
    assert!(block_on(outbox.settle(ids[3], Settlement::Landed)).unwrap());
    assert_eq!(block_on(outbox.dead_letter(ids[3], 400)), Ok(false), "settled already");

    assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox.dead_count(), 2);
    assert_eq!(outbox.dead_dropped(), 0);
    assert_eq!(outbox.counters().dead_lettered, 2);
    assert_eq!(outbox.counters().settled(), 1, "a dead letter is not a settlement");
    let letters = dead(&mut outbox);
    assert_eq!(
        letters,
        vec![
            DeadLetter { id: ids[0], reason: 400, entry: Reading::nth(0) },
            DeadLetter { id: ids[2], reason: 422, entry: Reading::nth(2) },
        ]
    );
    // The walk by id: after the first, the second; after the last, none.
    assert_eq!(block_on(outbox.next_dead_after(Some(ids[0]))).unwrap().map(|l| l.id), Some(ids[2]));
    assert_eq!(block_on(outbox.next_dead_after(Some(ids[1]))).unwrap().map(|l| l.id), Some(ids[2]));
    assert_eq!(block_on(outbox.next_dead_after(Some(ids[2]))).unwrap(), None);
}

#[test]
fn dead_letters_survive_a_reopen_and_the_count_steps_over_them() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let a = block_on(outbox.push(Reading::nth(1))).unwrap();
    let b = block_on(outbox.push(Reading::nth(2))).unwrap();
    assert!(block_on(outbox.dead_letter(a, 415)).unwrap());
    drop(outbox);

    let (mut outbox, report) = open(&mut flash);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.pending, report.dead_letters, report.dead_settled), (1, 1, 0));
    assert_eq!(outbox.dead_count(), 1);
    assert_eq!(dead(&mut outbox), vec![DeadLetter { id: a, reason: 415, entry: Reading::nth(1) }]);
    assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![b]);
    // Settle the last pending record: the dead letter is the only trace of boot 1's ids.
    assert!(block_on(outbox.settle(b, Settlement::Landed)).unwrap());
    drop(outbox);

    // A damaged counter range restarts the count above the dead letters too.
    flash.memory()[..2 * PAGE as usize].fill(0x5A);
    let (mut outbox, report) = open(&mut flash);
    assert!(report.boot_range_reset.is_some(), "{report:?}");
    assert!(report.boot > a.boot, "{report:?}");
    assert_eq!(report.dead_letters, 1);
    assert_eq!(ids_of(&dead(&mut outbox)), vec![a]);
}

#[test]
fn a_full_region_drops_its_oldest_letters_and_counts_every_drop() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    // Letters of a 14-byte reading take 40 bytes on 4-byte words: six on a 256-byte page, so
    // two pages hold twelve. Dead-letter them newest first, so the region's order is not the
    // id order.
    let ids: Vec<RecordId> = (0..20).map(|n| block_on(outbox.push(Reading::nth(n))).unwrap()).collect();
    let mut order: Vec<RecordId> = ids[..12].iter().rev().copied().collect();
    for &id in &order {
        assert!(block_on(outbox.dead_letter(id, 400)).unwrap());
    }
    assert_eq!((outbox.dead_count(), outbox.dead_dropped()), (12, 0));
    let mut expected = ids[..12].to_vec();
    assert_eq!(ids_of(&dead(&mut outbox)), expected);

    // The thirteenth finds no room: the six letters of the oldest page go, oldest first.
    assert!(block_on(outbox.dead_letter(ids[12], 409)).unwrap());
    assert_eq!(outbox.dead_dropped(), 6);
    assert_eq!(outbox.dead_count(), 7);
    let dropped: Vec<RecordId> = order.drain(..6).collect();
    order.push(ids[12]);
    expected.retain(|id| !dropped.contains(id));
    expected.push(ids[12]);
    expected.sort();
    assert_eq!(ids_of(&dead(&mut outbox)), expected);
    // The rest fit on the freed page without dropping more.
    for &id in &ids[13..18] {
        assert!(block_on(outbox.dead_letter(id, 409)).unwrap());
    }
    assert_eq!((outbox.dead_count(), outbox.dead_dropped()), (12, 6));
    // And the next drops the next page's six.
    assert!(block_on(outbox.dead_letter(ids[18], 410)).unwrap());
    assert_eq!((outbox.dead_count(), outbox.dead_dropped()), (7, 12));
    let letters = dead(&mut outbox);
    assert_eq!(ids_of(&letters), ids[12..19].to_vec());
    assert_eq!(letters.last(), Some(&DeadLetter { id: ids[18], reason: 410, entry: Reading::nth(18) }));
    assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[19]]);
    drop(outbox);

    // The count is on flash.
    let (mut outbox, report) = open(&mut flash);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.dead_letters, report.dead_dropped, report.pending), (7, 12, 1));
    assert_eq!(outbox.dead_dropped(), 12);
    assert_eq!(ids_of(&dead(&mut outbox)), ids[12..19].to_vec());
    // Other history writes keep it.
    block_on(outbox.mark_healthy()).unwrap();
    drop(outbox);
    let (_, report) = open(&mut flash);
    assert_eq!(report.dead_dropped, 12);
}

#[test]
fn a_move_cut_between_its_two_steps_leaves_the_record_a_dead_letter_only() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    let a = block_on(outbox.push(Reading::nth(1))).unwrap();
    let b = block_on(outbox.push(Reading::nth(2))).unwrap();
    let c = block_on(outbox.push(Reading::nth(3))).unwrap();
    // The backoff mark is on the record the cut leaves in both places.
    block_on(outbox.set_backoff(Some(BackoffMark { id: b, step: 2 }))).unwrap();
    drop(outbox);
    // What a cut after the first step leaves: the dead letter written, the record pending.
    push_raw_dead(&mut flash, &[&raw_letter(b, 422, &Reading::nth(2))]);

    let (mut outbox, report) = open(&mut flash);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.dead_settled, report.pending, report.dead_letters), (1, 2, 1));
    assert_eq!(report.backoff, None, "the mark's reading is no longer pending");
    assert_eq!(pending(&mut outbox).iter().map(|r| r.id).collect::<Vec<_>>(), vec![a, c]);
    assert_eq!(dead(&mut outbox), vec![DeadLetter { id: b, reason: 422, entry: Reading::nth(2) }]);
    drop(outbox);
    let (_, report) = open(&mut flash);
    assert_eq!((report.dead_settled, report.pending, report.dead_letters), (0, 2, 1));
}

#[test]
fn a_foreign_or_damaged_dead_region_is_erased_and_reported() {
    // Another format's items in the dead-letter range.
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    push_raw_dead(&mut flash, &[b"another firmware's log line", b"and another"]);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.dead_range_reset, Some(Damage::Foreign), "{report:?}");
    assert_eq!(report.queue_range_reset, None, "{report:?}");
    assert_eq!(outbox.counters().regions_reset, 1, "the dead-letter range only");
    assert_eq!(block_on(outbox.next_dead_after(None)), Ok(None));
    let a = block_on(outbox.push(Reading::nth(1))).unwrap();
    assert!(block_on(outbox.dead_letter(a, 400)).unwrap());
    drop(outbox);
    let (mut outbox, report) = open(&mut flash);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(ids_of(&dead(&mut outbox)), vec![a]);
    drop(outbox);

    // A foreign item among ours is removed alone; garbage over the range erases it.
    push_raw_dead(&mut flash, &[b"stray"]);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!((report.foreign_discarded, report.dead_range_reset), (1, None), "{report:?}");
    assert_eq!(ids_of(&dead(&mut outbox)), vec![a]);
    drop(outbox);
    let dead_range = CONFIG.dead_range.start as usize..CONFIG.dead_range.end as usize;
    flash.memory()[dead_range].fill(0x00);
    let (mut outbox, report) = open(&mut flash);
    assert!(report.dead_range_reset.is_some(), "{report:?}");
    assert_eq!(report.dead_letters, 0);
    assert_eq!(block_on(outbox.next_dead_after(None)), Ok(None));
    let b = block_on(outbox.push(Reading::nth(2))).unwrap();
    assert!(block_on(outbox.dead_letter(b, 400)).unwrap());
    assert_eq!(ids_of(&dead(&mut outbox)), vec![b]);
}

#[test]
fn the_dead_range_needs_two_pages_of_its_own() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let configs = [
        (Config { dead_range: 6 * PAGE..7 * PAGE, ..CONFIG }, ConfigError::DeadRangeTooSmall),
        (Config { dead_range: 5 * PAGE..7 * PAGE, ..CONFIG }, ConfigError::Overlap),
        (Config { dead_range: PAGE..3 * PAGE, ..CONFIG }, ConfigError::Overlap),
        (Config { dead_range: 7 * PAGE..9 * PAGE, ..CONFIG }, ConfigError::OutsideFlash),
        (Config { dead_range: 6 * PAGE + 4..8 * PAGE, ..CONFIG }, ConfigError::NotPageAligned),
    ];
    for (config, expected) in configs {
        match block_on(Outbox::<_, Reading>::open(&mut flash, config.clone())) {
            Err(OpenError { error: Error::Config(error), .. }) => assert_eq!(error, expected, "{config:?}"),
            Err(other) => panic!("{config:?}: {:?}", other.error),
            Ok(_) => panic!("{config:?} opened"),
        }
    }
}

#[test]
fn a_hold_survives_a_reset_until_it_is_cleared() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!((report.hold, outbox.hold()), (None, None));
    let hold = HoldMark { step: 3, reason: 401 };
    block_on(outbox.set_hold(Some(hold))).unwrap();
    assert_eq!(outbox.hold(), Some(hold));
    drop(outbox);

    // Whatever the queue holds (nothing here): the refusal was the endpoint's.
    for _ in 0..3 {
        let (outbox, report) = open(&mut flash);
        assert_eq!((report.hold, outbox.hold()), (Some(hold), Some(hold)));
    }
    let (mut outbox, _) = open(&mut flash);
    let next = HoldMark { step: 4, reason: 403 };
    block_on(outbox.set_hold(Some(next))).unwrap();
    // Other history writes keep it.
    block_on(outbox.mark_healthy()).unwrap();
    block_on(outbox.set_backoff(None)).unwrap();
    drop(outbox);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.hold, Some(next));

    // A probe got through.
    block_on(outbox.set_hold(None)).unwrap();
    assert_eq!(outbox.hold(), None);
    drop(outbox);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.hold, None);
    // A step of 0 is no hold.
    block_on(outbox.set_hold(Some(HoldMark { step: 0, reason: 401 }))).unwrap();
    assert_eq!(outbox.hold(), None);
    drop(outbox);
    let (_, report) = open(&mut flash);
    assert_eq!(report.hold, None);
}

#[test]
fn a_full_queue_sheds_its_oldest_to_the_dead_letters_when_asked() {
    let mut memory = blank();
    let mut flash = Flash::new(&mut memory);
    let (mut outbox, _) = open(&mut flash);
    // Fill the queue: push refuses the newest.
    let mut ids = vec![];
    let mut n = 0;
    loop {
        match block_on(outbox.push(Reading::nth(n))) {
            Ok(id) => ids.push(id),
            Err(wary_outbox::PushError::Full(back)) => {
                assert_eq!(back, Reading::nth(n), "the refused reading comes back");
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
        n += 1;
    }
    let pending_before = outbox.len();
    assert_eq!(outbox.counters().refused, 1);

    // Shedding: the oldest readings go to the dead letters, oldest first, until the new one fits.
    let (id, shed) = block_on(outbox.push_shedding(Reading::nth(n))).unwrap();
    assert!(shed >= 1, "something was shed");
    assert!(id > *ids.last().unwrap(), "the new reading is the newest");
    let letters = dead(&mut outbox);
    assert_eq!(ids_of(&letters), ids[..shed as usize].to_vec(), "the oldest, in order");
    assert!(letters.iter().all(|l| l.reason == wary_outbox::REASON_SHED));
    assert_eq!(letters[0].entry, Reading::nth(0), "the shed reading is kept whole");
    assert_eq!(outbox.len(), pending_before - shed + 1);
    let counters = outbox.counters();
    assert_eq!((counters.shed, counters.dead_lettered), (shed, shed));
    assert_eq!(counters.refused, 1, "the shedding push is not a refusal");
    // The queue's next oldest is the first reading not shed.
    assert_eq!(block_on(outbox.oldest()).unwrap().unwrap().id, ids[shed as usize]);

    // Nothing lost across a reset: every reading is pending or a dead letter.
    drop(outbox);
    let (mut outbox, report) = open(&mut flash);
    assert_eq!(report.dead_letters, shed);
    let mut all: Vec<RecordId> = pending(&mut outbox).iter().map(|r| r.id).collect();
    all.extend(ids_of(&dead(&mut outbox)));
    all.sort();
    let mut expected = ids.clone();
    expected.push(id);
    assert_eq!(all, expected);
}
