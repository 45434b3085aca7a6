//! The boot counter: one record in a `sequential-storage` map in its own flash range.
//!
//! The record also names the queue range it belongs to. A queue range named by the record was
//! erased and formatted by this outbox; one that is not (first use, or a damaged counter
//! range) is checked more strictly before it is trusted (see [`crate::Outbox::open`]).
//!
//! ```text
//! byte 0..2    'W' 'B'        magic
//! byte 2       BOOT_VERSION   layout of this record (2; version 1 ended at byte 15)
//! byte 3..7    boot           (u32 LE) the last boot count handed out
//! byte 7..11   queue start    (u32 LE)
//! byte 11..15  queue end      (u32 LE)
//! -- version 2 only --
//! byte 15..19  unhealthy      (u32 LE) consecutive unhealthy boots, the last one included
//! byte 19..23  mark boot      (u32 LE) \ the oldest reading a kept round left pending
//! byte 23..27  mark seq       (u32 LE) /
//! byte 27      mark step      rounds in a row that kept readings; 0: no mark
//! byte 28..32  dial elapsed   (u32 LE) uptime in the modem's dial window, ms
//! byte 32..34  dials          (u16 LE) dial-ups and modem resets in that window
//! byte last    COMMIT (0xC3)  never 0xFF: a record cut short never reads back
//! ```
//!
//! A version 1 record (16 bytes, written by an older firmware) still reads: its boot count
//! and queue range as written, and no history (no unhealthy boot, no backoff mark, an empty
//! dial window). The next write turns it into version 2.
//!
//! The map writes a new record before it forgets the old one, and a record whose write was cut
//! fails its checksum, so a read returns either the old value or the new one: never less than
//! the last value that was written in full. The outbox uses a boot count only after its write
//! returned, so a boot never reuses a count an earlier boot used.

use core::ops::Range;

use crate::entry::RecordId;
use crate::health::{BackoffMark, DialWindow, Health};

/// The map key of the boot record.
pub(crate) const BOOT_KEY: u8 = 0xB0;
const MAGIC: [u8; 2] = *b"WB";
const BOOT_VERSION: u8 = 2;
const BOOT_VERSION_1: u8 = 1;
const COMMIT: u8 = 0xC3;
/// The encoded record's length.
pub(crate) const BOOT_RECORD_SIZE: usize = 35;
/// A version 1 record's length.
const BOOT_RECORD_V1_SIZE: usize = 16;

/// The boot record: the last boot count handed out, the queue range it vouches for, and the
/// history of the last boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootRecord {
    pub(crate) boot: u32,
    pub(crate) queue: Range<u32>,
    pub(crate) health: Health,
}

impl BootRecord {
    pub(crate) fn encode(&self) -> [u8; BOOT_RECORD_SIZE] {
        let mut out = [0u8; BOOT_RECORD_SIZE];
        let (mark_boot, mark_seq, step) =
            self.health.backoff.map_or((0, 0, 0), |mark| (mark.id.boot, mark.id.seq, mark.step));
        let parts: [&[u8]; 12] = [
            &MAGIC,
            &[BOOT_VERSION],
            &self.boot.to_le_bytes(),
            &self.queue.start.to_le_bytes(),
            &self.queue.end.to_le_bytes(),
            &self.health.unhealthy.to_le_bytes(),
            &mark_boot.to_le_bytes(),
            &mark_seq.to_le_bytes(),
            &[step],
            &self.health.dial.elapsed_ms.to_le_bytes(),
            &self.health.dial.dials.to_le_bytes(),
            &[COMMIT],
        ];
        let mut at = 0usize;
        for part in parts {
            let end = at.saturating_add(part.len());
            // Byte by byte: `copy_from_slice` would link a length check's panic, which the
            // compiler cannot see past here (the parts' lengths sum to the record's size).
            for (byte, from) in out.get_mut(at..end).unwrap_or_default().iter_mut().zip(part) {
                *byte = *from;
            }
            at = end;
        }
        out
    }

