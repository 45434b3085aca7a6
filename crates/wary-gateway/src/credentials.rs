//! Device credentials: who may post, proven on every request.
//!
//! A device sends `Authorization: Bearer <token>`, its token a random 256-bit value written as
//! 64 lowercase hex digits. The gateway keeps no token, only its SHA-256 digest, in a file of
//! one device a line:
//!
//! ```text
//! # device id (16 hex)  SHA-256 of the token's 64 ASCII characters (64 hex)
//! 0123456789abcdef 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
//! ```
//!
//! `#` starts a comment; blank lines are ignored. A file that cannot be read whole is refused
//! whole: the error names the line, never its content.
//!
//! **Rotation.** A device may have two lines, two tokens valid at once: the one it holds and
//! the one being rolled out to it. Either admits it until the old line is deleted and the file
//! reloaded (`docs/security.md`, "Making and rotating credentials"). A third line for one device,
//! or one digest on two lines, is refused.
//!
//! ```text
//! 0123456789abcdef 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8  # old
//! 0123456789abcdef 1b4f0e9851971998e732078544c96b36c3d01cedf7caa332359d6f1d83567014  # new
//! ```
//!
//! Checking a request: the key names the device it claims (its first 16 hex digits); the
//! digest of the presented token is compared with that device's digest in constant time
//! ([`subtle`]), so the time taken tells nothing about how much of a guess was right. A token
//! that is not the claimed device's is then looked up among all digests, only to tell "you are
//! another device" (403) from "you are nobody" (401): that lookup compares digests of the
//! presented token, and the digest of a 256-bit random value gives nothing away about another
//! token.
//!
//! ```
//! use wary_gateway::credentials::{Credentials, Identity};
//! let (token, line) = Credentials::issue(0x0123_4567_89ab_cdef);
//! let creds: Credentials = line.parse().unwrap();
//! let header = format!("Bearer {token}");
//! assert_eq!(creds.identify(Some(header.as_bytes()), Some(0x0123_4567_89ab_cdef)), Identity::Device(0x0123_4567_89ab_cdef));
//! assert_eq!(creds.identify(Some(b"Bearer 00"), None), Identity::Nobody);
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Hex digits of a device id.
pub const DEVICE_HEX: usize = 16;
/// Hex digits of a token (256 bits).
pub const TOKEN_HEX: usize = 64;
/// Tokens one device may hold at once: its own and, while a new one is rolled out, that one.
pub const TOKENS_PER_DEVICE: usize = 2;

/// A SHA-256 digest.
type Sha = [u8; 32];

/// Who a request's credential names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// A device whose token matched.
    Device(u64),
    /// No credential, a malformed one, or a token no device has.
    Nobody,
}

/// Why a credentials file was refused. Never carries a line's text (it holds digests).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// The file could not be read.
    #[error("cannot read the credentials file: {0:?}")]
    Read(std::io::ErrorKind),
    /// A line is not `<16 hex device id> <64 hex SHA-256>`.
    #[error("line {0}: expected `<16 hex digits of device id> <64 hex digits of SHA-256>`")]
    Malformed(usize),
    /// A device appears more than [`TOKENS_PER_DEVICE`] times.
    #[error("line {0}: this device already has two credentials (the old and the new); delete one")]
    DuplicateDevice(usize),
    /// A token digest appears twice (one token must name one device, once).
    #[error("line {0}: this digest is already in the file")]
    DuplicateDigest(usize),
}

/// The set of device credentials, by device and by digest.
#[derive(Default, Clone)]
pub struct Credentials {
    /// Each device's first token.
    by_device: HashMap<u64, Sha>,
    /// The second token of a device that has two (while a new one is rolled out): empty but
    /// for those, so a fleet that is not rotating pays nothing for it.
    second: HashMap<u64, Sha>,
    by_digest: HashMap<Sha, u64>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Digests stay out of logs too.
        f.debug_struct("Credentials").field("devices", &self.len()).finish()
    }
}

/// The SHA-256 of a token's ASCII form, as kept in the file.
pub fn digest(token: &[u8]) -> Sha {
    Sha256::digest(token).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let b = text.as_bytes();
    if b.len() != N * 2 {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let [hi, lo] = pair else { return None };
        *o = (nibble(*hi)? << 4) | nibble(*lo)?;
    }
    Some(out)
}

/// The device a key claims: its first 16 hex digits, if they are hex.
pub fn device_of_key(key: &[u8]) -> Option<u64> {
    let head = key.get(..DEVICE_HEX)?;
    let head = std::str::from_utf8(head).ok()?;
    unhex::<8>(head).map(u64::from_be_bytes)
}

/// A device id as the 16 hex digits keys and the file use.
pub fn device_hex(device: u64) -> String {
    format!("{device:016x}")
}

