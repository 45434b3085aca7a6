//! A NOR flash simulated in RAM, with power cuts and a tally of wear: the host tests' flash,
//! and a way to measure what the outbox costs a real part.
//!
//! It keeps NOR's rules: erase sets a whole page to `0xFF`; a write can only clear bits (it
//! stores the AND of old and new bytes, as [`MultiwriteNorFlash`] specifies: writing a 1 over a
//! 0 has no effect, and is counted in [`FlashStats::bits_not_set`] so a test can assert it never
//! happens); writes are whole words at word-aligned addresses; reads take any byte.
//!
//! [`SimFlash::cut_after`] cuts the power once a number of bytes has been written or erased:
//! the operation under way stops after exactly that many bytes (a write leaves its first bytes
//! written and the rest untouched; an erase leaves the page erased from its start up to there),
//! returns [`SimError::PowerCut`], and every later operation fails the same way until
//! [`SimFlash::power_on`], which is the reboot.
//!
//! ```
//! use embassy_futures::block_on;
//! use embedded_storage_async::nor_flash::{NorFlash, ReadNorFlash};
//! use wary_outbox::sim::{SimError, SimFlash};
//!
//! let mut memory = [0u8; 512];
//! let mut flash = SimFlash::<4, 256>::new(&mut memory);
//! block_on(async {
//!     flash.erase(0, 256).await.unwrap();
//!     flash.cut_after(2);
//!     assert_eq!(flash.write(0, &[0x12, 0x34, 0x56, 0x78]).await, Err(SimError::PowerCut));
//!     flash.power_on();
//!     let mut seen = [0u8; 4];
//!     flash.read(0, &mut seen).await.unwrap();
//!     assert_eq!(seen, [0x12, 0x34, 0xFF, 0xFF]);
//! });
//! ```

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

/// What the simulated flash refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum SimError {
    /// An address or length not aligned to the word or the page.
    NotAligned,
    /// An address outside the memory.
    OutOfBounds,
    /// The power is off (cut during this or an earlier operation).
    PowerCut,
    /// A failure injected by [`SimFlash::fail`].
    Injected,
}

impl NorFlashError for SimError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            SimError::NotAligned => NorFlashErrorKind::NotAligned,
            SimError::OutOfBounds => NorFlashErrorKind::OutOfBounds,
            SimError::PowerCut | SimError::Injected => NorFlashErrorKind::Other,
        }
    }
}

/// Operations and bytes the flash has seen since it was made or [`SimFlash::reset_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FlashStats {
    /// Read calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Write calls.
    pub writes: u64,
    /// Bytes written (whole words).
    pub bytes_written: u64,
    /// Pages erased (an erase call over several pages counts each).
    pub pages_erased: u64,
    /// Bytes erased.
    pub bytes_erased: u64,
    /// Bits a write asked to set from 0 to 1, which NOR cannot do (they stayed 0).
    pub bits_not_set: u64,
}

/// Which operations [`SimFlash::fail`] makes fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Faults {
    /// Reads fail with [`SimError::Injected`].
    pub reads: bool,
    /// Writes fail, changing nothing.
    pub writes: bool,
    /// Erases fail, changing nothing.
    pub erases: bool,
}

/// A NOR flash over `memory`: `WRITE`-byte words, `ERASE`-byte pages, reads of any size.
#[derive(Debug)]
pub struct SimFlash<'m, const WRITE: usize, const ERASE: usize> {
    memory: &'m mut [u8],
    /// Bytes that may still be written or erased before the power goes.
    budget: Option<u64>,
    powered: bool,
    faults: Faults,
    stats: FlashStats,
}

impl<'m, const WRITE: usize, const ERASE: usize> SimFlash<'m, WRITE, ERASE> {
    /// A flash over `memory` as it is (fresh memory is not erased: erase it, or fill it with
    /// `0xFF`, to start blank). Its capacity is `memory.len()` rounded down to whole pages.
    pub fn new(memory: &'m mut [u8]) -> Self {
        SimFlash {
            memory,
            budget: None,
            powered: true,
            faults: Faults::default(),
            stats: FlashStats::default(),
        }
    }

    /// Cuts the power after `bytes` more bytes have been written or erased.
    pub fn cut_after(&mut self, bytes: u64) {
        self.budget = Some(bytes);
    }

