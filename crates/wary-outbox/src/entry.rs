//! What the outbox stores: an [`Entry`] (the caller's reading) framed as a record that carries
//! the [`RecordId`] it was created under.
//!
//! ```text
//! byte 0..2   'W' 'O'            the outbox's magic: anything else is foreign
//! byte 2      RECORD_VERSION     the record layout; another value is an older or newer outbox
//! byte 3      Entry::TAG         the entry type and its encoding version
//! byte 4      n                  the entry's length
//! byte 5..9   boot  (u32 LE)     \ the record's id, fixed when the reading was made:
//! byte 9..13  seq   (u32 LE)     / its idempotency key is made from it on every send
//! byte 13..   the entry's n bytes, then 0x00 up to a whole flash word less one byte
//! last byte   COMMIT (0xC3)      never 0xFF, and the last byte of the last word: see below
//! ```
//!
//! Flash is written in address order, so the last byte of a record is the last to land. An erased
//! byte reads `0xFF`; if the record could end in `0xFF`, or if padding came after it, a power cut
//! just before the end would leave a record that reads back whole although its write was
//! reported as failed, and a caller that pushed the reading again would send it under two
//! keys. Ending every record, at a word boundary, with a byte that is never `0xFF` makes "the
//! write failed" mean "the record is not there".

/// An item the outbox can hold: a reading with a fixed maximum encoded size.
///
/// `decode` must accept exactly what `encode` wrote and should reject anything else (return
/// `None`): a record whose entry does not decode is treated as foreign, never handed back.
///
/// ```
/// use wary_outbox::Entry;
///
/// #[derive(Debug, PartialEq)]
/// struct Celsius(i32);
///
/// impl Entry for Celsius {
///     const TAG: u8 = 0x01;
///     const MAX_SIZE: usize = 4;
///     fn encode(&self, buf: &mut [u8]) -> usize {
///         match buf.get_mut(..4) {
///             Some(out) => {
///                 out.copy_from_slice(&self.0.to_le_bytes());
///                 4
///             }
///             None => 0,
///         }
///     }
///     fn decode(bytes: &[u8]) -> Option<Self> {
///         Some(Celsius(i32::from_le_bytes(bytes.try_into().ok()?)))
///     }
/// }
/// ```
pub trait Entry: Sized {
    /// The entry type and its encoding version. Change it whenever the encoding changes: records
    /// with another tag are recognised as foreign and discarded, never decoded as this type.
    const TAG: u8;
    /// The most bytes [`Entry::encode`] ever writes; at most [`MAX_ENTRY_SIZE`].
    const MAX_SIZE: usize;
    /// Writes the entry into `buf` (exactly [`Entry::MAX_SIZE`] bytes long) and returns how many
    /// bytes it used. Returning more than `buf.len()` is refused as an encoding error.
    fn encode(&self, buf: &mut [u8]) -> usize;
    /// Reads an entry back from what [`Entry::encode`] wrote; `None` for anything else.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

/// The largest [`Entry::MAX_SIZE`] the outbox accepts; it bounds the outbox's one RAM buffer.
/// A larger entry type does not compile with [`crate::Outbox`]:
///
/// ```compile_fail
/// use wary_outbox::{Config, Entry, Outbox, sim::SimFlash};
///
/// struct Big;
/// impl Entry for Big {
///     const TAG: u8 = 1;
///     const MAX_SIZE: usize = wary_outbox::MAX_ENTRY_SIZE + 1;
///     fn encode(&self, _: &mut [u8]) -> usize { 0 }
///     fn decode(_: &[u8]) -> Option<Self> { Some(Big) }
/// }
///
/// let mut memory = [0xFFu8; 2048];
/// let config = Config { boot_range: 0..512, queue_range: 512..1536, dead_range: 1536..2048 };
/// let _ = Outbox::<_, Big>::open(SimFlash::<4, 256>::new(&mut memory), config);
/// ```
pub const MAX_ENTRY_SIZE: usize = 64;

/// Where a record came from: the boot it was created in and its sequence number within that
/// boot. Unique per device by construction (the boot counter never repeats a value and the
/// sequence never repeats within a boot), and ordered like the queue: older records have
/// smaller ids.
///
/// The idempotency key of a reading is made from its id (`wary::Key::from_parts(device,
/// id.boot, id.seq)`), so a reading resent after a reset carries the same key as
/// before it, and the cloud deduplicates an effect that landed just before the reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RecordId {
    /// The boot count when the record was made (from 1).
    pub boot: u32,
    /// The sequence number within that boot (from 0).
    pub seq: u32,
}

