//! Every outcome sequence up to length 6 over a representative alphabet, every operation, a grid
//! of policies and draws of 0, 50 and 99, checked against the core's `plan`.
//!
//! Under the `basic` preset the expected schedule comes from a model of `wary plan`'s formula,
//! written below without calling the core's classification or backoff, in the cases' own unit
//! (one unit is one millisecond to the core, as `wary plan` reads it). Under the `default` and
//! `strict` presets the design's invariants are asserted instead.
//!
//! Sequences are walked as a tree: once a call has ended, the outcomes after it cannot matter, so
//! each ended prefix stands for every sequence that starts with it (checked by appending one more
//! outcome). The count of sequences this covers is printed with `--nocapture`.

use std::time::Instant;

use wary::{Draw, Duration, Failure, GiveUp, Operation, Outcome, Policy, Preset, Verdict, plan::plan};

const MAX_LEN: usize = 6;
/// A Retry-After in the case's Retry-After unit ([`Case::ra_ms`]): fits most budgets in the grid.
const RA_SMALL: u64 = 5;
/// Longer than any budget in the grid, in either Retry-After unit.
const RA_HUGE: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sym {
    Ok,
    /// A response timeout: the request was sent.
    Timeout,
    Status(u16),
    StatusAfter(u16, u64),
    ConnectTimeout,
    Reset,
    BadBody,
}

const ALPHABET: [Sym; 13] = [
    Sym::Ok,
    Sym::Timeout,
    Sym::Status(400),
    Sym::Status(408),
    Sym::Status(429),
    Sym::StatusAfter(429, RA_SMALL),
    Sym::StatusAfter(429, RA_HUGE),
    Sym::Status(500),
    Sym::Status(503),
    Sym::Status(501),
    Sym::ConnectTimeout,
    Sym::Reset,
    Sym::BadBody,
];

const OPS: [Operation; 3] = [Operation::Idempotent, Operation::KeyedWrite, Operation::Write];
const DRAWS: [u8; 3] = [0, 50, 99];

/// The core's outcome of a symbol; a Retry-After of `ra` units lasts `ra · ra_ms` milliseconds.
fn to_outcome(s: Sym, ra_ms: u64) -> Outcome {
    match s {
        Sym::Ok => Outcome::Ok,
        Sym::Timeout => Failure::ResponseTimeout.into(),
        Sym::Status(c) => Outcome::status(c),
        Sym::StatusAfter(c, ra) => Outcome::status_after(c, Duration::from_millis(ra * ra_ms)),
        Sym::ConnectTimeout => Failure::ConnectTimeout.into(),
        Sym::Reset => Failure::Reset.into(),
        Sym::BadBody => Failure::BadBody.into(),
    }
}

/// Milliseconds as a number.
fn ms(d: Duration) -> u64 {
    u64::from(d.as_millis())
}

fn retry_after(s: Sym) -> Option<u64> {
    match s {
        Sym::StatusAfter(_, ra) => Some(ra),
        _ => None,
    }
}

/// The model's own verdicts, with the reason a call gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Ok,
    Failed,
    Unknown,
    GaveUpBudget,
    GaveUpRetryAfter(u64),
    GaveUpExhausted,
}

