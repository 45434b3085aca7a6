//! Idempotency keys: made once, before the first attempt, and sent on every attempt, so the
//! server can recognise a replay and apply the work once.
//!
//! Two ways to make one:
//! - [`Key::from_parts`]: device id, boot count and a sequence number. Unique as long as the
//!   boot count is persisted and increments every boot; the best choice on a device.
//! - `Key::from_payload` (feature `payload-key`): the first 128 bits of the payload's SHA-256, the same on every resend. Limitation:
//!   a payload hash is not a business key. Two legitimately different events with the same
//!   bytes (two identical readings, two equal payments) get the same key, and the server
//!   applies only the first. Include something that tells them apart (a timestamp or sequence
//!   in the payload), or use [`Key::from_parts`].
//!
//! ```
//! use wary::Key;
//! let k = Key::from_parts(0x0102_0304, 7, 42);
//! assert_eq!(k.to_hex().as_str(), "0102030400000007000000000000002a");
//! ```

use core::fmt;

/// A 128-bit idempotency key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Key([u8; 16]);

impl Key {
    /// The key of (device id, boot count, sequence number), big-endian.
    pub fn from_parts(device: u32, boot: u32, sequence: u64) -> Key {
        let mut b = [0u8; 16];
        for (dst, src) in b
            .iter_mut()
            .zip(device.to_be_bytes().into_iter().chain(boot.to_be_bytes()).chain(sequence.to_be_bytes()))
        {
            *dst = src;
        }
        Key(b)
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
    fn hex_round_trips() {
        let k = Key::from_parts(0xdead_beef, 7, 0x0123_4567_89ab_cdef);
        assert_eq!(Key::from_hex(k.to_hex().as_str()), Some(k));
        assert_eq!(Key::from_hex(&k.to_hex().to_uppercase()), Some(k));
        assert_eq!(Key::from_hex("xyz"), None);
        assert_eq!(Key::from_hex("g0000000000000000000000000000000"), None);
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
