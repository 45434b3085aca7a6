//! The host's settings, as `key=value` words on semihosting's command line (QEMU passes
//! `-append` there when no `-semihosting-config arg=` is given).

use heapless::Vec;
use semihosting::experimental::env::{Args, args};
use static_cell::StaticCell;

/// Bytes of command line kept: the program's path, ports and a 64-digit seed fit.
const LINE: usize = 512;
/// Words kept: the program's path and one per setting.
const WORDS: usize = 16;

/// The raw line lives here so the words can borrow it for the rest of the run.
static RAW: StaticCell<Args<LINE>> = StaticCell::new();

/// The command line's words, read once.
pub struct CommandLine {
    words: Vec<&'static str, WORDS>,
}

impl CommandLine {
    /// Reads the command line; `None` if the host gave none, it does not fit, or it was
    /// already read.
    pub fn read() -> Option<Self> {
        let raw: &'static Args<LINE> = RAW.try_init(args::<LINE>().ok()?)?;
        // The words are walked once here: the iterator keeps its place inside `Args`.
        let mut words = Vec::new();
        for word in raw.into_iter().filter_map(Result::ok) {
            words.push(word).ok()?;
        }
        Some(Self { words })
    }

    /// The value of `key=value`, the first one if repeated.
    pub fn get(&self, key: &str) -> Option<&'static str> {
        self.words.iter().find_map(|word| word.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
    }

    /// A TCP port given as `key=<decimal>`.
    pub fn port(&self, key: &str) -> Option<u16> {
        self.get(key)?.parse().ok().filter(|port| *port != 0)
    }

    /// 32 bytes given as `seed=<64 hex digits>`.
    pub fn seed(&self) -> Option<[u8; 32]> {
        let hex = self.get("seed")?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut seed = [0u8; 32];
        for (byte, pair) in seed.iter_mut().zip(hex.chunks_exact(2)) {
            let digits = core::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(digits, 16).ok()?;
        }
        Some(seed)
    }
}
