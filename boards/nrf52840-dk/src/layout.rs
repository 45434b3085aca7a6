// The nRF52840's internal flash, split between the program and the outbox. Included by
// `build.rs` too, which refuses to build when `memory.x` gives the program a different range:
// the linker then keeps every byte of code out of the outbox's pages.

/// The nRF52840's internal flash: 1 MiB from address 0.
pub const FLASH_SIZE: u32 = 1024 * 1024;
/// One NVMC page, the unit of erase.
pub const PAGE_SIZE: u32 = 4096;
/// The outbox's pages: the top 40 KiB of the flash. `memory.x` ends FLASH here.
pub const OUTBOX_START: u32 = FLASH_SIZE - 10 * PAGE_SIZE;
/// The dead letters' two pages, at the start of the outbox's range: below the boot counter and
/// the queue, which keep the addresses they had before there were dead letters, so a firmware
/// update keeps the readings and the boot count.
pub const DEAD_RANGE: core::ops::Range<u32> = OUTBOX_START..OUTBOX_START + 2 * PAGE_SIZE;
/// The boot counter's two pages.
pub const BOOT_RANGE: core::ops::Range<u32> = DEAD_RANGE.end..DEAD_RANGE.end + 2 * PAGE_SIZE;
/// The queue's six pages, up to the end of the flash.
pub const QUEUE_RANGE: core::ops::Range<u32> = BOOT_RANGE.end..FLASH_SIZE;
