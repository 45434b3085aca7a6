//! A device outbox on NOR flash that survives resets: readings wait in a queue on flash until
//! the uplink settles them, and a boot counter on flash makes every reading's id unique.
//!
//! A device's most common fault is a reset (a brown-out, the watchdog, a battery swap). An
//! outbox in RAM loses every undelivered reading then; this one keeps them, and keeps their
//! idempotency keys too.
//!
//! - **Ids, made once.** Each record carries the [`RecordId`] it was pushed under: this boot's
//!   count and a sequence number. The reading's idempotency key is made from it
//!   (`wary::Key::from_parts(device, id.boot, id.seq)`) when it is sent, every time
//!   it is sent. After a reset the *same* key goes out again, so if the reading's write landed
//!   just before the reset, the cloud recognises the resend and does not apply it twice.
//! - **Boot counter.** [`Outbox::open`] counts a new boot and writes it to flash before it
//!   returns, so before the first send of the boot. It never goes back, wherever power is cut
//!   during that write, and it steps over the newest record still queued, so the pair (boot,
//!   sequence) is never handed out twice. Sequence numbers start at 0 each boot and never
//!   repeat within it (a failed push spends its number too).
//! - **Sequence exhaustion.** A boot has 2³² sequence numbers. The push after the last one
//!   starts a new boot (the next count, written to flash before the record) and takes
//!   sequence 0 there; a sequence never wraps. Only when the boot count itself is at
//!   `u32::MAX` does a push fail ([`Error::BootsExhausted`]): refused, never a repeated id.
//! - **Settling.** A record leaves the queue only through [`Outbox::settle`]: call it for a
//!   verdict of `ok` ([`Settlement::Landed`]) or `failed` ([`Settlement::Failed`]). A reading
//!   that gave up, is unknown or was cancelled stays for a later round. Records can be settled
//!   in any order.
//! - **The last boots' history.** Beside the count, the boot record keeps how many boots in a
//!   row ended unhealthy ([`OpenReport::unhealthy_boots`]; a boot counts as unhealthy from
//!   open until [`Outbox::mark_healthy`]), how far the backoff of the oldest kept reading had
//!   gone ([`BackoffMark`], handed back at open while that reading is pending), and the
//!   modem's [`DialWindow`]. A device in a reset loop thus does not start every boot from no
//!   backoff. Record version 3; a version 1 or 2 record reads with the history it has (see
//!   `boot.rs`).
//! - **Dead letters.** A reading the server refused as it is (a 400, a 422: no resend can fix
//!   it) moves with [`Outbox::dead_letter`] to a bounded region of its own
//!   ([`Config::dead_range`], at least two pages), with the refusal's code, and keeps its id.
//!   The letter is written before the record leaves the queue, and open removes a record a cut
//!   left in both places ([`OpenReport::dead_settled`]). A full region drops its oldest letters
//!   (its oldest page's) to make room, each counted on flash before it goes
//!   ([`Outbox::dead_dropped`]): never silently. Walk them with [`Outbox::next_dead_after`].
//! - **Hold.** When the endpoint itself refuses (unknown device, bad credentials), the uplink
//!   holds the whole outbox; [`Outbox::set_hold`] keeps that [`HoldMark`] in the boot record, so
//!   a reset does not end the hold ([`OpenReport::hold`]).
//! - **Refusal.** A full queue refuses a push and hands the entry back
//!   ([`PushError::Full`]), counting the refusal; nothing is dropped silently. Full means
//!   full: settled records free their page only when a walk of the queue passes it, so a push
//!   that finds no room walks the queue once and tries again before it refuses.
//! - **Damage.** At open, a range holding garbage, another format or a fresh emulator's zeros is
//!   recognised, reported in the [`OpenReport`] and erased; foreign records are discarded, never
//!   handed back as readings. A flash error is counted and returned as [`Error::Flash`].
//!
//! # Power cuts
//!
//! The host tests cut the power at every byte of every flash write and erase of a
//! push/settle sequence, of a dead-letter sequence that fills the region and drops, and of the
//! boot counter's update, reboot, and check: a record whose
//! push returned `Ok` is pending until it is settled; a push that did not return `Ok` left
//! nothing behind; a settled record never comes back, except that a cut during its own settle
//! may leave it pending (settle it again: its key is unchanged, so a resend is deduplicated);
//! no record is duplicated or garbled; every boot's count is above every earlier one; a record
//! is pending or a dead letter, never both; a dead letter is gone only if it was dropped, oldest
//! first, and every drop is counted once.
//!
//! # On flash
//!
//! The queue, the dead letters and the boot counter are `sequential-storage` 8.0.2's queue (two
//! of them) and map, each in its own range of whole pages ([`Config`]). The flash must be a
//! [`MultiwriteNorFlash`](embedded_storage_async::nor_flash::MultiwriteNorFlash): settling
//! clears a record's checksum in place instead of rewriting the queue, which is what lets
//! records be settled in any order. The cost is that a pending record keeps its page from
//! being erased: a record that never settles holds one page of the queue.
//!
//! Per delivered reading the flash sees one push (an 8-byte item header, then the record padded
//! to whole words) and one settle (the header rewritten in place), plus a page erase per page's
//! worth of records. For a 14-byte reading on 4-byte words and 4 KiB pages (`tests/wear.rs`):
//! 44 bytes written in 3 writes, and one page erase per about 118 readings. A boot writes one
//! 60-byte boot record (with the history below). A dead letter costs 40 bytes more than a
//! delivered reading while the region has room (its letter); once the region is full, each one
//! also drops one, which writes a boot record: about 155 bytes per dead letter then, and a page
//! erase of the counter's range per about 65 of them. There is no RAM cache: each operation reads the page markers and walks
//! the records it needs (about 1 KiB read per reading there, and a scan of every erased page
//! at open), which is cheap on internal flash and on the small queues of a device; a dead
//! letter reads the whole dead-letter region a few times. RAM is
//! the outbox itself (240 bytes on a Cortex-M4, 96 of them the record buffer) and the futures
//! of the calls (about 300 bytes while a settle is awaited). A push's future also has room for
//! the boot counter's write, which the push that starts a new boot makes: on the host
//! (`tests/wear.rs`) it is 1,232 bytes, where a push that could not start a boot took 520. A
//! dead letter's future has room for a boot record's write too (a drop counts itself): 1,568
//! bytes there, 64 of them the entry's bytes carried from the queue to the dead letter.
//!
//! # Features
//!
//! - `defmt`: `defmt::Format` on every public type.

#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

mod boot;
mod dead_letter;
mod entry;
mod error;
mod health;
mod outbox;
pub mod sim;

pub use dead_letter::{DeadLetter, REASON_SHED};
pub use entry::{Entry, MAX_ENTRY_SIZE, Record, RecordId};
pub use error::{Error, FlashFault, PushError};
pub use health::{BackoffMark, DialWindow, HoldMark};
pub use outbox::{Config, ConfigError, Counters, Damage, OpenError, OpenReport, Outbox, Pending, Settlement};
