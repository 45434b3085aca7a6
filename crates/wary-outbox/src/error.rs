//! The outbox's errors: one flat enum for every operation, and the refusal of a push, which
//! hands the entry back.

use embedded_storage_async::nor_flash::{NorFlashError, NorFlashErrorKind};

/// What went wrong in an outbox operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The flash refused a read, write or erase (counted in [`crate::Counters::flash_errors`]).
    #[error("flash {0} error")]
    Flash(FlashFault),
    /// The queue region is damaged beyond the flash library's own repair; the next
    /// [`crate::Outbox::open`] erases it and reports it.
    #[error("the queue region is corrupted")]
    Corrupted,
    /// The configuration does not fit the flash (see [`crate::ConfigError`]).
    #[error("bad outbox configuration: {0}")]
    Config(crate::ConfigError),
    /// The entry wrote more bytes than its `MAX_SIZE`.
    #[error("the entry encoded to more than its maximum size")]
    Encode,
    /// The boot counter reached `u32::MAX` and this boot's sequence numbers, if any, are spent:
    /// no new id can be unique, so no record is made (a repeated id would be a repeated key).
    #[error("the boot counter is exhausted")]
    BootsExhausted,
    /// A state that should not happen: the flash library reported a bug of its own, or the
    /// flash reads in words larger than the outbox's buffer.
    #[error("the flash library reported an internal error")]
    Internal,
}

/// The kind of a flash failure, as `embedded-storage` classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum FlashFault {
    /// An address or length was not aligned to the flash's read, write or erase size.
    #[error("alignment")]
    NotAligned,
    /// An address was outside the flash.
    #[error("out-of-bounds")]
    OutOfBounds,
    /// Any other failure of the flash (a timeout, a programming failure, lost power).
    #[error("device")]
    Other,
}

impl FlashFault {
    /// The fault of a flash driver's error.
    pub fn of<E: NorFlashError>(error: &E) -> Self {
        match error.kind() {
            NorFlashErrorKind::NotAligned => FlashFault::NotAligned,
            NorFlashErrorKind::OutOfBounds => FlashFault::OutOfBounds,
            _ => FlashFault::Other,
        }
    }
}

/// A push the outbox did not take: the entry comes back, so nothing is dropped silently.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PushError<E> {
    /// The queue has no room (counted in [`crate::Counters::refused`]). Room comes back as
    /// records are settled; a record that stays pending keeps its whole flash page in use.
    #[error("the outbox is full")]
    Full(E),
    /// The push failed; the entry is not in the queue (a record cut short never reads back).
    #[error("the push failed: {1}")]
    Failed(E, Error),
}

impl<E> PushError<E> {
    /// The entry that was not queued.
    pub fn into_entry(self) -> E {
        match self {
            PushError::Full(entry) | PushError::Failed(entry, _) => entry,
        }
    }
}
