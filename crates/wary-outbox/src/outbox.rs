//! The outbox: a queue of records on flash, the boot counter beside it, and what opening them
//! found.
//!
//! ```
//! use embassy_futures::block_on;
//! use wary_outbox::sim::SimFlash;
//! use wary_outbox::{Config, Entry, Outbox, Settlement};
//!
//! #[derive(Debug, PartialEq)]
//! struct Reading(u16);
//!
//! impl Entry for Reading {
//!     const TAG: u8 = 1;
//!     const MAX_SIZE: usize = 2;
//!     fn encode(&self, buf: &mut [u8]) -> usize {
//!         buf.get_mut(..2).map_or(0, |out| { out.copy_from_slice(&self.0.to_le_bytes()); 2 })
//!     }
//!     fn decode(bytes: &[u8]) -> Option<Self> {
//!         Some(Reading(u16::from_le_bytes(bytes.try_into().ok()?)))
//!     }
//! }
//!
//! // Two 256-byte pages for the boot counter, four for the queue, two for dead letters.
//! let mut memory = [0xFFu8; 8 * 256];
//! let mut flash = SimFlash::<4, 256>::new(&mut memory);
//! let config = Config { boot_range: 0..512, queue_range: 512..1536, dead_range: 1536..2048 };
//! block_on(async {
//!     let (mut outbox, report) = Outbox::<_, Reading>::open(&mut flash, config.clone()).await.unwrap();
//!     assert_eq!(report.boot, 1);
//!     let id = outbox.push(Reading(21)).await.unwrap();
//!     drop(outbox); // a reset
//!
//!     let (mut outbox, report) = Outbox::<_, Reading>::open(&mut flash, config).await.unwrap();
//!     assert_eq!(report.boot, 2);
//!     let oldest = outbox.oldest().await.unwrap().unwrap();
//!     assert_eq!((oldest.id, oldest.entry), (id, Reading(21)));
//!     assert!(outbox.settle(id, Settlement::Landed).await.unwrap());
//!     assert_eq!(outbox.oldest().await.unwrap(), None);
//!
//!     // The server refuses the next one as it is (a 422): it moves to the dead letters.
//!     let id = outbox.push(Reading(0xFFFF)).await.unwrap();
//!     assert!(outbox.dead_letter(id, 422).await.unwrap());
//!     assert_eq!(outbox.oldest().await.unwrap(), None);
//!     let letter = outbox.next_dead_after(None).await.unwrap().unwrap();
//!     assert_eq!((letter.id, letter.reason, letter.entry), (id, 422, Reading(0xFFFF)));
//!     assert_eq!(outbox.dead_count(), 1);
//! });
//! ```

use core::marker::PhantomData;
use core::ops::Range;

use embedded_storage_async::nor_flash::{MultiwriteNorFlash, NorFlash, NorFlashError};
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::map::{MapConfig, MapStorage};
use sequential_storage::queue::{QueueConfig, QueueIterator, QueueStorage};

use crate::boot::{BOOT_KEY, BOOT_RECORD_SIZE, BootRecord};
use crate::dead_letter::MAX_DEAD_SIZE;
use crate::entry::{self, Decoded, Entry, FRAME_SIZE, MAX_ENTRY_SIZE, MAX_RECORD_SIZE, Record, RecordId};
use crate::error::{Error, FlashFault, PushError};
use crate::health::{BackoffMark, DialWindow, Health, HoldMark};

mod dead_region;

/// No cache: every operation reads what it needs from flash, so nothing in RAM can disagree
/// with the flash after a cut, and the only RAM the queue needs is one record buffer.
type NoCache<K> = Cache<Uncached, Uncached, Uncached, K>;

/// The largest flash word the buffer allows for: the flash library reads a record with its
/// padding to a whole word (32 bytes covers every part it supports).
const MAX_WORD: usize = 32;
/// The longest item either queue holds: a queued record or a dead letter.
const MAX_ITEM_SIZE: usize = if MAX_DEAD_SIZE > MAX_RECORD_SIZE { MAX_DEAD_SIZE } else { MAX_RECORD_SIZE };
/// The outbox's one buffer: the longest item rounded up to a whole largest word.
const BUF_SIZE: usize = MAX_ITEM_SIZE.div_ceil(MAX_WORD).saturating_mul(MAX_WORD);
/// A page whose first and last read words have fewer zero bits than this is an erased page to
/// `sequential-storage` 8.0.2, which will write into it without erasing it first.
const PAGE_MARKER_BITS: u32 = 4;

/// Internal flash controllers may need write data aligned in RAM too.
#[repr(align(4))]
struct Buf([u8; BUF_SIZE]);

/// Where the outbox lives on the flash: three ranges of whole pages that do not overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// The boot counter's range: at least two pages.
    pub boot_range: Range<u32>,
    /// The queue's range: at least one page. A record that stays pending keeps its page in use,
    /// so give it a few more pages than the backlog it must hold.
    pub queue_range: Range<u32>,
    /// The dead-letter region's range: at least two pages. Room on NOR comes back a page at a
    /// time, so when the region is full the dead letters of its oldest page are dropped (oldest
    /// first, each counted); with two pages or more, the other pages' letters stay.
    pub dead_range: Range<u32>,
}

/// Why a [`Config`] does not fit the flash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigError {
    /// A range does not start and end on page boundaries.
    #[error("a range is not made of whole pages")]
    NotPageAligned,
    /// The boot counter's range has fewer than two pages.
    #[error("the boot counter needs at least two pages")]
    BootRangeTooSmall,
    /// The queue's range is empty.
    #[error("the queue needs at least one page")]
    QueueRangeTooSmall,
    /// The dead-letter region's range has fewer than two pages.
    #[error("the dead-letter region needs at least two pages")]
    DeadRangeTooSmall,
    /// Two of the ranges overlap.
    #[error("two of the outbox's ranges overlap")]
    Overlap,
    /// A range reaches past the end of the flash.
    #[error("a range reaches past the end of the flash")]
    OutsideFlash,
    /// The flash's pages are too small for the largest record (a page must hold a queued
    /// record or a dead letter of the largest entry, and two boot records), or its words are
    /// too large.
    #[error("the largest record does not fit in a flash page")]
    EntryTooBig,
}