    /// Powers the flash on again with no cut pending: the reboot after a cut.
    pub fn power_on(&mut self) {
        self.budget = None;
        self.powered = true;
    }

    /// True once a cut has happened and until [`SimFlash::power_on`].
    pub fn is_cut(&self) -> bool {
        !self.powered
    }

    /// Makes the chosen operations fail from now on.
    pub fn fail(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// The tally so far.
    pub fn stats(&self) -> FlashStats {
        self.stats
    }

    /// Starts a new tally.
    pub fn reset_stats(&mut self) {
        self.stats = FlashStats::default();
    }

    /// The memory behind the flash, for a test to inspect or damage.
    pub fn memory(&mut self) -> &mut [u8] {
        self.memory
    }

    fn capacity_bytes(&self) -> usize {
        match self.memory.len().checked_rem(ERASE) {
            Some(rest) => self.memory.len().saturating_sub(rest),
            None => 0,
        }
    }

    /// The byte range `offset..offset + len`, checked against the capacity and `align`.
    fn span(&self, offset: u32, len: usize, align: usize) -> Result<core::ops::Range<usize>, SimError> {
        let start = usize::try_from(offset).map_err(|_| SimError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(SimError::OutOfBounds)?;
        if end > self.capacity_bytes() {
            return Err(SimError::OutOfBounds);
        }
        if start.checked_rem(align) != Some(0) || len.checked_rem(align) != Some(0) {
            return Err(SimError::NotAligned);
        }
        Ok(start..end)
    }

    /// Takes one byte of the budget; false (and the power goes) when none is left.
    fn spend(&mut self) -> bool {
        match self.budget {
            Some(0) => {
                self.powered = false;
                false
            }
            Some(left) => {
                self.budget = Some(left.saturating_sub(1));
                true
            }
            None => true,
        }
    }
}

impl<const WRITE: usize, const ERASE: usize> ErrorType for SimFlash<'_, WRITE, ERASE> {
    type Error = SimError;
}

impl<const WRITE: usize, const ERASE: usize> ReadNorFlash for SimFlash<'_, WRITE, ERASE> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), SimError> {
        if !self.powered {
            return Err(SimError::PowerCut);
        }
        if self.faults.reads {
            return Err(SimError::Injected);
        }
        let span = self.span(offset, bytes.len(), 1)?;
        let from = self.memory.get(span).ok_or(SimError::OutOfBounds)?;
        bytes.copy_from_slice(from);
        self.stats.reads = self.stats.reads.saturating_add(1);
        self.stats.bytes_read = self.stats.bytes_read.saturating_add(bytes.len() as u64);
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.capacity_bytes()
    }
}

impl<const WRITE: usize, const ERASE: usize> NorFlash for SimFlash<'_, WRITE, ERASE> {
    const WRITE_SIZE: usize = WRITE;
    const ERASE_SIZE: usize = ERASE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), SimError> {
        if !self.powered {
            return Err(SimError::PowerCut);
        }
        if self.faults.erases {
            return Err(SimError::Injected);
        }
        let len = usize::try_from(to.checked_sub(from).ok_or(SimError::OutOfBounds)?)
            .map_err(|_| SimError::OutOfBounds)?;
        let span = self.span(from, len, ERASE)?;
        self.stats.pages_erased =
            self.stats.pages_erased.saturating_add(len.checked_div(ERASE).unwrap_or(0) as u64);
        for at in span {
            if !self.spend() {
                return Err(SimError::PowerCut);
            }
            let byte = self.memory.get_mut(at).ok_or(SimError::OutOfBounds)?;
            *byte = 0xFF;
            self.stats.bytes_erased = self.stats.bytes_erased.saturating_add(1);
        }
        Ok(())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), SimError> {
        if !self.powered {
            return Err(SimError::PowerCut);
        }
        if self.faults.writes {
            return Err(SimError::Injected);
        }
        let span = self.span(offset, bytes.len(), WRITE)?;
        self.stats.writes = self.stats.writes.saturating_add(1);
        for (at, &new) in span.zip(bytes) {
            if !self.spend() {
                return Err(SimError::PowerCut);
            }
            let byte = self.memory.get_mut(at).ok_or(SimError::OutOfBounds)?;
            let refused = u64::from((new & !*byte).count_ones());
            *byte &= new;
            self.stats.bits_not_set = self.stats.bits_not_set.saturating_add(refused);
            self.stats.bytes_written = self.stats.bytes_written.saturating_add(1);
        }
        Ok(())
    }
}

