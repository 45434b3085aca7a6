//! A NOR flash emulated in PSRAM, which survives a guest reset.
//!
//! mps2-an386 has no flash, but QEMU rewrites only the ELF's load segments on a reset
//! (`SYSRESETREQ`): the 16 MiB PSRAM at `0x2100_0000`, outside `memory.x`, keeps its contents
//! until the QEMU process ends. [`PsramFlash`] keeps NOR's rules there, so code written for a
//! real part behaves the same:
//!
//! - [`FLASH_SIZE`] bytes in [`PAGE_SIZE`]-byte pages and [`WORD_SIZE`]-byte words (the
//!   nRF52840's geometry);
//! - an erase sets whole pages to `0xFF`;
//! - a write takes whole, aligned words and can only clear bits: it stores the AND of the old
//!   and new bytes (what `MultiwriteNorFlash` specifies), so writing a 1 over a 0 has no effect;
//! - reads take any byte.
//!
//! On the first boot of a QEMU process the region holds what QEMU put there (zeros), which no
//! flash format takes for its own: code on top must treat it as foreign and erase it.
//!
//! [`reset`] resets the guest on purpose; [`SurvivingWord`] is one more word beside the flash
//! that survives it too, for a test to count its resets.

use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

/// The emulated flash's first byte: the start of PSRAM.
pub const BASE: usize = 0x2100_0000;
/// The emulated flash's size: 16 pages.
pub const FLASH_SIZE: usize = 64 * 1024;
/// The erase unit.
pub const PAGE_SIZE: usize = 4096;
/// The write unit.
pub const WORD_SIZE: usize = 4;
/// The surviving word sits right after the flash, still in PSRAM.
const SURVIVING_WORD: usize = BASE + FLASH_SIZE;

/// What the emulated flash refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum FlashError {
    /// An address or length not aligned to the word (writes) or the page (erases).
    NotAligned,
    /// An address outside the flash.
    OutOfBounds,
}

impl NorFlashError for FlashError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            FlashError::NotAligned => NorFlashErrorKind::NotAligned,
            FlashError::OutOfBounds => NorFlashErrorKind::OutOfBounds,
        }
    }
}

/// The emulated flash; [`take`] hands out the only one.
#[derive(Debug)]
pub struct PsramFlash {
    _only_one: (),
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// The emulated flash, the first time; `None` after that, so no two owners write it.
pub fn take() -> Option<PsramFlash> {
    (!TAKEN.swap(true, Ordering::AcqRel)).then_some(PsramFlash { _only_one: () })
}

impl PsramFlash {
    /// The byte range `offset..offset + len` as addresses, checked against the size and `align`.
    fn span(offset: u32, len: usize, align: usize) -> Result<core::ops::Range<usize>, FlashError> {
        let start = offset as usize;
        let end = start.checked_add(len).ok_or(FlashError::OutOfBounds)?;
        if end > FLASH_SIZE {
            return Err(FlashError::OutOfBounds);
        }
        if !start.is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(FlashError::NotAligned);
        }
        Ok(BASE + start..BASE + end)
    }
}

impl ErrorType for PsramFlash {
    type Error = FlashError;
}

impl ReadNorFlash for PsramFlash {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        let span = Self::span(offset, bytes.len(), 1)?;
        for (address, byte) in span.zip(bytes) {
            // SAFETY: `span` lies inside the PSRAM region that `take` hands to one owner; no
            // Rust object lives there (it is outside memory.x).
            *byte = unsafe { ptr::read_volatile(address as *const u8) };
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        FLASH_SIZE
    }
}

impl NorFlash for PsramFlash {
    const WRITE_SIZE: usize = WORD_SIZE;
    const ERASE_SIZE: usize = PAGE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        let len = to.checked_sub(from).ok_or(FlashError::OutOfBounds)? as usize;
        for address in Self::span(from, len, PAGE_SIZE)? {
            // SAFETY: as in `read`.
            unsafe { ptr::write_volatile(address as *mut u8, 0xFF) };
        }
        Ok(())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        for (address, &new) in Self::span(offset, bytes.len(), WORD_SIZE)?.zip(bytes) {
            // SAFETY: as in `read`. NOR can only clear bits: the cell keeps the AND.
            unsafe {
                let old = ptr::read_volatile(address as *const u8);
                ptr::write_volatile(address as *mut u8, old & new);
            }
        }
        Ok(())
    }
}

/// A word is written more than once as the AND of its values, as on NOR.
impl MultiwriteNorFlash for PsramFlash {}

/// A word in PSRAM beside the flash that survives a reset (and holds zero, or whatever QEMU put
/// there, on the first boot of a QEMU process).
#[derive(Debug)]
pub struct SurvivingWord {
    _private: (),
}

impl SurvivingWord {
    /// The word. It is plain RAM with no owner: callers agree on who writes it.
    pub const fn new() -> Self {
        SurvivingWord { _private: () }
    }

    /// Reads it.
    pub fn get(&self) -> u32 {
        // SAFETY: an aligned word of PSRAM outside memory.x and outside the flash.
        unsafe { ptr::read_volatile(SURVIVING_WORD as *const u32) }
    }

    /// Writes it.
    pub fn set(&self, value: u32) {
        // SAFETY: as in `get`.
        unsafe { ptr::write_volatile(SURVIVING_WORD as *mut u32, value) }
    }
}

impl Default for SurvivingWord {
    fn default() -> Self {
        Self::new()
    }
}

/// Resets the guest through the SCB (`SYSRESETREQ`), as a watchdog or a brown-out would: QEMU
/// reloads the ELF and starts it again, and PSRAM keeps the flash. Needs QEMU without
/// `-no-reboot`, which would end the process instead.
pub fn reset() -> ! {
    // Volatile writes above are done before this: `sys_reset` issues a DSB before requesting
    // the reset.
    cortex_m::peripheral::SCB::sys_reset()
}
