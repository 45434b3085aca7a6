//! The AT-style protocol between wary's device and its modem, modeled on cellular modems' HTTP
//! commands; `no_std`, no allocation, shared by the firmware and the host emulator
//! (`wary-modem`).
//!
//! The modem is a transparent transport: **one command is one HTTP request**, and the modem
//! passes back the real status, `Retry-After` and `Date` without retrying anything itself; the
//! device's wary policy decides.
//!
//! ```text
//! device → modem   AT+SEED?\r
//! modem → device   \r\n+SEED: 1234567\r\n\r\nOK\r\n
//!
//! device → modem   AT+HTTPPOST="/readings","<32 hex key>",<len>\r<len payload bytes>
//! modem → device   \r\n+HTTPPOST: 503,"1","Sun, 06 Nov 1994 08:49:37 GMT"\r\n\r\nOK\r\n
//!                  \r\n+HTTPPOST: 201,"",""\r\n\r\nOK\r\n
//!                  \r\n+HTTPERR: RESET\r\n\r\nERROR\r\n      (TIMEOUT | CONNECT | REFUSED | RESET | BADBODY)
//! ```
//!
//! Every line is bounded by [`MAX_LINE`]. A line that is too long, not printable ASCII, of an
//! unknown kind or with fields that do not parse is *classified* ([`LineError`]), never a
//! panic: [`PostExchange`] skips noise between a command and its answer, and turns an answer it
//! cannot read into a [`ProtoError`], which [`ProtoError::outcome`] maps to a wary [`Outcome`].

#![no_std]
#[cfg(test)]
extern crate std;

use core::fmt::Write as _;

use wary::Outcome;
use wary::retry_after::Rules;

/// The longest line either side sends or accepts, terminator excluded.
pub const MAX_LINE: usize = 128;
/// The longest `Retry-After` or `Date` value carried in a reply.
pub const MAX_FIELD: usize = 40;
/// The longest payload a `AT+HTTPPOST` may announce.
pub const MAX_PAYLOAD: usize = 512;
/// The query for the host's jitter seed.
pub const SEED_QUERY: &[u8] = b"AT+SEED?\r";

/// A line on the link that is not one this protocol knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LineError {
    /// Longer than [`MAX_LINE`]; its bytes were discarded up to the terminator.
    Overflow,
    /// Not printable ASCII, or no kind of line this protocol has.
    Garbage,
    /// A known kind of line whose fields do not parse.
    Malformed,
}

/// Why the modem's HTTP request produced no status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LinkError {
    /// No answer in the modem's time after sending (the request may have landed).
    Timeout,
    /// Could not connect in time (nothing sent).
    Connect,
    /// Connection refused (nothing sent).
    Refused,
    /// Connection closed after sending, without an answer (the request may have landed).
    Reset,
    /// A 2xx whose body was malformed.
    BadBody,
}

impl LinkError {
    /// The word on the `+HTTPERR:` line.
    pub const fn word(self) -> &'static str {
        match self {
            LinkError::Timeout => "TIMEOUT",
            LinkError::Connect => "CONNECT",
            LinkError::Refused => "REFUSED",
            LinkError::Reset => "RESET",
            LinkError::BadBody => "BADBODY",
        }
    }

    fn from_word(word: &[u8]) -> Option<Self> {
        [LinkError::Timeout, LinkError::Connect, LinkError::Refused, LinkError::Reset, LinkError::BadBody]
            .into_iter()
            .find(|e| e.word().as_bytes() == word)
    }

    /// The wary outcome of this attempt.
    pub const fn outcome(self) -> Outcome {
        match self {
            LinkError::Timeout => Outcome::ResponseTimeout,
            LinkError::Connect => Outcome::ConnectTimeout,
            LinkError::Refused => Outcome::Refused,
            LinkError::Reset => Outcome::Reset,
            LinkError::BadBody => Outcome::BadBody,
        }
    }
}

/// One line from the modem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// `OK`: the command is complete.
    Ok,
    /// `ERROR`: the command failed (after `+HTTPERR`, or alone when the modem refused it).
    Error,
    /// `+HTTPPOST: <status>,"<retry-after>","<date>"`.
    Post(PostInfo<'a>),
    /// `+HTTPERR: <word>`.
    HttpErr(LinkError),
    /// `+SEED: <u64>`.
    Seed(u64),
}

