//! The boot counter: one record in a `sequential-storage` map in its own flash range.
//!
//! The record also names the queue range it belongs to. A queue range named by the record was
//! erased and formatted by this outbox; one that is not (first use, or a damaged counter
//! range) is checked more strictly before it is trusted (see [`crate::Outbox::open`]).
//!
//! ```text
//! byte 0..2    'W' 'B'        magic
//! byte 2       BOOT_VERSION   layout of this record
//! byte 3..7    boot           (u32 LE) the last boot count handed out
//! byte 7..11   queue start    (u32 LE)
//! byte 11..15  queue end      (u32 LE)
//! byte 15      COMMIT (0xC3)  never 0xFF: a record cut short never reads back
//! ```
//!
//! The map writes a new record before it forgets the old one, and a record whose write was cut
//! fails its checksum, so a read returns either the old value or the new one: never less than
//! the last value that was written in full. The outbox uses a boot count only after its write
//! returned, so a boot never reuses a count an earlier boot used.

use core::ops::Range;

/// The map key of the boot record.
pub(crate) const BOOT_KEY: u8 = 0xB0;
const MAGIC: [u8; 2] = *b"WB";
const BOOT_VERSION: u8 = 1;
const COMMIT: u8 = 0xC3;
/// The encoded record's length.
pub(crate) const BOOT_RECORD_SIZE: usize = 16;

/// The boot record: the last boot count handed out, and the queue range it vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootRecord {
    pub(crate) boot: u32,
    pub(crate) queue: Range<u32>,
}

impl BootRecord {
    pub(crate) fn encode(&self) -> [u8; BOOT_RECORD_SIZE] {
        let [b0, b1, b2, b3] = self.boot.to_le_bytes();
        let [s0, s1, s2, s3] = self.queue.start.to_le_bytes();
        let [e0, e1, e2, e3] = self.queue.end.to_le_bytes();
        [MAGIC[0], MAGIC[1], BOOT_VERSION, b0, b1, b2, b3, s0, s1, s2, s3, e0, e1, e2, e3, COMMIT]
    }

    /// The record in `bytes`, or `None` if they are not exactly one of ours.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; BOOT_RECORD_SIZE] = bytes.try_into().ok()?;
        let [m0, m1, version, b0, b1, b2, b3, s0, s1, s2, s3, e0, e1, e2, e3, commit] = *bytes;
        if [m0, m1] != MAGIC || version != BOOT_VERSION || commit != COMMIT {
            return None;
        }
        Some(BootRecord {
            boot: u32::from_le_bytes([b0, b1, b2, b3]),
            queue: u32::from_le_bytes([s0, s1, s2, s3])..u32::from_le_bytes([e0, e1, e2, e3]),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_record_round_trips() {
        let record = BootRecord { boot: 0x0000_00FF, queue: 0x2000..0x8000 };
        let bytes = record.encode();
        assert_eq!(bytes[15], COMMIT);
        assert_eq!(BootRecord::decode(&bytes), Some(record));
    }

    #[test]
    fn anything_else_is_not_a_boot_record() {
        let bytes = BootRecord { boot: 7, queue: 0..4096 }.encode();
        for at in [0, 1, 2, 15] {
            let mut other = bytes;
            other[at] ^= 0x01;
            assert_eq!(BootRecord::decode(&other), None, "byte {at}");
        }
        assert_eq!(BootRecord::decode(&bytes[..15]), None);
        assert_eq!(BootRecord::decode(&[0xFF; 16]), None);
        assert_eq!(BootRecord::decode(&[0; 16]), None);
    }
}