fn expect_of(v: Verdict) -> Option<Expect> {
    Some(match v {
        Verdict::Ok => Expect::Ok,
        Verdict::Failed => Expect::Failed,
        Verdict::Unknown => Expect::Unknown,
        Verdict::GaveUp(GiveUp::Budget) => Expect::GaveUpBudget,
        Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }) => Expect::GaveUpRetryAfter(ms(asked)),
        Verdict::GaveUp(GiveUp::OutcomesExhausted) => Expect::GaveUpExhausted,
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelClass {
    Ok,
    Retry,
    Unknown,
    Failed,
}

/// The basic table's classification, extended to the outcomes `wary plan` does not name by the default
/// table (a connect timeout was never sent: retry any; a reset may have landed; a bad body fails).
fn model_classify(s: Sym, op: Operation) -> ModelClass {
    let idempotent = matches!(op, Operation::Idempotent | Operation::KeyedWrite);
    let if_idempotent = if idempotent { ModelClass::Retry } else { ModelClass::Unknown };
    match s {
        Sym::Ok => ModelClass::Ok,
        Sym::Status(429) | Sym::StatusAfter(429, _) | Sym::ConnectTimeout => ModelClass::Retry,
        Sym::Timeout | Sym::Reset => if_idempotent,
        Sym::Status(c) | Sym::StatusAfter(c, _) if (500..=599).contains(&c) => if_idempotent,
        _ => ModelClass::Failed,
    }
}

/// The basic formula in the case's integer unit, with the reason for giving up the core adds.
fn model_solve(
    outcomes: &[Sym],
    op: Operation,
    base: u64,
    cap: u64,
    budget: u64,
    draws: &[u8],
) -> (Vec<u64>, Expect) {
    let mut waits = Vec::new();
    let mut spent = 0u64;
    for (i, &o) in outcomes.iter().enumerate() {
        let k = i + 1;
        match model_classify(o, op) {
            ModelClass::Ok => return (waits, Expect::Ok),
            ModelClass::Failed => return (waits, Expect::Failed),
            ModelClass::Unknown => return (waits, Expect::Unknown),
            ModelClass::Retry => {}
        }
        if k == outcomes.len() {
            return (waits, Expect::GaveUpExhausted);
        }
        let c = cap.min(base * 2u64.pow(k as u32 - 1));
        let mut wait = c / 2 + (c - c / 2) * u64::from(draws[k - 1]) / 100;
        if let Some(ra) = retry_after(o) {
            if ra > budget - spent {
                return (waits, Expect::GaveUpRetryAfter(ra));
            }
            wait = wait.max(ra);
        }
        if spent + wait > budget {
            return (waits, Expect::GaveUpBudget);
        }
        waits.push(wait);
        spent += wait;
    }
    (waits, Expect::GaveUpExhausted)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `basic` in case units with this base, cap and budget: compared with the model.
    Basic { base: u64, cap: u64, budget: u64 },
    /// A preset checked by invariants only.
    Invariants(Preset),
}

struct Case {
    name: &'static str,
    kind: Kind,
    policy: Policy,
    /// Milliseconds per unit of the alphabet's Retry-After: 1 where the case counts in its own
    /// unit (as `wary plan`), 1000 where the policy runs in real time and a Retry-After is the
    /// header's seconds.
    ra_ms: u64,
}

fn basic(name: &'static str, base: u64, cap: u64, budget: u64) -> Case {
    let unit = Duration::from_millis;
    let policy = Policy::builder(Preset::Basic).base(unit(base)).cap(unit(cap)).budget(unit(budget)).build();
    Case { name, kind: Kind::Basic { base, cap, budget }, policy: policy.unwrap(), ra_ms: 1 }
}

fn grid() -> Vec<Case> {
    let s = Duration::from_secs;
    let seconds = Policy::builder(Preset::Default).base(s(2)).cap(s(60)).budget(s(12)).build().unwrap();
    vec![
        basic("basic base 2 cap 60 budget 120", 2, 60, 120),
        // The rest have budgets that end calls before six attempts, which keeps the walk short.
        basic("basic tight budget", 2, 60, 12),
        basic("basic low cap", 3, 4, 6),
        basic("basic budget exactly 1+2+4", 2, 60, 7),
        basic("basic wide", 10, 1000, 40),
        Case {
            name: "default ms",
            kind: Kind::Invariants(Preset::Default),
            policy: Policy::builder(Preset::Default).build().unwrap(),
            ra_ms: 1000,
        },
        Case {
            name: "default seconds",
            kind: Kind::Invariants(Preset::Default),
            policy: seconds,
            ra_ms: 1000,
        },
        Case {
            name: "strict",
            kind: Kind::Invariants(Preset::Strict),
            policy: Policy::builder(Preset::Strict).build().unwrap(),
            ra_ms: 1000,
        },
        Case {
            name: "coap",
            kind: Kind::Invariants(Preset::Coap),
            policy: Policy::builder(Preset::Coap).build().unwrap(),
            ra_ms: 1000,
        },
    ]
}

/// Whether `s` is resent at all for `op` under `preset`, as the design states the tables.
fn preset_retries(preset: Preset, s: Sym, op: Operation) -> bool {
    let read = op == Operation::Idempotent;
    let idempotent = op != Operation::Write;
    let code = match s {
        Sym::Status(c) | Sym::StatusAfter(c, _) => Some(c),
        _ => None,
    };
    match preset {
        Preset::Default => match (s, code) {
            (_, Some(408 | 429)) | (Sym::ConnectTimeout, _) => true,
            (_, Some(500 | 502 | 503 | 504)) | (Sym::Timeout | Sym::Reset, _) => idempotent,
            _ => false,
        },
        Preset::Strict => match (s, code) {
            (_, Some(429 | 502 | 503 | 504)) | (Sym::Timeout | Sym::Reset | Sym::ConnectTimeout, _) => read,
            _ => false,
        },
        Preset::Basic => model_classify(s, op) == ModelClass::Retry,
        // CoAP's table: 4.29 (and a connection never made) for any operation; 5.00, 5.02,
        // 5.03, 5.04, no ACK and a reset when idempotent.
        Preset::Coap => match (s, code) {
            (_, Some(429)) | (Sym::ConnectTimeout, _) => true,
            (_, Some(500 | 502 | 503 | 504)) | (Sym::Timeout | Sym::Reset, _) => idempotent,
            _ => false,
        },
    }
}

/// The design's invariants for one planned call; `waits` in milliseconds.
fn check_invariants(
    case: &Case,
    preset: Preset,
    outcomes: &[Sym],
    op: Operation,
    draw: u8,
    waits: &[u64],
    verdict: Verdict,
) {
    let p = &case.policy;
    let ctx = || format!("{} {op:?} draw {draw} {outcomes:?} -> {waits:?} {verdict:?}", case.name);
    let ra_ms = case.ra_ms;
    let (base, cap, budget) = (ms(p.backoff().base), ms(p.backoff().cap), ms(p.budget()));

    // Waits never sum past the budget.
    assert!(waits.iter().sum::<u64>() <= budget, "budget: {}", ctx());
    // No more waits than the policy's bound on retries.
    assert!(waits.len() as u64 <= u64::from(p.max_retries().unwrap()), "max_retries: {}", ctx());

    let mut spent = 0u64;
    for (i, &w) in waits.iter().enumerate() {
        let o = outcomes[i];
        // Every wait follows an outcome the preset resends for this operation; an unkeyed write is
        // never resent after a response timeout, a 5xx or a reset.
        assert!(preset_retries(preset, o, op), "resent a non-retryable outcome: {}", ctx());
        if op == Operation::Write {
            let ambiguous = matches!(o, Sym::Timeout | Sym::Reset)
                || matches!(o, Sym::Status(c) | Sym::StatusAfter(c, _) if c >= 500);
            assert!(!ambiguous, "unkeyed write resent: {}", ctx());
        }
        let c = cap.min(base.saturating_mul(1 << i));
        // CoAP's timeouts lie in [c, c + c/2]; every other jitter's under the ceiling.
        let top = if preset == Preset::Coap { c + c / 2 } else { c };
        match retry_after(o) {
            None => {
                assert!(w <= top, "wait above its ceiling {c}: {}", ctx());
                // Equal jitter keeps a fixed half; strict has no jitter at all, CoAP's starts at
                // the ceiling.
                let floor = if matches!(preset, Preset::Strict | Preset::Coap) { c } else { c / 2 };
                assert!(w >= floor, "wait below {floor}: {}", ctx());
            }
            Some(ra) => {
                let asked = ra * ra_ms;
                assert!(w >= asked, "Retry-After lowered the wait: {}", ctx());
                assert!(w <= top.max(asked + c), "wait above ceiling and Retry-After: {}", ctx());
                assert!(asked <= budget - spent, "waited on a Retry-After past the budget: {}", ctx());
            }
        }
        spent += w;
    }

    // The outcome the call ended on.
    let end = waits.len();
    if end >= outcomes.len() {
        assert_eq!(verdict, Verdict::GaveUp(GiveUp::OutcomesExhausted), "{}", ctx());
        return;
    }
    let last = outcomes[end];
    let retried = preset_retries(preset, last, op);
    match last {
        Sym::Ok => assert_eq!(verdict, Verdict::Ok, "{}", ctx()),
        Sym::Status(c) | Sym::StatusAfter(c, _) if (400..=499).contains(&c) && !retried => {
            assert_eq!(verdict, Verdict::Failed, "non-retryable 4xx: {}", ctx())
        }
        _ if !retried => {
            assert!(matches!(verdict, Verdict::Failed | Verdict::Unknown), "{}", ctx());
            if verdict == Verdict::Unknown {
                assert!(op != Operation::Idempotent, "a read is never unknown: {}", ctx());
            }
        }
        _ if end + 1 == outcomes.len() => {
            assert_eq!(verdict, Verdict::GaveUp(GiveUp::OutcomesExhausted), "{}", ctx())
        }
        _ => {
            let attempts_left = p.max_attempts().is_none_or(|m| end as u64 + 1 < u64::from(m));
            match retry_after(last) {
                // A Retry-After beyond the remaining budget gives up now and says what was asked.
                Some(ra) if ra * ra_ms > budget - spent && attempts_left => assert_eq!(
                    verdict,
                    Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: Duration::from_millis(ra * ra_ms) }),
                    "{}",
                    ctx()
                ),
                _ => assert!(
                    matches!(verdict, Verdict::GaveUp(GiveUp::Budget | GiveUp::Attempts)),
                    "{}",
                    ctx()
                ),
            }
            if !attempts_left {
                assert_eq!(verdict, Verdict::GaveUp(GiveUp::Attempts), "{}", ctx());
            }
        }
    }
}

