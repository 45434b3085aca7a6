//! The JSON-lines ledger: one flushed line per attempt, so the retry history outlives the
//! process, and every line carries what a replay needs (the draw, the outcome with its status
//! and Retry-After, the policy's fingerprint). A `policy` line, written before the first
//! attempt under a policy, holds that policy's every setting, so a ledger replays on its own.
//!
//! Both kinds of line are [`Line`], the one definition the writer ([`JsonLedger`]) and the
//! readers ([`Line::parse`], [`read_lines`]) share. An attempt line is the core's
//! [`Record`] in its serde form, a policy line the core's [`Policy`] in its serde form; both
//! carry [`LEDGER_VERSION`] as `"v"`, and a line of another version is refused as such
//! ([`LineError::Version`]):
//!
//! ```text
//! {"type":"policy","v":4,"fingerprint":"5924342a","policy":{"base_ms":100,…,"table":{…}}}
//! {"type":"attempt","v":4,"key":"…","attempt":1,"op":"keyed_write","outcome":"status","status":503,…,"policy":"5924342a"}
//! {"type":"attempt","v":4,…,"policy":"5924342a","admitted":{"at_ms":0,"breaker":"closed","breaker_ms":0,"rate_milli":50,"due":0,"wait_ms":0}}
//! ```
//!
//! No line holds payload bytes, credentials or raw error text: only classes, numbers and keys.

use std::io::{self, Write};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use wary::{
    Policy, Sink,
    ledger::{LEDGER_VERSION, Record},
};

/// One line of a ledger: a policy's settings, or one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// A policy's every setting, written before its first attempt. Its fingerprint is
    /// [`Policy::fingerprint`], which the attempts' [`Record::policy`] name.
    Policy(Policy),
    /// One attempt.
    Attempt(Record),
}

/// Why a ledger line could not be read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not JSON, not a ledger line, or a field holds a value wary does not accept (an unknown
    /// name, a policy the builder refuses). The message names the field, never the line.
    #[error("not a ledger line: {0}")]
    Json(#[from] serde_json::Error),
    /// The line was written in another version of the ledger format: read it with the wary
    /// that wrote it. `found` is `None` for a line without a `"v"` (written before versions
    /// were carried on JSON lines).
    #[error(
        "ledger line version {}, this wary reads version {expected}",
        found.map_or_else(
            || format!("1 (no \"v\"; {})", wary::ledger::LineError::version_note(1)),
            |v| format!("{v} ({})", wary::ledger::LineError::version_note(v))
        )
    )]
    Version {
        /// The version the line carries, if any.
        found: Option<u32>,
        /// The version this build reads and writes ([`LEDGER_VERSION`]).
        expected: u32,
    },
    /// A policy line whose fingerprint is not that of the policy it holds.
    #[error("policy line fingerprint {line:08x}, but its policy's is {policy:08x}")]
    Fingerprint {
        /// The fingerprint the line carries.
        line: u32,
        /// The fingerprint of the policy it holds.
        policy: u32,
    },
}

/// The fingerprint's hex form on a line, as the core writes it in records.
mod hex32 {
    pub(super) fn serialize<S: serde::Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:08x}"))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        u32::from_str_radix(&s, 16).map_err(|_| serde::de::Error::custom("a fingerprint is 8 hex digits"))
    }
}

/// A line as JSON: tagged by `"type"`. The attempt's `"v"` is the record's own.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum LineForm {
    Policy {
        v: u32,
        #[serde(with = "hex32")]
        fingerprint: u32,
        policy: Policy,
    },
    Attempt(Record),
}

/// What is read of a line before the rest: its version.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    v: Option<u32>,
}

impl Line {
    /// Reads one line. The version is checked first, so a line of another format version is
    /// [`LineError::Version`] whatever else it holds; a policy line's fingerprint must be its
    /// policy's.
    pub fn parse(text: &str) -> Result<Line, LineError> {
        let head: Head = serde_json::from_str(text)?;
        if head.v != Some(LEDGER_VERSION) {
            return Err(LineError::Version { found: head.v, expected: LEDGER_VERSION });
        }
        match serde_json::from_str::<LineForm>(text)? {
            LineForm::Attempt(r) => Ok(Line::Attempt(r)),
            LineForm::Policy { fingerprint, policy, .. } => {
                let own = policy.fingerprint();
                if fingerprint != own {
                    return Err(LineError::Fingerprint { line: fingerprint, policy: own });
                }
                Ok(Line::Policy(policy))
            }
        }
    }

