//! `wary plan`: seed 000's `solve` as JSON lines, under the `exercise` preset, in the numbers'
//! own unit (the policy's ticks are whatever unit the case's numbers are in).

use serde::{Deserialize, Serialize};
use wary::plan::plan;
use wary::{Draw, Operation, Outcome, Policy, Preset};

/// The most outcomes (and so waits) one case may hold: the plan's fixed capacity.
pub const CAPACITY: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    outcomes: Vec<OutcomeIn>,
    op: String,
    policy: PolicyIn,
    #[serde(default)]
    draws: Vec<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OutcomeIn {
    Word(String),
    Status(i64),
    WithRetryAfter((i64, i64)),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyIn {
    base: u64,
    cap: u64,
    budget: u64,
}

#[derive(Serialize)]
struct Answer<'a> {
    waits: &'a [u64],
    verdict: &'a str,
}

fn status(code: i64) -> Result<u16, String> {
    u16::try_from(code)
        .ok()
        .filter(|c| (100..=999).contains(c))
        .ok_or_else(|| format!("status {code} is not a three-digit HTTP status"))
}

fn outcome(o: &OutcomeIn) -> Result<Outcome, String> {
    Ok(match o {
        OutcomeIn::Word(w) if w == "ok" => Outcome::Ok,
        OutcomeIn::Word(w) if w == "timeout" => Outcome::ResponseTimeout,
        OutcomeIn::Word(w) => return Err(format!("unknown outcome {w:?}")),
        OutcomeIn::Status(c) => Outcome::status(status(*c)?),
        OutcomeIn::WithRetryAfter((c, ra)) => {
            let ra = u64::try_from(*ra).map_err(|_| format!("negative retry_after {ra}"))?;
            Outcome::status_after(status(*c)?, ra)
        }
    })
}

/// Answers one input line: the JSON answer, or the message for `{"error": …}`.
pub fn answer(line: &str) -> Result<String, String> {
    let case: Case = serde_json::from_str(line).map_err(|e| format!("invalid case: {e}"))?;
    let op = Operation::from_name(&case.op).ok_or_else(|| format!("unknown op {:?}", case.op))?;
    if case.outcomes.len() > CAPACITY {
        return Err(format!("{} outcomes is more than the capacity of {CAPACITY}", case.outcomes.len()));
    }
    let outcomes = case.outcomes.iter().map(outcome).collect::<Result<Vec<_>, _>>()?;
    let draws = case
        .draws
        .iter()
        .map(|d| {
            u8::try_from(*d)
                .ok()
                .and_then(|p| Draw::percent(p).ok())
                .ok_or_else(|| format!("draw {d} is outside 0..=99"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let policy = Policy::builder(Preset::Exercise)
        .tick_hz(1)
        .base(case.policy.base)
        .cap(case.policy.cap)
        .budget(case.policy.budget)
        .build()
        .map_err(|e| format!("invalid policy: {e}"))?;
    let p = plan::<CAPACITY>(&policy, op, &outcomes, &draws).map_err(|e| e.to_string())?;
    serde_json::to_string(&Answer { waits: &p.waits, verdict: p.verdict.name() }).map_err(|e| e.to_string())
}

/// The `{"error": …}` line for a message.
pub fn error_line(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_example() {
        let line = r#"{"outcomes":[503,503,503,503,503,503,503,503,503,503],"op":"read","policy":{"base":2,"cap":60,"budget":120},"draws":[99,99,99,99,99,99,99,99,99]}"#;
        assert_eq!(answer(line).unwrap(), r#"{"waits":[1,3,7,15,31,59],"verdict":"gave_up"}"#);
    }

    #[test]
    fn invalid_lines_say_what_is_wrong() {
        let p = r#""policy":{"base":2,"cap":60,"budget":120}"#;
        let cases = [
            ("not json", "invalid case"),
            (&format!(r#"{{"outcomes":[500],"op":"delete",{p},"draws":[]}}"#), "unknown op"),
            (&format!(r#"{{"outcomes":[500,"ok"],"op":"read",{p},"draws":[100]}}"#), "outside 0..=99"),
            (&format!(r#"{{"outcomes":[500,"ok"],"op":"read",{p},"draws":[-1]}}"#), "outside 0..=99"),
            (&format!(r#"{{"outcomes":[500,500,"ok"],"op":"read",{p},"draws":[1]}}"#), "too few draws"),
            (
                &format!(r#"{{"outcomes":[{}],"op":"read",{p},"draws":[]}}"#, vec!["500"; 65].join(",")),
                "capacity",
            ),
            (&format!(r#"{{"outcomes":["later"],"op":"read",{p},"draws":[]}}"#), "unknown outcome"),
            (&format!(r#"{{"outcomes":[42],"op":"read",{p},"draws":[]}}"#), "three-digit"),
            (&format!(r#"{{"outcomes":[[429,-3]],"op":"read",{p},"draws":[]}}"#), "negative retry_after"),
            (r#"{"outcomes":[],"op":"read","policy":{"base":0,"cap":60,"budget":120},"draws":[]}"#, "base"),
            (r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":1,"budget":120},"draws":[]}"#, "cap"),
            (r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":60},"draws":[]}"#, "budget"),
        ];
        for (line, want) in cases {
            let e = answer(line).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
            let out: serde_json::Value = serde_json::from_str(&error_line(&e)).unwrap();
            assert!(out["error"].is_string());
        }
    }
}
