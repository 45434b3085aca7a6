//! The boot counter: one record in a `sequential-storage` map in its own flash range.
//!
//! The record also names the queue range it belongs to. A queue range named by the record was
//! erased and formatted by this outbox; one that is not (first use, or a damaged counter
//! range) is checked more strictly before it is trusted (see [`crate::Outbox::open`]).
//!
//! ```text
//! byte 0..2    'W' 'B'        magic
//! byte 2       BOOT_VERSION   layout of this record (3; version 1 ended at byte 15, 2 at 34)
//! byte 3..7    boot           (u32 LE) the last boot count handed out
//! byte 7..11   queue start    (u32 LE)
//! byte 11..15  queue end      (u32 LE)
//! -- versions 2 and 3 --
//! byte 15..19  unhealthy      (u32 LE) consecutive unhealthy boots, the last one included
//! byte 19..23  mark boot      (u32 LE) \ the oldest reading a kept round left pending
//! byte 23..27  mark seq       (u32 LE) /
//! byte 27      mark step      rounds in a row that kept readings; 0: no mark
//! byte 28..32  dial elapsed   (u32 LE) uptime in the modem's dial window, ms
//! byte 32..34  dials          (u16 LE) dial-ups and modem resets in that window
//! -- version 3 only --
//! byte 34      hold step      probes in a row the endpoint refused; 0: no hold
//! byte 35..37  hold reason    (u16 LE) the last refusal's status or protocol code
//! byte 37..41  dead dropped   (u32 LE) dead letters dropped to make room, ever
//! byte 41..45  dropping boot  (u32 LE) \ the dead letter being dropped (counted already);
//! byte 45..49  dropping seq   (u32 LE) / boot 0: none
//! byte last    COMMIT (0xC3)  never 0xFF: a record cut short never reads back
//! ```
//!
//! A version 1 record (16 bytes) or version 2 record (35 bytes), written by an older firmware,
//! still reads: its boot count and queue range as written, and the history it has (none for
//! version 1: no unhealthy boot, no backoff mark, an empty dial window; for both: no hold and no
//! dead letter dropped). The next write turns it into version 3.
//!
//! The map writes a new record before it forgets the old one, and a record whose write was cut
//! fails its checksum, so a read returns either the old value or the new one: never less than
//! the last value that was written in full. The outbox uses a boot count only after its write
//! returned, so a boot never reuses a count an earlier boot used.

use core::ops::Range;

use crate::entry::RecordId;
use crate::health::{BackoffMark, DialWindow, Health, HoldMark};

