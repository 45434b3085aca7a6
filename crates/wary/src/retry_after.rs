//! Retry-After, both forms (RFC 9110 §10.2.3), resolved to whole seconds.
//!
//! `Retry-After` is either delay-seconds (`120`) or an HTTP-date. Recipients must accept the
//! three date forms RFC 9110 §5.6.7 names: IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the
//! obsolete RFC 850 form (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
//! (`Sun Nov  6 08:49:37 1994`). A date is measured against the response's own `Date` header
//! when there is one, since both come from the server's clock and a device's clock may be
//! skewed or absent; otherwise against the caller's clock (Unix seconds). A date in the past
//! means "now".
//!
//! A hostile or broken server cannot make a device wait past its budget: a huge value saturates
//! and the policy then gives up at once, reporting what was asked (see [`crate::GiveUp::RetryAfterTooLong`]).
//!
//! Lenient rules never come back sooner than asked: a number a server writes outside the
//! grammar (`1.5`, `+5`, `1e3`) is read as the longest wait it can mean, rounded up to whole
//! seconds, rather than ignored, which would retry on the backoff's shorter wait. A value that
//! cannot be read at all is ignored but counted ([`Reading::unreadable`]), so a ledger shows a
//! server sending garbage. Strict rules read delay-seconds only and refuse anything else.
//!
//! ```
//! use wary::{retry_after::{RetryAfter, parse as parse, parse_http_date}};
//! assert_eq!(parse(b"120"), Ok(RetryAfter::Seconds(120)));
//! let date = parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
//! assert_eq!(date, 784111777);
//! assert_eq!(parse(b"Sunday, 06-Nov-94 08:49:37 GMT"), Ok(RetryAfter::Date(784111777)));
//! assert_eq!(parse(b"Sun Nov  6 08:49:37 1994"), Ok(RetryAfter::Date(784111777)));
//! ```

pub use crate::error::RetryAfterError;
use crate::names::named_enum;

/// A parsed Retry-After value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RetryAfter {
    /// Delay-seconds (saturated at `u64::MAX`).
    Seconds(u64),
    /// An HTTP-date, as Unix seconds (0 for dates before 1970).
    Date(u64),
}

impl RetryAfter {
    /// Seconds to wait from now. `date_header` is the response's `Date` (Unix seconds), `now`
    /// the caller's wall clock (Unix seconds); the Date header wins when both are given.
    pub const fn resolve(self, date_header: Option<u64>, now: Option<u64>) -> Result<u64, RetryAfterError> {
        match self {
            RetryAfter::Seconds(s) => Ok(s),
            RetryAfter::Date(at) => {
                let reference = match (date_header, now) {
                    (Some(d), _) => d,
                    (None, Some(n)) => n,
                    (None, None) => return Err(RetryAfterError::NoReference),
                };
                Ok(at.saturating_sub(reference))
            }
        }
    }
}

named_enum! {
    /// What to do with a Retry-After that can be read more than one way: several headers, a
    /// number written outside the grammar (`1.5`, `+5`), a value that cannot be read at all.
    pub enum Ambiguous {
        /// Refuse it: the response is treated as having no Retry-After (strict reading).
        Reject => "reject",
        /// Read it as the longest wait it can mean: the longest of several values, a malformed
        /// number rounded up (see [`parse_lenient`]); a value that cannot be read at all is
        /// ignored and counted (lenient reading).
        Longest => "longest",
    }
}

/// One response's Retry-After headers as a policy's rules read them, with the count of values
/// that could not be read at all, for the ledger and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Reading {
    /// The wait asked for, whole seconds from now: the longest value read. `None` when there was
    /// no header or none could be used.
    pub seconds: Option<u64>,
    /// Values that were present but could not be read at all (neither a number nor an
    /// HTTP-date), and so were ignored.
    pub unreadable: u32,
    /// Why no value was used, when headers were present but none was: the first problem met
    /// (under strict rules, the one that refused the header).
    pub error: Option<RetryAfterError>,
}