struct Stats {
    cases: u64,
    sequences: u64,
}

/// Plans `outcomes` and checks it; true if the call is still failing at the end (so a longer
/// sequence can reach another attempt).
fn check(
    case: &Case,
    outcomes: &[Sym],
    core_outcomes: &mut Vec<Outcome>,
    op: Operation,
    draw: u8,
    stats: &mut Stats,
) -> bool {
    let draws = [Draw::percent(draw).unwrap(); MAX_LEN];
    let got = plan::<8>(&case.policy, op, core_outcomes, &draws).unwrap();
    let waits: Vec<u64> = got.waits.iter().map(|w| ms(*w)).collect();
    stats.cases += 1;
    match case.kind {
        Kind::Basic { base, cap, budget } => {
            let want = model_solve(outcomes, op, base, cap, budget, &[draw; MAX_LEN]);
            assert_eq!(
                (waits.as_slice(), expect_of(got.verdict)),
                (want.0.as_slice(), Some(want.1)),
                "{} {op:?} draw {draw} outcomes {outcomes:?}",
                case.name
            );
        }
        Kind::Invariants(preset) => {
            check_invariants(case, preset, outcomes, op, draw, &waits, got.verdict);
        }
    }
    let live =
        got.verdict == Verdict::GaveUp(GiveUp::OutcomesExhausted) && got.waits.len() + 1 == outcomes.len();
    if !live && !outcomes.is_empty() && outcomes.len() < MAX_LEN {
        // An ended call ignores whatever follows (whatever the draws: checked once, to save time).
        if draw == DRAWS[0] {
            core_outcomes.push(Outcome::status(503));
            let again = plan::<8>(&case.policy, op, core_outcomes, &draws).unwrap();
            core_outcomes.pop();
            assert_eq!(again, got, "{} {op:?}: outcomes after the end changed the plan", case.name);
        }
        // Every sequence that starts with this prefix, up to the longest length.
        let free = MAX_LEN - outcomes.len();
        stats.sequences += (1..=free).map(|n| (ALPHABET.len() as u64).pow(n as u32)).sum::<u64>();
    }
    stats.sequences += 1;
    live
}