    /// The record in `bytes` (version 2, or version 1 read with no history), or `None` if they
    /// are not exactly one of ours.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let (&commit, _) = bytes.split_last()?;
        let [m0, m1, version] = *bytes.get(..3)? else { return None };
        let fits = match version {
            BOOT_VERSION => bytes.len() == BOOT_RECORD_SIZE,
            BOOT_VERSION_1 => bytes.len() == BOOT_RECORD_V1_SIZE,
            _ => false,
        };
        if [m0, m1] != MAGIC || !fits || commit != COMMIT {
            return None;
        }
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at.checked_add(4)?)?.try_into().ok()?))
        };
        let boot = u32_at(3)?;
        let queue = u32_at(7)?..u32_at(11)?;
        let health = if version == BOOT_VERSION_1 {
            Health::default()
        } else {
            let step = *bytes.get(27)?;
            let backoff = (step > 0)
                .then(|| Some(BackoffMark { id: RecordId { boot: u32_at(19)?, seq: u32_at(23)? }, step }))
                .flatten();
            let dials = u16::from_le_bytes(bytes.get(32..34)?.try_into().ok()?);
            Health { unhealthy: u32_at(15)?, backoff, dial: DialWindow { elapsed_ms: u32_at(28)?, dials } }
        };
        Some(BootRecord { boot, queue, health })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    fn full() -> BootRecord {
        BootRecord {
            boot: 0x0000_00FF,
            queue: 0x2000..0x8000,
            health: Health {
                unhealthy: 3,
                backoff: Some(BackoffMark { id: RecordId { boot: 9, seq: 0x0102_0304 }, step: 4 }),
                dial: DialWindow { elapsed_ms: 70_000, dials: 5 },
            },
        }
    }

    #[test]
    fn a_boot_record_round_trips() {
        let record = full();
        let bytes = record.encode();
        assert_eq!(bytes[2], 2);
        assert_eq!(bytes[BOOT_RECORD_SIZE - 1], COMMIT);
        assert_eq!(BootRecord::decode(&bytes), Some(record));
        let bare = BootRecord { boot: 1, queue: 0..4096, health: Health::default() };
        assert_eq!(BootRecord::decode(&bare.encode()), Some(bare));
    }

    #[test]
    fn a_version_1_record_reads_with_no_history() {
        // As the firmware before version 2 wrote it.
        let v1 = [b'W', b'B', 1, 0xFF, 0, 0, 0, 0, 0x20, 0, 0, 0, 0x80, 0, 0, COMMIT];
        let record = BootRecord::decode(&v1).unwrap();
        assert_eq!(record.boot, 0xFF);
        assert_eq!(record.queue, 0x2000..0x8000);
        assert_eq!(record.health, Health::default());
        assert_eq!(record.health.backoff, None);
        // A version 1 header on a version 2 length (or the other way round) is not ours.
        let mut long = full().encode();
        long[2] = 1;
        assert_eq!(BootRecord::decode(&long), None);
        let mut short = v1;
        short[2] = 2;
        assert_eq!(BootRecord::decode(&short), None);
    }

    #[test]
    fn anything_else_is_not_a_boot_record() {
        let bytes = full().encode();
        for at in [0, 1, 2, BOOT_RECORD_SIZE - 1] {
            let mut other = bytes;
            other[at] ^= 0x01;
            assert_eq!(BootRecord::decode(&other), None, "byte {at}");
        }
        assert_eq!(BootRecord::decode(&bytes[..BOOT_RECORD_SIZE - 1]), None);
        assert_eq!(BootRecord::decode(&[0xFF; BOOT_RECORD_SIZE]), None);
        assert_eq!(BootRecord::decode(&[0; BOOT_RECORD_SIZE]), None);
        assert_eq!(BootRecord::decode(&[]), None);
    }

    #[test]
    fn a_step_of_zero_is_no_mark() {
        let mut record = full();
        record.health.backoff = Some(BackoffMark { id: RecordId { boot: 2, seq: 3 }, step: 0 });
        assert_eq!(BootRecord::decode(&record.encode()).unwrap().health.backoff, None);
    }
}