impl Reading {
    /// The result [`Rules::read`] gives: the seconds, or the error when no value was used.
    pub const fn result(&self) -> Result<Option<u64>, RetryAfterError> {
        match (self.seconds, self.error) {
            (Some(secs), _) => Ok(Some(secs)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }
}

/// Which Retry-After values a policy accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Rules {
    /// Accept the HTTP-date form.
    pub accept_dates: bool,
    /// What to do with an ambiguous value: several headers, or a number outside the grammar.
    /// Its serde name is `duplicates`, the key policy files use.
    #[cfg_attr(feature = "serde", serde(rename = "duplicates"))]
    pub ambiguous: Ambiguous,
}

impl Rules {
    /// Both forms, the longest of duplicates.
    pub const LENIENT: Rules = Rules { accept_dates: true, ambiguous: Ambiguous::Longest };
    /// Integer seconds only, duplicates refused: a header that is not exactly what the rule
    /// allows is not guessed at.
    pub const STRICT: Rules = Rules { accept_dates: false, ambiguous: Ambiguous::Reject };

    /// True for rules that read an ambiguous value as the longest wait it can mean
    /// ([`Ambiguous::Longest`]).
    pub const fn is_lenient(&self) -> bool {
        matches!(self.ambiguous, Ambiguous::Longest)
    }

