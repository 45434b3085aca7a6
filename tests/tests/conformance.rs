//! wary's conformance cases, read from `tests/data/conformance.jsonl` (the on-target
//! conformance binary reads the same file): each line is a `wary plan` case with the waits, the
//! verdict and, for a give-up, the reason the core must give. Every case is checked through the
//! core's plan and through `wary plan`'s own line handling. A case's numbers are in its own
//! unit; the core reads one unit as one millisecond, as `wary plan` does.

use serde_json::{Value, json};
use wary::{Class, Draw, Failure, GiveUp, Operation, Outcome, Policy, Preset, Table, Verdict};
use wary_tests::{basic_policy, plan_percent, unit, units};

const CASES: &str = include_str!("../data/conformance.jsonl");

struct Case {
    name: String,
    line: Value,
    op: Operation,
    outcomes: Vec<Outcome>,
    draws: Vec<Draw>,
    policy: (u64, u64, u64),
    waits: Vec<u64>,
    verdict: String,
    reason: Option<String>,
    asked: Option<u64>,
}

fn outcome(v: &Value) -> Outcome {
    match v {
        Value::String(s) if s == "ok" => Outcome::Ok,
        Value::String(s) if s == "timeout" => Failure::ResponseTimeout.into(),
        Value::Number(n) => Outcome::status(u16::try_from(n.as_u64().unwrap()).unwrap()),
        Value::Array(pair) => Outcome::status_after(
            u16::try_from(pair[0].as_u64().unwrap()).unwrap(),
            unit(pair[1].as_u64().unwrap()),
        ),
        other => panic!("not an outcome: {other}"),
    }
}

fn cases() -> Vec<Case> {
    CASES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            let nums = |k: &str| -> Vec<u64> {
                v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
            };
            let p = &v["policy"];
            Case {
                name: v["name"].as_str().unwrap().to_owned(),
                op: Operation::from_name(v["op"].as_str().unwrap()).unwrap(),
                outcomes: v["outcomes"].as_array().unwrap().iter().map(outcome).collect(),
                draws: nums("draws")
                    .iter()
                    .map(|d| Draw::percent(u8::try_from(*d).unwrap()).unwrap())
                    .collect(),
                policy: (
                    p["base"].as_u64().unwrap(),
                    p["cap"].as_u64().unwrap(),
                    p["budget"].as_u64().unwrap(),
                ),
                waits: nums("waits"),
                verdict: v["verdict"].as_str().unwrap().to_owned(),
                reason: v.get("reason").and_then(Value::as_str).map(str::to_owned),
                asked: v.get("asked").and_then(Value::as_u64),
                line: v,
            }
        })
        .collect()
}

#[test]
fn the_data_file_holds_every_case_once() {
    let cases = cases();
    assert!(cases.len() >= 16, "{} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    // Every verdict a plan can give, and every reason the file names, appears.
    for verdict in ["ok", "failed", "unknown", "gave_up"] {
        assert!(cases.iter().any(|c| c.verdict == verdict), "no case ends {verdict}");
    }
}

#[test]
fn the_core_plans_every_case_as_written() {
    for c in cases() {
        let (base, cap, budget) = c.policy;
        let plan = Policy::builder(Preset::Basic)
            .base(unit(base))
            .cap(unit(cap))
            .budget(unit(budget))
            .plan::<64>(c.op, &c.outcomes, &c.draws)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(units(&plan.waits), c.waits, "{}", c.name);
        assert_eq!(plan.verdict.name(), c.verdict, "{}", c.name);
        match (plan.verdict, c.reason.as_deref()) {
            (Verdict::GaveUp(why), Some(reason)) => {
                assert_eq!(why.name(), reason, "{}", c.name);
                if let GiveUp::RetryAfterTooLong { asked } = why {
                    assert_eq!(Some(asked), c.asked.map(unit), "{}: what the server asked", c.name);
                }
            }
            (Verdict::GaveUp(why), None) => {
                panic!("{}: gave up ({}) with no reason in the file", c.name, why.name())
            }
            (_, None) => {}
            (v, Some(r)) => panic!("{}: {} has a reason {r}", c.name, v.name()),
        }
        // Where the running call's builder accepts the policy, the checked path agrees.
        if let Ok(p) =
            Policy::builder(Preset::Basic).base(unit(base)).cap(unit(cap)).budget(unit(budget)).build()
        {
            let percents: Vec<u8> = c
                .draws
                .iter()
                .map(|d| match d {
                    Draw::Percent(p) => *p,
                    Draw::Unit(_) => unreachable!("the cases' draws are percents"),
                })
                .collect();
            let checked = plan_percent(&c.outcomes, c.op, &p, &percents);
            assert_eq!(
                (checked.waits.as_slice(), checked.verdict),
                (plan.waits.as_slice(), plan.verdict),
                "{}",
                c.name
            );
        }
    }
}

#[test]
fn wary_plan_answers_every_case_as_written() {
    for c in cases() {
        let mut input = c.line.clone();
        let obj = input.as_object_mut().unwrap();
        for extra in ["name", "waits", "verdict", "reason", "asked"] {
            obj.remove(extra);
        }
        let answer = wary_cli::plan::answer(&input.to_string()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let got: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(got, json!({ "waits": c.waits, "verdict": c.verdict }), "{}", c.name);
    }
}

const OK: Outcome = Outcome::Ok;

fn s(code: u16) -> Outcome {
    Outcome::status(code)
}

#[test]
fn seven_retries_at_most_with_every_draw_at_zero() {
    assert_eq!(basic_policy().max_retries(), Some(7));
    // 1 + 2 + 4 + 8 + 16 + 30 + 30 = 91; another 30 would pass 120.
    let p = plan_percent(&[s(503); 30], Operation::Idempotent, &basic_policy(), &[0; 29]);
    assert_eq!(units(&p.waits).iter().sum::<u64>(), 91);
    assert_eq!(p.verdict, Verdict::GaveUp(GiveUp::Budget));
    let p = plan_percent(&[s(503), OK], Operation::Idempotent, &basic_policy(), &[0]);
    assert_eq!(p.verdict, Verdict::Ok);
}

#[test]
fn the_default_table_retries_what_may_succeed_and_fails_what_will_not() {
    let t = Table::DEFAULT;
    let class = |o: Outcome, op| t.classify(op, &o);
    for code in [400, 401, 403, 404, 422] {
        for op in [Operation::Idempotent, Operation::KeyedWrite, Operation::Write] {
            assert_eq!(class(s(code), op), Class::Failed, "{code}: the request is wrong; it will stay wrong");
        }
    }
    for code in [408, 429] {
        assert_eq!(class(s(code), Operation::Write), Class::Retry, "{code}: transient or throttled");
    }
    for code in [500, 502, 503, 504] {
        assert_eq!(
            class(s(code), Operation::Idempotent),
            Class::Retry,
            "{code}: server-side, usually temporary"
        );
    }
    for o in [Failure::ResponseTimeout.into(), Failure::Reset.into()] {
        assert_eq!(class(o, Operation::Idempotent), Class::Retry, "yes, if idempotent");
        assert_eq!(class(o, Operation::KeyedWrite), Class::Retry, "yes, if idempotent");
        assert_eq!(class(o, Operation::Write), Class::Unknown, "nobody knows whether it landed");
    }
    assert_eq!(
        class(Failure::BadBody.into(), Operation::Idempotent),
        Class::Failed,
        "a validation bug, not transport"
    );
}
