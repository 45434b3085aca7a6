//! `wary plan` against a reference model of the formula it answers, on thousands of generated
//! cases: every policy of non-negative integers up to wary's largest duration gets the model's
//! answer (a budget of 0, a cap below the base, waits of 0 and numbers at the limit included),
//! a policy number past that limit gets `{"error": …}` naming the field and the limit, and every
//! other invalid line gets `{"error": …}`.
//!
//! The model is written from the contract alone, in 128-bit arithmetic, sharing no code with
//! the core: if the two disagree, one of them is wrong.

#![allow(missing_docs)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// The largest base, cap or budget wary's durations hold: 2³² − 2 (2³² − 1 milliseconds stands
/// for "longer than wary counts").
const LARGEST: u64 = (1 << 32) - 2;

/// Why the model refuses a line.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Not a case of the contract at all.
    Invalid,
    /// A policy number past [`LARGEST`]: refused by name rather than answered wrongly.
    TooLarge(&'static str),
}

/// The reference: `Ok((waits, verdict))`, or why the line must be refused.
fn model(case: &Value) -> Result<(Vec<u64>, &'static str), Refusal> {
    use Refusal::Invalid;
    let obj = case.as_object().ok_or(Invalid)?;
    let num = |v: &Value| v.as_u64().ok_or(Invalid);
    let policy = obj.get("policy").and_then(Value::as_object).ok_or(Invalid)?;
    let field = |name| num(policy.get(name).ok_or(Invalid)?);
    let (base, cap, budget) = (field("base")?, field("cap")?, field("budget")?);
    for (name, n) in [("base", base), ("cap", cap), ("budget", budget)] {
        if n > LARGEST {
            return Err(Refusal::TooLarge(name));
        }
    }
    let (base, cap, budget) = (u128::from(base), u128::from(cap), u128::from(budget));
    let op = obj.get("op").and_then(Value::as_str).ok_or(Invalid)?;
    if !["read", "keyed_write", "write"].contains(&op) {
        return Err(Invalid);
    }
    let draws: Vec<u128> = match obj.get("draws") {
        None => Vec::new(),
        Some(d) => {
            d.as_array().ok_or(Invalid)?.iter().map(|x| num(x).map(u128::from)).collect::<Result<_, _>>()?
        }
    };
    if draws.iter().any(|d| *d > 99) {
        return Err(Invalid);
    }
    let outcomes = obj.get("outcomes").and_then(Value::as_array).ok_or(Invalid)?;
    if outcomes.len() > 64 {
        return Err(Invalid);
    }
    // Each outcome as (status or None for ok, is a timeout, Retry-After).
    enum O {
        Ok,
        Timeout,
        Status(u64, Option<u128>),
    }
    let mut parsed = Vec::new();
    for o in outcomes {
        parsed.push(match o {
            Value::String(s) if s == "ok" => O::Ok,
            Value::String(s) if s == "timeout" => O::Timeout,
            Value::Number(_) => O::Status(num(o)?, None),
            Value::Array(pair) if pair.len() == 2 => {
                O::Status(num(&pair[0])?, Some(u128::from(num(&pair[1])?)))
            }
            _ => return Err(Invalid),
        });
        if let Some(O::Status(code, _)) = parsed.last()
            && !(100..=999).contains(code)
        {
            return Err(Invalid);
        }
    }
    let idempotent = op != "write";
    let mut waits = Vec::new();
    let mut spent: u128 = 0;
    for (i, o) in parsed.iter().enumerate() {
        let k = i + 1;
        let retry_after = match o {
            O::Ok => return Ok((waits, "ok")),
            O::Status(429, ra) => *ra,
            O::Timeout => None,
            O::Status(500..=599, ra) => *ra,
            O::Status(..) => return Ok((waits, "failed")),
        };
        let safe = matches!(o, O::Status(429, _)) || idempotent;
        if !safe {
            return Ok((waits, "unknown"));
        }
        if k == parsed.len() {
            return Ok((waits, "gave_up"));
        }
        let draw = *draws.get(k - 1).ok_or(Invalid)?;
        // base·2^(k−1), exact while it fits; past 2¹²⁷ it is above any cap a u64 can hold.
        let grown = if k > 127 { u128::MAX } else { base.saturating_mul(1u128 << (k - 1)) };
        let c = cap.min(grown);
        let mut wait = c / 2 + (c - c / 2) * draw / 100;
        if let Some(ra) = retry_after {
            wait = wait.max(ra);
        }
        if spent + wait > budget {
            return Ok((waits, "gave_up"));
        }
        waits.push(u64::try_from(wait).map_err(|_| Invalid)?);
        spent += wait;
    }
    Ok((waits, "gave_up"))
}

/// xorshift64*, seeded: the same cases on every run.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Usual,
    ZeroBudget,
    CapBelowBase,
    ZeroWaits,
    /// Numbers up to the largest wary holds: answered exactly.
    Huge,
    /// One number past it: refused by name.
    TooLarge,
}

fn number(g: &mut Gen, kind: Kind, role: &str) -> u64 {
    match (kind, role) {
        (Kind::Huge, _) => {
            let small = g.below(1000);
            g.pick(&[LARGEST, LARGEST - 1, 1 << 31, (1 << 31) + 1, (1 << 24) + 3, small])
        }
        (Kind::ZeroBudget, "budget") => 0,
        (Kind::ZeroWaits, "base") => g.pick(&[0, 1]),
        (Kind::ZeroWaits, "cap") => g.pick(&[0, 1, 2, 60]),
        _ => {
            let any = g.below(300);
            g.pick(&[1, 2, 3, 5, 10, 60, 100, 120, 1000, any])
        }
    }
}