    /// Reads every `Retry-After` value of one response, with its `Date` value, to whole seconds
    /// from now. `Ok(None)` when there is no Retry-After header at all. [`Rules::read_counted`]
    /// also counts the values that could not be read.
    pub fn read<'a, I>(
        &self,
        values: I,
        date: Option<&[u8]>,
        now: Option<u64>,
    ) -> Result<Option<u64>, RetryAfterError>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        self.read_counted(values, date, now).result()
    }

    /// [`Rules::read`], keeping the count of values that could not be read at all, so a ledger
    /// or a metric can show a server that sends garbage.
    ///
    /// ```
    /// use wary::{retry_after::{RetryAfterError, Rules}};
    /// let r = Rules::LENIENT.read_counted([b"1.5".as_slice(), b"soon"], None, None);
    /// // 1.5 s means at least 1.5 s: wait 2, never 1. "soon" is ignored, and counted.
    /// assert_eq!((r.seconds, r.unreadable), (Some(2), 1));
    /// let r = Rules::STRICT.read_counted([b"1.5".as_slice()], None, None);
    /// assert_eq!((r.seconds, r.unreadable, r.error), (None, 1, Some(RetryAfterError::Malformed)));
    /// ```
    pub fn read_counted<'a, I>(&self, values: I, date: Option<&[u8]>, now: Option<u64>) -> Reading
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let date_header = date.and_then(|d| parse_http_date(d).ok());
        let lenient = self.is_lenient();
        let mut result: Option<u64> = None;
        let mut first_error: Option<RetryAfterError> = None;
        let mut unreadable: u32 = 0;
        for value in values {
            if result.is_some() && !lenient {
                return Reading { seconds: None, unreadable, error: Some(RetryAfterError::Duplicate) };
            }
            let parsed = if lenient { parse_lenient(value) } else { parse(value) };
            if matches!(parsed, Err(RetryAfterError::Malformed | RetryAfterError::Empty)) {
                unreadable = unreadable.saturating_add(1);
            }
            let secs = parsed.and_then(|parsed| {
                if matches!(parsed, RetryAfter::Date(_)) && !self.accept_dates {
                    return Err(RetryAfterError::DateNotAccepted);
                }
                parsed.resolve(date_header, now)
            });
            match secs {
                Ok(secs) => {
                    result = Some(match result {
                        Some(prev) => prev.max(secs),
                        None => secs,
                    });
                }
                // Strict rules refuse what they cannot read.
                Err(e) if !lenient => return Reading { seconds: None, unreadable, error: Some(e) },
                // Lenient rules take the longest value they can read: one garbled header must
                // not lower the wait a good one asks for.
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        match result {
            Some(_) => Reading { seconds: result, unreadable, error: None },
            None => Reading { seconds: None, unreadable, error: first_error },
        }
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Parses one Retry-After value (surrounding whitespace allowed).
pub fn parse(value: &[u8]) -> Result<RetryAfter, RetryAfterError> {
    let v = trim(value);
    if v.is_empty() {
        return Err(RetryAfterError::Empty);
    }
    if v.iter().all(u8::is_ascii_digit) {
        let mut n: u64 = 0;
        for d in v {
            // A year's worth of digits still only means "longer than any budget".
            n = n.saturating_mul(10).saturating_add(u64::from(d.saturating_sub(b'0')));
        }
        return Ok(RetryAfter::Seconds(n));
    }
    parse_http_date(v).map(RetryAfter::Date)
}

/// Parses one Retry-After value as lenient rules read it: delay-seconds or an HTTP-date as
/// [`parse`] does, and also a number written outside the grammar — a sign (`+5`), a fraction
/// (`1.5`, `.5`), an exponent (`1e3`, `2.5E-1`) — read as the longest wait it can mean, rounded
/// up to whole seconds and saturated at `u64::MAX`. A negative number or anything else is still
/// [`RetryAfterError::Malformed`].
///
/// ```
/// use wary::{retry_after::{RetryAfter, parse_lenient as parse_lenient}};
/// assert_eq!(parse_lenient(b"1.5"), Ok(RetryAfter::Seconds(2)));
/// assert_eq!(parse_lenient(b"+5"), Ok(RetryAfter::Seconds(5)));
/// assert_eq!(parse_lenient(b"1e3"), Ok(RetryAfter::Seconds(1000)));
/// assert_eq!(parse_lenient(b"1e400"), Ok(RetryAfter::Seconds(u64::MAX)));
/// ```
pub fn parse_lenient(value: &[u8]) -> Result<RetryAfter, RetryAfterError> {
    match parse(value) {
        Err(RetryAfterError::Malformed) => {
            loose_seconds(trim(value)).map(RetryAfter::Seconds).ok_or(RetryAfterError::Malformed)
        }
        other => other,
    }
}

/// Splits off the leading ASCII digits.
fn leading_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    s.split_at_checked(n).unwrap_or((s, &[]))
}

/// `[+] digits [. digits] [(e|E) [+|-] digits]`, at least one mantissa digit, rounded up.
fn loose_seconds(v: &[u8]) -> Option<u64> {
    let v = v.strip_prefix(b"+").unwrap_or(v);
    let (int, rest) = leading_digits(v);
    let (frac, rest) = match rest.strip_prefix(b".") {
        Some(after) => leading_digits(after),
        None => (&[][..], rest),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    // The exponent, clamped: past a few dozen either way the answer is already 0 + 1 or u64::MAX.
    let exp: i64 = match rest {
        [] => 0,
        [b'e' | b'E', tail @ ..] => {
            let (negative, tail) = match tail {
                [b'-', t @ ..] => (true, t),
                [b'+', t @ ..] => (false, t),
                t => (false, t),
            };
            let (digits, after) = leading_digits(tail);
            if digits.is_empty() || !after.is_empty() {
                return None;
            }
            let e = digits.iter().fold(0i64, |n, d| {
                n.saturating_mul(10).saturating_add(i64::from(d.saturating_sub(b'0'))).min(1_000)
            });
            if negative { e.saturating_neg() } else { e }
        }
        _ => return None,
    };
    // value = mantissa digits × 10^(exp − fraction digits); leading zeros carry nothing.
    let digits = int.iter().chain(frac.iter()).skip_while(|d| **d == b'0');
    let significant = i64::try_from(digits.clone().count()).unwrap_or(i64::MAX);
    if significant == 0 {
        return Some(0);
    }
    let scale = exp.saturating_sub(i64::try_from(frac.len()).unwrap_or(i64::MAX));
    let whole = significant.saturating_add(scale);
    if whole > 20 {
        return Some(u64::MAX);
    }
    let keep = usize::try_from(whole.max(0)).unwrap_or(0);
    let mut n: u64 = 0;
    for d in digits.clone().take(keep) {
        n = n.saturating_mul(10).saturating_add(u64::from(d.saturating_sub(b'0')));
    }
    // Zeros the exponent adds past the digits given.
    for _ in 0..scale.max(0) {
        n = n.saturating_mul(10);
    }
    // Anything left below the point rounds up: 1.5 s asks for more than 1 s.
    if digits.skip(keep).any(|d| *d != b'0') {
        n = n.saturating_add(1);
    }
    Some(n)
}

const MONTHS: [&[u8; 3]; 12] =
    [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
const DAYS: [&[u8]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
const LONG_DAYS: [&[u8]; 7] =
    [b"Monday", b"Tuesday", b"Wednesday", b"Thursday", b"Friday", b"Saturday", b"Sunday"];

fn digits(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 4 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u32, |n, d| n.checked_mul(10)?.checked_add(u32::from(d.checked_sub(b'0')?)))
}

fn month(s: &[u8]) -> Option<u32> {
    let pos = MONTHS.iter().position(|m| m.as_slice() == s)?;
    u32::try_from(pos).ok()?.checked_add(1)
}

/// `HH:MM:SS` to seconds of the day.
fn time_of_day(s: &[u8]) -> Option<u32> {
    let [h1, h2, b':', m1, m2, b':', s1, s2] = s else { return None };
    let h = digits(&[*h1, *h2])?;
    let m = digits(&[*m1, *m2])?;
    let sec = digits(&[*s1, *s2])?;
    // 60 allows a leap second.
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    h.checked_mul(3600)?.checked_add(m.checked_mul(60)?)?.checked_add(sec)
}

fn is_leap(y: u32) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian), for years ≥ 1.
fn days_from_civil(y: u32, m: u32, d: u32) -> Option<i64> {
    let y = i64::from(y).checked_sub(i64::from(m <= 2))?;
    let era = y.checked_div(400)?;
    let yoe = y.checked_sub(era.checked_mul(400)?)?;
    let mp = (i64::from(m).checked_add(9)?).checked_rem(12)?;
    let doy =
        (mp.checked_mul(153)?.checked_add(2)?).checked_div(5)?.checked_add(i64::from(d))?.checked_sub(1)?;
    let doe = yoe
        .checked_mul(365)?
        .checked_add(yoe.checked_div(4)?)?
        .checked_sub(yoe.checked_div(100)?)?
        .checked_add(doy)?;
    era.checked_mul(146_097)?.checked_add(doe)?.checked_sub(719_468)
}

fn to_unix(y: u32, m: u32, d: u32, secs: u32) -> Option<u64> {
    if y == 0 || !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    let days = days_from_civil(y, m, d)?;
    let t = days.checked_mul(86_400)?.checked_add(i64::from(secs))?;
    // Dates before 1970 are in the past: wait nothing.
    Some(u64::try_from(t).unwrap_or(0))
}

/// Splits on single spaces; `None` if there are more than `N` fields.
fn fields<const N: usize>(s: &[u8]) -> Option<[&[u8]; N]> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut parts = s.split(|b| *b == b' ');
    for slot in out.iter_mut() {
        *slot = parts.next()?;
    }
    parts.next().is_none().then_some(out)
}

/// Parses an HTTP-date in any of RFC 9110's three forms to Unix seconds.
pub fn parse_http_date(value: &[u8]) -> Result<u64, RetryAfterError> {
    let v = trim(value);
    if v.is_empty() {
        return Err(RetryAfterError::Empty);
    }
    imf_fixdate(v).or_else(|| rfc850(v)).or_else(|| asctime(v)).ok_or(RetryAfterError::Malformed)
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(v: &[u8]) -> Option<u64> {
    let [wd, day, mon, year, time, gmt] = fields::<6>(v)?;
    let [w @ .., b','] = wd else { return None };
    if !DAYS.contains(&w) || gmt != b"GMT" || day.len() != 2 || year.len() != 4 {
        return None;
    }
    to_unix(digits(year)?, month(mon)?, digits(day)?, time_of_day(time)?)
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`
fn rfc850(v: &[u8]) -> Option<u64> {
    let [wd, date, time, gmt] = fields::<4>(v)?;
    let [w @ .., b','] = wd else { return None };
    let [d1, d2, b'-', m1, m2, m3, b'-', y1, y2] = date else { return None };
    if !LONG_DAYS.contains(&w) || gmt != b"GMT" {
        return None;
    }
    let yy = digits(&[*y1, *y2])?;
    // Two-digit years: 70..99 are 1970..1999, 00..69 are 2000..2069. RFC 9110 asks recipients to
    // read a year more than 50 years ahead as the past one, which from 2025 on would put 70..76
    // in this century; either reading of such a Retry-After is decades off, and ends the same
    // way (no wait, or a give-up), so the fixed split needs no clock to parse.
    let year = if yy >= 70 { yy.checked_add(1900)? } else { yy.checked_add(2000)? };
    to_unix(year, month(&[*m1, *m2, *m3])?, digits(&[*d1, *d2])?, time_of_day(time)?)
}

/// `Sun Nov  6 08:49:37 1994` (a one-digit day is padded with a space).
fn asctime(v: &[u8]) -> Option<u64> {
    if v.len() != 24 {
        return None;
    }
    let [b' '] = v.get(3..4)? else { return None };
    let [b' '] = v.get(7..8)? else { return None };
    let [b' '] = v.get(10..11)? else { return None };
    let [b' '] = v.get(19..20)? else { return None };
    if !DAYS.contains(&v.get(0..3)?) {
        return None;
    }
    let day = match v.get(8..10)? {
        [b' ', d] => digits(&[*d])?,
        d => digits(d)?,
    };
    to_unix(digits(v.get(20..24)?)?, month(v.get(4..7)?)?, day, time_of_day(v.get(11..19)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUNDAY: u64 = 784_111_777;

    #[test]
    fn duplicates_names_round_trip() {
        assert_eq!((Ambiguous::Reject.name(), Ambiguous::Longest.name()), ("reject", "longest"));
        for d in Ambiguous::ALL {
            assert_eq!(Ambiguous::from_name(d.name()), Some(d));
        }
        assert_eq!(Ambiguous::from_name("first"), None);
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse(b"0"), Ok(RetryAfter::Seconds(0)));
        assert_eq!(parse(b" 30 "), Ok(RetryAfter::Seconds(30)));
        assert_eq!(parse(b"99999999999999999999999999"), Ok(RetryAfter::Seconds(u64::MAX)));
        for bad in [&b"-1"[..], b"+5", b"1.5", b"1e3", b"soon", b"12 34", b"\xff"] {
            assert_eq!(parse(bad), Err(RetryAfterError::Malformed), "{bad:?}");
        }
        assert_eq!(parse(b"   "), Err(RetryAfterError::Empty));
    }

    #[test]
    fn lenient_numbers_mean_the_longest_wait_they_can() {
        let secs = |v: &[u8]| {
            parse_lenient(v).map(|r| match r {
                RetryAfter::Seconds(s) => s,
                RetryAfter::Date(_) => panic!("a date"),
            })
        };
        for (v, want) in [
            (&b"1.5"[..], 2),
            (b"1.0", 1),
            (b"1.000001", 2),
            (b"0.0001", 1),
            (b".5", 1),
            (b"5.", 5),
            (b"0.0", 0),
            (b"+5", 5),
            (b"+0", 0),
            (b" +7 ", 7),
            (b"1e3", 1000),
            (b"1E3", 1000),
            (b"1e+3", 1000),
            (b"2.5e1", 25),
            (b"2.55e1", 26),
            (b"1e-3", 1),
            (b"1500e-3", 2),
            (b"1000e-3", 1),
            (b"0e99999999999999999999", 0),
            (b"007.50", 8),
            (b"18446744073709551615", u64::MAX),
            (b"18446744073709551614.5", u64::MAX),
            (b"1e19", 10_000_000_000_000_000_000),
            (b"1e20", u64::MAX),
            (b"1e400", u64::MAX),
            (b"9e99999999999999999999", u64::MAX),
            (b"99999999999999999999999.9", u64::MAX),
            (b"1e-99999999999999999999", 1),
        ] {
            assert_eq!(secs(v), Ok(want), "{:?}", core::str::from_utf8(v));
        }
        for bad in [
            &b"-1"[..],
            b"-0.5",
            b"+",
            b".",
            b"e3",
            b"1e",
            b"1e+",
            b"1.5.2",
            b"1,5",
            b"++5",
            b"5s",
            b"0x10",
            b"inf",
            b"NaN",
            b"1 e3",
            b"soon",
            b"\xff",
        ] {
            assert_eq!(
                parse_lenient(bad),
                Err(RetryAfterError::Malformed),
                "{:?}",
                core::str::from_utf8(bad)
            );
        }
        assert_eq!(parse_lenient(b""), Err(RetryAfterError::Empty));
        // Dates and plain seconds read as `parse` reads them.
        assert_eq!(parse_lenient(b"Sun, 06 Nov 1994 08:49:37 GMT"), Ok(RetryAfter::Date(SUNDAY)));
        assert_eq!(parse_lenient(b"120"), Ok(RetryAfter::Seconds(120)));
    }

    #[test]
    fn lenient_rules_read_loose_numbers_and_count_garbage_strict_rules_refuse_both() {
        let l = Rules::LENIENT;
        assert_eq!(l.read([b"1.5".as_slice()], None, None), Ok(Some(2)));
        assert_eq!(l.read([b"+5".as_slice()], None, None), Ok(Some(5)));
        assert_eq!(l.read([b"1e3".as_slice()], None, None), Ok(Some(1000)));
        // The longest of a loose and a plain value.
        assert_eq!(l.read([b"2".as_slice(), b"2.1"], None, None), Ok(Some(3)));
        let r = l.read_counted([b"soon".as_slice(), b"", b"4"], None, None);
        assert_eq!(r, Reading { seconds: Some(4), unreadable: 2, error: None });
        let r = l.read_counted([b"garbage".as_slice()], None, None);
        assert_eq!(r, Reading { seconds: None, unreadable: 1, error: Some(RetryAfterError::Malformed) });
        assert_eq!(r.result(), Err(RetryAfterError::Malformed));
        // Readable but unusable is not garbage: a date with nothing to measure it against.
        let r = l.read_counted([b"Sun, 06 Nov 1994 08:49:37 GMT".as_slice()], None, None);
        assert_eq!((r.unreadable, r.error), (0, Some(RetryAfterError::NoReference)));
        assert_eq!(l.read_counted(core::iter::empty(), None, None), Reading::default());
        assert!(l.is_lenient() && !Rules::STRICT.is_lenient());
        let s = Rules::STRICT;
        for loose in [&b"1.5"[..], b"+5", b"1e3"] {
            let r = s.read_counted([loose], None, None);
            assert_eq!(r, Reading { seconds: None, unreadable: 1, error: Some(RetryAfterError::Malformed) });
        }
        assert_eq!(s.read_counted([b"3".as_slice()], None, None).seconds, Some(3));
        let r = s.read_counted([b"3".as_slice(), b"3"], None, None);
        assert_eq!((r.seconds, r.error), (None, Some(RetryAfterError::Duplicate)));
    }

    #[test]
    fn three_date_forms_agree() {
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Ok(SUNDAY));
        assert_eq!(parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), Ok(SUNDAY));
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994"), Ok(SUNDAY));
        assert_eq!(parse_http_date(b"Thu, 01 Jan 1970 00:00:00 GMT"), Ok(0));
        assert_eq!(parse_http_date(b"Tue, 29 Feb 2028 23:59:59 GMT"), Ok(1_835_481_599));
        assert_eq!(parse_http_date(b"Wednesday, 01-Jan-25 00:00:00 GMT"), Ok(1_735_689_600));
        assert_eq!(parse_http_date(b"Mon Dec 31 23:59:60 2029"), Ok(1_893_456_000));
    }

    #[test]
    fn malformed_dates_are_refused() {
        for bad in [
            &b"Sun, 06 Nov 1994 08:49:37 UTC"[..],
            b"Sun, 6 Nov 1994 08:49:37 GMT",
            b"Sun, 31 Nov 1994 08:49:37 GMT",
            b"Sun, 29 Feb 2023 08:49:37 GMT",
            b"Sun, 06 Now 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 24:00:00 GMT",
            b"Sun, 06 Nov 1994 08:49 GMT",
            b"Xyz, 06 Nov 1994 08:49:37 GMT",
            b"Sun 06 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994  08:49:37 GMT",
            b"Sunday, 06-Nov-1994 08:49:37 GMT",
            b"Sun Nov 6 08:49:37 1994",
            b"Sun Nov 06 08:49:37 94",
            b"garbage",
        ] {
            assert_eq!(
                parse_http_date(bad),
                Err(RetryAfterError::Malformed),
                "{:?}",
                core::str::from_utf8(bad)
            );
        }
    }

    #[test]
    fn dates_resolve_against_the_date_header_first() {
        let at = RetryAfter::Date(SUNDAY + 30);
        assert_eq!(at.resolve(Some(SUNDAY), Some(0)), Ok(30));
        assert_eq!(at.resolve(None, Some(SUNDAY + 10)), Ok(20));
        assert_eq!(at.resolve(None, Some(SUNDAY + 100)), Ok(0));
        assert_eq!(at.resolve(None, None), Err(RetryAfterError::NoReference));
        assert_eq!(RetryAfter::Seconds(5).resolve(None, None), Ok(5));
    }

    #[test]
    fn rules_for_duplicates_and_dates() {
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT".as_slice();
        let later = b"Sun, 06 Nov 1994 08:50:37 GMT".as_slice();
        let lenient = Rules::LENIENT;
        assert_eq!(lenient.read([b"5".as_slice(), b"9"], None, None), Ok(Some(9)));
        assert_eq!(lenient.read([later], Some(date), None), Ok(Some(60)));
        assert_eq!(lenient.read(core::iter::empty(), Some(date), None), Ok(None));
        assert_eq!(lenient.read([b"x".as_slice()], None, None), Err(RetryAfterError::Malformed));
        // One garbled header does not lower the wait a good one asks for.
        assert_eq!(lenient.read([b"3600".as_slice(), b"junk"], None, None), Ok(Some(3600)));
        assert_eq!(lenient.read([b"junk".as_slice(), b"7"], None, None), Ok(Some(7)));
        assert_eq!(Rules::STRICT.read([b"junk".as_slice()], None, None), Err(RetryAfterError::Malformed));
        // A garbage Date header leaves the caller's clock as the reference.
        assert_eq!(lenient.read([later], Some(b"yesterday"), Some(SUNDAY)), Ok(Some(60)));
        assert_eq!(lenient.read([later], Some(b"yesterday"), None), Err(RetryAfterError::NoReference));
        let strict = Rules::STRICT;
        assert_eq!(strict.read([b"2".as_slice()], None, None), Ok(Some(2)));
        assert_eq!(strict.read([b"2".as_slice(), b"2"], None, None), Err(RetryAfterError::Duplicate));
        assert_eq!(strict.read([later], Some(date), None), Err(RetryAfterError::DateNotAccepted));
    }

    #[test]
    fn every_calendar_rule_of_the_three_date_forms() {
        for (date, unix) in [
            // Leap years: every fourth, not centuries, but every fourth century.
            (&b"Sat, 29 Feb 2000 12:00:00 GMT"[..], 951_825_600),
            (b"Thu, 29 Feb 1996 00:00:00 GMT", 825_552_000),
            (b"Thu, 29 Feb 2024 23:59:59 GMT", 1_709_251_199),
            (b"Wed, 01 Mar 2000 00:00:00 GMT", 951_868_800),
            (b"Sat, 01 Jan 2000 00:00:00 GMT", 946_684_800),
            (b"Thu, 01 Mar 2100 00:00:00 GMT", 4_107_542_400),
            (b"Sun, 28 Feb 2100 00:00:00 GMT", 4_107_456_000),
            (b"Fri, 31 Dec 1999 23:59:59 GMT", 946_684_799),
            // The last day of every month.
            (b"Fri, 31 Jan 2025 00:00:00 GMT", 1_738_281_600),
            (b"Mon, 31 Mar 2025 00:00:00 GMT", 1_743_379_200),
            (b"Wed, 30 Apr 2025 00:00:00 GMT", 1_745_971_200),
            (b"Sat, 31 May 2025 00:00:00 GMT", 1_748_649_600),
            (b"Mon, 30 Jun 2025 00:00:00 GMT", 1_751_241_600),
            (b"Thu, 31 Jul 2025 00:00:00 GMT", 1_753_920_000),
            (b"Sun, 31 Aug 2025 00:00:00 GMT", 1_756_598_400),
            (b"Tue, 30 Sep 2025 00:00:00 GMT", 1_759_190_400),
            (b"Fri, 31 Oct 2025 00:00:00 GMT", 1_761_868_800),
            (b"Sun, 30 Nov 2025 00:00:00 GMT", 1_764_460_800),
            // Around 1970: a date in the past means now.
            (b"Thu, 01 Jan 1970 00:00:01 GMT", 1),
            (b"Wed, 31 Dec 1969 23:59:59 GMT", 0),
            (b"Mon, 28 Feb 1900 00:00:00 GMT", 0),
            (b"Mon, 01 Jan 0001 00:00:00 GMT", 0),
            // The last second of a day, a leap second, a four-digit year's end.
            (b"Sun, 06 Nov 1994 23:59:59 GMT", 784_166_399),
            (b"Sun, 06 Nov 1994 00:00:60 GMT", 784_080_060),
            (b"Sun, 06 Nov 9999 08:49:37 GMT", 253_397_494_177),
            // Two-digit years: 70 and up are the 1900s, below 70 the 2000s.
            (b"Thursday, 01-Jan-70 00:00:00 GMT", 0),
            (b"Friday, 31-Dec-99 23:59:59 GMT", 946_684_799),
            (b"Saturday, 01-Jan-00 00:00:00 GMT", 946_684_800),
            (b"Saturday, 01-Jan-69 00:00:00 GMT", 3_124_224_000),
            // asctime with a two-digit day, a leap day, a padded one-digit day.
            (b"Sun Nov 16 08:49:37 1994", 784_975_777),
            (b"Tue Feb 29 00:00:00 2028", 1_835_395_200),
            (b"Sun Jan  1 00:00:00 2023", 1_672_531_200),
        ] {
            assert_eq!(parse_http_date(date), Ok(unix), "{:?}", core::str::from_utf8(date));
        }
        for bad in [
            &b"Thu, 29 Feb 1900 00:00:00 GMT"[..],
            b"Mon, 29 Feb 2100 00:00:00 GMT",
            b"Thu, 31 Apr 2025 00:00:00 GMT",
            b"Thu, 31 Jun 2025 00:00:00 GMT",
            b"Thu, 31 Sep 2025 00:00:00 GMT",
            b"Thu, 31 Nov 2025 00:00:00 GMT",
            b"Thu, 32 Jan 2025 00:00:00 GMT",
            b"Thu, 00 Jan 2025 00:00:00 GMT",
            b"Thu, 01 Jan 0000 00:00:00 GMT",
            b"Thu, 01 Jan 19940 00:00:00 GMT",
            b"Thu, 01 Jan 94 00:00:00 GMT",
            b"Thu, 01 Jan 2025 00:60:00 GMT",
            b"Thu, 01 Jan 2025 00:00:61 GMT",
            b"Thu, 01 Jan 2025 0:00:00 GMT",
            b"Sun, 06 Nov 1994 08:49:37 GMT extra",
            b"Sun, 06-Nov-94 08:49:37 GMT",
            b"Sunday, 06-Nov-94 08:49:37 UTC",
            b"Sunday, 06 Nov 1994 08:49:37 GMT",
            b"Sun Nov  6 08:49:37 19945",
            b"Xyz Nov  6 08:49:37 1994",
            b"Sun Now  6 08:49:37 1994",
            b"Sun Nov  6 08:49:37 19a4",
            b"Sun,Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_http_date(bad),
                Err(RetryAfterError::Malformed),
                "{:?}",
                core::str::from_utf8(bad)
            );
        }
        assert_eq!(parse_http_date(b""), Err(RetryAfterError::Empty));
    }

    #[test]
    fn the_longest_of_several_values_whatever_their_order() {
        let l = Rules::LENIENT;
        assert_eq!(l.read([b"9".as_slice(), b"5"], None, None), Ok(Some(9)));
        assert_eq!(l.read([b"5".as_slice(), b"9", b"7"], None, None), Ok(Some(9)));
        assert_eq!(l.read([b"4".as_slice(), b"4"], None, None), Ok(Some(4)));
        // A date and seconds compare as waits from now.
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT".as_slice();
        let later = b"Sun, 06 Nov 1994 08:50:37 GMT".as_slice();
        assert_eq!(l.read([later, b"30"], Some(date), None), Ok(Some(60)));
        assert_eq!(l.read([b"90".as_slice(), later], Some(date), None), Ok(Some(90)));
        // Strict rules take one value as it is.
        assert_eq!(Rules::STRICT.read([b"0".as_slice()], None, None), Ok(Some(0)));
        // Strict rules stop at the first value they cannot read, even before a good one.
        assert_eq!(
            Rules::STRICT.read([b"junk".as_slice(), b"5"], None, None),
            Err(RetryAfterError::Malformed)
        );
        // Field digits: one to four ASCII digits, nothing else.
        assert_eq!((digits(b""), digits(b"12345"), digits(b"1a")), (None, None, None));
        assert_eq!((digits(b"0"), digits(b"9999")), (Some(0), Some(9999)));
        // A value past u64 in the loose form rounds up within u64.
        assert_eq!(
            parse_lenient(b"10000000000000000000.5"),
            Ok(RetryAfter::Seconds(10_000_000_000_000_000_001))
        );
        assert_eq!(parse_lenient(b"1.8446744073709551615e19"), Ok(RetryAfter::Seconds(u64::MAX)));
    }
}
