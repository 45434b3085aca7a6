//! Arbitrary bytes into the Retry-After and HTTP-date readers, and dates formatted here parsed
//! back.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use wary::retry_after::{RetryAfter, Rules, parse, parse_http_date};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    value: &'a [u8],
    date: Option<&'a [u8]>,
    more: Vec<&'a [u8]>,
    now: Option<u64>,
    seconds: u64,
    time: u64,
}

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const LONG_DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
/// 9999-12-31T23:59:59Z: the last time a four-digit year can write.
const LAST: u64 = 253_402_300_799;

/// Civil date of a day count from 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as usize, d)
}

struct Parts {
    year: i64,
    month: &'static str,
    day: i64,
    weekday: usize,
    hms: String,
}

fn parts(t: u64) -> Parts {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    let (year, m, day) = civil(days);
    Parts {
        year,
        month: MONTHS[m - 1],
        day,
        weekday: (days % 7) as usize,
        hms: format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60),
    }
}

fn imf(t: u64) -> String {
    let p = parts(t);
    format!("{}, {:02} {} {:04} {} GMT", DAYS[p.weekday], p.day, p.month, p.year, p.hms)
}

fn rfc850(t: u64) -> String {
    let p = parts(t);
    format!("{}, {:02}-{}-{:02} {} GMT", LONG_DAYS[p.weekday], p.day, p.month, p.year % 100, p.hms)
}

fn asctime(t: u64) -> String {
    let p = parts(t);
    format!("{} {} {:>2} {} {:04}", DAYS[p.weekday], p.month, p.day, p.hms, p.year)
}

fuzz_target!(|input: Input<'_>| {
    // Arbitrary bytes: no panic, and a parsed date re-formats to the same time.
    let parsed = parse(input.value);
    if let Ok(t) = parse_http_date(input.value) {
        assert_eq!(parse_http_date(imf(t).as_bytes()), Ok(t), "{:?}", input.value);
        assert_eq!(parsed, Ok(RetryAfter::Date(t)));
    }
    if let Ok(RetryAfter::Seconds(_)) = parsed {
        let digits = input.value.iter().filter(|b| !matches!(b, b' ' | b'\t'));
        assert!(digits.clone().all(u8::is_ascii_digit), "{:?}", input.value);
    }
    let _ = parse_http_date(input.date.unwrap_or_default());

    // Formatted delta-seconds round-trip, with the whitespace a header may carry.
    let n = input.seconds;
    assert_eq!(parse(n.to_string().as_bytes()), Ok(RetryAfter::Seconds(n)));
    assert_eq!(parse(format!(" \t{n} ").as_bytes()), Ok(RetryAfter::Seconds(n)));

    // Each of RFC 9110's three date forms, formatted here, parses back to its time.
    let t = input.time % (LAST + 1);
    assert_eq!(parse_http_date(imf(t).as_bytes()), Ok(t), "{}", imf(t));
    assert_eq!(parse_http_date(asctime(t).as_bytes()), Ok(t), "{}", asctime(t));
    // Two-digit years read as 1970..=2069.
    if t < 3_155_760_000 {
        assert_eq!(parse_http_date(rfc850(t).as_bytes()), Ok(t), "{}", rfc850(t));
    }

    // Rules over several values: no panic; plain seconds give the longest.
    let values: Vec<&[u8]> =
        core::iter::once(input.value).chain(input.more.iter().copied().take(8)).collect();
    for rules in [Rules::LENIENT, Rules::STRICT] {
        let _ = rules.read(values.iter().copied(), input.date, input.now);
    }
    let plain: Option<Vec<u64>> = values
        .iter()
        .map(|v| match parse(v) {
            Ok(RetryAfter::Seconds(s)) => Some(s),
            _ => None,
        })
        .collect();
    if let Some(plain) = plain {
        let got = Rules::LENIENT.read(values.iter().copied(), input.date, input.now);
        assert_eq!(got, Ok(plain.iter().copied().max()));
    }
});