fn policy(g: &mut Gen, kind: Kind) -> Value {
    let number_kind = if kind == Kind::TooLarge { g.pick(&[Kind::Usual, Kind::Huge]) } else { kind };
    let base = number(g, number_kind, "base");
    let mut cap = number(g, number_kind, "cap");
    if kind == Kind::CapBelowBase {
        cap = g.below(base.max(1));
    }
    let mut p = json!({ "base": base, "cap": cap, "budget": number(g, number_kind, "budget") });
    if kind == Kind::TooLarge {
        let field = g.pick(&["base", "cap", "budget"]);
        p[field] = json!(g.pick(&[LARGEST + 1, LARGEST + 2, 1 << 40, (1 << 48) + 1, 1 << 63, u64::MAX]));
    }
    p
}

fn outcome(g: &mut Gen, huge: bool) -> Value {
    let small = g.below(200);
    let ra = if huge { g.pick(&[u64::MAX, 1 << 62, LARGEST + 1, LARGEST, small]) } else { small % 150 };
    match g.below(14) {
        0 | 1 => json!("ok"),
        2 | 3 => json!("timeout"),
        4 => json!(429),
        5 => json!([429, ra]),
        6 => json!([503, ra]),
        7 => json!(g.pick(&[500, 502, 503, 504, 599])),
        8 | 9 => json!(g.pick(&[500, 503])),
        10 => json!(g.pick(&[400, 401, 404, 409, 422])),
        11 => json!(g.pick(&[200, 204, 301, 100, 600, 999])),
        12 => json!([400, ra]),
        _ => json!(502),
    }
}

/// One generated case line, with its kind; about one line in ten is made invalid on purpose.
fn case(g: &mut Gen) -> (String, Kind, bool) {
    let kind = g.pick(&[
        Kind::Usual,
        Kind::Usual,
        Kind::ZeroBudget,
        Kind::CapBelowBase,
        Kind::ZeroWaits,
        Kind::Huge,
        Kind::TooLarge,
    ]);
    let n = g.below(13) as usize;
    let outcomes: Vec<Value> =
        (0..n).map(|_| outcome(g, matches!(kind, Kind::Huge | Kind::TooLarge))).collect();
    let mut draws: Vec<Value> = (0..n.saturating_sub(1)).map(|_| json!(g.below(100))).collect();
    let op = g.pick(&["read", "keyed_write", "write"]);
    let mut c = json!({ "outcomes": outcomes, "op": op, "policy": policy(g, kind), "draws": draws });
    let broken = g.below(10) == 0;
    if broken {
        match g.below(8) {
            0 => return ("{\"outcomes\": [".to_owned(), kind, true),
            1 => c["op"] = json!("delete"),
            2 => {
                draws.push(json!(100));
                c["draws"] = json!(draws);
            }
            3 => {
                draws.push(json!(-1));
                c["draws"] = json!(draws);
            }
            4 => c["policy"]["budget"] = json!(-5),
            5 => c["policy"]["cap"] = json!(2.5),
            6 => c["outcomes"] = json!(vec![json!(503); 65]),
            // Too few draws: the model decides whether the call reaches a retry without one.
            _ => {
                draws.truncate(g.below(3) as usize);
                c["draws"] = json!(draws);
            }
        }
    }
    (c.to_string(), kind, broken)
}

#[test]
fn wary_plan_answers_every_policy_the_formula_defines() {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let cases: Vec<(String, Kind, bool)> = (0..4000).map(|_| case(&mut g)).collect();
    let input: String = cases.iter().map(|(l, ..)| format!("{l}\n")).collect();

    let mut child = Command::new(env!("CARGO_BIN_EXE_wary"))
        .arg("plan")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let answers: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(answers.len(), cases.len(), "one answer line per case");

    let mut answered = std::collections::HashMap::<String, usize>::new();
    let mut any_error = false;
    let mut zero_waits = 0;
    let mut too_large = 0;
    for ((line, kind, _), got) in cases.iter().zip(&answers) {
        let got: Value = serde_json::from_str(got).unwrap();
        let want = serde_json::from_str::<Value>(line).map_err(|_| Refusal::Invalid).and_then(|v| model(&v));
        match want {
            Ok((waits, verdict)) => {
                assert_eq!(got, json!({ "waits": waits, "verdict": verdict }), "{line}");
                *answered.entry(format!("{kind:?}")).or_default() += 1;
                if waits.contains(&0) {
                    zero_waits += 1;
                }
            }
            Err(Refusal::TooLarge(field)) => {
                any_error = true;
                too_large += 1;
                let e = got["error"].as_str().unwrap_or_else(|| panic!("{line} → {got}"));
                assert!(
                    e.contains(&format!("policy {field} ")) && e.contains(&LARGEST.to_string()),
                    "{line} → {e}"
                );
            }
            Err(Refusal::Invalid) => {
                any_error = true;
                assert!(got["error"].as_str().is_some_and(|e| !e.is_empty()), "{line} → {got}");
            }
        }
    }
    assert_eq!(out.status.code(), Some(if any_error { 1 } else { 0 }));
    // The generator reaches every class the contract names, hundreds of times each.
    for kind in ["Usual", "ZeroBudget", "CapBelowBase", "ZeroWaits", "Huge"] {
        let n = answered.get(kind).copied().unwrap_or(0);
        assert!(n >= 300, "{kind}: only {n} answered cases");
    }
    assert!(too_large >= 300, "only {too_large} policies past the limit");
    assert!(zero_waits >= 100, "only {zero_waits} plans with a wait of 0");
}
