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
//! and the policy then gives up at once, reporting what was asked (see [`crate::GiveUp`]).
//!
//! ```
//! use wary::retry_after::{parse, parse_http_date, RetryAfter};
//! assert_eq!(parse(b"120"), Ok(RetryAfter::Seconds(120)));
//! let date = parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
//! assert_eq!(date, 784111777);
//! assert_eq!(parse(b"Sunday, 06-Nov-94 08:49:37 GMT"), Ok(RetryAfter::Date(784111777)));
//! assert_eq!(parse(b"Sun Nov  6 08:49:37 1994"), Ok(RetryAfter::Date(784111777)));
//! ```

/// A parsed Retry-After value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RetryAfter {
    /// Delay-seconds (saturated at `u64::MAX`).
    Seconds(u64),
    /// An HTTP-date, as Unix seconds (0 for dates before 1970).
    Date(u64),
}

/// Why a Retry-After (or Date) header was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum RetryAfterError {
    /// The value is empty or only whitespace.
    #[error("empty value")]
    Empty,
    /// The value is neither delay-seconds nor an HTTP-date.
    #[error("neither delay-seconds nor an HTTP-date")]
    Malformed,
    /// The value is an HTTP-date and these rules accept integer seconds only (seed 003).
    #[error("HTTP-date not accepted by this policy")]
    DateNotAccepted,
    /// The header appears more than once and these rules refuse to guess which one holds.
    #[error("duplicate Retry-After headers")]
    Duplicate,
    /// An HTTP-date arrived with neither a Date header nor a caller's clock to measure it against.
    #[error("no reference time for an HTTP-date")]
    NoReference,
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

/// How duplicate Retry-After headers are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Duplicates {
    /// Refuse them: ambiguous, so the response is treated as having no Retry-After (seed 003).
    Reject,
    /// Take the longest wait any of them asks for: the server wants at least that.
    Longest,
}

/// Which Retry-After values a policy accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Rules {
    /// Accept the HTTP-date form.
    pub accept_dates: bool,
    /// What to do with more than one header.
    pub duplicates: Duplicates,
}

impl Rules {
    /// Both forms, the longest of duplicates.
    pub const LENIENT: Rules = Rules { accept_dates: true, duplicates: Duplicates::Longest };
    /// Integer seconds only, duplicates refused (seed 003).
    pub const STRICT: Rules = Rules { accept_dates: false, duplicates: Duplicates::Reject };

    /// Reads every `Retry-After` value of one response, with its `Date` value, to whole seconds
    /// from now. `Ok(None)` when there is no Retry-After header at all.
    pub fn read<'a, I>(
        &self,
        values: I,
        date: Option<&[u8]>,
        now: Option<u64>,
    ) -> Result<Option<u64>, RetryAfterError>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let date_header = date.and_then(|d| parse_http_date(d).ok());
        let mut result: Option<u64> = None;
        let mut first_error: Option<RetryAfterError> = None;
        for value in values {
            if result.is_some() && self.duplicates == Duplicates::Reject {
                return Err(RetryAfterError::Duplicate);
            }
            let secs = parse(value).and_then(|parsed| {
                if matches!(parsed, RetryAfter::Date(_)) && !self.accept_dates {
                    return Err(RetryAfterError::DateNotAccepted);
                }
                parsed.resolve(date_header, now)
            });
            match secs {
                Ok(secs) => {
                    result = Some(match result {
                        Some(prev) if prev > secs => prev,
                        _ => secs,
                    });
                }
                // Strict rules refuse what they cannot read.
                Err(e) if self.duplicates == Duplicates::Reject => return Err(e),
                // Lenient rules take the longest value they can read: one garbled header must
                // not lower the wait a good one asks for.
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        match (result, first_error) {
            (Some(secs), _) => Ok(Some(secs)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
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
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
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
}