/// The fields of a `+HTTPPOST:` line, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostInfo<'a> {
    /// The HTTP status.
    pub status: u16,
    /// The raw `Retry-After` value, if the response had one.
    pub retry_after: Option<&'a [u8]>,
    /// The raw `Date` value, if the response had one.
    pub date: Option<&'a [u8]>,
}

/// A command to the modem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// `AT`: are you there.
    At,
    /// `AT+SEED?`: a per-run jitter seed from the host.
    Seed,
    /// `AT+HTTPPOST="<path>","<key>",<len>`, followed by `len` payload bytes.
    Post {
        /// The request path.
        path: &'a str,
        /// The idempotency key (visible ASCII).
        key: &'a str,
        /// Payload bytes that follow the command.
        len: usize,
    },
}

fn printable(line: &[u8]) -> bool {
    line.iter().all(|&b| (0x20..0x7f).contains(&b))
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        let digit = u64::from(d.checked_sub(b'0').filter(|d| *d <= 9)?);
        acc.checked_mul(10)?.checked_add(digit)
    })
}

/// Splits `"<text>"` off the front of `s`; the text may not contain a quote.
fn quoted(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = s.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    Some((rest.get(..end)?, rest.get(end.checked_add(1)?..)?))
}

fn non_empty(s: &[u8]) -> Option<&[u8]> {
    if s.is_empty() { None } else { Some(s) }
}

/// Classifies one line from the modem (terminators already removed).
pub fn parse_line(line: &[u8]) -> Result<Line<'_>, LineError> {
    if line.len() > MAX_LINE {
        return Err(LineError::Overflow);
    }
    if !printable(line) {
        return Err(LineError::Garbage);
    }
    match line {
        b"OK" => return Ok(Line::Ok),
        b"ERROR" => return Ok(Line::Error),
        _ => {}
    }
    if let Some(rest) = line.strip_prefix(b"+HTTPPOST: ") {
        return parse_post(rest).map(Line::Post).ok_or(LineError::Malformed);
    }
    if let Some(rest) = line.strip_prefix(b"+HTTPERR: ") {
        return LinkError::from_word(rest).map(Line::HttpErr).ok_or(LineError::Malformed);
    }
    if let Some(rest) = line.strip_prefix(b"+SEED: ") {
        return parse_u64(rest).map(Line::Seed).ok_or(LineError::Malformed);
    }
    Err(LineError::Garbage)
}

fn parse_post(rest: &[u8]) -> Option<PostInfo<'_>> {
    let comma = rest.iter().position(|&b| b == b',')?;
    let status = parse_u64(rest.get(..comma)?)?;
    let status = u16::try_from(status).ok().filter(|s| (100..=999).contains(s))?;
    let (retry_after, rest) = quoted(rest.get(comma.checked_add(1)?..)?)?;
    let (date, rest) = quoted(rest.strip_prefix(b",")?)?;
    if !rest.is_empty() || retry_after.len() > MAX_FIELD || date.len() > MAX_FIELD {
        return None;
    }
    Some(PostInfo { status, retry_after: non_empty(retry_after), date: non_empty(date) })
}

/// Classifies one command line (terminator removed), on the modem's side.
pub fn parse_command(line: &[u8]) -> Result<Command<'_>, LineError> {
    if line.len() > MAX_LINE {
        return Err(LineError::Overflow);
    }
    if !printable(line) {
        return Err(LineError::Garbage);
    }
    match line {
        b"AT" => return Ok(Command::At),
        b"AT+SEED?" => return Ok(Command::Seed),
        _ => {}
    }
    let rest = line.strip_prefix(b"AT+HTTPPOST=").ok_or(LineError::Garbage)?;
    let parse = || {
        let (path, rest) = quoted(rest)?;
        let (key, rest) = quoted(rest.strip_prefix(b",")?)?;
        let len = usize::try_from(parse_u64(rest.strip_prefix(b",")?)?).ok()?;
        if !path.starts_with(b"/") || key.is_empty() || len > MAX_PAYLOAD {
            return None;
        }
        // Printable ASCII was checked above, so both are UTF-8.
        Some(Command::Post {
            path: core::str::from_utf8(path).ok()?,
            key: core::str::from_utf8(key).ok()?,
            len,
        })
    };
    parse().ok_or(LineError::Malformed)
}