impl Credentials {
    /// No device at all (every request is refused).
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a credentials file.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let text = std::fs::read_to_string(path).map_err(|e| CredentialsError::Read(e.kind()))?;
        text.parse()
    }

    /// A new random token for `device` and the file line that admits it. The token is shown
    /// once, to be put on the device; the gateway keeps only the line.
    pub fn issue(device: u64) -> (String, String) {
        let mut raw = [0u8; 32];
        rand::rngs::StdRng::from_os_rng().fill_bytes(&mut raw);
        let token = hex(&raw);
        let line = format!("{} {}", device_hex(device), hex(&digest(token.as_bytes())));
        (token, line)
    }

    /// Admits `device` with the token whose digest is `sha` alone (replacing its old ones).
    pub fn insert(&mut self, device: u64, sha: Sha) {
        for old in [self.by_device.insert(device, sha), self.second.remove(&device)].into_iter().flatten() {
            self.by_digest.remove(&old);
        }
        self.by_digest.insert(sha, device);
    }

    /// Admits `device` with the token whose digest is `sha` as well as the one it has (a
    /// rotation: both valid until one is removed). False, and nothing changed, if the device
    /// already has [`TOKENS_PER_DEVICE`] tokens or the digest is already someone's.
    pub fn add(&mut self, device: u64, sha: Sha) -> bool {
        if self.by_digest.contains_key(&sha) || self.second.contains_key(&device) {
            return false;
        }
        match self.by_device.entry(device) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.second.insert(device, sha);
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(sha);
            }
        }
        self.by_digest.insert(sha, device);
        true
    }

    /// Tokens `device` holds: 0, 1 or, during a rotation, 2.
    pub fn tokens(&self, device: u64) -> usize {
        usize::from(self.by_device.contains_key(&device)) + usize::from(self.second.contains_key(&device))
    }

    /// True if `device` has a credential.
    pub fn contains(&self, device: u64) -> bool {
        self.by_device.contains_key(&device)
    }

    /// Devices admitted.
    pub fn len(&self) -> usize {
        self.by_device.len()
    }

    /// True if no device is admitted.
    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }

    /// Who `authorization` (the header's bytes) names; `claimed` is the device the request's key
    /// claims, checked first and in constant time.
    pub fn identify(&self, authorization: Option<&[u8]>, claimed: Option<u64>) -> Identity {
        let Some(token) = authorization.and_then(bearer) else { return Identity::Nobody };
        let sha = digest(token);
        if let Some(device) = claimed
            && let Some(expected) = self.by_device.get(&device)
        {
            // Both of a rotating device's digests are compared, whichever matches.
            let mut matched = expected.ct_eq(&sha);
            if let Some(second) = self.second.get(&device) {
                matched |= second.ct_eq(&sha);
            }
            if bool::from(matched) {
                return Identity::Device(device);
            }
        }
        match self.by_digest.get(&sha) {
            Some(device) => Identity::Device(*device),
            None => Identity::Nobody,
        }
    }
}

/// The token of `Bearer <64 hex>`; the scheme's case does not matter (RFC 9110, 11.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (token.len() == TOKEN_HEX && token.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then_some(token)
}

