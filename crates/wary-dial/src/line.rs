//! Framing the modem's bytes into lines, and naming the result codes among them.
//!
//! Replies are `\r\n`-framed (`\r\nOK\r\n`), an echo ends with the command's own `\r`, so
//! either byte ends a line and empty lines are skipped. A line is kept only while it is
//! printable ASCII and fits [`MAX_LINE`]: a longer one is dropped as it arrives and counted, a
//! line with any other byte (noise on the wire, PPP frames still in flight) is dropped as
//! garbage. Nothing a peer sends can grow memory or panic the reader.

use heapless::Vec;

use crate::outcome::CmeError;

/// The longest line kept, terminator excluded: room for the echo of the longest command
/// (`AT+CGDCONT=1,"IP","` + a 100-byte APN + `"`, 120 bytes). Result codes are far shorter.
pub const MAX_LINE: usize = 128;

/// One finished line, as the reader saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// Printable ASCII that fit the buffer.
    Text(&'a [u8]),
    /// Held a byte that is not printable ASCII; dropped.
    Garbage,
    /// Longer than [`MAX_LINE`]; dropped, never kept.
    Overlong,
}

/// A fixed-capacity line assembler. `Debug` and `defmt::Format` show the length only: a line
/// may be the echo of `AT+CGDCONT`, APN and all.
#[derive(Default)]
pub(crate) struct LineReader {
    buf: Vec<u8, MAX_LINE>,
    garbage: bool,
    overlong: bool,
    /// The last call returned a line; the next byte starts a new one.
    done: bool,
}

impl core::fmt::Debug for LineReader {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LineReader").field("len", &self.buf.len()).finish_non_exhaustive()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for LineReader {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "LineReader {{ len: {} }}", self.buf.len())
    }
}

impl LineReader {
    pub(crate) const fn new() -> Self {
        Self { buf: Vec::new(), garbage: false, overlong: false, done: false }
    }

    /// Forgets any partial line (at the start of a step: stale bytes belong to no reply).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.garbage = false;
        self.overlong = false;
        self.done = false;
    }

    /// Takes one byte; returns a line when this byte ends a non-empty one.
    pub(crate) fn push(&mut self, byte: u8) -> Option<Event<'_>> {
        if self.done {
            self.clear();
        }
        match byte {
            b'\r' | b'\n' => {
                if self.garbage {
                    self.done = true;
                    Some(Event::Garbage)
                } else if self.overlong {
                    self.done = true;
                    Some(Event::Overlong)
                } else if self.buf.is_empty() {
                    None
                } else {
                    self.done = true;
                    Some(Event::Text(&self.buf))
                }
            }
            0x20..=0x7e => {
                if !self.garbage && !self.overlong && self.buf.push(byte).is_err() {
                    // Drop what was kept at once: an overlong line is never partly used.
                    self.overlong = true;
                    self.buf.clear();
                }
                None
            }
            _ => {
                self.garbage = true;
                self.buf.clear();
                None
            }
        }
    }
}

/// A line's meaning for the chat: a V.250 / 3GPP TS 27.007 result code, or anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Ok,
    /// `CONNECT` or `CONNECT <text>`; the rate when the text is a number (bits per second).
    Connect(Option<u32>),
    Error,
    Cme(CmeError),
    NoCarrier,
    Busy,
    NoDialtone,
    NoAnswer,
    /// Anything else: unsolicited result codes (`RING`, `+CREG: 2`), information text.
    Other,
}

/// Names a line. Result codes are matched exactly, in the verbose (`ATV1`) form modems use by
/// default; a near miss such as `CONNECTED` or `OK1` is [`Code::Other`].
pub(crate) fn classify(line: &[u8]) -> Code {
    match line {
        b"OK" => Code::Ok,
        b"ERROR" => Code::Error,
        b"NO CARRIER" => Code::NoCarrier,
        b"BUSY" => Code::Busy,
        // V.250 spells it NO DIALTONE; some modems keep the older NO DIAL TONE.
        b"NO DIALTONE" | b"NO DIAL TONE" => Code::NoDialtone,
        b"NO ANSWER" => Code::NoAnswer,
        b"CONNECT" => Code::Connect(None),
        _ => {
            if let Some(text) = line.strip_prefix(b"CONNECT ") {
                Code::Connect(number(text.trim_ascii()))
            } else if let Some(err) = line.strip_prefix(b"+CME ERROR:") {
                // Numeric with AT+CMEE=1, verbose text with AT+CMEE=2: the text is not kept.
                Code::Cme(match number(err.trim_ascii()) {
                    Some(n) => u16::try_from(n).map_or(CmeError::Verbose, CmeError::Code),
                    None => CmeError::Verbose,
                })
            } else {
                Code::Other
            }
        }
    }
}