/// A line that does not fit the buffer it is written into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TooLong;

/// A line being written, bounded by [`MAX_LINE`] plus its terminators.
pub type LineText = heapless::String<{ MAX_LINE + 4 }>;

/// `AT+HTTPPOST="<path>","<key>",<len>\r`.
pub fn post_command(path: &str, key: &str, len: usize) -> Result<LineText, TooLong> {
    let mut s = LineText::new();
    write!(s, "AT+HTTPPOST=\"{path}\",\"{key}\",{len}\r").map_err(|_| TooLong)?;
    Ok(s)
}

/// The modem's answer to a request that got a status: `\r\n+HTTPPOST: ...\r\n\r\nOK\r\n`.
/// A value with a quote or a non-printable byte, or longer than [`MAX_FIELD`], is left out.
pub fn post_reply(status: u16, retry_after: Option<&str>, date: Option<&str>) -> Result<LineText, TooLong> {
    let mut s = LineText::new();
    write!(s, "\r\n+HTTPPOST: {status},\"{}\",\"{}\"\r\n\r\nOK\r\n", clean(retry_after), clean(date))
        .map_err(|_| TooLong)?;
    Ok(s)
}

fn clean(v: Option<&str>) -> &str {
    v.filter(|v| v.len() <= MAX_FIELD && printable(v.as_bytes()) && !v.contains('"')).unwrap_or("")
}

/// The modem's answer to a request that got no status: `\r\n+HTTPERR: <word>\r\n\r\nERROR\r\n`.
pub fn err_reply(error: LinkError) -> LineText {
    let mut s = LineText::new();
    // 30 bytes at most: always fits.
    let _ = write!(s, "\r\n+HTTPERR: {}\r\n\r\nERROR\r\n", error.word());
    s
}

/// The answer to `AT+SEED?`.
pub fn seed_reply(seed: u64) -> LineText {
    let mut s = LineText::new();
    let _ = write!(s, "\r\n+SEED: {seed}\r\n\r\nOK\r\n");
    s
}

/// What [`LineBuf::push`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// Nothing complete yet.
    Pending,
    /// A non-empty line is complete: read it with [`LineBuf::line`].
    Line,
    /// A line longer than the buffer ended; its bytes are gone.
    Overflow,
}

/// Assembles bytes into lines ended by `\r`, `\n` or both; empty lines are skipped. Bounded:
/// a longer line is reported as [`Event::Overflow`] at its end, never kept in part.
#[derive(Debug, Clone)]
pub struct LineBuf<const N: usize = MAX_LINE> {
    buf: [u8; N],
    len: usize,
    overflow: bool,
    complete: bool,
}

impl<const N: usize> Default for LineBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> LineBuf<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        LineBuf { buf: [0; N], len: 0, overflow: false, complete: false }
    }

    /// Forgets any partial line (before a new command, so a truncated answer cannot prefix
    /// the next one).
    pub fn clear(&mut self) {
        self.len = 0;
        self.overflow = false;
        self.complete = false;
    }

    /// Bytes of a line not yet ended.
    pub fn partial(&self) -> usize {
        if self.complete { 0 } else { self.len }
    }

    /// Takes one byte.
    pub fn push(&mut self, byte: u8) -> Event {
        if self.complete {
            self.clear();
        }
        if byte == b'\r' || byte == b'\n' {
            if self.overflow {
                self.clear();
                return Event::Overflow;
            }
            if self.len == 0 {
                return Event::Pending;
            }
            self.complete = true;
            return Event::Line;
        }
        match self.buf.get_mut(self.len) {
            Some(slot) if !self.overflow => {
                *slot = byte;
                self.len = self.len.saturating_add(1);
            }
            _ => self.overflow = true,
        }
        Event::Pending
    }

    /// The line just completed (empty unless the last event was [`Event::Line`]).
    pub fn line(&self) -> &[u8] {
        if self.complete { self.buf.get(..self.len).unwrap_or(&[]) } else { &[] }
    }
}

/// A `Retry-After` or `Date` value kept from a reply.
pub type Field = heapless::Vec<u8, MAX_FIELD>;