/// What a caller's verdict on a record was; either one removes it from the queue. A record the
/// server refused as it is goes to the dead letters instead ([`Outbox::dead_letter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Settlement {
    /// It landed (`ok`).
    Landed,
    /// It failed in a way a resend cannot fix (`failed`).
    Failed,
}

/// Tallies for the device's log. They count from [`Outbox::open`] and saturate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Counters {
    /// Records pushed.
    pub accepted: u32,
    /// Pushes refused because the queue was full.
    pub refused: u32,
    /// Records settled as landed.
    pub landed: u32,
    /// Records settled as failed.
    pub failed: u32,
    /// Records moved to the dead-letter region ([`Outbox::dead_letter`]), those shed included.
    pub dead_lettered: u32,
    /// Records moved to the dead letters to make room for a newer one
    /// ([`Outbox::push_shedding`]).
    pub shed: u32,
    /// Flash operations that returned an error.
    pub flash_errors: u32,
    /// Ranges found damaged or foreign and erased at open.
    pub regions_reset: u32,
    /// Foreign records discarded from the queue at open.
    pub foreign_discarded: u32,
}

impl Counters {
    /// Records settled either way.
    pub fn settled(&self) -> u32 {
        self.landed.saturating_add(self.failed)
    }
}

/// What was wrong with a range that [`Outbox::open`] erased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Damage {
    /// Its structure was broken beyond the flash library's repair.
    Corrupted,
    /// It held something other than this outbox's data (another format, or what a fresh part
    /// or a fresh emulator holds).
    Foreign,
}

/// What [`Outbox::open`] found and did. Log it: anything but [`OpenReport::is_clean`] means
/// data that was not this outbox's, or that was damaged, was thrown away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OpenReport {
    /// This boot's count: every record pushed until the next open carries it.
    pub boot: u32,
    /// Records pending from earlier boots.
    pub pending: u32,
    /// Set when the boot counter's range was erased; counting then went on above the newest
    /// record still in the queue.
    pub boot_range_reset: Option<Damage>,
    /// Set when the queue's range was erased. A [`Damage::Foreign`] range held no pending
    /// record of this outbox (a queue of only settled records, whose boot record was lost, is
    /// erased this way too); a [`Damage::Corrupted`] one may have held some.
    pub queue_range_reset: Option<Damage>,
    /// Foreign records (another format or version, or an entry that does not decode) removed.
    pub foreign_discarded: u32,
    /// Pages that read as erased but were not, erased again before anything is written there.
    pub pages_scrubbed: u32,
    /// Boots in a row before this one that ended unhealthy (never marked with
    /// [`Outbox::mark_healthy`]); 0 after a healthy boot, on a fresh flash, and on a boot
    /// record written before the outbox kept this count.
    pub unhealthy_boots: u32,
    /// How far the backoff of the oldest kept reading had gone, if that reading is still
    /// pending (see [`Outbox::set_backoff`]).
    pub backoff: Option<BackoffMark>,
    /// The hold the endpoint's refusals put on the outbox, if the last boot left one (see
    /// [`Outbox::set_hold`]).
    pub hold: Option<HoldMark>,
    /// Dead letters held in the dead-letter region.
    pub dead_letters: u32,
    /// Dead letters dropped to make room, over the device's life (see
    /// [`Outbox::dead_dropped`]).
    pub dead_dropped: u32,
    /// Pending records that were dead-lettered already (a cut came between the two steps of
    /// [`Outbox::dead_letter`]), settled by this open: none is left in both places.
    pub dead_settled: u32,
    /// Set when the dead-letter region's range was erased. A [`Damage::Foreign`] range held no
    /// dead letter of this outbox; a [`Damage::Corrupted`] one may have held some.
    pub dead_range_reset: Option<Damage>,
}

impl OpenReport {
    /// True when open found nothing to throw away or repair.
    pub fn is_clean(&self) -> bool {
        self.boot_range_reset.is_none()
            && self.queue_range_reset.is_none()
            && self.dead_range_reset.is_none()
            && self.foreign_discarded == 0
            && self.pages_scrubbed == 0
    }
}

/// [`Outbox::open`] failed; the flash comes back so the caller can try again or use it
/// otherwise.
#[derive(Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OpenError<F> {
    /// Why.
    pub error: Error,
    /// The flash that was handed in.
    pub flash: F,
}

/// A power-cut-safe queue of [`Entry`] records on a NOR flash, with a boot counter and a
/// bounded region of dead letters.
///
/// RAM: one record buffer ([`Outbox::BUFFER_SIZE`] bytes), the tallies and a few words; no
/// cache (see the crate docs for what that costs in reads).
pub struct Outbox<F: NorFlash, E: Entry> {
    queue: QueueStorage<F, NoCache<()>>,
    boot_range: Range<u32>,
    /// The queue's range, named by every boot record written.
    queue_range: Range<u32>,
    /// The dead-letter region's range: a second queue, opened on the flash for each operation.
    dead_range: Range<u32>,
    /// Dead letters held, counted at open and kept up to date.
    dead: u32,
    boot: u32,
    /// `None` once this boot has used every sequence number: the next push starts a new boot.
    next_seq: Option<u32>,
    pending: u32,
    /// What the boot record on flash says about the last boots, as last written.
    health: Health,
    counters: Counters,
    buf: Buf,
    _entry: PhantomData<fn() -> E>,
}

