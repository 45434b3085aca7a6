//! Idempotency keys: made once, before the first attempt, and sent on every attempt, so the
//! server can recognise a replay and apply the work once.
//!
//! Two ways to make one:
//! - [`Key::from_parts`]: the device's whole 64-bit id, a 32-bit boot count and a 32-bit
//!   sequence number. Unique as long as the boot count is persisted and increments every boot,
//!   and a new boot starts before a boot's sequence would wrap; the best choice on a device.
//! - `Key::from_payload` (feature `payload-key`): the first 128 bits of the payload's SHA-256, the same on every resend. Limitation:
//!   a payload hash is not a business key. Two legitimately different events with the same
//!   bytes (two identical readings, two equal payments) get the same key, and the server
//!   applies only the first. Include something that tells them apart (a timestamp or sequence
//!   in the payload), or use [`Key::from_parts`].
//!
//! # Layout of a parts key
//!
//! ```text
//! bytes 0..8    device id    (u64, big-endian)  hex digits 0..16
//! bytes 8..12   boot count   (u32, big-endian)  hex digits 16..24
//! bytes 12..16  sequence     (u32, big-endian)  hex digits 24..32
//! ```
//!
//! The device id is the whole 64-bit identity (on the nRF52840 both FICR `DEVICEID` words), not
//! a part of it: two devices whose ids share their low 32 bits still make different keys from
//! their first reading. A gateway can read the device a key belongs to from its first 16 hex
//! digits and refuse a device that sends another's.
//!
//! **When a boot's sequence runs out.** A boot hands out at most 2³² sequence numbers. The
//! layer that counts (the device outbox) starts a new boot, with the next persisted boot count
//! and sequence 0, instead of wrapping; when the boot count itself would wrap it refuses to make
//! a key. A key is never made twice.
//!
//! ```
//! use wary::Key;
//! let k = Key::from_parts(0x0011_2233_4455_6677, 7, 42);
//! assert_eq!(k.to_hex().as_str(), "0011223344556677000000070000002a");
//! assert_eq!((k.device_part(), k.boot_part(), k.sequence_part()), (0x0011_2233_4455_6677, 7, 42));
//! ```

use core::fmt;

/// A 128-bit idempotency key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Key([u8; 16]);

impl Key {
    /// The key of (device id, boot count, sequence number), big-endian (see the module docs for
    /// the layout): the first 16 hex digits are the device id.
    pub const fn from_parts(device: u64, boot: u32, sequence: u32) -> Key {
        let [d0, d1, d2, d3, d4, d5, d6, d7] = device.to_be_bytes();
        let [b0, b1, b2, b3] = boot.to_be_bytes();
        let [s0, s1, s2, s3] = sequence.to_be_bytes();
        Key([d0, d1, d2, d3, d4, d5, d6, d7, b0, b1, b2, b3, s0, s1, s2, s3])
    }

    /// The device id of a parts key: its first 8 bytes, the first 16 hex digits. Meaningful for
    /// a key made by [`Key::from_parts`] (or received from a device that makes its keys that
    /// way); for a payload key or a foreign key it is just the key's first 64 bits.
    pub const fn device_part(&self) -> u64 {
        let [d0, d1, d2, d3, d4, d5, d6, d7, ..] = self.0;
        u64::from_be_bytes([d0, d1, d2, d3, d4, d5, d6, d7])
    }

    /// The boot count of a parts key: bytes 8..12. Meaningful for parts keys only, as
    /// [`Key::device_part`].
    pub const fn boot_part(&self) -> u32 {
        let [_, _, _, _, _, _, _, _, b0, b1, b2, b3, ..] = self.0;
        u32::from_be_bytes([b0, b1, b2, b3])
    }

    /// The sequence number of a parts key: bytes 12..16. Meaningful for parts keys only, as
    /// [`Key::device_part`].
    pub const fn sequence_part(&self) -> u32 {
        let [.., s0, s1, s2, s3] = self.0;
        u32::from_be_bytes([s0, s1, s2, s3])
    }

    /// The first 128 bits of SHA-256 of `payload` (see the module docs for the limitation).
    #[cfg(feature = "payload-key")]
    #[cfg_attr(docsrs, doc(cfg(feature = "payload-key")))]
    pub fn from_payload(payload: &[u8]) -> Key {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(payload);
        let mut b = [0u8; 16];
        for (dst, src) in b.iter_mut().zip(digest.iter()) {
            *dst = *src;
        }
        Key(b)
    }