fn walk(
    case: &Case,
    prefix: &mut Vec<Sym>,
    core: &mut Vec<Outcome>,
    op: Operation,
    draw: u8,
    stats: &mut Stats,
) {
    for s in ALPHABET {
        prefix.push(s);
        core.push(to_outcome(s, case.ra_ms));
        if check(case, prefix, core, op, draw, stats) && prefix.len() < MAX_LEN {
            walk(case, prefix, core, op, draw, stats);
        }
        core.pop();
        prefix.pop();
    }
}

/// Outcomes, operation, (base, cap, budget), draws, expected waits and verdict.
type ConformanceCase = (Vec<Sym>, Operation, (u64, u64, u64), Vec<u8>, Vec<u64>, String);

/// The conformance cases (`tests/data/conformance.jsonl`) as the model's symbols.
fn conformance_cases() -> Vec<ConformanceCase> {
    let sym = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) if s == "ok" => Sym::Ok,
        serde_json::Value::String(s) if s == "timeout" => Sym::Timeout,
        serde_json::Value::Array(p) => {
            Sym::StatusAfter(u16::try_from(p[0].as_u64().unwrap()).unwrap(), p[1].as_u64().unwrap())
        }
        n => Sym::Status(u16::try_from(n.as_u64().unwrap()).unwrap()),
    };
    include_str!("../data/conformance.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let nums =
                |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<_>>();
            let p = &v["policy"];
            (
                v["outcomes"].as_array().unwrap().iter().map(sym).collect(),
                Operation::from_name(v["op"].as_str().unwrap()).unwrap(),
                (p["base"].as_u64().unwrap(), p["cap"].as_u64().unwrap(), p["budget"].as_u64().unwrap()),
                nums("draws").into_iter().map(|d| u8::try_from(d).unwrap()).collect(),
                nums("waits"),
                v["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_model_reproduces_the_conformance_cases() {
    let cases = conformance_cases();
    assert!(cases.len() >= 11);
    for (outcomes, op, (base, cap, budget), draws, waits, verdict) in cases {
        let (got, v) = model_solve(&outcomes, op, base, cap, budget, &draws);
        let name = match v {
            Expect::Ok => "ok",
            Expect::Failed => "failed",
            Expect::Unknown => "unknown",
            _ => "gave_up",
        };
        assert_eq!((&got, name), (&waits, verdict.as_str()), "model: {outcomes:?}");
        // And the core agrees where its running-call builder accepts the policy.
        let Ok(p) = Policy::builder(Preset::Basic)
            .base(Duration::from_millis(base))
            .cap(Duration::from_millis(cap))
            .budget(Duration::from_millis(budget))
            .build()
        else {
            continue;
        };
        let core: Vec<Outcome> = outcomes.iter().map(|s| to_outcome(*s, 1)).collect();
        let planned = wary_tests::plan_percent(&core, op, &p, &draws);
        assert_eq!(
            (wary_tests::units(&planned.waits), planned.verdict.name()),
            (waits, verdict.as_str()),
            "core: {outcomes:?}"
        );
    }
}

#[test]
fn every_sequence_up_to_six_matches_the_model_or_the_invariants() {
    let start = Instant::now();
    let mut stats = Stats { cases: 0, sequences: 0 };
    for case in grid() {
        for op in OPS {
            for draw in DRAWS {
                // The empty sequence: nothing attempted.
                check(&case, &[], &mut Vec::new(), op, draw, &mut stats);
                let mut core = Vec::with_capacity(MAX_LEN + 1);
                walk(&case, &mut Vec::with_capacity(MAX_LEN), &mut core, op, draw, &mut stats);
            }
        }
    }
    println!(
        "exhaustive: {} planned cases covering {} sequences in {:.1?}",
        stats.cases,
        stats.sequences,
        start.elapsed()
    );
    assert!(stats.cases > 100_000, "the walk reached too few cases: {}", stats.cases);
}
