//! Who the device is: its 64-bit id, the first 16 hex digits of every key it makes, and its
//! [`Credential`], the bearer token it proves that id with on every attempt.
//!
//! **The id** is the device's whole identity (on the nRF52840 both FICR `DEVICEID` words).
//! Where it arrives as text (the QEMU application's command line), [`parse_device_id`] reads it
//! strictly: exactly 16 hex digits, or a decimal number of any other length.
//!
//! **The credential** is a random 256-bit token, written as 64 lowercase hex digits, set when
//! the device is built or provisioned. It is sent as `Authorization: Bearer <token>` on every
//! attempt ([`crate::http::Post::credential`]) and nowhere else: it is never logged (its
//! `Debug` and `defmt::Format` print no digit of it), never written to a ledger, never part of
//! a key. A device without one sends no `Authorization` header.
//!
//! ```
//! use wary_uplink::identity::{Credential, parse_device_id};
//! assert_eq!(parse_device_id("574152590a386001"), Some(0x5741_5259_0a38_6001));
//! assert_eq!(parse_device_id("42"), Some(42));
//! assert_eq!(parse_device_id("0x2a"), None);
//! const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
//! let credential = Credential::from_token(TOKEN).unwrap();
//! assert_eq!(credential.header_value(), "Bearer 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
//! // Its Debug and defmt::Format print `Credential(..)`.
//! ```

use core::fmt;

/// The length of a token: 256 bits as lowercase hex digits.
pub const TOKEN_LEN: usize = 64;
/// The header value's scheme and its separator.
const SCHEME: &[u8; 7] = b"Bearer ";
/// `Bearer ` and the token.
const VALUE_LEN: usize = SCHEME.len() + TOKEN_LEN;

/// A device id from text: exactly 16 hex digits (either case), read as hex; or a decimal
/// number (ASCII digits only, at most `u64::MAX`) of any other length. Anything else (a sign,
/// a `0x` prefix, spaces, an empty string, an overflow) is `None`. A 16-digit decimal id must be
/// written with a leading zero, or in hex: 16 characters are always hex.
pub const fn parse_device_id(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let hex = bytes.len() == 16;
    let mut value: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let digit = if hex { hex_digit(b) } else { dec_digit(b) };
        let Some(digit) = digit else { return None };
        let base = if hex { 16 } else { 10 };
        value = match value.checked_mul(base) {
            Some(v) => match v.checked_add(digit as u64) {
                Some(v) => v,
                None => return None,
            },
            None => return None,
        };
        i += 1;
    }
    Some(value)
}

const fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const fn dec_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        _ => None,
    }
}

/// The device's bearer credential: the `Authorization` header value `Bearer <token>`.
///
/// Made only from a well-formed token ([`Credential::from_token`]); `const`, so a token set at
/// build time is checked when the firmware is built. Its `Debug` and `defmt::Format` show no
/// part of the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    value: [u8; VALUE_LEN],
}

impl Credential {
    /// The credential of `token`: exactly 64 lowercase hex digits (a random 256-bit value);
    /// `None` for anything else (upper case included: one spelling per token, so the gateway's
    /// hash of it matches).
    pub const fn from_token(token: &str) -> Option<Credential> {
        let bytes = token.as_bytes();
        if bytes.len() != TOKEN_LEN {
            return None;
        }
        let mut value = [0u8; VALUE_LEN];
        let mut i = 0;
        while i < SCHEME.len() {
            value[i] = SCHEME[i];
            i += 1;
        }
        let mut j = 0;
        while j < TOKEN_LEN {
            let b = bytes[j];
            if !matches!(b, b'0'..=b'9' | b'a'..=b'f') {
                return None;
            }
            value[SCHEME.len() + j] = b;
            j += 1;
        }
        Some(Credential { value })
    }

    /// The `Authorization` header's value: `Bearer ` and the 64 hex digits. For the request
    /// head only: never log it.
    pub fn header_value(&self) -> &str {
        // Built from ASCII only, so this never fails; an empty value would be refused by the
        // request encoder rather than sent.
        core::str::from_utf8(&self.value).unwrap_or("")
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(..)")
    }
}

impl defmt::Format for Credential {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "Credential(..)");
    }
}

// The parsers run at compile time wherever a token or id is built in: check them there too.
const fn same(a: Option<u64>, b: u64) -> bool {
    match a {
        Some(a) => a == b,
        None => false,
    }
}
const _: () = {
    assert!(same(parse_device_id("574152590a386001"), 0x5741_5259_0a38_6001));
    assert!(same(parse_device_id("574152590A386001"), 0x5741_5259_0a38_6001));
    assert!(same(parse_device_id("ffffffffffffffff"), u64::MAX));
    assert!(same(parse_device_id("0000000000000001"), 1));
    assert!(same(parse_device_id("18446744073709551615"), u64::MAX));
    assert!(same(parse_device_id("7"), 7));
    assert!(same(parse_device_id("01234567890123456"), 1_234_567_890_123_456));
    assert!(parse_device_id("18446744073709551616").is_none());
    assert!(parse_device_id("").is_none());
    assert!(parse_device_id("-1").is_none());
    assert!(parse_device_id("+1").is_none());
    assert!(parse_device_id("0x2a").is_none());
    assert!(parse_device_id("574152590a38600g").is_none());
    assert!(parse_device_id("574152590a38600").is_none());
    assert!(parse_device_id(" 574152590a386001").is_none());
    assert!(parse_device_id("12ab").is_none());
    assert!(
        Credential::from_token("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff").is_some()
    );
    assert!(
        Credential::from_token("00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff").is_none()
    );
    assert!(
        Credential::from_token("00112233445566778899aabbccddeeff00112233445566778899aabbccddeef").is_none()
    );
    assert!(
        Credential::from_token("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff0").is_none()
    );
    assert!(
        Credential::from_token("00112233445566778899aabbccddeeff00112233445566778899aabbccddee f").is_none()
    );
    assert!(Credential::from_token("").is_none());
};
