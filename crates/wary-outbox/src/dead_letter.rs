//! A dead letter: a reading the server refused as it is, kept on flash with the server's reason
//! instead of being thrown away (see [`crate::Outbox::dead_letter`]).
//!
//! ```text
//! byte 0..2    'W' 'D'            dead letter magic: anything else is foreign here
//! byte 2       DEAD_VERSION       the layout; another value is an older or newer outbox
//! byte 3       Entry::TAG         the entry type and its encoding version
//! byte 4       n                  the entry's length
//! byte 5..9    boot  (u32 LE)     \ the record's id, as it was pending
//! byte 9..13   seq   (u32 LE)     /
//! byte 13..15  reason (u16 LE)    the status or protocol code the server refused it with
//! byte 15..    the entry's n bytes as the queue held them, then 0x00 up to a whole flash
//!              word less one byte
//! last byte    COMMIT (0xC3)      never 0xFF, for the reason a queued record ends with it
//! ```
//!
//! The end byte has the same job as a queued record's (see `entry.rs`): a write that was cut,
//! and so reported as failed, never reads back as a whole dead letter.

use crate::entry::{Entry, MAX_ENTRY_SIZE, RecordId};

/// A reading moved out of the queue because the server refused it as it is, with the reason it
/// gave. Its id is the one it was pending under, so the idempotency key it was sent with can be
/// made again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DeadLetter<E> {
    /// The record's id, as it was pending.
    pub id: RecordId,
    /// The status or protocol code the server refused it with (a 400 or 422, say).
    pub reason: u16,
    /// The caller's entry, as the queue held it.
    pub entry: E,
}

/// The reason of a dead letter the outbox made itself rather than a server's refusal: the
/// queue was full and [`crate::Outbox::push_shedding`] moved its oldest reading out to make room
/// for a new one. No status or protocol code is below 100, so it never reads as a server's.
pub const REASON_SHED: u16 = 1;

const MAGIC: [u8; 2] = *b"WD";
/// The layout above. Bump it when the layout changes.
const DEAD_VERSION: u8 = 1;
const COMMIT: u8 = 0xC3;
/// Magic, version, tag, length, boot, seq, reason.
const HEADER_SIZE: usize = 15;
/// The longest dead letter before padding to a flash word.
pub(crate) const MAX_DEAD_SIZE: usize = HEADER_SIZE + 1 + MAX_ENTRY_SIZE;

/// Frames the entry bytes `body` of entry type `E` as a dead letter of `id` with `reason`
/// into `buf`, padded to a whole number of `word`-byte flash words; its length, or `None` if
/// `body` is longer than `E` allows or `buf` is too short.
pub(crate) fn encode<E: Entry>(
    id: RecordId,
    reason: u16,
    body: &[u8],
    word: usize,
    buf: &mut [u8],
) -> Option<usize> {
    if body.len() > E::MAX_SIZE.min(MAX_ENTRY_SIZE) {
        return None;
    }
    let [b0, b1, b2, b3] = id.boot.to_le_bytes();
    let [s0, s1, s2, s3] = id.seq.to_le_bytes();
    let [r0, r1] = reason.to_le_bytes();
    let n = u8::try_from(body.len()).ok()?;
    let header = [MAGIC[0], MAGIC[1], DEAD_VERSION, E::TAG, n, b0, b1, b2, b3, s0, s1, s2, s3, r0, r1];
    let end = HEADER_SIZE.checked_add(body.len())?;
    // Byte by byte: `copy_from_slice` would link a length check's panic (see `boot.rs`).
    let framed = buf.get_mut(..end)?;
    for (byte, from) in framed.iter_mut().zip(header.iter().chain(body)) {
        *byte = *from;
    }
    let total = end.checked_add(1)?.div_ceil(word.max(1)).checked_mul(word.max(1))?;
    let last = total.checked_sub(1)?;
    buf.get_mut(end..last)?.fill(0);
    *buf.get_mut(last)? = COMMIT;
    Some(total)
}

/// The id of a stored item if it is a dead letter of ours for entry type `E` (its entry
/// decodes), `None` for anything else.
pub(crate) fn peek_id<E: Entry>(bytes: &[u8]) -> Option<RecordId> {
    decode::<E>(bytes).map(|letter| letter.id)
}

