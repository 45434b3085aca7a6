//! The JSON-lines ledger: one flushed line per attempt, so the retry history outlives the
//! process, and every line carries what a replay needs (the draw, the outcome with its status
//! and Retry-After, the policy's fingerprint). A `policy` line, written before the first
//! attempt under a policy, holds that policy's settings, so a ledger replays on its own.
//!
//! No line holds payload bytes, credentials or raw error text: only classes, numbers and keys.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use wary::ledger::{Record, Sink};
use wary::{Class, Draw, GiveUp, Key, Operation, Outcome, Verdict};

use crate::spec::PolicySpec;

/// One line of a ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    /// A policy's settings, written before its first attempt.
    Policy {
        /// [`wary::Policy::fingerprint`], in hex.
        fingerprint: String,
        /// The settings.
        policy: PolicySpec,
    },
    /// One attempt.
    Attempt(AttemptLine),
}

/// One attempt, as a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptLine {
    /// The call's idempotency key, hex.
    pub key: String,
    /// Attempt number from 1.
    pub attempt: u32,
    /// `read`, `keyed_write`, `write`.
    pub op: String,
    /// The outcome's kind (`status`, `response_timeout`, …).
    pub outcome: String,
    /// The status, for `status` outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The Retry-After the server sent, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// `ok`, `retry`, `unknown`, `failed`, `cancelled`.
    pub class: String,
    /// The draw used for the wait after this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<DrawLine>,
    /// The wait after this attempt, ticks.
    pub wait: u64,
    /// The attempt's own time, ticks.
    pub attempt_ticks: u64,
    /// The call's time so far, ticks.
    pub total_ticks: u64,
    /// The verdict, on a call's last line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Why the call gave up, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The wait a server asked for when the call gave up on it, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// The policy's fingerprint, hex.
    pub policy: String,
}

/// A draw, in the form it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrawLine {
    /// A whole percent, 0..=99.
    Percent(u8),
    /// A fraction of 2³².
    Unit(u32),
}