/// A decimal number of at most `u32`; anything else (empty, a sign, text, overflow) is `None`.
fn number(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u32, |acc, &d| {
        let digit = u32::from(d.checked_sub(b'0').filter(|v| *v <= 9)?);
        acc.checked_mul(10)?.checked_add(digit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec as StdVec;

    fn feed(reader: &mut LineReader, bytes: &[u8]) -> StdVec<std::string::String> {
        let mut out = StdVec::new();
        for &b in bytes {
            if let Some(event) = reader.push(b) {
                out.push(match event {
                    Event::Text(t) => std::string::String::from_utf8(t.to_vec()).unwrap(),
                    Event::Garbage => "<garbage>".into(),
                    Event::Overlong => "<overlong>".into(),
                });
            }
        }
        out
    }

    #[test]
    fn frames_on_either_terminator_and_skips_empty_lines() {
        let mut r = LineReader::new();
        assert_eq!(feed(&mut r, b"ATE0\r\r\nOK\r\n\r\n+CREG: 2\n"), ["ATE0", "OK", "+CREG: 2"]);
    }

    #[test]
    fn a_partial_line_waits_for_its_terminator() {
        let mut r = LineReader::new();
        assert!(feed(&mut r, b"\r\nCONN").is_empty());
        assert_eq!(feed(&mut r, b"ECT 150000000\r"), ["CONNECT 150000000"]);
    }

    #[test]
    fn garbage_is_dropped_whole_and_the_next_line_is_clean() {
        let mut r = LineReader::new();
        assert_eq!(feed(&mut r, b"\x00\xffOK\x7e\r\nOK\r\n"), ["<garbage>", "OK"]);
    }

    #[test]
    fn an_overlong_line_is_dropped_and_never_kept() {
        let mut r = LineReader::new();
        let mut long = std::vec![b'A'; MAX_LINE + 1];
        long.extend_from_slice(b"\r\nOK\r\n");
        assert_eq!(feed(&mut r, &long), ["<overlong>", "OK"]);
        let mut exact = std::vec![b'B'; MAX_LINE];
        exact.push(b'\n');
        assert_eq!(
            feed(&mut r, &exact),
            [std::string::String::from_utf8(std::vec![b'B'; MAX_LINE]).unwrap()]
        );
    }

    #[test]
    fn debug_never_shows_the_line() {
        let mut r = LineReader::new();
        feed(&mut r, b"AT+CGDCONT=1,\"IP\",\"secret.corp\"");
        let shown = std::format!("{r:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn clear_forgets_a_partial_line() {
        let mut r = LineReader::new();
        feed(&mut r, b"NO CARR");
        r.clear();
        assert_eq!(feed(&mut r, b"OK\r"), ["OK"]);
    }

    #[test]
    fn result_codes_are_matched_exactly() {
        assert_eq!(classify(b"OK"), Code::Ok);
        assert_eq!(classify(b"ERROR"), Code::Error);
        assert_eq!(classify(b"NO CARRIER"), Code::NoCarrier);
        assert_eq!(classify(b"BUSY"), Code::Busy);
        assert_eq!(classify(b"NO DIALTONE"), Code::NoDialtone);
        assert_eq!(classify(b"NO DIAL TONE"), Code::NoDialtone);
        assert_eq!(classify(b"NO ANSWER"), Code::NoAnswer);
        assert_eq!(classify(b"CONNECT"), Code::Connect(None));
        assert_eq!(classify(b"CONNECT 150000000"), Code::Connect(Some(150_000_000)));
        assert_eq!(classify(b"CONNECT LTE"), Code::Connect(None));
        assert_eq!(classify(b"CONNECT 99999999999"), Code::Connect(None));
        assert_eq!(classify(b"CONNECTED"), Code::Other);
        assert_eq!(classify(b"OK1"), Code::Other);
        assert_eq!(classify(b"ok"), Code::Other);
        assert_eq!(classify(b"RING"), Code::Other);
        assert_eq!(classify(b"+CREG: 2"), Code::Other);
    }

    #[test]
    fn cme_errors_keep_the_number_and_drop_the_text() {
        assert_eq!(classify(b"+CME ERROR: 30"), Code::Cme(CmeError::Code(30)));
        assert_eq!(classify(b"+CME ERROR:133"), Code::Cme(CmeError::Code(133)));
        assert_eq!(classify(b"+CME ERROR: SIM not inserted"), Code::Cme(CmeError::Verbose));
        assert_eq!(classify(b"+CME ERROR: 70000"), Code::Cme(CmeError::Verbose));
        assert_eq!(classify(b"+CME ERROR: -1"), Code::Cme(CmeError::Verbose));
        assert_eq!(classify(b"+CME ERROR: "), Code::Cme(CmeError::Verbose));
    }
}