/// What one pass over the queue found.
#[derive(Default)]
struct Scan {
    ours: u32,
    foreign: u32,
    newest_boot: u32,
    /// The id looked for (a backoff mark's reading) is among ours.
    found: bool,
    /// The smallest and the largest id among ours.
    ids: Option<(RecordId, RecordId)>,
}

/// A queue operation's failure, told apart where open needs to.
enum QueueFault {
    /// The flash failed: give up, erase nothing.
    Flash(Error),
    /// The structure is broken, or holds items no record of ours can be: erase.
    Damaged,
}

impl<F: MultiwriteNorFlash, E: Entry> Outbox<F, E> {
    /// The record buffer's size in bytes.
    pub const BUFFER_SIZE: usize = BUF_SIZE;

    const ENTRY_FITS: () = assert!(E::MAX_SIZE <= MAX_ENTRY_SIZE, "Entry::MAX_SIZE is above MAX_ENTRY_SIZE");

    /// Opens the outbox on `flash` and starts a new boot.
    ///
    /// 1. Reads the boot counter. A range that holds no boot record of ours (garbage, another
    ///    format, the zeros of a fresh emulator) is erased and reported.
    /// 2. Checks the queue: a structure the flash library cannot repair, or (unless the boot
    ///    record vouches for this queue range) content that holds no record of ours, is erased
    ///    and reported; foreign records among ours are removed one by one; pages that read as
    ///    erased but are not are erased again.
    /// 3. Checks the dead-letter region the same way (content with no dead letter of ours is
    ///    erased as foreign), finishes a drop a cut interrupted, and settles every pending
    ///    record that is dead-lettered already (a cut between the two steps of
    ///    [`Outbox::dead_letter`]): after open a record is pending or a dead letter, never both.
    /// 4. Counts a new boot, above the last one and above every record in the queue and in the
    ///    dead-letter region, and writes it before returning: nothing can be sent under this boot's ids before it is
    ///    on flash, and a cut during the write leaves the old count, which the next open
    ///    steps over.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for ranges that do not fit `flash`, [`Error::Flash`] when the flash
    /// fails, [`Error::BootsExhausted`] after `u32::MAX` boots. The flash comes back in
    /// [`OpenError`].
    pub async fn open(flash: F, config: Config) -> Result<(Self, OpenReport), OpenError<F>> {
        let () = Self::ENTRY_FITS;
        let queue_config = match check(&flash, &config, E::MAX_SIZE) {
            Ok(queue_config) => queue_config,
            Err(error) => return Err(OpenError { error: Error::Config(error), flash }),
        };
        let mut outbox = Outbox {
            queue: QueueStorage::new(flash, queue_config, Cache::new_uncached()),
            boot_range: config.boot_range,
            queue_range: config.queue_range.clone(),
            dead_range: config.dead_range,
            dead: 0,
            boot: 0,
            next_seq: Some(0),
            pending: 0,
            health: Health::default(),
            counters: Counters::default(),
            buf: Buf([0; BUF_SIZE]),
            _entry: PhantomData,
        };
        match outbox.start(config.queue_range).await {
            Ok(report) => Ok((outbox, report)),
            Err(error) => Err(OpenError { error, flash: outbox.queue.destroy().0 }),
        }
    }

    async fn start(&mut self, queue_range: Range<u32>) -> Result<OpenReport, Error> {
        let mut report = OpenReport {
            boot: 0,
            pending: 0,
            boot_range_reset: None,
            queue_range_reset: None,
            foreign_discarded: 0,
            pages_scrubbed: 0,
            unhealthy_boots: 0,
            backoff: None,
            hold: None,
            dead_letters: 0,
            dead_dropped: 0,
            dead_settled: 0,
            dead_range_reset: None,
        };

        let last = match self.read_boot_record().await? {
            Ok(last) => last,
            Err(damage) => {
                self.erase(self.boot_range.clone()).await?;
                report.boot_range_reset = Some(damage);
                None
            }
        };
        report.pages_scrubbed = self.scrub(self.boot_range.clone()).await?;
        let vouched = last.as_ref().is_some_and(|record| record.queue == queue_range);

        let before_health = last.as_ref().map(|record| record.health).unwrap_or_default();
        let mark = before_health.backoff;
        let scan = match self.scan(mark.map(|mark| mark.id)).await {
            Ok(scan) => Some(scan),
            Err(QueueFault::Flash(error)) => return Err(error),
            Err(QueueFault::Damaged) => None,
        };
        let scan = match scan {
            None => {
                self.erase(queue_range.clone()).await?;
                report.queue_range_reset = Some(Damage::Corrupted);
                Scan::default()
            }
            Some(scan) if scan.ours == 0 && !vouched && !self.is_blank(queue_range.clone()).await? => {
                self.erase(queue_range.clone()).await?;
                report.queue_range_reset = Some(Damage::Foreign);
                Scan::default()
            }
            Some(scan) => {
                if scan.foreign > 0 {
                    report.foreign_discarded = self.discard_foreign().await?;
                }
                report.pages_scrubbed =
                    report.pages_scrubbed.saturating_add(self.scrub(queue_range.clone()).await?);
                scan
            }
        };

        let mut dead = self.open_dead_region(&mut report).await?;
        let (dead_settled, mark_settled) = match scan.ids {
            Some(ids) if dead.held > 0 => self.settle_dead_lettered(ids, mark.map(|mark| mark.id)).await?,
            _ => (0, false),
        };
        // A drop a cut interrupted is finished after the settling: a letter dropped while its
        // record was still pending must not leave that record behind.
        if let Some(id) = before_health.dropping
            && dead.held > 0
            && self.finish_drop(id).await?
        {
            dead.held = dead.held.saturating_sub(1);
        }

        // Dead letters carry ids too: a count restarted after a damaged counter range steps
        // over them as well, or a new reading could take a dead letter's key.
        let before = last.map_or(0, |record| record.boot).max(scan.newest_boot).max(dead.newest_boot);
        let boot = before.checked_add(1).ok_or(Error::BootsExhausted)?;
        // This boot counts as unhealthy until it is marked healthy: a reset before then leaves
        // the count one higher. A mark whose reading is gone is forgotten. A hold stays: the
        // endpoint refused, and a reset changes nothing there.
        let health = Health {
            unhealthy: before_health.unhealthy.saturating_add(1),
            backoff: mark.filter(|_| scan.found && !mark_settled),
            dial: before_health.dial,
            hold: before_health.hold,
            dead_dropped: before_health.dead_dropped,
            dropping: None,
        };
        self.write_boot_record(&BootRecord { boot, queue: queue_range, health }).await?;
        self.health = health;

        self.boot = boot;
        self.next_seq = Some(0);
        self.pending = scan.ours.saturating_sub(dead_settled);
        self.dead = dead.held;
        let resets = u32::from(report.boot_range_reset.is_some())
            .saturating_add(u32::from(report.queue_range_reset.is_some()))
            .saturating_add(u32::from(report.dead_range_reset.is_some()));
        self.counters.regions_reset = self.counters.regions_reset.saturating_add(resets);
        self.counters.foreign_discarded =
            self.counters.foreign_discarded.saturating_add(report.foreign_discarded);
        report.boot = boot;
        report.pending = self.pending;
        report.unhealthy_boots = before_health.unhealthy;
        report.backoff = health.backoff;
        report.hold = health.hold;
        report.dead_letters = dead.held;
        report.dead_dropped = health.dead_dropped;
        report.dead_settled = dead_settled;
        Ok(report)
    }