impl FromStr for Credentials {
    type Err = CredentialsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut c = Credentials::new();
        for (i, line) in text.lines().enumerate() {
            let n = i.saturating_add(1);
            let line = line.split_once('#').map_or(line, |(before, _)| before).trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let (Some(dev), Some(sha), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(CredentialsError::Malformed(n));
            };
            let lower = |s: &str| !s.bytes().any(|b| b.is_ascii_uppercase());
            let (Some(dev), Some(sha)) = (unhex::<8>(dev).filter(|_| lower(dev)), unhex::<32>(sha)) else {
                return Err(CredentialsError::Malformed(n));
            };
            let dev = u64::from_be_bytes(dev);
            if c.by_digest.contains_key(&sha) {
                return Err(CredentialsError::DuplicateDigest(n));
            }
            if !c.add(dev, sha) {
                return Err(CredentialsError::DuplicateDevice(n));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_admits_its_devices_and_only_with_their_tokens() {
        let (ta, la) = Credentials::issue(0xa);
        let (tb, lb) = Credentials::issue(0xb);
        assert_eq!(ta.len(), 64);
        assert_ne!(ta, tb);
        let c: Credentials = format!("# fleet\n\n{la}\n  {lb}  # second\n").parse().unwrap();
        assert_eq!(c.len(), 2);
        let h = |t: &str| format!("Bearer {t}");
        assert_eq!(c.identify(Some(h(&ta).as_bytes()), Some(0xa)), Identity::Device(0xa));
        // Another device's token names that device, whatever the key claims.
        assert_eq!(c.identify(Some(h(&tb).as_bytes()), Some(0xa)), Identity::Device(0xb));
        assert_eq!(c.identify(Some(format!("bearer {ta}").as_bytes()), None), Identity::Device(0xa));
        let mut wrong = ta.clone().into_bytes();
        wrong[63] = if wrong[63] == b'0' { b'1' } else { b'0' };
        assert_eq!(c.identify(Some(&[b"Bearer ".as_slice(), &wrong].concat()), Some(0xa)), Identity::Nobody);
        assert_eq!(c.identify(None, Some(0xa)), Identity::Nobody);
        assert_eq!(c.identify(Some(format!("Basic {ta}").as_bytes()), Some(0xa)), Identity::Nobody);
        assert_eq!(c.identify(Some(h(&ta.to_uppercase()).as_bytes()), Some(0xa)), Identity::Nobody);
        // The digest, not the token, is in the file: the token itself is no credential line.
        assert!(!la.contains(&ta));
    }

    #[test]
    fn a_bad_file_is_refused_by_line_without_its_content() {
        let (_, la) = Credentials::issue(1);
        let sha = la.split(' ').nth(1).unwrap();
        for (text, want) in [
            (format!("{la}\nnot a line\n"), "line 2:"),
            (format!("0000000000000001 {}\n", &sha[..60]), "line 1:"),
            (format!("000000000000000G {sha}\n"), "line 1:"),
            (format!("000000000000000A {sha}\n"), "line 1:"),
            (format!("{la} extra\n"), "line 1:"),
            (format!("{la}\n{la}\n"), "line 2: this digest is already"),
            (format!("{la}\n0000000000000002 {sha}\n"), "already in the file"),
            (
                format!("{la}\n{}\n{}\n", Credentials::issue(1).1, Credentials::issue(1).1),
                "line 3: this device already has two",
            ),
        ] {
            let e = text.parse::<Credentials>().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains(sha), "{e}");
        }
    }

    #[test]
    fn a_device_may_hold_two_tokens_while_a_new_one_is_rolled_out() {
        let (old, lo) = Credentials::issue(0xa);
        let (new, ln) = Credentials::issue(0xa);
        let (tb, lb) = Credentials::issue(0xb);
        let h = |t: &str| format!("Bearer {t}");
        // Both lines in force: either token admits the device, with its key or without one.
        let both: Credentials = format!("{lo}  # old\n{lb}\n{ln}  # new\n").parse().unwrap();
        assert_eq!((both.len(), both.tokens(0xa), both.tokens(0xb)), (2, 2, 1));
        for t in [&old, &new] {
            assert_eq!(both.identify(Some(h(t).as_bytes()), Some(0xa)), Identity::Device(0xa));
            assert_eq!(both.identify(Some(h(t).as_bytes()), None), Identity::Device(0xa));
            // Neither names another device, whatever the key claims.
            assert_eq!(both.identify(Some(h(t).as_bytes()), Some(0xb)), Identity::Device(0xa));
        }
        assert_eq!(both.identify(Some(h(&tb).as_bytes()), Some(0xa)), Identity::Device(0xb));
        // The old line deleted: the old token is nobody's, the new one still the device's.
        let after: Credentials = format!("{lb}\n{ln}\n").parse().unwrap();
        assert_eq!(after.tokens(0xa), 1);
        assert_eq!(after.identify(Some(h(&old).as_bytes()), Some(0xa)), Identity::Nobody);
        assert_eq!(after.identify(Some(h(&new).as_bytes()), Some(0xa)), Identity::Device(0xa));
        // `insert` puts one token in force alone; `add` refuses a third and a digest in use.
        let mut c = both.clone();
        let sha = |line: &str| unhex::<32>(line.split(' ').nth(1).unwrap()).unwrap();
        let (third, l3) = Credentials::issue(0xa);
        assert!(!c.add(0xa, sha(&l3)));
        assert!(!c.add(0xc, sha(&lb)));
        c.insert(0xa, sha(&l3));
        assert_eq!(c.tokens(0xa), 1);
        assert_eq!(c.identify(Some(h(&old).as_bytes()), Some(0xa)), Identity::Nobody);
        assert_eq!(c.identify(Some(h(&new).as_bytes()), None), Identity::Nobody);
        assert_eq!(c.identify(Some(h(&third).as_bytes()), Some(0xa)), Identity::Device(0xa));
    }

    #[test]
    fn the_device_of_a_key_is_its_first_16_hex_digits() {
        assert_eq!(device_of_key(b"0123456789abcdef0000000100000000"), Some(0x0123_4567_89ab_cdef));
        assert_eq!(device_of_key(b"0123456789abcde"), None);
        assert_eq!(device_of_key(b"0123456789abcdeZ00"), None);
        assert_eq!(device_hex(0xab), "00000000000000ab");
        // The digest is SHA-256 of the ASCII form (a known vector).
        assert_eq!(hex(&digest(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
