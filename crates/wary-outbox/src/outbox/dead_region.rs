//! The dead-letter region: a second `sequential-storage` queue in [`crate::Config::dead_range`] that
//! holds the readings the server refused as they are ([`Outbox::dead_letter`]).
//!
//! **Moving a record.** A record goes to the dead letters in two steps: the dead letter is
//! written first, then the record is removed from the queue. A cut between the two leaves the
//! record in both places; [`Outbox::open`] then removes the pending copy
//! ([`Outbox::settle_dead_lettered`]), so after open a record is pending or a dead letter,
//! never both, and never neither. A call that failed between the steps is finished by calling
//! it again: the dead letter is not written twice.
//!
//! **Dropping.** The region is bounded. When a dead letter finds no room, the oldest letters
//! are dropped one at a time until it fits: NOR gives room back a page at a time, so that is
//! the oldest page's letters, oldest first. Each drop is counted first, in the boot record's
//! health (`dead_dropped`, with `dropping` naming the letter), and only then removed: a cut
//! between the two leaves the count right and the letter still there, and open removes it. A
//! drop is never lost from the count, and never counted twice.
//!
//! **Order.** Dead letters are ordered by id for [`Outbox::next_dead_after`], whatever order
//! they were written in; ids are unique, so walking by id meets each one once even while the
//! region drops letters under the walk.

use core::ops::Range;

use embedded_storage_async::nor_flash::{MultiwriteNorFlash, NorFlash};
use sequential_storage::cache::Cache;
use sequential_storage::queue::{QueueConfig, QueueStorage};

use super::{ConfigError, Damage, NoCache, OpenReport, Outbox, QueueFault, open_fault, runtime_error};
use crate::dead_letter::{self, DeadLetter};
use crate::entry::{self, Entry, MAX_ENTRY_SIZE, RecordId};
use crate::error::Error;
use crate::health::Health;

/// Pending ids checked against the queue per pass over the dead letters at open.
const SETTLE_BATCH: usize = 8;

/// What open found in the dead-letter region.
#[derive(Default)]
pub(super) struct DeadScan {
    /// Dead letters of ours.
    pub(super) held: u32,
    /// Items that are not (another format, another entry type).
    foreign: u32,
    /// The newest boot among the dead letters' ids.
    pub(super) newest_boot: u32,
}

/// The dead-letter region as a queue on the outbox's flash, for one operation.
fn dead_queue<'a, F: NorFlash>(
    queue: &'a mut QueueStorage<F, NoCache<()>>,
    range: &Range<u32>,
) -> Result<QueueStorage<&'a mut F, NoCache<()>>, Error> {
    let config =
        QueueConfig::try_new(range.clone()).map_err(|_| Error::Config(ConfigError::DeadRangeTooSmall))?;
    Ok(QueueStorage::new(queue.flash(), config, Cache::new_uncached()))
}

impl<F: MultiwriteNorFlash, E: Entry> Outbox<F, E> {
    /// Checks the dead-letter region at open: a structure the flash library cannot repair, or
    /// content with no dead letter of ours, is erased and reported; foreign items among ours are
    /// removed one by one (counted in [`OpenReport::foreign_discarded`]); pages that read as
    /// erased but are not are erased again.
    pub(super) async fn open_dead_region(&mut self, report: &mut OpenReport) -> Result<DeadScan, Error> {
        let range = self.dead_range.clone();
        let scan = match self.scan_dead().await {
            Ok(scan) => Some(scan),
            Err(QueueFault::Flash(error)) => return Err(error),
            Err(QueueFault::Damaged) => None,
        };
        Ok(match scan {
            None => {
                self.erase(range).await?;
                report.dead_range_reset = Some(Damage::Corrupted);
                DeadScan::default()
            }
            // Nothing of ours is written here before a dead letter is, and a letter leaves only
            // by a drop, which comes with a newer letter: no letter of ours, nothing to keep.
            Some(scan) if scan.held == 0 && !self.is_blank(range.clone()).await? => {
                self.erase(range).await?;
                report.dead_range_reset = Some(Damage::Foreign);
                DeadScan::default()
            }
            Some(scan) => {
                if scan.foreign > 0 {
                    let discarded = self.discard_foreign_dead().await?;
                    report.foreign_discarded = report.foreign_discarded.saturating_add(discarded);
                }
                report.pages_scrubbed = report.pages_scrubbed.saturating_add(self.scrub(range).await?);
                scan
            }
        })
    }

