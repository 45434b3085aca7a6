//! `wary plan`: the core's pure plan as JSON lines, under the `basic` preset, in the numbers'
//! own unit.
//!
//! Every policy of non-negative integers that fits wary's durations gets the answer the backoff
//! formula defines, even one the builder refuses for a running call (a budget of 0, a cap below
//! the base, waits that can be 0): the case's outcomes bound its plan, so nothing can loop.
//! `wary explain` says why a running call refuses such a policy. A policy number too large for
//! wary's durations is refused by name, never answered wrongly.

use serde::{Deserialize, Serialize};
use wary::{Draw, Duration, Failure, Operation, Outcome, Policy, Preset};

/// The most outcomes (and so waits) one case may hold: the plan's fixed capacity.
pub const CAPACITY: usize = 64;

/// The largest base, cap or budget a case may give: one below [`Duration::MAX`], which stands
/// for "longer than wary counts" and so cannot be a setting.
pub const LARGEST: u64 = Duration::MAX.as_millis() as u64 - 1;

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
    waits: &'a [u32],
    verdict: &'a str,
}

// The contract's numbers are in the case's own unit, and the formula rounds in that unit
// (`c // 2`, `· draw // 100`). The core counts whole milliseconds, so one unit of the case is
// one millisecond here, and every wait is printed back as the bare number: the core's integer
// arithmetic is then the formula's, in whatever unit the case meant.
fn unit(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn setting(name: &str, n: u64) -> Result<Duration, String> {
    if n > LARGEST {
        return Err(format!("policy {name} {n} is larger than wary counts (at most {LARGEST})"));
    }
    Ok(unit(n))
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
        // The contract's timeout came after the request was sent.
        OutcomeIn::Word(w) if w == "timeout" => Failure::ResponseTimeout.into(),
        OutcomeIn::Word(w) => return Err(format!("unknown outcome {w:?}")),
        OutcomeIn::Status(c) => Outcome::status(status(*c)?),
        OutcomeIn::WithRetryAfter((c, ra)) => {
            let ra = ra.as_u64().ok_or_else(|| format!("retry_after {ra} is not a non-negative integer"))?;
            // A Retry-After past what wary counts saturates to `Duration::MAX`: longer than any
            // budget a case can give, so the call gives up on it exactly as the formula does.
            Outcome::status_after(status(*c)?, unit(ra))
        }
    })
}

/// Answers one input line: the JSON answer, or the message for `{"error": …}`.
pub fn answer(line: &str) -> Result<String, String> {
    let case: Case = serde_json::from_str(line).map_err(|e| format!("invalid case: {e}"))?;
    let base = setting("base", case.policy.base)?;
    let cap = setting("cap", case.policy.cap)?;
    let budget = setting("budget", case.policy.budget)?;
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
    let p = Policy::builder(Preset::Basic)
        .base(base)
        .cap(cap)
        .budget(budget)
        .plan::<CAPACITY>(op, &outcomes, &draws)
        .map_err(|e| e.to_string())?;
    let waits: Vec<u32> = p.waits.iter().map(|w| w.as_millis()).collect();
    serde_json::to_string(&Answer { waits: &waits, verdict: p.verdict.name() }).map_err(|e| e.to_string())
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
    fn the_largest_numbers_are_answered_and_larger_ones_refused_by_name() {
        let line = |policy: String, outcomes: &str, draws: &str| {
            answer(&format!(r#"{{"outcomes":{outcomes},"op":"read","policy":{policy},"draws":{draws}}}"#))
        };
        // At the limit the doubling saturates into the cap, exactly.
        let top = format!(r#"{{"base":{LARGEST},"cap":{LARGEST},"budget":{LARGEST}}}"#);
        let half = LARGEST / 2;
        assert_eq!(
            line(top.clone(), "[503,503]", "[0,0]").unwrap(),
            format!(r#"{{"waits":[{half}],"verdict":"gave_up"}}"#)
        );
        // A Retry-After past the limit saturates and gives up, as the formula does.
        let ra = u64::MAX;
        assert_eq!(
            line(top, &format!("[[429,{ra}],\"ok\"]"), "[0]").unwrap(),
            r#"{"waits":[],"verdict":"gave_up"}"#
        );
        let small = r#"{"base":2,"cap":60,"budget":120}"#.to_owned();
        assert_eq!(
            line(small, &format!("[[429,{ra}],\"ok\"]"), "[0]").unwrap(),
            r#"{"waits":[],"verdict":"gave_up"}"#
        );
        for (field, policy) in [
            ("base", format!(r#"{{"base":{},"cap":60,"budget":120}}"#, LARGEST + 1)),
            ("cap", format!(r#"{{"base":2,"cap":{},"budget":120}}"#, u64::MAX)),
            ("budget", format!(r#"{{"base":2,"cap":60,"budget":{}}}"#, 1u64 << 48)),
        ] {
            let e = line(policy, "[\"ok\"]", "[]").unwrap_err();
            assert!(e.contains(&format!("policy {field} ")) && e.contains("at most 4294967294"), "{e}");
        }
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
            (
                r#"{"outcomes":[],"op":"read","policy":{"base":2,"cap":60,"budget":4294967295},"draws":[]}"#,
                "policy budget 4294967295 is larger than wary counts",
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