/// The map key of the boot record.
pub(crate) const BOOT_KEY: u8 = 0xB0;
const MAGIC: [u8; 2] = *b"WB";
const BOOT_VERSION: u8 = 3;
const BOOT_VERSION_2: u8 = 2;
const BOOT_VERSION_1: u8 = 1;
const COMMIT: u8 = 0xC3;
/// The encoded record's length.
pub(crate) const BOOT_RECORD_SIZE: usize = 50;
/// A version 2 record's length.
const BOOT_RECORD_V2_SIZE: usize = 35;
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
        let health = &self.health;
        let (mark_boot, mark_seq, step) =
            health.backoff.map_or((0, 0, 0), |mark| (mark.id.boot, mark.id.seq, mark.step));
        let (hold_step, hold_reason) = health.hold.map_or((0, 0), |hold| (hold.step, hold.reason));
        let dropping = health.dropping.unwrap_or(RecordId { boot: 0, seq: 0 });
        let parts: [&[u8]; 17] = [
            &MAGIC,
            &[BOOT_VERSION],
            &self.boot.to_le_bytes(),
            &self.queue.start.to_le_bytes(),
            &self.queue.end.to_le_bytes(),
            &health.unhealthy.to_le_bytes(),
            &mark_boot.to_le_bytes(),
            &mark_seq.to_le_bytes(),
            &[step],
            &health.dial.elapsed_ms.to_le_bytes(),
            &health.dial.dials.to_le_bytes(),
            &[hold_step],
            &hold_reason.to_le_bytes(),
            &health.dead_dropped.to_le_bytes(),
            &dropping.boot.to_le_bytes(),
            &dropping.seq.to_le_bytes(),
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

    /// The record in `bytes` (version 3, or version 2 or 1 read with the history they have),
    /// or `None` if they are not exactly one of ours.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let (&commit, _) = bytes.split_last()?;
        let [m0, m1, version] = *bytes.get(..3)? else { return None };
        let fits = match version {
            BOOT_VERSION => bytes.len() == BOOT_RECORD_SIZE,
            BOOT_VERSION_2 => bytes.len() == BOOT_RECORD_V2_SIZE,
            BOOT_VERSION_1 => bytes.len() == BOOT_RECORD_V1_SIZE,
            _ => false,
        };
        if [m0, m1] != MAGIC || !fits || commit != COMMIT {
            return None;
        }
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at.checked_add(4)?)?.try_into().ok()?))
        };
        let u16_at = |at: usize| -> Option<u16> {
            Some(u16::from_le_bytes(bytes.get(at..at.checked_add(2)?)?.try_into().ok()?))
        };
        let boot = u32_at(3)?;
        let queue = u32_at(7)?..u32_at(11)?;
        let mut health = Health::default();
        if version >= BOOT_VERSION_2 {
            let step = *bytes.get(27)?;
            health.backoff = (step > 0)
                .then(|| Some(BackoffMark { id: RecordId { boot: u32_at(19)?, seq: u32_at(23)? }, step }))
                .flatten();
            health.unhealthy = u32_at(15)?;
            health.dial = DialWindow { elapsed_ms: u32_at(28)?, dials: u16_at(32)? };
        }
        if version >= BOOT_VERSION {
            let step = *bytes.get(34)?;
            health.hold = (step > 0).then(|| Some(HoldMark { step, reason: u16_at(35)? })).flatten();
            health.dead_dropped = u32_at(37)?;
            let dropping = RecordId { boot: u32_at(41)?, seq: u32_at(45)? };
            // Boots count from 1: boot 0 is no record's.
            health.dropping = (dropping.boot > 0).then_some(dropping);
        }
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
                hold: Some(HoldMark { step: 6, reason: 403 }),
                dead_dropped: 0x0A0B_0C0D,
                dropping: Some(RecordId { boot: 8, seq: 0x1122_3344 }),
            },
        }
    }

    /// As the firmware before version 2 wrote it.
    const V1: [u8; 16] = [b'W', b'B', 1, 0xFF, 0, 0, 0, 0, 0x20, 0, 0, 0, 0x80, 0, 0, COMMIT];

    /// As the firmware before version 3 wrote it: boot 0xFF, queue 0x2000..0x8000, 3 unhealthy
    /// boots, a backoff mark on (9, 0x01020304) at step 4, 70 s and 5 dials in the window.
    #[rustfmt::skip]
    const V2: [u8; 35] = [
        b'W', b'B', 2,
        0xFF, 0, 0, 0,
        0, 0x20, 0, 0,
        0, 0x80, 0, 0,
        3, 0, 0, 0,
        9, 0, 0, 0,
        0x04, 0x03, 0x02, 0x01,
        4,
        0x70, 0x11, 0x01, 0x00,
        5, 0,
        COMMIT,
    ];

    #[test]
    fn a_boot_record_round_trips() {
        let record = full();
        let bytes = record.encode();
        assert_eq!(bytes[2], 3);
        assert_eq!(bytes[BOOT_RECORD_SIZE - 1], COMMIT);
        assert_eq!(BootRecord::decode(&bytes), Some(record));
        let bare = BootRecord { boot: 1, queue: 0..4096, health: Health::default() };
        assert_eq!(BootRecord::decode(&bare.encode()), Some(bare));
    }

    #[test]
    fn the_version_3_fields_sit_where_the_table_says() {
        let bytes = full().encode();
        assert_eq!(bytes[34], 6, "hold step");
        assert_eq!(&bytes[35..37], &403u16.to_le_bytes(), "hold reason");
        assert_eq!(&bytes[37..41], &[0x0D, 0x0C, 0x0B, 0x0A], "dead dropped");
        assert_eq!(&bytes[41..45], &8u32.to_le_bytes(), "dropping boot");
        assert_eq!(&bytes[45..49], &0x1122_3344u32.to_le_bytes(), "dropping seq");
        // The part shared with version 2 is laid out as version 2 laid it out.
        let mut as_v2 = full();
        as_v2.health.hold = None;
        as_v2.health.dead_dropped = 0;
        as_v2.health.dropping = None;
        assert_eq!(&as_v2.encode()[3..34], &V2[3..34]);
    }

    #[test]
    fn a_version_2_record_reads_with_no_hold_and_no_drops() {
        let record = BootRecord::decode(&V2).unwrap();
        assert_eq!(record.boot, 0xFF);
        assert_eq!(record.queue, 0x2000..0x8000);
        let expected = Health {
            unhealthy: 3,
            backoff: Some(BackoffMark { id: RecordId { boot: 9, seq: 0x0102_0304 }, step: 4 }),
            dial: DialWindow { elapsed_ms: 70_000, dials: 5 },
            hold: None,
            dead_dropped: 0,
            dropping: None,
        };
        assert_eq!(record.health, expected);
        // Written again, it is a version 3 record with the same history.
        let again = BootRecord::decode(&record.encode()).unwrap();
        assert_eq!(again, record);
    }

    #[test]
    fn a_version_1_record_reads_with_no_history() {
        let record = BootRecord::decode(&V1).unwrap();
        assert_eq!(record.boot, 0xFF);
        assert_eq!(record.queue, 0x2000..0x8000);
        assert_eq!(record.health, Health::default());
        assert_eq!(record.health.backoff, None);
        assert_eq!(record.health.hold, None);
        assert_eq!(record.health.dead_dropped, 0);
    }

    #[test]
    fn a_version_byte_on_another_versions_length_is_not_ours() {
        for version in [1, 2, 4, 0xFF] {
            let mut long = full().encode();
            long[2] = version;
            assert_eq!(BootRecord::decode(&long), None, "version {version} on 50 bytes");
        }
        for version in [1, 3] {
            let mut v2 = V2;
            v2[2] = version;
            assert_eq!(BootRecord::decode(&v2), None, "version {version} on 35 bytes");
        }
        for version in [2, 3] {
            let mut v1 = V1;
            v1[2] = version;
            assert_eq!(BootRecord::decode(&v1), None, "version {version} on 16 bytes");
        }
    }

    #[test]
    fn a_record_cut_short_never_reads() {
        // Whatever prefix landed, with the rest still erased: none of the three versions.
        let v3 = full().encode();
        let records: [&[u8]; 3] = [&v3, &V2, &V1];
        for record in records {
            for cut in 0..record.len() {
                let mut seen = record.to_vec();
                seen[cut..].fill(0xFF);
                assert_eq!(BootRecord::decode(&seen), None, "{} bytes, cut at {cut}", record.len());
                assert_eq!(BootRecord::decode(&record[..cut]), None, "{} bytes, {cut} read", record.len());
            }
        }
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
    fn a_step_of_zero_is_no_mark_and_no_hold() {
        let mut record = full();
        record.health.backoff = Some(BackoffMark { id: RecordId { boot: 2, seq: 3 }, step: 0 });
        record.health.hold = Some(HoldMark { step: 0, reason: 401 });
        let read = BootRecord::decode(&record.encode()).unwrap();
        assert_eq!(read.health.backoff, None);
        assert_eq!(read.health.hold, None);
    }

    #[test]
    fn a_dropping_mark_of_boot_zero_is_none() {
        let mut record = full();
        record.health.dropping = Some(RecordId { boot: 0, seq: 7 });
        assert_eq!(BootRecord::decode(&record.encode()).unwrap().health.dropping, None);
    }
}
