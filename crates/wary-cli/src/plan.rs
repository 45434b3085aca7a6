//! `wary plan`: the core's pure plan as JSON lines, under the `exercise` preset, in the numbers'
//! own unit (the policy's ticks are whatever unit the case's numbers are in).
//!
//! Every policy of non-negative integers gets the answer the backoff formula defines, even one
//! the builder refuses for a running call (a budget of 0, a cap below the base, waits that can
//! be 0): the case's outcomes bound its plan, so nothing can loop. `wary explain` says why a
//! running call refuses such a policy.

use serde::{Deserialize, Serialize};
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
    /// Any JSON number, so the whole range of u64 is read and a negative or fractional value is
    /// refused by name.
    WithRetryAfter((i64, serde_json::Number)),
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
            let ra = ra.as_u64().ok_or_else(|| format!("retry_after {ra} is not a non-negative integer"))?;
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
    let p = Policy::builder(Preset::Exercise)
        .tick_hz(1)
        .base(case.policy.base)
        .cap(case.policy.cap)
        .budget(case.policy.budget)
        .plan::<CAPACITY>(op, &outcomes, &draws)
        .map_err(|e| e.to_string())?;
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
    fn policies_the_builder_refuses_for_a_running_call_are_answered() {
        let line = |policy: &str, outcomes: &str, draws: &str| {
            answer(&format!(r#"{{"outcomes":{outcomes},"op":"read","policy":{policy},"draws":{draws}}}"#))
        };
        // Budget 0: no wait is allowed, so the first retry gives up; a success needs none.
        let zero = r#"{"base":2,"cap":60,"budget":0}"#;
        assert_eq!(line(zero, "[503,\"ok\"]", "[0]").unwrap(), r#"{"waits":[],"verdict":"gave_up"}"#);
        assert_eq!(line(zero, "[\"ok\"]", "[]").unwrap(), r#"{"waits":[],"verdict":"ok"}"#);
        // A base of 1 waits 0 at a draw below 50 and so spends none of a zero budget.
        let one = r#"{"base":1,"cap":1,"budget":0}"#;
        assert_eq!(line(one, "[503,503,\"ok\"]", "[0,49]").unwrap(), r#"{"waits":[0,0],"verdict":"ok"}"#);
        // Cap below base: a constant ceiling, the cap.
        let low = r#"{"base":10,"cap":3,"budget":120}"#;
        assert_eq!(line(low, "[500,500,\"ok\"]", "[0,99]").unwrap(), r#"{"waits":[1,2],"verdict":"ok"}"#);
        // Base 0: every backoff wait is 0; a Retry-After still raises it.
        let none = r#"{"base":0,"cap":0,"budget":5}"#;
        assert_eq!(
            line(none, "[503,[429,5],\"ok\"]", "[99,0]").unwrap(),
            r#"{"waits":[0,5],"verdict":"ok"}"#
        );
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
            (
                &format!(r#"{{"outcomes":[[429,-3]],"op":"read",{p},"draws":[]}}"#),
                "not a non-negative integer",
            ),
            (
                &format!(r#"{{"outcomes":[[429,1.5]],"op":"read",{p},"draws":[]}}"#),
                "not a non-negative integer",
            ),
            (r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":60},"draws":[]}"#, "budget"),
            (
                r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":60,"budget":-1},"draws":[]}"#,
                "invalid case",
            ),
            (
                r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":6.5,"budget":9},"draws":[]}"#,
                "invalid case",
            ),
        ];
        for (line, want) in cases {
            let e = answer(line).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
            let out: serde_json::Value = serde_json::from_str(&error_line(&e)).unwrap();
            assert!(out["error"].is_string());
        }
    }
}