    /// Queues `entry` as a new record of this boot and returns its id.
    ///
    /// **When the sequence runs out.** A boot hands out sequence numbers 0 to `u32::MAX`. The
    /// push after the last one starts a new boot first, as [`Outbox::open`] would: the next
    /// boot count is written to flash and read back, and only then is the record pushed, as
    /// sequence 0 of that boot. A sequence never wraps, so no id (and no key made from it)
    /// repeats; a cut during that write leaves the old count or the new one on flash, and the
    /// next open steps over both. When the boot count is at `u32::MAX` there is no new boot to
    /// start: the push fails with [`Error::BootsExhausted`] rather than repeat an id.
    ///
    /// # Errors
    ///
    /// The entry comes back: [`PushError::Full`] when the queue has no room (counted), or
    /// [`PushError::Failed`] when the flash failed, the entry did not encode, or every id is
    /// used ([`Error::BootsExhausted`]). A failed push leaves no record behind, and its
    /// sequence number is not used again.
    pub async fn push(&mut self, entry: E) -> Result<RecordId, PushError<E>> {
        if self.next_seq.is_none()
            && let Err(error) = self.next_boot().await
        {
            return Err(PushError::Failed(entry, error));
        }
        let Some(seq) = self.next_seq else {
            return Err(PushError::Failed(entry, Error::Internal));
        };
        let id = RecordId { boot: self.boot, seq };
        // Spent even if this push fails: a number is never worth two readings sharing a key.
        self.next_seq = seq.checked_add(1);
        let word = F::WRITE_SIZE.max(F::READ_SIZE);
        let mut walked = false;
        loop {
            let Some(record) =
                entry::encode(id, &entry, word, &mut self.buf.0).and_then(|len| self.buf.0.get(..len))
            else {
                return Err(PushError::Failed(entry, Error::Encode));
            };
            match self.queue.push(record, false).await {
                Ok(()) => {
                    self.counters.accepted = self.counters.accepted.saturating_add(1);
                    self.pending = self.pending.saturating_add(1);
                    return Ok(id);
                }
                // Settled records free their page only once a walk of the queue passes it: after
                // a reboot that settled the records a cut had left pending, the page the push
                // needs can still read as taken. One walk, then the push again, before the queue
                // is called full.
                Err(sequential_storage::Error::FullStorage) if !walked => {
                    walked = true;
                    if let Err(error) = self.walk().await {
                        return Err(PushError::Failed(entry, error));
                    }
                }
                Err(sequential_storage::Error::FullStorage) => {
                    self.counters.refused = self.counters.refused.saturating_add(1);
                    return Err(PushError::Full(entry));
                }
                Err(error) => return Err(PushError::Failed(entry, runtime_error(&mut self.counters, error))),
            }
        }
    }