    /// The line as JSON, without the newline.
    pub fn to_json(&self) -> String {
        let form = match *self {
            Line::Policy(policy) => {
                LineForm::Policy { v: LEDGER_VERSION, fingerprint: policy.fingerprint(), policy }
            }
            Line::Attempt(record) => LineForm::Attempt(record),
        };
        // Names, numbers and strings only, in maps with string keys: serialising cannot fail.
        serde_json::to_string(&form).unwrap_or_default()
    }

    /// Writes the line and its newline.
    pub fn write_to<W: Write + ?Sized>(&self, out: &mut W) -> io::Result<()> {
        let mut s = self.to_json();
        s.push('\n');
        out.write_all(s.as_bytes())
    }
}

impl FromStr for Line {
    type Err = LineError;
    fn from_str(s: &str) -> Result<Line, LineError> {
        Line::parse(s)
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// A ledger that writes JSON lines to `W`, flushing each. Announce each policy with
/// [`JsonLedger::policy`] before its first attempt.
#[derive(Debug)]
pub struct JsonLedger<W: Write> {
    out: W,
    errors: u64,
    announced: Vec<u32>,
}

impl<W: Write> JsonLedger<W> {
    /// A ledger writing to `out`.
    pub fn new(out: W) -> Self {
        JsonLedger { out, errors: 0, announced: Vec::new() }
    }

    /// Writes a policy line once per fingerprint: the policy's every setting, status rules
    /// included, so a reader rebuilds it exactly from the line alone.
    pub fn policy(&mut self, policy: &Policy) -> io::Result<()> {
        let fp = policy.fingerprint();
        if self.announced.contains(&fp) {
            return Ok(());
        }
        self.announced.push(fp);
        self.write_line(&Line::Policy(*policy))
    }

    /// Lines that could not be written (a ledger write never stops a call; this counts them).
    pub fn write_errors(&self) -> u64 {
        self.errors
    }

    /// The writer, to read what was written so far.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out
    }

    fn write_line(&mut self, line: &Line) -> io::Result<()> {
        line.write_to(&mut self.out)?;
        self.out.flush()
    }
}

impl<W: Write> Sink for JsonLedger<W> {
    fn record(&mut self, record: &Record) {
        if self.write_line(&Line::Attempt(*record)).is_err() {
            self.errors = self.errors.saturating_add(1);
        }
    }
}

/// Reads a ledger's lines with [`Line::parse`], numbered from 1; blank lines are skipped.
pub fn read_lines(text: &str) -> impl Iterator<Item = (usize, Result<Line, LineError>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i.saturating_add(1), Line::parse(l)))
}

#[cfg(test)]
mod tests {
    use wary::{
        CallState, Class, Decision, Draw, Duration, GiveUp, Key, Operation, Outcome, Preset, Rule, Table,
        Verdict,
    };

    use super::*;