/// Writing a word twice stores the AND of both, which is what NOR does.
impl<const WRITE: usize, const ERASE: usize> MultiwriteNorFlash for SimFlash<'_, WRITE, ERASE> {}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use embassy_futures::block_on;

    use super::*;

    type Flash<'m> = SimFlash<'m, 4, 64>;

    #[test]
    fn erase_sets_a_page_to_ff_and_writes_only_clear_bits() {
        let mut memory = [0u8; 128];
        let mut flash = Flash::new(&mut memory);
        block_on(async {
            flash.erase(64, 128).await.unwrap();
            flash.write(64, &[0x0F, 0xF0, 0x00, 0xFF]).await.unwrap();
            // 1s over 0s stay 0: the result is the AND.
            flash.write(64, &[0xFF, 0xFF, 0xFF, 0x0F]).await.unwrap();
            let mut seen = [0u8; 4];
            flash.read(64, &mut seen).await.unwrap();
            assert_eq!(seen, [0x0F, 0xF0, 0x00, 0x0F]);
            assert_eq!(flash.stats().bits_not_set, 4 + 4 + 8);
            let mut first = [0u8; 64];
            flash.read(0, &mut first).await.unwrap();
            assert_eq!(first, [0u8; 64], "the other page was not erased");
        });
    }

    #[test]
    fn misaligned_or_outside_operations_are_refused_and_change_nothing() {
        let mut memory = [0xFFu8; 130];
        let mut flash = Flash::new(&mut memory);
        block_on(async {
            assert_eq!(flash.capacity(), 128);
            assert_eq!(flash.write(2, &[0; 4]).await, Err(SimError::NotAligned));
            assert_eq!(flash.write(0, &[0; 3]).await, Err(SimError::NotAligned));
            assert_eq!(flash.write(128, &[0; 4]).await, Err(SimError::OutOfBounds));
            assert_eq!(flash.erase(0, 32).await, Err(SimError::NotAligned));
            assert_eq!(flash.erase(64, 0).await, Err(SimError::OutOfBounds));
            assert_eq!(flash.erase(0, 192).await, Err(SimError::OutOfBounds));
            assert_eq!(flash.read(127, &mut [0; 2]).await, Err(SimError::OutOfBounds));
        });
        assert!(memory.iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn a_cut_during_an_erase_leaves_the_page_erased_up_to_the_cut() {
        let mut memory = [0u8; 128];
        let mut flash = Flash::new(&mut memory);
        block_on(async {
            flash.cut_after(10);
            assert_eq!(flash.erase(0, 128).await, Err(SimError::PowerCut));
            assert!(flash.is_cut());
            assert_eq!(flash.read(0, &mut [0; 1]).await, Err(SimError::PowerCut));
            assert_eq!(flash.stats().pages_erased, 2);
            assert_eq!(flash.stats().bytes_erased, 10);
        });
        assert!(memory[..10].iter().all(|&b| b == 0xFF));
        assert!(memory[10..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_cut_at_the_end_of_an_operation_lets_it_finish_and_stops_the_next() {
        let mut memory = [0xFFu8; 64];
        let mut flash = Flash::new(&mut memory);
        block_on(async {
            flash.cut_after(4);
            flash.write(0, &[1, 2, 3, 4]).await.unwrap();
            assert_eq!(flash.write(4, &[5, 6, 7, 8]).await, Err(SimError::PowerCut));
            flash.power_on();
            let mut seen = [0u8; 8];
            flash.read(0, &mut seen).await.unwrap();
            assert_eq!(seen, [1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFF]);
        });
    }

    #[test]
    fn injected_faults_fail_without_changing_memory() {
        let mut memory = [0xFFu8; 64];
        let mut flash = Flash::new(&mut memory);
        block_on(async {
            flash.fail(Faults { reads: true, writes: true, erases: true });
            assert_eq!(flash.write(0, &[0; 4]).await, Err(SimError::Injected));
            assert_eq!(flash.erase(0, 64).await, Err(SimError::Injected));
            assert_eq!(flash.read(0, &mut [0; 4]).await, Err(SimError::Injected));
            assert_eq!(SimError::Injected.kind(), NorFlashErrorKind::Other);
        });
        assert!(memory.iter().all(|&b| b == 0xFF));
    }
}