/// A pending record: an entry and the id it was created under.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record<E> {
    /// The record's id, the source of its idempotency key.
    pub id: RecordId,
    /// The caller's entry.
    pub entry: E,
}

const MAGIC: [u8; 2] = *b"WO";
/// The record layout above. Bump it when the layout changes.
pub(crate) const RECORD_VERSION: u8 = 1;
const COMMIT: u8 = 0xC3;
/// Magic, version, tag, length, boot, seq.
pub(crate) const HEADER_SIZE: usize = 13;
/// The header and the commit byte.
pub(crate) const FRAME_SIZE: usize = HEADER_SIZE + 1;
/// The longest record before padding to a flash word.
pub(crate) const MAX_RECORD_SIZE: usize = FRAME_SIZE + MAX_ENTRY_SIZE;

/// Frames `entry` as a record with `id` into `buf`, padded to a whole number of `word`-byte
/// flash words; the record's length, or `None` if the entry wrote more than it may or `buf` is
/// too short.
pub(crate) fn encode<E: Entry>(id: RecordId, entry: &E, word: usize, buf: &mut [u8]) -> Option<usize> {
    let max = E::MAX_SIZE.min(MAX_ENTRY_SIZE);
    let body = buf.get_mut(HEADER_SIZE..HEADER_SIZE.checked_add(max)?)?;
    let len = entry.encode(body);
    if len > max {
        return None;
    }
    let [b0, b1, b2, b3] = id.boot.to_le_bytes();
    let [s0, s1, s2, s3] = id.seq.to_le_bytes();
    let n = u8::try_from(len).ok()?;
    let header = [MAGIC[0], MAGIC[1], RECORD_VERSION, E::TAG, n, b0, b1, b2, b3, s0, s1, s2, s3];
    buf.get_mut(..HEADER_SIZE)?.copy_from_slice(&header);
    let end = HEADER_SIZE.checked_add(len)?;
    let total = end.checked_add(1)?.div_ceil(word.max(1)).checked_mul(word.max(1))?;
    let last = total.checked_sub(1)?;
    buf.get_mut(end..last)?.fill(0);
    *buf.get_mut(last)? = COMMIT;
    Some(total)
}

/// What a stored item is, as far as this outbox can tell.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded<E> {
    /// One of ours.
    Ours(Record<E>),
    /// Anything else: another format, another outbox version, another entry type or an entry
    /// that does not decode.
    Foreign,
}

/// The id of a stored item if it is framed as one of ours for entry type `E`, without
/// decoding the entry.
pub(crate) fn peek_id<E: Entry>(bytes: &[u8]) -> Option<RecordId> {
    framed::<E>(bytes).map(|(id, _)| id)
}

/// The id and the entry's bytes of a stored item framed as one of ours for entry type `E`.
pub(crate) fn framed<E: Entry>(bytes: &[u8]) -> Option<(RecordId, &[u8])> {
    let header: &[u8; HEADER_SIZE] = bytes.get(..HEADER_SIZE)?.try_into().ok()?;
    let [m0, m1, version, tag, n, b0, b1, b2, b3, s0, s1, s2, s3] = *header;
    let (&commit, before_commit) = bytes.split_last()?;
    let len = usize::from(n);
    let ours = [m0, m1] == MAGIC
        && version == RECORD_VERSION
        && tag == E::TAG
        && commit == COMMIT
        && len <= E::MAX_SIZE.min(MAX_ENTRY_SIZE);
    if !ours {
        return None;
    }
    let body_end = HEADER_SIZE.checked_add(len)?;
    let body = before_commit.get(HEADER_SIZE..body_end)?;
    // The padding must be what `encode` wrote: anything else is not a record of ours.
    if before_commit.get(body_end..)?.iter().any(|&byte| byte != 0) {
        return None;
    }
    let id =
        RecordId { boot: u32::from_le_bytes([b0, b1, b2, b3]), seq: u32::from_le_bytes([s0, s1, s2, s3]) };
    Some((id, body))
}