    /// One pass over the dead-letter region.
    async fn scan_dead(&mut self) -> Result<DeadScan, QueueFault> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range).map_err(QueueFault::Flash)?;
        let mut iter = dead.iter().await.map_err(|error| open_fault(counters, error))?;
        let mut scan = DeadScan::default();
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| open_fault(counters, error))?
        {
            match dead_letter::peek_id::<E>(&item) {
                Some(id) => {
                    scan.held = scan.held.saturating_add(1);
                    scan.newest_boot = scan.newest_boot.max(id.boot);
                }
                None => scan.foreign = scan.foreign.saturating_add(1),
            }
        }
        Ok(scan)
    }

    /// Removes every item of the dead-letter region that is no dead letter of ours.
    async fn discard_foreign_dead(&mut self) -> Result<u32, Error> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
        let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
        let mut discarded = 0u32;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            if dead_letter::peek_id::<E>(&item).is_none() {
                item.pop().await.map_err(|error| runtime_error(counters, error))?;
                discarded = discarded.saturating_add(1);
            }
        }
        Ok(discarded)
    }

    /// Removes from the queue every pending record that is a dead letter already: a cut (or a
    /// failure) came between the two steps of [`Outbox::dead_letter`]. Only dead letters with
    /// an id in `ids` (the smallest and the largest pending id) can be pending. How many were
    /// removed, and whether `mark` (the backoff mark's reading) was among them.
    pub(super) async fn settle_dead_lettered(
        &mut self,
        ids: (RecordId, RecordId),
        mark: Option<RecordId>,
    ) -> Result<(u32, bool), Error> {
        let (low, high) = ids;
        let mut settled = 0u32;
        let mut mark_settled = false;
        // Dead letters already looked at: the region is not changed by this, so a pass can
        // skip them. No two iterations can be open on the one flash at once, so the candidates
        // are gathered a few at a time and checked against the queue between passes.
        let mut skip = 0u32;
        loop {
            let mut batch = [RecordId { boot: 0, seq: 0 }; SETTLE_BATCH];
            let mut found = 0usize;
            let mut seen = 0u32;
            let mut more = false;
            {
                let counters = &mut self.counters;
                let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
                let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
                while let Some(item) =
                    iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
                {
                    if seen < skip {
                        seen = seen.saturating_add(1);
                        continue;
                    }
                    let id = dead_letter::peek_id::<E>(&item).filter(|id| (low..=high).contains(id));
                    if let Some(id) = id {
                        let Some(slot) = batch.get_mut(found) else {
                            // The batch is full: this letter starts the next pass.
                            more = true;
                            break;
                        };
                        *slot = id;
                        found = found.saturating_add(1);
                    }
                    seen = seen.saturating_add(1);
                }
            }
            skip = seen;
            for &id in batch.get(..found).unwrap_or_default() {
                if self.remove(id).await? {
                    settled = settled.saturating_add(1);
                    mark_settled |= mark == Some(id);
                }
            }
            if !more {
                return Ok((settled, mark_settled));
            }
        }
    }

    /// Finishes a drop a cut interrupted: the boot record counted the drop of `id`, so the
    /// letter goes without being counted again. True if it was still there.
    pub(super) async fn finish_drop(&mut self, id: RecordId) -> Result<bool, Error> {
        self.pop_dead(id).await
    }

    /// Removes the dead letter `id`, then walks on to the end, which erases the pages whose
    /// letters are all gone. True if it was there.
    async fn pop_dead(&mut self, id: RecordId) -> Result<bool, Error> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
        let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
        let mut popped = false;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            if !popped && dead_letter::peek_id::<E>(&item) == Some(id) {
                item.pop().await.map_err(|error| runtime_error(counters, error))?;
                popped = true;
            }
        }
        Ok(popped)
    }

    /// True if `id` is among the dead letters.
    async fn is_dead_lettered(&mut self, id: RecordId) -> Result<bool, Error> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
        let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            if dead_letter::peek_id::<E>(&item) == Some(id) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Walks the whole dead-letter region, which erases the pages whose letters are all gone.
    async fn walk_dead(&mut self) -> Result<(), Error> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
        let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
        while iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?.is_some() {}
        Ok(())
    }

    /// The entry bytes of the pending record `id`, copied into `out`: their length, or `None`
    /// if `id` is not pending (or its entry does not decode: a foreign record, never handed
    /// back as a reading).
    async fn pending_body(
        &mut self,
        id: RecordId,
        out: &mut [u8; MAX_ENTRY_SIZE],
    ) -> Result<Option<usize>, Error> {
        let counters = &mut self.counters;
        let mut iter = self.queue.iter().await.map_err(|error| runtime_error(counters, error))?;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            match entry::framed::<E>(&item) {
                Some((found, body)) if found == id => {
                    if E::decode(body).is_none() {
                        return Ok(None);
                    }
                    let len = body.len();
                    for (to, from) in out.iter_mut().zip(body) {
                        *to = *from;
                    }
                    return Ok((len <= MAX_ENTRY_SIZE).then_some(len));
                }
                // The queue is in id order: it is not further on.
                Some((found, _)) if found > id => return Ok(None),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Writes the dead letter of `id` with `reason` and entry bytes `body`, dropping the
    /// oldest letters while the region has no room for it.
    async fn push_dead(&mut self, id: RecordId, reason: u16, body: &[u8]) -> Result<(), Error> {
        let word = F::WRITE_SIZE.max(F::READ_SIZE);
        let mut walked = false;
        loop {
            let len =
                dead_letter::encode::<E>(id, reason, body, word, &mut self.buf.0).ok_or(Error::Encode)?;
            let letter = self.buf.0.get(..len).ok_or(Error::Internal)?;
            let pushed = dead_queue(&mut self.queue, &self.dead_range)?.push(letter, false).await;
            match pushed {
                Ok(()) => return Ok(()),
                // Letters a cut left dropped but their page not yet erased: a walk frees it
                // before anything else is dropped.
                Err(sequential_storage::Error::FullStorage) if !walked => {
                    walked = true;
                    self.walk_dead().await?;
                }
                Err(sequential_storage::Error::FullStorage) => {
                    if !self.drop_oldest_dead().await? {
                        // Full with no letter in it: only damage does that.
                        return Err(Error::Corrupted);
                    }
                }
                Err(error) => return Err(runtime_error(&mut self.counters, error)),
            }
        }
    }

    /// Drops the oldest dead letter: counts it on flash (the boot record's `dead_dropped`, with
    /// `dropping` naming it), then removes it. False if there is none.
    async fn drop_oldest_dead(&mut self) -> Result<bool, Error> {
        let oldest = {
            let counters = &mut self.counters;
            let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
            let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
            let mut oldest = None;
            while let Some(item) =
                iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
            {
                if let Some(id) = dead_letter::peek_id::<E>(&item) {
                    oldest = Some(id);
                    break;
                }
                // No letter of ours (open removes such items; only damage since puts one here):
                // it holds room a letter needs, and it is nobody's to count.
                item.pop().await.map_err(|error| runtime_error(counters, error))?;
                counters.foreign_discarded = counters.foreign_discarded.saturating_add(1);
            }
            oldest
        };
        let Some(id) = oldest else { return Ok(false) };
        let health = Health {
            dead_dropped: self.health.dead_dropped.saturating_add(1),
            dropping: Some(id),
            ..self.health
        };
        self.write_health(health).await?;
        if self.pop_dead(id).await? {
            self.dead = self.dead.saturating_sub(1);
        }
        Ok(true)
    }

    /// Moves the pending record `id` to the dead letters, with `reason` (the status or protocol
    /// code the server refused it with): call it for a reading the server refused as it is,
    /// which no resend can fix. True if it was pending; false if it was not (settled, dead
    /// lettered already, or never pushed).
    ///
    /// The dead letter is written first, then the record leaves the queue. A cut between the
    /// two is repaired by the next [`Outbox::open`] (the record stays a dead letter only); a
    /// call that failed between them is finished by calling it again. When the region has no
    /// room, its oldest letters are dropped first, each counted on flash
    /// ([`Outbox::dead_dropped`]): one boot record write per letter dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`]; the record is still pending, or (if the
    /// failure came after the dead letter was written) in both places until the call is made
    /// again or the next open.
    pub async fn dead_letter(&mut self, id: RecordId, reason: u16) -> Result<bool, Error> {
        let mut body = [0u8; MAX_ENTRY_SIZE];
        let Some(len) = self.pending_body(id, &mut body).await? else { return Ok(false) };
        if !self.is_dead_lettered(id).await? {
            self.push_dead(id, reason, body.get(..len).ok_or(Error::Internal)?).await?;
            self.dead = self.dead.saturating_add(1);
        }
        let removed = self.remove(id).await?;
        if removed {
            self.counters.dead_lettered = self.counters.dead_lettered.saturating_add(1);
        }
        Ok(removed)
    }

    /// The dead letter with the smallest id above `after` (the smallest of all when `None`):
    /// walk the dead letters by id with it. Letters dropped meanwhile are simply not met.
    ///
    /// # Errors
    ///
    /// [`Error::Flash`] or [`Error::Corrupted`].
    pub async fn next_dead_after(&mut self, after: Option<RecordId>) -> Result<Option<DeadLetter<E>>, Error> {
        let counters = &mut self.counters;
        let mut dead = dead_queue(&mut self.queue, &self.dead_range)?;
        let mut iter = dead.iter().await.map_err(|error| runtime_error(counters, error))?;
        let mut best: Option<DeadLetter<E>> = None;
        while let Some(item) =
            iter.next(&mut self.buf.0).await.map_err(|error| runtime_error(counters, error))?
        {
            let Some(id) = dead_letter::peek_id::<E>(&item) else { continue };
            let newer = after.is_none_or(|after| id > after);
            let better = best.as_ref().is_none_or(|best| id < best.id);
            if newer && better {
                best = dead_letter::decode::<E>(&item);
            }
        }
        Ok(best)
    }

    /// Dead letters held, as counted since open.
    pub fn dead_count(&self) -> u32 {
        self.dead
    }

    /// Dead letters dropped to make room, over the device's life (as the boot record holds it;
    /// saturating).
    pub fn dead_dropped(&self) -> u32 {
        self.health.dead_dropped
    }
}
