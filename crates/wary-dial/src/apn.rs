//! The access point name, checked once when it is configured.
//!
//! The APN travels inside a quoted AT string argument (`AT+CGDCONT=1,"IP","<apn>"`). A `"` would
//! end that argument early, a `\` starts an escape in 3GPP string constants, a control
//! character can end or corrupt the command line, and a modem's command line buffer is finite:
//! each of those is refused here with a typed error, so a malformed command is never sent.
//!
//! ```
//! use wary_dial::{Apn, ApnError};
//!
//! const APN: Apn<'static> = match Apn::new("iot.example") {
//!     Ok(apn) => apn,
//!     Err(_) => panic!("bad APN"),
//! };
//! assert_eq!(APN.len(), 11);
//! assert_eq!(Apn::new("a\"b"), Err(ApnError::Quote));
//! ```

use core::fmt;

/// The longest APN accepted, in bytes: the 3GPP limit for an access point name.
pub const MAX_APN: usize = 100;

/// Why a string cannot be used as an APN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ApnError {
    /// Longer than [`MAX_APN`] bytes.
    #[error("APN longer than {MAX_APN} bytes")]
    TooLong,
    /// Contains `"`, which would close the quoted AT argument early.
    #[error("APN contains a double quote")]
    Quote,
    /// Contains `\`, the escape character of 3GPP string constants.
    #[error("APN contains a backslash")]
    Backslash,
    /// Contains a control character (below 0x20, or DEL), which could end the command line.
    #[error("APN contains a control character")]
    ControlCharacter,
    /// Contains a byte outside ASCII.
    #[error("APN is not ASCII")]
    NotAscii,
}

/// An access point name that is safe to place inside `AT+CGDCONT=1,"IP","…"`.
///
/// Empty is allowed: an empty APN asks the network for the subscription's default.
/// `Debug` and `defmt::Format` show only the length: configuration stays out of logs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Apn<'a>(&'a str);

impl<'a> Apn<'a> {
    /// Checks `apn` and wraps it; `const`, so a fixed APN is checked at compile time.
    pub const fn new(apn: &'a str) -> Result<Self, ApnError> {
        let bytes = apn.as_bytes();
        if bytes.len() > MAX_APN {
            return Err(ApnError::TooLong);
        }
        let mut rest = bytes;
        while let [byte, tail @ ..] = rest {
            match *byte {
                b'"' => return Err(ApnError::Quote),
                b'\\' => return Err(ApnError::Backslash),
                0x00..=0x1f | 0x7f => return Err(ApnError::ControlCharacter),
                0x80..=0xff => return Err(ApnError::NotAscii),
                _ => {}
            }
            rest = tail;
        }
        Ok(Self(apn))
    }

    /// The APN's length in bytes.
    pub const fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty APN (the network's default).
    pub const fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The APN's bytes, for building the command.
    pub(crate) const fn as_bytes(&self) -> &'a [u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Apn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Apn").field("len", &self.0.len()).finish()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Apn<'_> {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "Apn {{ len: {} }}", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_real_apns_and_the_empty_default() {
        for apn in ["internet", "iot.1nce.net", "em", "internet.t-mobile", "", "a_b"] {
            assert_eq!(Apn::new(apn).map(|a| a.len()), Ok(apn.len()), "{apn}");
        }
        let longest = "a".repeat(MAX_APN);
        assert!(Apn::new(&longest).is_ok());
    }

    #[test]
    fn refuses_what_would_break_the_quoted_argument() {
        assert_eq!(Apn::new("a\"b"), Err(ApnError::Quote));
        assert_eq!(Apn::new("a\\22b"), Err(ApnError::Backslash));
        assert_eq!(Apn::new("a\rATH"), Err(ApnError::ControlCharacter));
        assert_eq!(Apn::new("a\nb"), Err(ApnError::ControlCharacter));
        assert_eq!(Apn::new("a\0b"), Err(ApnError::ControlCharacter));
        assert_eq!(Apn::new("a\u{7f}"), Err(ApnError::ControlCharacter));
        assert_eq!(Apn::new("caf\u{e9}"), Err(ApnError::NotAscii));
        assert_eq!(Apn::new(&"a".repeat(MAX_APN + 1)), Err(ApnError::TooLong));
    }

    #[test]
    fn debug_shows_the_length_not_the_name() {
        let apn = Apn::new("secret.corp").unwrap();
        let shown = std::format!("{apn:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("11"), "{shown}");
    }
}