    /// A call's last record: gave up on a Retry-After too long, with its draw and times.
    fn record() -> Record {
        let policy = Policy::builder(Preset::Default).build().unwrap();
        let asked = Duration::from_millis(9000);
        Record::decided(
            &policy,
            Key::from_parts(1, 2, 3),
            2,
            Operation::KeyedWrite,
            Outcome::status_after(429, Duration::from_secs(7)),
            Draw::unit(12345),
            Decision::Done(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked })),
            Duration::from_millis(12),
            Duration::from_millis(900),
        )
    }

    #[test]
    fn records_round_trip_through_json_lines() {
        let rec = record();
        assert_eq!((rec.class, rec.draw), (Class::Retry, Some(Draw::unit(12345))));
        let mut l = JsonLedger::new(Vec::new());
        l.record(&rec);
        let text = String::from_utf8(l.into_inner()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains(&format!("\"policy\":\"{:08x}\"", rec.policy)));
        assert!(text.starts_with(&format!("{{\"type\":\"attempt\",\"v\":{LEDGER_VERSION},")), "{text}");
        let (n, line) = read_lines(&text).next().unwrap();
        assert_eq!(n, 1);
        assert_eq!(line.unwrap(), Line::Attempt(rec));
    }

    #[test]
    fn records_built_by_the_core_round_trip() {
        let policy = Policy::builder(Preset::Default).build().unwrap();
        let mut state = CallState::new();
        let outcome = Outcome::status(503);
        let draw = Draw::unit(7);
        let d =
            policy.decide(&mut state, Operation::Idempotent, &outcome, draw, Some(Duration::from_millis(5)));
        assert!(matches!(d, Decision::Retry { .. }));
        let rec = Record::decided(
            &policy,
            Key::from_parts(9, 9, 9),
            1,
            Operation::Idempotent,
            outcome,
            draw,
            d,
            Duration::from_millis(5),
            Duration::from_millis(5),
        );
        assert_eq!(Line::parse(&Line::Attempt(rec).to_json()).unwrap(), Line::Attempt(rec));
    }

    #[test]
    fn policy_lines_are_written_once_and_rebuild_the_policy_exactly() {
        let table =
            Table::DEFAULT.with_status(409, Rule::RetryAny).unwrap().with_status(503, Rule::Fail).unwrap();
        let p =
            Policy::builder(Preset::Strict).table(table).deadline(Duration::from_secs(3)).build().unwrap();
        let mut l = JsonLedger::new(Vec::new());
        l.policy(&p).unwrap();
        l.policy(&p).unwrap();
        let text = String::from_utf8(l.into_inner()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with("{\"type\":\"policy\""));
        assert!(text.contains(&format!("\"fingerprint\":\"{:08x}\"", p.fingerprint())));
        let Line::Policy(back) = Line::parse(text.trim_end()).unwrap() else { panic!("not a policy line") };
        assert_eq!(back, p);
        assert_eq!(back.table().status_rule(409), Rule::RetryAny);
        assert_eq!(back.table().status_rule(503), Rule::Fail);
    }

    #[test]
    fn other_versions_and_bad_lines_are_refused_clearly() {
        let good = Line::Attempt(record()).to_json();
        let old = good.replace(&format!("\"v\":{LEDGER_VERSION}"), "\"v\":1");
        let e = Line::parse(&old).unwrap_err();
        assert!(matches!(e, LineError::Version { found: Some(1), expected: LEDGER_VERSION }), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "ledger line version 1 (times were ticks and seconds), this wary reads version {LEDGER_VERSION}"
            )
        );
        // Version 2: the same fields, but keys of another layout.
        let v2 = good.replace(&format!("\"v\":{LEDGER_VERSION}"), "\"v\":2");
        assert_eq!(
            Line::parse(&v2).unwrap_err().to_string(),
            "ledger line version 2 (keys held a 32-bit device id), this wary reads version 4"
        );
        // Version 3: the same fields, but nothing of what the pace and the breaker said.
        let v3 = good.replace(&format!("\"v\":{LEDGER_VERSION}"), "\"v\":3");
        assert_eq!(
            Line::parse(&v3).unwrap_err().to_string(),
            "ledger line version 3 (no record of the pace and the breaker), this wary reads version 4"
        );
        // A line from before versions were carried.
        let none = good.replace(&format!("\"v\":{LEDGER_VERSION},"), "");
        assert!(matches!(Line::parse(&none), Err(LineError::Version { found: None, .. })));
        // A policy line of another version too.
        let p = Line::Policy(Policy::builder(Preset::Default).build().unwrap()).to_json();
        let p1 = p.replace(&format!("\"v\":{LEDGER_VERSION}"), "\"v\":3");
        assert!(matches!(Line::parse(&p1), Err(LineError::Version { found: Some(3), .. })));
        // A policy line whose fingerprint is not its policy's.
        let fp = Policy::builder(Preset::Default).build().unwrap().fingerprint();
        let forged = p.replace(&format!("{fp:08x}"), "00000000");
        assert!(matches!(Line::parse(&forged), Err(LineError::Fingerprint { line: 0, .. })));
        // Not JSON; an unknown type; a field wary does not know.
        assert!(matches!(Line::parse("hello"), Err(LineError::Json(_))));
        let other = good.replace("\"type\":\"attempt\"", "\"type\":\"note\"");
        assert!(matches!(Line::parse(&other), Err(LineError::Json(_))));
        let bad_op = good.replace("keyed_write", "peek");
        assert!(matches!(Line::parse(&bad_op), Err(LineError::Json(_))));
        // A policy the builder refuses is not read back.
        let zero = p.replace("\"base_ms\":100", "\"base_ms\":0");
        assert!(matches!(Line::parse(&zero), Err(LineError::Json(_))), "{zero}");
        // Blank lines are skipped, the rest numbered as in the file.
        let text = format!("\n{good}\n\nhello\n");
        let got: Vec<_> = read_lines(&text).map(|(n, l)| (n, l.is_ok())).collect();
        assert_eq!(got, [(2, true), (4, false)]);
    }
}
