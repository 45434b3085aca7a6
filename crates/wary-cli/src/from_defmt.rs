//! `wary ledger from-defmt`: device ledger lines, as `defmt-print` shows them, into the host's
//! JSON-lines ledger, so a field incident replays on a laptop.
//!
//! A device line is `wary-ledger v1` followed by sixteen fields (see
//! `wary::ledger::DEFMT_TAG`); whatever `defmt-print` puts before the tag (timestamp, level)
//! is skipped, and lines without the tag are ignored.

use wary::ledger::DEFMT_TAG;
use wary_host::ledger::{AttemptLine, DrawLine};

fn opt_u64(s: &str) -> Result<Option<u64>, String> {
    let v: i64 = s.parse().map_err(|_| format!("bad number {s:?}"))?;
    Ok(u64::try_from(v).ok())
}

fn opt_name(s: &str) -> Option<String> {
    (s != "-").then(|| s.to_owned())
}

/// Converts one line; `Ok(None)` if it is not a device ledger line.
pub fn convert(line: &str) -> Result<Option<AttemptLine>, String> {
    let Some(at) = line.find(DEFMT_TAG) else { return Ok(None) };
    let rest = line.get(at + DEFMT_TAG.len()..).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let [
        key,
        attempt,
        op,
        outcome,
        status,
        ra,
        class,
        dkind,
        dval,
        wait,
        att,
        total,
        verdict,
        reason,
        asked,
        policy,
    ] = f.as_slice()
    else {
        return Err(format!("expected 16 fields after the tag, found {}", f.len()));
    };
    let num = |s: &str| s.parse::<u64>().map_err(|_| format!("bad number {s:?}"));
    let draw = match *dkind {
        "none" => None,
        "pct" => Some(DrawLine::Percent(dval.parse().map_err(|_| format!("bad draw {dval:?}"))?)),
        "unit" => Some(DrawLine::Unit(dval.parse().map_err(|_| format!("bad draw {dval:?}"))?)),
        other => return Err(format!("bad draw kind {other:?}")),
    };
    let status: u16 = status.parse().map_err(|_| format!("bad status {status:?}"))?;
    let policy: u32 = policy.parse().map_err(|_| format!("bad policy {policy:?}"))?;
    Ok(Some(AttemptLine {
        key: (*key).to_owned(),
        attempt: attempt.parse().map_err(|_| format!("bad attempt {attempt:?}"))?,
        op: (*op).to_owned(),
        outcome: (*outcome).to_owned(),
        status: (status != 0).then_some(status),
        retry_after: opt_u64(ra)?,
        class: (*class).to_owned(),
        draw,
        wait: num(wait)?,
        attempt_ticks: num(att)?,
        total_ticks: num(total)?,
        verdict: opt_name(verdict),
        reason: opt_name(reason),
        asked: opt_u64(asked)?,
        policy: format!("{policy:08x}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_a_defmt_print_line() {
        let line = "0.512000 INFO  wary-ledger v1 0000000700000001000000000000002a 2 keyed_write status 429 3 retry unit 2147483648 3050 40 1200 - - -1 305419896";
        let a = convert(line).unwrap().unwrap();
        assert_eq!(a.attempt, 2);
        assert_eq!(a.status, Some(429));
        assert_eq!(a.retry_after, Some(3));
        assert_eq!(a.draw, Some(DrawLine::Unit(1 << 31)));
        assert_eq!(a.policy, "12345678");
        assert_eq!(a.verdict, None);
        let r = a.to_record().unwrap();
        assert_eq!(r.wait, 3050);
        let last = "wary-ledger v1 0000000700000001000000000000002a 3 keyed_write response_timeout 0 -1 retry none 0 0 40 5000 gave_up retry_after_too_long 9000 305419896";
        let a = convert(last).unwrap().unwrap();
        assert_eq!(
            (a.verdict.as_deref(), a.reason.as_deref(), a.asked),
            (Some("gave_up"), Some("retry_after_too_long"), Some(9000))
        );
        assert!(a.to_record().is_ok());
    }

    #[test]
    fn other_lines_are_ignored_and_broken_ones_reported() {
        assert_eq!(convert("0.1 INFO  uplink: reading 3 queued").unwrap(), None);
        assert!(convert("wary-ledger v1 abc 1 read").unwrap_err().contains("16 fields"));
        let bad = "wary-ledger v1 00 x read ok 0 -1 ok none 0 0 0 0 ok - -1 1";
        assert!(convert(bad).unwrap_err().contains("attempt"));
    }
}