/// Classifies a stored item: ours (and decoded) or foreign.
pub(crate) fn decode<E: Entry>(bytes: &[u8]) -> Decoded<E> {
    match framed::<E>(bytes).and_then(|(id, body)| Some(Record { id, entry: E::decode(body)? })) {
        Some(record) => Decoded::Ours(record),
        None => Decoded::Foreign,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

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

    /// Claims to write more than it may.
    struct Liar;

    impl Entry for Liar {
        const TAG: u8 = 8;
        const MAX_SIZE: usize = 2;
        fn encode(&self, _buf: &mut [u8]) -> usize {
            3
        }
        fn decode(_bytes: &[u8]) -> Option<Self> {
            Some(Liar)
        }
    }

    const ID: RecordId = RecordId { boot: 0x0102_0304, seq: 0xA0B0_C0D0 };

    #[test]
    fn a_record_round_trips_and_ends_with_the_commit_byte() {
        let mut buf = [0u8; MAX_RECORD_SIZE + 32];
        let len = encode(ID, &Bytes3([0xFF, 0xFF, 0xFF]), 1, &mut buf).unwrap();
        assert_eq!(len, FRAME_SIZE + 3);
        assert_eq!(&buf[..13], &[b'W', b'O', 1, 7, 3, 4, 3, 2, 1, 0xD0, 0xC0, 0xB0, 0xA0]);
        assert_eq!(buf[len - 1], COMMIT);
        assert_eq!(decode::<Bytes3>(&buf[..len]), Decoded::Ours(Record { id: ID, entry: Bytes3([0xFF; 3]) }));
        assert_eq!(peek_id::<Bytes3>(&buf[..len]), Some(ID));
    }

    #[test]
    fn a_record_fills_whole_words_and_ends_with_the_commit_byte() {
        for word in [1, 2, 4, 8, 16, 32] {
            let mut buf = [0xAAu8; MAX_RECORD_SIZE + 32];
            let len = encode(ID, &Bytes3([0xFF; 3]), word, &mut buf).unwrap();
            assert_eq!(len % word, 0, "word {word}");
            assert!(len >= FRAME_SIZE + 3 && len < FRAME_SIZE + 3 + word, "word {word}: {len}");
            assert_eq!(buf[len - 1], COMMIT, "word {word}");
            assert!(buf[FRAME_SIZE - 1 + 3..len - 1].iter().all(|&b| b == 0), "word {word}: padding");
            assert_eq!(
                decode::<Bytes3>(&buf[..len]),
                Decoded::Ours(Record { id: ID, entry: Bytes3([0xFF; 3]) })
            );
        }
    }

    #[test]
    fn a_record_cut_short_is_foreign() {
        let mut buf = [0u8; MAX_RECORD_SIZE + 32];
        let len = encode(ID, &Bytes3([1, 2, 3]), 4, &mut buf).unwrap();
        for cut in 0..len {
            // What a reader would see of a record whose last bytes never landed.
            let mut seen = buf;
            seen[cut..len].fill(0xFF);
            assert_eq!(decode::<Bytes3>(&seen[..len]), Decoded::Foreign, "cut at {cut}");
        }
    }

    #[test]
    fn another_magic_version_tag_or_entry_is_foreign() {
        let mut buf = [0u8; MAX_RECORD_SIZE + 32];
        let len = encode(ID, &Bytes3([1, 2, 3]), 4, &mut buf).unwrap();
        assert_eq!(len, 20);
        for (at, value) in [(0, b'X'), (1, b'X'), (2, RECORD_VERSION + 1), (3, 6), (4, 2), (4, 200), (17, 1)]
        {
            let mut other = buf;
            other[at] = value;
            assert_eq!(decode::<Bytes3>(&other[..len]), Decoded::Foreign, "byte {at}");
        }
        // Framed right, but the entry's own decoder refuses a body of the wrong length.
        let mut short = buf;
        short[4] = 2;
        short[15] = 0;
        assert_eq!(peek_id::<Bytes3>(&short[..len]), Some(ID));
        assert_eq!(decode::<Bytes3>(&short[..len]), Decoded::Foreign);
        assert_eq!(decode::<Bytes3>(&[]), Decoded::Foreign);
        assert_eq!(decode::<Bytes3>(&[0xFF; 20]), Decoded::Foreign);
    }

    #[test]
    fn an_entry_that_overruns_its_size_is_refused() {
        let mut buf = [0u8; MAX_RECORD_SIZE + 32];
        assert_eq!(encode(ID, &Liar, 4, &mut buf), None);
    }

    #[test]
    fn ids_order_like_the_queue() {
        let a = RecordId { boot: 1, seq: 9 };
        let b = RecordId { boot: 2, seq: 0 };
        assert!(a < b);
        assert!(RecordId { boot: 2, seq: 1 } > b);
    }
}