/// The answer to one `AT+HTTPPOST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The server answered.
    Status {
        /// HTTP status.
        status: u16,
        /// Raw `Retry-After`, if any.
        retry_after: Option<Field>,
        /// Raw `Date`, if any.
        date: Option<Field>,
    },
    /// The modem's request failed.
    Link(LinkError),
}

impl Answer {
    /// The wary outcome: 2xx is ok; any other status carries the `Retry-After` read with
    /// `rules` (a date against the response's own `Date`; an unreadable value counts as none).
    pub fn outcome(&self, rules: &Rules) -> Outcome {
        match self {
            Answer::Status { status, .. } if (200..300).contains(status) => Outcome::Ok,
            Answer::Status { status, retry_after, date } => {
                // Several Retry-After headers arrive joined with `|`.
                let values = retry_after.as_deref().into_iter().flat_map(|v| v.split(|b| *b == b'|'));
                let secs = rules.read(values, date.as_deref(), None).ok().flatten();
                Outcome::Status { code: *status, retry_after: secs }
            }
            Answer::Link(e) => e.outcome(),
        }
    }
}

/// An answer that could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ProtoError {
    /// No final `OK`/`ERROR` in time (a truncated or missing answer).
    Timeout,
    /// A `+HTTPPOST`/`+HTTPERR` line whose fields do not parse.
    Malformed,
    /// A final `OK` with no `+HTTPPOST` before it (the information line was lost).
    NoInfo,
    /// `ERROR` and no other line since the command: the modem refused it, so nothing was sent.
    Rejected,
}

impl ProtoError {
    /// The wary outcome. An answer lost after the modem may have sent the request is a
    /// "maybe sent" outcome (response timeout or reset: retried for a keyed write, `unknown`
    /// for an unkeyed one); a command the modem refused was never sent.
    pub const fn outcome(self) -> Outcome {
        match self {
            ProtoError::Timeout => Outcome::ResponseTimeout,
            ProtoError::Malformed | ProtoError::NoInfo => Outcome::Reset,
            ProtoError::Rejected => Outcome::Refused,
        }
    }
}

/// The device's side of one `AT+HTTPPOST`: feed it lines until it returns an answer.
/// Lines it does not know (noise, unsolicited codes, overflows) are counted and skipped.
#[derive(Debug, Default)]
pub struct PostExchange {
    info: Option<Result<Answer, ProtoError>>,
    noise: u32,
}

impl PostExchange {
    /// A new exchange.
    pub const fn new() -> Self {
        PostExchange { info: None, noise: 0 }
    }

    /// Lines skipped as noise so far.
    pub const fn noise(&self) -> u32 {
        self.noise
    }

    /// Takes one classified line; `Some` once the exchange is over.
    pub fn feed(&mut self, line: Result<Line<'_>, LineError>) -> Option<Result<Answer, ProtoError>> {
        match line {
            Ok(Line::Post(p)) => {
                let field = |v: Option<&[u8]>| v.and_then(|v| Field::from_slice(v).ok());
                self.info = Some(Ok(Answer::Status {
                    status: p.status,
                    retry_after: field(p.retry_after),
                    date: field(p.date),
                }));
                None
            }
            Ok(Line::HttpErr(e)) => {
                self.info = Some(Ok(Answer::Link(e)));
                None
            }
            Err(LineError::Malformed) => {
                self.info = Some(Err(ProtoError::Malformed));
                None
            }
            Ok(Line::Ok) => Some(self.info.take().unwrap_or(Err(ProtoError::NoInfo))),
            Ok(Line::Error) => Some(match self.info.take() {
                Some(Ok(Answer::Link(e))) => Ok(Answer::Link(e)),
                Some(Err(e)) => Err(e),
                // A status line proves the request went out: whatever `ERROR` means after it,
                // the write may have landed.
                Some(Ok(Answer::Status { .. })) => Err(ProtoError::Malformed),
                // `ERROR` after noise may follow a garbled `+HTTPERR: TIMEOUT`: may have landed.
                None if self.noise > 0 => Err(ProtoError::NoInfo),
                // `ERROR` and nothing else since the command: the modem refused it, unsent.
                None => Err(ProtoError::Rejected),
            }),
            Ok(Line::Seed(_)) | Err(LineError::Garbage | LineError::Overflow) => {
                self.noise = self.noise.saturating_add(1);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