    /// Pushes `entry` as [`Outbox::push`] does, but when the queue is full moves its oldest
    /// readings to the dead letters (reason [`crate::dead_letter::REASON_SHED`], each counted in
    /// [`Counters::dead_lettered`] and [`Counters::shed`]) until the new one fits: for a device
    /// whose newest readings matter more than its oldest. NOR flash frees a page at a time, so
    /// one push may shed several readings, at most the queue's whole backlog. Returns the new
    /// record's id and how many readings it shed.
    ///
    /// # Errors
    ///
    /// As [`Outbox::push`]; [`PushError::Full`] only when nothing is left to shed and the entry
    /// still does not fit.
    pub async fn push_shedding(&mut self, entry: E) -> Result<(RecordId, u32), PushError<E>> {
        let mut entry = entry;
        let mut shed = 0u32;
        loop {
            match self.push(entry).await {
                Ok(id) => return Ok((id, shed)),
                Err(PushError::Full(back)) => {
                    let oldest = match self.oldest().await {
                        Ok(Some(record)) => record.id,
                        Ok(None) => return Err(PushError::Full(back)),
                        Err(error) => return Err(PushError::Failed(back, error)),
                    };
                    match self.dead_letter(oldest, crate::dead_letter::REASON_SHED).await {
                        Ok(true) => {}
                        Ok(false) => return Err(PushError::Failed(back, Error::Internal)),
                        Err(error) => return Err(PushError::Failed(back, error)),
                    }
                    // The refusal the full push counted is undone: the entry goes in after all.
                    self.counters.refused = self.counters.refused.saturating_sub(1);
                    self.counters.shed = self.counters.shed.saturating_add(1);
                    shed = shed.saturating_add(1);
                    entry = back;
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Walks the whole queue without popping anything, which lets the flash library free the
    /// pages whose records are all settled as it passes them.
    async fn walk(&mut self) -> Result<(), Error> {
        let counters = &mut self.counters;
        let mut iter = self.queue.iter().await.map_err(|error| runtime_error(counters, error))?;
        while iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?.is_some() {}
        Ok(())
    }

    /// The oldest pending record.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn oldest(&mut self) -> Result<Option<Record<E>>, Error> {
        self.next_after(None).await
    }

    /// The oldest pending record newer than `after` (any record when `None`): walk the queue
    /// with it, settling as you go, without holding a borrow across sends.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn next_after(&mut self, after: Option<RecordId>) -> Result<Option<Record<E>>, Error> {
        let mut pending = self.pending().await?;
        while let Some(record) = pending.next().await? {
            if after.is_none_or(|after| record.id > after) {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// The pending records, oldest first. Foreign records are skipped, never decoded. Walking
    /// the queue may erase a page whose records are all settled (the flash library frees pages
    /// as it passes them).
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn pending(&mut self) -> Result<Pending<'_, F, E>, Error> {
        let iter = self.queue.iter().await.map_err(|error| runtime_error(&mut self.counters, error))?;
        Ok(Pending { iter, buf: &mut self.buf.0, counters: &mut self.counters, _entry: PhantomData })
    }

    /// Removes the record `id` from the queue: call it for a verdict of `ok` or `failed` only
    /// (a reading that gave up, is unknown or was cancelled stays for a later round). True if
    /// it was pending; false if it was not (settled already, or never pushed).
    ///
    /// A record is removed by clearing its checksum in place (one small write, no erase); its
    /// page is erased once every record on it is settled. A power cut during this write can
    /// leave the record pending, never half there: settle it again after the reboot.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn settle(&mut self, id: RecordId, how: Settlement) -> Result<bool, Error> {
        let removed = self.remove(id).await?;
        if removed {
            let counters = &mut self.counters;
            match how {
                Settlement::Landed => counters.landed = counters.landed.saturating_add(1),
                Settlement::Failed => counters.failed = counters.failed.saturating_add(1),
            }
        }
        Ok(removed)
    }

    /// Removes the record `id` from the queue; true if it was pending.
    async fn remove(&mut self, id: RecordId) -> Result<bool, Error> {
        let counters = &mut self.counters;
        let mut iter = self.queue.iter().await.map_err(|error| runtime_error(counters, error))?;
        loop {
            let next = iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?;
            let Some(item) = next else { return Ok(false) };
            match entry::peek_id::<E>(&item) {
                Some(found) if found == id => {
                    item.pop().await.map_err(|error| runtime_error(counters, error))?;
                    self.pending = self.pending.saturating_sub(1);
                    return Ok(true);
                }
                // The queue is in id order: it is not further on.
                Some(found) if found > id => return Ok(false),
                _ => {}
            }
        }
    }

    /// Starts a new boot in the running outbox, once this one's sequence numbers are spent:
    /// the next count is on flash (and reads back) before any record carries it.
    async fn next_boot(&mut self) -> Result<(), Error> {
        let boot = self.boot.checked_add(1).ok_or(Error::BootsExhausted)?;
        let record = BootRecord { boot, queue: self.queue_range.clone(), health: self.health };
        self.write_boot_record(&record).await?;
        self.boot = boot;
        self.next_seq = Some(0);
        Ok(())
    }

    /// Marks this boot healthy: the count of unhealthy boots in a row goes back to 0 on flash.
    /// Call it once the boot has shown it works (see the docs of the uplink for the rule); a
    /// boot that resets before it is marked counts as unhealthy at the next open. True if it
    /// wrote (false: the count was 0 already, nothing written).
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`]; the count stays as it was.
    pub async fn mark_healthy(&mut self) -> Result<bool, Error> {
        if self.health.unhealthy == 0 {
            return Ok(false);
        }
        self.write_health(Health { unhealthy: 0, ..self.health }).await?;
        Ok(true)
    }

    /// Remembers on flash how far the backoff of the pending readings has gone (`None`: back
    /// at the start, a round landed everything). Nothing is written when it is what flash
    /// already holds, so a caller may call it after every round. [`OpenReport::backoff`] hands
    /// it back after a reset while its reading is still pending.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`]; flash keeps the old mark.
    pub async fn set_backoff(&mut self, mark: Option<BackoffMark>) -> Result<(), Error> {
        let mark = mark.filter(|mark| mark.step > 0);
        if self.health.backoff == mark {
            return Ok(());
        }
        self.write_health(Health { backoff: mark, ..self.health }).await
    }

    /// The backoff mark as flash holds it now.
    pub fn backoff(&self) -> Option<BackoffMark> {
        self.health.backoff
    }

    /// Remembers on flash that the endpoint holds the outbox (`None`: a probe got through, the
    /// hold is over; a mark with step 0 is `None` too). Nothing is written when it is what
    /// flash already holds. [`OpenReport::hold`] hands it back after a reset, whatever the
    /// queue holds then: the refusal was the endpoint's, not a reading's.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`]; flash keeps the old hold.
    pub async fn set_hold(&mut self, hold: Option<HoldMark>) -> Result<(), Error> {
        let hold = hold.filter(|hold| hold.step > 0);
        if self.health.hold == hold {
            return Ok(());
        }
        self.write_health(Health { hold, ..self.health }).await
    }

    /// The hold as flash holds it now (at open: what the last boot left).
    pub fn hold(&self) -> Option<HoldMark> {
        self.health.hold
    }

    /// Remembers the modem's dial window on flash (nothing written if unchanged).
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`]; flash keeps the old window.
    pub async fn set_dial_window(&mut self, window: DialWindow) -> Result<(), Error> {
        if self.health.dial == window {
            return Ok(());
        }
        self.write_health(Health { dial: window, ..self.health }).await
    }

    /// The modem's dial window as flash holds it now (as the last boot left it, at open).
    pub fn dial_window(&self) -> DialWindow {
        self.health.dial
    }

    /// Rewrites the boot record with this boot's count and `health`.
    async fn write_health(&mut self, health: Health) -> Result<(), Error> {
        let record = BootRecord { boot: self.boot, queue: self.queue_range.clone(), health };
        self.write_boot_record(&record).await?;
        self.health = health;
        Ok(())
    }

    /// Moves this boot's sequence forward to `seq`, never back: the numbers skipped are never
    /// used. True if it moved (or was there already); false if `seq` is below the next number,
    /// or this boot's numbers are spent. Use it to reserve a range of sequence numbers, or to
    /// bring a test to the end of a boot's sequence.
    pub fn skip_sequence_to(&mut self, seq: u32) -> bool {
        match self.next_seq {
            Some(next) if seq >= next => {
                self.next_seq = Some(seq);
                true
            }
            _ => false,
        }
    }

    /// The sequence number the next push takes in this boot; `None` when this boot's numbers
    /// are spent and the next push starts a new boot.
    pub fn next_sequence(&self) -> Option<u32> {
        self.next_seq
    }

    /// This boot's count (the `boot` of every record pushed since open, or since the push that
    /// started a new boot when a boot's sequence ran out).
    pub fn boot(&self) -> u32 {
        self.boot
    }

    /// Records pending, as counted since open.
    pub fn len(&self) -> u32 {
        self.pending
    }

    /// True when no record is pending.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// The tallies since open.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Closes the outbox and hands the flash back (nothing needs flushing: every operation is
    /// on flash when it returns).
    pub fn into_flash(self) -> F {
        self.queue.destroy().0
    }

    /// The boot record, `Ok(None)` for a blank range, `Err(damage)` for anything else.
    async fn read_boot_record(&mut self) -> Result<Result<Option<BootRecord>, Damage>, Error> {
        let config = map_config(self.boot_range.clone())?;
        let mut map = MapStorage::<u8, _, _>::new(self.queue.flash(), config, NoCache::<u8>::new_uncached());
        let fetched = map.fetch_item::<&[u8]>(&mut self.buf.0, &BOOT_KEY).await;
        let found = match fetched {
            Ok(Some(bytes)) => Some(BootRecord::decode(bytes)),
            Ok(None) => None,
            Err(sequential_storage::Error::Storage { value, .. }) => {
                return Err(flash_error(&mut self.counters, &value));
            }
            Err(sequential_storage::Error::Corrupted { .. }) => return Ok(Err(Damage::Corrupted)),
            Err(_) => return Ok(Err(Damage::Foreign)),
        };
        Ok(match found {
            Some(Some(record)) => Ok(Some(record)),
            Some(None) => Err(Damage::Foreign),
            // No record: fine on a blank range, foreign otherwise (nothing of ours is written
            // there before a record is).
            None if self.is_blank(self.boot_range.clone()).await? => Ok(None),
            None => Err(Damage::Foreign),
        })
    }

    /// Writes `record` and reads it back: a count is used only once it reads back from flash,
    /// so a range that takes writes but loses them cannot make a later boot reuse it.
    async fn write_boot_record(&mut self, record: &BootRecord) -> Result<(), Error> {
        let bytes = record.encode();
        for attempt in 0..2 {
            if attempt > 0 {
                // Damaged under us since it was read: start the range again. The count in
                // `record` is already above everything used before.
                self.erase(self.boot_range.clone()).await?;
                self.counters.regions_reset = self.counters.regions_reset.saturating_add(1);
            }
            match self.store_boot_record(&bytes).await {
                Ok(()) => {}
                Err(Error::Corrupted) => continue,
                Err(error) => return Err(error),
            }
            if self.read_boot_record().await?.ok().flatten().as_ref() == Some(record) {
                return Ok(());
            }
        }
        Err(Error::Corrupted)
    }

    async fn store_boot_record(&mut self, bytes: &[u8; BOOT_RECORD_SIZE]) -> Result<(), Error> {
        let config = map_config(self.boot_range.clone())?;
        let mut map = MapStorage::<u8, _, _>::new(self.queue.flash(), config, NoCache::<u8>::new_uncached());
        map.store_item(&mut self.buf.0, &BOOT_KEY, &&bytes[..])
            .await
            .map_err(|error| runtime_error(&mut self.counters, error))
    }

    /// One pass over the queue: how many records are ours, how many foreign, the newest boot.
    async fn scan(&mut self, look_for: Option<RecordId>) -> Result<Scan, QueueFault> {
        let counters = &mut self.counters;
        let mut iter = self.queue.iter().await.map_err(|error| open_fault(counters, error))?;
        let mut scan = Scan::default();
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| open_fault(counters, error))?
        {
            match entry::decode::<E>(&item) {
                Decoded::Ours(record) => {
                    scan.ours = scan.ours.saturating_add(1);
                    scan.newest_boot = scan.newest_boot.max(record.id.boot);
                    scan.found |= look_for == Some(record.id);
                    let (low, high) = scan.ids.unwrap_or((record.id, record.id));
                    scan.ids = Some((low.min(record.id), high.max(record.id)));
                }
                Decoded::Foreign => scan.foreign = scan.foreign.saturating_add(1),
            }
        }
        Ok(scan)
    }

    /// Removes every foreign record; how many there were.
    async fn discard_foreign(&mut self) -> Result<u32, Error> {
        let counters = &mut self.counters;
        let mut iter = self.queue.iter().await.map_err(|error| runtime_error(counters, error))?;
        let mut discarded = 0u32;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            if matches!(entry::decode::<E>(&item), Decoded::Foreign) {
                item.pop().await.map_err(|error| runtime_error(counters, error))?;
                discarded = discarded.saturating_add(1);
            }
        }
        Ok(discarded)
    }

    /// Erases every page in `range` that the flash library would take for erased but that is
    /// not: it would write records over the old bits and lose them. Such a page holds nothing
    /// the library can read, so erasing it loses nothing. How many pages were erased.
    async fn scrub(&mut self, range: Range<u32>) -> Result<u32, Error> {
        let page = page_size::<F>();
        let marker = F::READ_SIZE;
        let mut scrubbed = 0u32;
        let mut start = range.start;
        while start < range.end {
            let end = start.saturating_add(page);
            let last = end.saturating_sub(u32::try_from(marker).unwrap_or(u32::MAX));
            let looks_erased = self.marker_zeros(start, marker).await? < PAGE_MARKER_BITS
                && self.marker_zeros(last, marker).await? < PAGE_MARKER_BITS;
            if looks_erased && !self.is_blank(start..end).await? {
                self.erase(start..end).await?;
                scrubbed = scrubbed.saturating_add(1);
            }
            start = end;
        }
        Ok(scrubbed)
    }

    async fn marker_zeros(&mut self, at: u32, len: usize) -> Result<u32, Error> {
        let word = self.buf.0.get_mut(..len).ok_or(Error::Internal)?;
        if let Err(error) = self.queue.flash().read(at, word).await {
            return Err(flash_error(&mut self.counters, &error));
        }
        Ok(word.iter().map(|byte| byte.count_zeros()).sum())
    }

    /// True if every byte of `range` reads `0xFF`.
    async fn is_blank(&mut self, range: Range<u32>) -> Result<bool, Error> {
        // Whole read words at a time; the range is whole pages, so they divide it.
        let chunk =
            BUF_SIZE.checked_div(F::READ_SIZE).unwrap_or(0).saturating_mul(F::READ_SIZE).max(F::READ_SIZE);
        let step = u32::try_from(chunk).unwrap_or(u32::MAX);
        let mut at = range.start;
        while at < range.end {
            let len = usize::try_from(range.end.saturating_sub(at)).unwrap_or(usize::MAX).min(chunk);
            let part = self.buf.0.get_mut(..len).ok_or(Error::Internal)?;
            if let Err(error) = self.queue.flash().read(at, part).await {
                return Err(flash_error(&mut self.counters, &error));
            }
            if part.iter().any(|&byte| byte != 0xFF) {
                return Ok(false);
            }
            at = at.saturating_add(step);
        }
        Ok(true)
    }

    async fn erase(&mut self, range: Range<u32>) -> Result<(), Error> {
        match self.queue.flash().erase(range.start, range.end).await {
            Ok(()) => Ok(()),
            Err(error) => Err(flash_error(&mut self.counters, &error)),
        }
    }
}

/// An iteration over the pending records, oldest first (see [`Outbox::pending`]).
pub struct Pending<'a, F: NorFlash, E> {
    iter: QueueIterator<'a, F, NoCache<()>>,
    buf: &'a mut [u8; BUF_SIZE],
    counters: &'a mut Counters,
    _entry: PhantomData<fn() -> E>,
}

impl<F: NorFlash, E: Entry> Pending<'_, F, E> {
    /// The next pending record, `None` after the newest.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn next(&mut self) -> Result<Option<Record<E>>, Error> {
        loop {
            let next = self
                .iter
                .next(&mut self.buf[..])
                .await
                .map_err(|error| runtime_error(self.counters, error))?;
            let Some(item) = next else { return Ok(None) };
            if let Decoded::Ours(record) = entry::decode::<E>(&item) {
                return Ok(Some(record));
            }
        }
    }
}

fn page_size<F: NorFlash>() -> u32 {
    u32::try_from(F::ERASE_SIZE).unwrap_or(u32::MAX)
}

fn map_config<S: NorFlash>(range: Range<u32>) -> Result<MapConfig<S>, Error> {
    MapConfig::try_new(range).map_err(|_| Error::Config(crate::ConfigError::BootRangeTooSmall))
}

/// Checks `config` against the flash and the entry type.
fn check<F: NorFlash>(
    flash: &F,
    config: &Config,
    entry_size: usize,
) -> Result<QueueConfig<F>, crate::ConfigError> {
    use crate::ConfigError as C;
    let page = page_size::<F>();
    let (boot, queue, dead) = (&config.boot_range, &config.queue_range, &config.dead_range);
    for range in [boot, queue, dead] {
        if range.start.checked_rem(page) != Some(0) || range.end.checked_rem(page) != Some(0) {
            return Err(C::NotPageAligned);
        }
        if usize::try_from(range.end).map_or(true, |end| end > flash.capacity()) {
            return Err(C::OutsideFlash);
        }
    }
    if boot.end.saturating_sub(boot.start) < page.saturating_mul(2) {
        return Err(C::BootRangeTooSmall);
    }
    if queue.end.saturating_sub(queue.start) < page {
        return Err(C::QueueRangeTooSmall);
    }
    if dead.end.saturating_sub(dead.start) < page.saturating_mul(2) {
        return Err(C::DeadRangeTooSmall);
    }
    let overlap = |a: &Range<u32>, b: &Range<u32>| a.start < b.end && b.start < a.end;
    if overlap(boot, queue) || overlap(boot, dead) || overlap(queue, dead) {
        return Err(C::Overlap);
    }
    // The library's frame: two page markers of a word each, an 8-byte item header padded to a
    // word, the item padded to a word. A dead letter is a record with its reason.
    let word = F::WRITE_SIZE.max(F::READ_SIZE);
    let padded = |len: usize| len.div_ceil(word.max(1)).saturating_mul(word);
    let item = |len: usize| padded(8).saturating_add(padded(len));
    let record = padded(FRAME_SIZE.saturating_add(entry_size).saturating_add(2));
    let needed = word.saturating_mul(2).saturating_add(padded(8)).saturating_add(record);
    // The map moves the boot record to the next page before it writes the new one there: a
    // page must hold two (its key byte and the record each).
    let boot_records =
        word.saturating_mul(2).saturating_add(item(BOOT_RECORD_SIZE.saturating_add(1)).saturating_mul(2));
    if word > MAX_WORD || record > BUF_SIZE || needed > F::ERASE_SIZE || boot_records > F::ERASE_SIZE {
        return Err(C::EntryTooBig);
    }
    QueueConfig::<F>::try_new(dead.clone()).map_err(|_| C::DeadRangeTooSmall)?;
    QueueConfig::try_new(queue.clone()).map_err(|_| C::QueueRangeTooSmall)
}

fn flash_error<E: NorFlashError>(counters: &mut Counters, error: &E) -> Error {
    counters.flash_errors = counters.flash_errors.saturating_add(1);
    Error::Flash(FlashFault::of(error))
}

/// A library error in normal operation.
fn runtime_error<E: NorFlashError>(counters: &mut Counters, error: sequential_storage::Error<E>) -> Error {
    match error {
        sequential_storage::Error::Storage { value, .. } => flash_error(counters, &value),
        sequential_storage::Error::LogicBug { .. } => Error::Internal,
        // Corrupted, or an item too large for any record of ours: only damage puts it there.
        _ => Error::Corrupted,
    }
}

/// A library error while open checks the queue.
fn open_fault<E: NorFlashError>(counters: &mut Counters, error: sequential_storage::Error<E>) -> QueueFault {
    match error {
        sequential_storage::Error::Storage { value, .. } => QueueFault::Flash(flash_error(counters, &value)),
        _ => QueueFault::Damaged,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
mod tests {
    use embassy_futures::block_on;

    use super::*;
    use crate::sim::SimFlash;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Tiny(u8);

    impl Entry for Tiny {
        const TAG: u8 = 0x33;
        const MAX_SIZE: usize = 1;
        fn encode(&self, buf: &mut [u8]) -> usize {
            buf.first_mut().map_or(0, |b| {
                *b = self.0;
                1
            })
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            match bytes {
                [b] => Some(Tiny(*b)),
                _ => None,
            }
        }
    }

    const CONFIG: Config = Config { boot_range: 0..512, queue_range: 512..1536, dead_range: 1536..2048 };

    #[test]
    fn a_boot_count_that_would_wrap_refuses_the_push_and_makes_no_record() {
        let mut memory = [0xFFu8; 2048];
        let mut flash = SimFlash::<4, 256>::new(&mut memory);
        block_on(async {
            let (mut outbox, _) = Outbox::<_, Tiny>::open(&mut flash, CONFIG).await.unwrap();
            // The last boot but one, its sequence spent: the next push starts the last boot.
            outbox.boot = u32::MAX - 1;
            outbox.next_seq = None;
            let id = outbox.push(Tiny(1)).await.unwrap();
            assert_eq!(id, RecordId { boot: u32::MAX, seq: 0 });
            assert_eq!(outbox.boot(), u32::MAX);
            // The last boot's sequence spent too: nothing is left that would not repeat an id.
            assert!(outbox.skip_sequence_to(u32::MAX));
            let last = outbox.push(Tiny(2)).await.unwrap();
            assert_eq!(last, RecordId { boot: u32::MAX, seq: u32::MAX });
            assert_eq!(outbox.next_sequence(), None);
            match outbox.push(Tiny(3)).await {
                Err(PushError::Failed(Tiny(3), Error::BootsExhausted)) => {}
                other => panic!("expected BootsExhausted, got {other:?}"),
            }
            // Refused again, and nothing was queued by the refusals.
            assert!(matches!(outbox.push(Tiny(4)).await, Err(PushError::Failed(_, Error::BootsExhausted))));
            assert_eq!(outbox.len(), 2);
            let mut ids = [None, None, None];
            let mut pending = outbox.pending().await.unwrap();
            for slot in &mut ids {
                *slot = pending.next().await.unwrap().map(|r| r.id);
            }
            assert_eq!(ids, [Some(id), Some(last), None]);
            // And a reboot cannot count past the last boot either.
            let _flash = outbox.into_flash();
            let reopened = Outbox::<_, Tiny>::open(&mut flash, CONFIG).await;
            assert!(matches!(reopened, Err(OpenError { error: Error::BootsExhausted, .. })));
        });
    }

    #[test]
    fn skipping_the_sequence_only_moves_forward() {
        let mut memory = [0xFFu8; 2048];
        let mut flash = SimFlash::<4, 256>::new(&mut memory);
        block_on(async {
            let (mut outbox, report) = Outbox::<_, Tiny>::open(&mut flash, CONFIG).await.unwrap();
            assert_eq!(outbox.push(Tiny(0)).await.unwrap(), RecordId { boot: report.boot, seq: 0 });
            assert!(!outbox.skip_sequence_to(0), "back to a used number");
            assert!(outbox.skip_sequence_to(1), "where it is already");
            assert!(outbox.skip_sequence_to(100));
            assert!(!outbox.skip_sequence_to(99));
            assert_eq!(outbox.push(Tiny(1)).await.unwrap(), RecordId { boot: report.boot, seq: 100 });
            assert_eq!(outbox.next_sequence(), Some(101));
        });
    }
}