/// Why a ledger line could not be read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not JSON, or not a ledger line.
    #[error("not a ledger line: {0}")]
    Json(#[from] serde_json::Error),
    /// A field holds a value wary does not know.
    #[error("bad {0} in a ledger line")]
    Field(&'static str),
}

impl From<&Record> for AttemptLine {
    fn from(r: &Record) -> Self {
        let (reason, asked) = match r.verdict {
            Some(Verdict::GaveUp(g)) => (
                Some(g.name().to_owned()),
                match g {
                    GiveUp::RetryAfterTooLong { asked } => Some(asked),
                    _ => None,
                },
            ),
            _ => (None, None),
        };
        AttemptLine {
            key: r.key.to_hex().as_str().to_owned(),
            attempt: r.attempt,
            op: r.op.name().to_owned(),
            outcome: r.outcome.kind_name().to_owned(),
            status: r.outcome.code(),
            retry_after: r.outcome.retry_after(),
            class: r.class.name().to_owned(),
            draw: r.draw.map(|d| match (d.as_percent(), d.as_unit()) {
                (Some(p), _) => DrawLine::Percent(p),
                (None, u) => DrawLine::Unit(u.unwrap_or(0)),
            }),
            wait: r.wait,
            attempt_ticks: r.attempt_ticks,
            total_ticks: r.total_ticks,
            verdict: r.verdict.map(|v| v.name().to_owned()),
            reason,
            asked,
            policy: format!("{:08x}", r.policy),
        }
    }
}

fn class_from_name(s: &str) -> Option<Class> {
    Some(match s {
        "ok" => Class::Ok,
        "retry" => Class::Retry,
        "unknown" => Class::Unknown,
        "failed" => Class::Failed,
        "cancelled" => Class::Cancelled,
        _ => return None,
    })
}

/// Parses a verdict name and give-up reason back.
pub fn verdict_from_names(verdict: &str, reason: Option<&str>, asked: Option<u64>) -> Option<Verdict> {
    Some(match verdict {
        "ok" => Verdict::Ok,
        "failed" => Verdict::Failed,
        "unknown" => Verdict::Unknown,
        "cancelled" => Verdict::Cancelled,
        "gave_up" => Verdict::GaveUp(match reason? {
            "budget" => GiveUp::Budget,
            "deadline" => GiveUp::Deadline,
            "attempts" => GiveUp::Attempts,
            "retry_after_too_long" => GiveUp::RetryAfterTooLong { asked: asked? },
            "throttled" => GiveUp::Throttled,
            "outcomes_exhausted" => GiveUp::OutcomesExhausted,
            _ => return None,
        }),
        _ => return None,
    })
}

impl AttemptLine {
    /// The record this line was written from.
    pub fn to_record(&self) -> Result<Record, LineError> {
        let outcome = match self.outcome.as_str() {
            "status" => Outcome::Status {
                code: self.status.ok_or(LineError::Field("status"))?,
                retry_after: self.retry_after,
            },
            other => Outcome::from_kind_name(other).ok_or(LineError::Field("outcome"))?,
        };
        let verdict = match &self.verdict {
            None => None,
            Some(v) => Some(
                verdict_from_names(v, self.reason.as_deref(), self.asked)
                    .ok_or(LineError::Field("verdict"))?,
            ),
        };
        let draw = match self.draw {
            None => None,
            Some(DrawLine::Percent(p)) => Some(Draw::percent(p).map_err(|_| LineError::Field("draw"))?),
            Some(DrawLine::Unit(u)) => Some(Draw::unit(u)),
        };
        Ok(Record {
            key: Key::from_hex(&self.key).ok_or(LineError::Field("key"))?,
            attempt: self.attempt,
            op: Operation::from_name(&self.op).ok_or(LineError::Field("op"))?,
            outcome,
            class: class_from_name(&self.class).ok_or(LineError::Field("class"))?,
            draw,
            wait: self.wait,
            attempt_ticks: self.attempt_ticks,
            total_ticks: self.total_ticks,
            verdict,
            policy: u32::from_str_radix(&self.policy, 16).map_err(|_| LineError::Field("policy"))?,
        })
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

    /// Writes a policy line once per fingerprint.
    pub fn policy(&mut self, policy: &wary::Policy, spec: &PolicySpec) -> io::Result<()> {
        let fp = policy.fingerprint();
        if self.announced.contains(&fp) {
            return Ok(());
        }
        self.announced.push(fp);
        let line = Line::Policy { fingerprint: format!("{fp:08x}"), policy: spec.clone() };
        self.write_line(&line)
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
        let mut s = serde_json::to_string(line).map_err(io::Error::other)?;
        s.push('\n');
        self.out.write_all(s.as_bytes())?;
        self.out.flush()
    }
}

impl<W: Write> Sink for JsonLedger<W> {
    fn record(&mut self, record: &Record) {
        if self.write_line(&Line::Attempt(AttemptLine::from(record))).is_err() {
            self.errors = self.errors.saturating_add(1);
        }
    }
}

/// Reads a ledger's lines; blank lines are skipped.
pub fn read_lines(text: &str) -> impl Iterator<Item = (usize, Result<Line, LineError>)> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i.saturating_add(1), serde_json::from_str::<Line>(l).map_err(LineError::from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_json_lines() {
        let rec = Record {
            key: Key::from_parts(1, 2, 3),
            attempt: 2,
            op: Operation::KeyedWrite,
            outcome: Outcome::status_after(429, 7),
            class: Class::Retry,
            draw: Some(Draw::unit(12345)),
            wait: 7000,
            attempt_ticks: 12,
            total_ticks: 900,
            verdict: Some(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: 9000 })),
            policy: 0xdead_beef,
        };
        let mut l = JsonLedger::new(Vec::new());
        l.record(&rec);
        let text = String::from_utf8(l.into_inner()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("\"policy\":\"deadbeef\""));
        let (_, line) = read_lines(&text).next().unwrap();
        let Line::Attempt(a) = line.unwrap() else { panic!("not an attempt") };
        assert_eq!(a.to_record().unwrap(), rec);
    }

    #[test]
    fn policy_lines_are_written_once() {
        let spec = PolicySpec::default();
        let p = spec.build().unwrap();
        let mut l = JsonLedger::new(Vec::new());
        l.policy(&p, &spec).unwrap();
        l.policy(&p, &spec).unwrap();
        let text = String::from_utf8(l.into_inner()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with("{\"type\":\"policy\""));
    }
}
