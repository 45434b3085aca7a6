//! FNV-1a over fixed-width little-endian fields: the policy fingerprint's hash, kept apart from
//! both the policy and the table that feed it.
//!
//! The same bytes go in on every target: a derived `Hash` would feed `usize` lengths and
//! discriminants, whose width differs between a 32-bit device and a 64-bit host.

/// The hash state.
pub(crate) struct Fnv(u32);

impl Fnv {
    pub(crate) const fn new() -> Self {
        Fnv(0x811c_9dc5)
    }

    // `const`, with `while` loops: a policy's fingerprint is worked out when it is built, and
    // `PolicyBuilder::build` is a `const fn`.
    const fn bytes(&mut self, mut bytes: &[u8]) {
        while let [b, rest @ ..] = bytes {
            self.0 = (self.0 ^ *b as u32).wrapping_mul(0x0100_0193);
            bytes = rest;
        }
    }

    pub(crate) const fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }

    pub(crate) const fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) const fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) const fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u32(v);
            }
            None => self.u8(0),
        }
    }

    pub(crate) const fn finish(&self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_fnv1a_vectors() {
        // FNV-1a 32-bit test vectors: "" and "a".
        assert_eq!(Fnv::new().finish(), 0x811c_9dc5);
        let mut h = Fnv::new();
        h.u8(b'a');
        assert_eq!(h.finish(), 0xe40c_292c);
        let mut h = Fnv::new();
        h.u16(u16::from_le_bytes(*b"fo"));
        h.u8(b'o');
        assert_eq!(h.finish(), 0xa9f3_7ed7);
        let (mut a, mut b) = (Fnv::new(), Fnv::new());
        a.opt_u32(None);
        b.opt_u32(Some(0));
        assert_ne!(a.finish(), b.finish());
        let mut c = Fnv::new();
        c.u32(7);
        let mut d = Fnv::new();
        d.bytes(&[7, 0, 0, 0]);
        assert_eq!(c.finish(), d.finish());
    }
}
