//! `wary ledger from-defmt`: device ledger lines, as `defmt-print` shows them, into the host's
//! JSON-lines ledger, so a field incident replays on a laptop.
//!
//! A device line is [`wary::ledger::DEVICE_TAG`] followed by the fields of [`wary::ledger::DEVICE_FIELDS`],
//! read by the core's own [`wary::ledger::parse_device_line`]; whatever `defmt-print` puts before the
//! tag (timestamp, level) is skipped, and lines without a ledger tag are ignored. A line of
//! another ledger version is refused as such: its fields mean something else.

use wary::ledger::{LineError, Record, parse_device_line};

/// Converts one line; `Ok(None)` if it is not a device ledger line.
pub fn convert(line: &str) -> Result<Option<Record>, LineError> {
    match parse_device_line(line) {
        Ok(r) => Ok(Some(r)),
        Err(LineError::NotALedgerLine) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use wary::{Draw, Duration, GiveUp, Verdict};

    use super::*;

    #[test]
    fn converts_a_defmt_print_line() {
        let line = "0.512000 INFO  wary-ledger v4 0000000000000007000000010000002a 2 keyed_write status 429 3000 retry unit 2147483648 3050 40 1200 - - -1 305419896 1 - -";
        let r = convert(line).unwrap().unwrap();
        assert_eq!(r.key, wary::Key::from_parts(7, 1, 42));
        assert_eq!(r.attempt, 2);
        assert_eq!(r.outcome.code(), Some(429));
        assert_eq!(r.outcome.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(r.outcome.failure().map(|f| f.unreadable_retry_after()), Some(1));
        assert_eq!(r.draw, Some(Draw::unit(1 << 31)));
        assert_eq!(r.policy, 0x1234_5678);
        assert_eq!(r.verdict, None);
        assert_eq!(r.wait, Duration::from_millis(3050));
        let last = "wary-ledger v4 0000000000000007000000010000002a 3 keyed_write response_timeout 0 -1 retry none 0 0 40 5000 gave_up retry_after_too_long 9000 305419896 0 - -";
        let r = convert(last).unwrap().unwrap();
        assert_eq!(
            r.verdict,
            Some(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: Duration::from_millis(9000) }))
        );
    }

    #[test]
    fn other_lines_are_ignored_and_broken_or_old_ones_reported() {
        assert_eq!(convert("0.1 INFO  uplink: reading 3 queued").unwrap(), None);
        assert_eq!(convert("wary-ledger v4 abc 1 read").unwrap_err(), LineError::Missing("outcome"));
        let bad = "wary-ledger v4 00 x read ok 0 -1 ok none 0 0 0 0 ok - -1 1 0 - -";
        assert_eq!(convert(bad).unwrap_err(), LineError::Bad("attempt"));
        // The first version's line: its numbers were ticks and seconds, so it is refused by its
        // version, not read as if it were this one.
        let v1 = "3.017 INFO  wary-ledger v1 0a386001a4cf94560000000000000000 1 keyed_write response_timeout 0 -1 retry unit 17852510 50 3005 3005 - - -1 3383049023";
        let e = convert(v1).unwrap_err();
        assert_eq!(e, LineError::Version { found: 1, expected: wary::ledger::LEDGER_VERSION });
        assert_eq!(
            e.to_string(),
            "ledger line version 1 (times were ticks and seconds), this wary reads version 4"
        );
        // The second version's line: the same fields, but its key's device part was 32 bits
        // (0a386001), so read as this version it would name another device. Refused, saying why.
        let v2 = "0.029 INFO  wary-ledger v2 0a386001000000010000000000000000 1 keyed_write ok 0 -1 ok none 0 0 10 10 ok - -1 2599086968 0";
        let e = convert(v2).unwrap_err();
        assert_eq!(e, LineError::Version { found: 2, expected: wary::ledger::LEDGER_VERSION });
        assert_eq!(
            e.to_string(),
            "ledger line version 2 (keys held a 32-bit device id), this wary reads version 4"
        );
    }
}