    /// A key from its 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Key {
        Key(bytes)
    }

    /// The 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The key as 32 lowercase hex digits, as sent in an `Idempotency-Key` header.
    pub fn to_hex(&self) -> heapless::String<32> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = heapless::String::new();
        for byte in self.0 {
            for nibble in [byte >> 4, byte & 0x0f] {
                let c = HEX.get(usize::from(nibble)).copied().unwrap_or(b'0');
                // 32 characters exactly fill the string; a push cannot fail.
                let _ = s.push(char::from(c));
            }
        }
        s
    }

    /// Parses 32 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<Key> {
        let bytes = hex.as_bytes();
        if bytes.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (dst, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let [hi, lo] = pair else { return None };
            let hi = char::from(*hi).to_digit(16)?;
            let lo = char::from(*lo).to_digit(16)?;
            *dst = u8::try_from(hi.checked_mul(16)?.checked_add(lo)?).ok()?;
        }
        Some(Key(out))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.to_hex().as_str())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Key {
    /// As its 32 hex digits.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Key {
    /// From its 32 hex digits.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        let s = <heapless::String<32> as serde::Deserialize>::deserialize(d)?;
        Key::from_hex(&s).ok_or_else(|| serde::de::Error::custom("a key is 32 hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_keys_differ_by_any_part() {
        let a = Key::from_parts(1, 1, 1);
        assert_ne!(a, Key::from_parts(2, 1, 1));
        assert_ne!(a, Key::from_parts(1, 2, 1));
        assert_ne!(a, Key::from_parts(1, 1, 2));
    }

    #[test]
    fn devices_that_share_their_low_32_bits_make_different_keys() {
        // Two nRF52840s whose FICR DEVICEID[0] words are equal: the same low 32 bits.
        let a = Key::from_parts(0x0000_0001_0a38_6001, 1, 0);
        let b = Key::from_parts(0x0000_0002_0a38_6001, 1, 0);
        assert_ne!(a, b);
        assert_eq!(a.to_hex().as_str(), "000000010a3860010000000100000000");
        assert_eq!(b.to_hex().as_str(), "000000020a3860010000000100000000");
        // And the high word alone does not decide either.
        assert_ne!(
            Key::from_parts(0x0a38_6001_0000_0000, 1, 0),
            Key::from_parts(0x0a38_6001_0000_0001, 1, 0)
        );
    }

    #[test]
    fn the_parts_read_back_and_the_device_is_the_first_16_hex_digits() {
        for (device, boot, sequence) in [
            (0, 0, 0),
            (u64::MAX, u32::MAX, u32::MAX),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98, 0x7654_3210),
            (1, 2, 3),
        ] {
            let k = Key::from_parts(device, boot, sequence);
            assert_eq!((k.device_part(), k.boot_part(), k.sequence_part()), (device, boot, sequence));
            let hex = k.to_hex();
            assert_eq!(hex.get(..16), Some(format!("{device:016x}").as_str()));
            assert_eq!(hex.get(16..24), Some(format!("{boot:08x}").as_str()));
            assert_eq!(hex.get(24..), Some(format!("{sequence:08x}").as_str()));
            let back = Key::from_hex(hex.as_str()).unwrap();
            assert_eq!(back, k);
            assert_eq!(back.device_part(), device);
        }
    }

    #[test]
    fn hex_round_trips() {
        let k = Key::from_parts(0xdead_beef_0bad_f00d, 7, 0x89ab_cdef);
        assert_eq!(Key::from_hex(k.to_hex().as_str()), Some(k));
        assert_eq!(Key::from_hex(&k.to_hex().to_uppercase()), Some(k));
        assert_eq!(Key::from_hex("xyz"), None);
        assert_eq!(Key::from_hex("g0000000000000000000000000000000"), None);
    }

    #[test]
    fn a_key_shows_as_its_hex() {
        extern crate std;
        use std::format;
        let k = Key::from_parts(0xdead_beef_0bad_f00d, 7, 0x89ab_cdef);
        assert_eq!(format!("{k}"), "deadbeef0badf00d0000000789abcdef");
        assert_eq!(format!("{k:?}"), "Key(deadbeef0badf00d0000000789abcdef)");
    }

    #[test]
    #[cfg(feature = "payload-key")]
    fn payload_key_is_sha256_prefix() {
        // SHA-256("") = e3b0c442 98fc1c14 9afbf4c8 996fb924 ...
        assert_eq!(Key::from_payload(b"").to_hex().as_str(), "e3b0c44298fc1c149afbf4c8996fb924");
        // The documented limitation: equal bytes, equal key.
        assert_eq!(Key::from_payload(b"21.5C"), Key::from_payload(b"21.5C"));
        assert_eq!(Key::from_payload(b"abc").to_hex().as_str(), "ba7816bf8f01cfea414140de5dae2223");
    }
}