/// The dead letter in a stored item, `None` if it is not one of ours for entry type `E`.
pub(crate) fn decode<E: Entry>(bytes: &[u8]) -> Option<DeadLetter<E>> {
    let header: &[u8; HEADER_SIZE] = bytes.get(..HEADER_SIZE)?.try_into().ok()?;
    let [m0, m1, version, tag, n, b0, b1, b2, b3, s0, s1, s2, s3, r0, r1] = *header;
    let (&commit, before_commit) = bytes.split_last()?;
    let len = usize::from(n);
    let ours = [m0, m1] == MAGIC
        && version == DEAD_VERSION
        && tag == E::TAG
        && commit == COMMIT
        && len <= E::MAX_SIZE.min(MAX_ENTRY_SIZE);
    if !ours {
        return None;
    }
    let body_end = HEADER_SIZE.checked_add(len)?;
    let body = before_commit.get(HEADER_SIZE..body_end)?;
    if before_commit.get(body_end..)?.iter().any(|&byte| byte != 0) {
        return None;
    }
    Some(DeadLetter {
        id: RecordId {
            boot: u32::from_le_bytes([b0, b1, b2, b3]),
            seq: u32::from_le_bytes([s0, s1, s2, s3]),
        },
        reason: u16::from_le_bytes([r0, r1]),
        entry: E::decode(body)?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use crate::entry::{self, Decoded};

    #[derive(Debug, PartialEq, Eq, Clone)]
    struct Bytes3([u8; 3]);

    impl Entry for Bytes3 {
        const TAG: u8 = 7;
        const MAX_SIZE: usize = 3;
        fn encode(&self, buf: &mut [u8]) -> usize {
            if let Some(out) = buf.get_mut(..3) {
                out.copy_from_slice(&self.0);
            }
            3
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            Some(Bytes3(bytes.try_into().ok()?))
        }
    }

    const ID: RecordId = RecordId { boot: 0x0102_0304, seq: 0xA0B0_C0D0 };

    #[test]
    fn a_dead_letter_round_trips_and_ends_with_the_commit_byte() {
        let mut buf = [0xAAu8; MAX_DEAD_SIZE + 32];
        for word in [1, 2, 4, 8, 16, 32] {
            let len = encode::<Bytes3>(ID, 422, &[0xFF; 3], word, &mut buf).unwrap();
            assert_eq!(len % word, 0, "word {word}");
            assert!(len >= HEADER_SIZE + 4 && len < HEADER_SIZE + 4 + word, "word {word}: {len}");
            assert_eq!(buf[len - 1], COMMIT);
            let letter = decode::<Bytes3>(&buf[..len]).unwrap();
            assert_eq!(letter, DeadLetter { id: ID, reason: 422, entry: Bytes3([0xFF; 3]) });
            assert_eq!(peek_id::<Bytes3>(&buf[..len]), Some(ID));
        }
        assert_eq!(&buf[..15], &[b'W', b'D', 1, 7, 3, 4, 3, 2, 1, 0xD0, 0xC0, 0xB0, 0xA0, 0xA6, 0x01]);
    }

    #[test]
    fn a_dead_letter_cut_short_or_changed_is_foreign() {
        let mut buf = [0u8; MAX_DEAD_SIZE + 32];
        let len = encode::<Bytes3>(ID, 400, &[1, 2, 3], 4, &mut buf).unwrap();
        assert_eq!(len, 20);
        for cut in 0..len {
            let mut seen = buf;
            seen[cut..len].fill(0xFF);
            assert_eq!(decode::<Bytes3>(&seen[..len]), None, "cut at {cut}");
        }
        for (at, value) in [(0, b'X'), (1, b'O'), (2, DEAD_VERSION + 1), (3, 6), (4, 2), (4, 200), (18, 1)] {
            let mut other = buf;
            other[at] = value;
            assert_eq!(decode::<Bytes3>(&other[..len]), None, "byte {at}");
        }
        assert_eq!(decode::<Bytes3>(&[]), None);
    }

    #[test]
    fn a_queued_record_is_no_dead_letter_and_the_other_way_round() {
        let mut buf = [0u8; MAX_DEAD_SIZE + 32];
        let len = entry::encode(ID, &Bytes3([1, 2, 3]), 4, &mut buf).unwrap();
        assert_eq!(decode::<Bytes3>(&buf[..len]), None);
        let len = encode::<Bytes3>(ID, 400, &[1, 2, 3], 4, &mut buf).unwrap();
        assert_eq!(entry::decode::<Bytes3>(&buf[..len]), Decoded::Foreign);
    }

    #[test]
    fn a_body_longer_than_the_entry_allows_is_refused() {
        let mut buf = [0u8; MAX_DEAD_SIZE + 32];
        assert_eq!(encode::<Bytes3>(ID, 400, &[0; 4], 4, &mut buf), None);
        assert_eq!(encode::<Bytes3>(ID, 400, &[0; 3], 4, &mut buf[..10]), None);
    }
}
