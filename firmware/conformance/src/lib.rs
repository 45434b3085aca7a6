//! wary's on-target conformance check, shared by every core it runs on (the Cortex-M4 under
//! `boards/mps2-an386/app`, the Cortex-M0 and Cortex-M33 under `firmware/conformance-cores`):
//! every line of the repository's conformance data file (`tests/data/conformance.jsonl`, the
//! same file the host tests read), parsed here without allocation and planned by the core; then
//! properties over generated cases, the policy fingerprint, and a fleet-budget sequence with
//! known results (on thumbv6m the fleet budget's atomic runs on a critical section).
//!
//! No board code: a binary calls [`run`] with its own `check(name, ok)` and turns the tally into
//! an exit code. Failures are logged with defmt where they happen, with what was expected.

#![no_std]
#![deny(missing_docs)]

use heapless::Vec;
use wary::{
    Attempts, Breaker, BreakerSettings, CallState, Class, Decision, Draw, Duration, Failure, FleetBudget,
    Gate, GiveUp, Instant, Operation, Outcome, Pace, PaceSettings, Policy, Preset, StaticPolicy, Verdict,
    plan::{Plan, plan_static},
};

/// Runs every check: the conformance cases, the generated properties with the fingerprint, the
/// fleet budget, and the send rate with the circuit breaker. `check` is called once per check
/// with its name and result.
pub fn run(check: &mut impl FnMut(&str, bool)) {
    conformance_cases(check);
    properties(check);
    fleet(check);
    pacing(check);
}

/// One unit of the cases (written in whole seconds) as one millisecond of the core. The
/// backoff's integer rounding (half a ceiling, a percent of it) happens in the core's unit, so
/// with one case unit per millisecond every wait, budget and Retry-After comes out exactly as
/// the cases state it.
const fn unit(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The basic preset with the cases' usual settings: base 2, cap 60, budget 120 (in case units).
struct BasicPolicy;

impl StaticPolicy for BasicPolicy {
    const POLICY: Policy =
        match Policy::builder(Preset::Basic).base(unit(2)).cap(unit(60)).budget(unit(120)).build() {
            Ok(p) => p,
            Err(_) => panic!("the basic policy is refused"),
        };
}

/// [`BasicPolicy`]'s fingerprint, as the host computes it (`Policy::fingerprint` of the same
/// settings): a device's ledger replays on a laptop only if the two agree.
const FINGERPRINT: u32 = 0xe6a2_674b;

/// Holds every retry the policy can make (checked at compile time by `plan_static`).
const CAPACITY: usize = BasicPolicy::MAX_RETRIES;
/// More than any case needs.
const MAX_OUTCOMES: usize = 16;

/// The conformance cases, one JSON object per line.
const CASES: &str = include_str!("../../../tests/data/conformance.jsonl");

const OK: Outcome = Outcome::Ok;
const TIMEOUT: Outcome = Outcome::Failure(Failure::ResponseTimeout);
const fn s(code: u16) -> Outcome {
    Outcome::status(code)
}

/// One line of the data file.
struct Case<'a> {
    name: &'a str,
    op: Option<Operation>,
    outcomes: Vec<Outcome, MAX_OUTCOMES>,
    draws: Vec<Draw, MAX_OUTCOMES>,
    /// Base, cap and budget.
    policy: (Duration, Duration, Duration),
    waits: Vec<Duration, MAX_OUTCOMES>,
    verdict: &'a str,
    reason: Option<&'a str>,
    asked: Option<Duration>,
}

/// A cursor over one line of the data file's JSON: objects, arrays, strings without escapes,
/// unsigned integers. Enough for our own data, with no allocation; anything else is refused.
struct Json<'a> {
    rest: &'a str,
}

impl<'a> Json<'a> {
    fn ws(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        match self.rest.strip_prefix(c) {
            Some(after) => {
                self.rest = after;
                true
            }
            None => false,
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.ws();
        self.rest.chars().next()
    }

    fn string(&mut self) -> Option<&'a str> {
        if !self.eat('"') {
            return None;
        }
        let end = self.rest.find('"')?;
        let (text, after) = self.rest.split_at(end);
        if text.contains('\\') {
            return None;
        }
        self.rest = after.get(1..)?;
        Some(text)
    }

    fn number(&mut self) -> Option<u64> {
        self.ws();
        let end = self.rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(self.rest.len());
        let (digits, after) = self.rest.split_at(end);
        self.rest = after;
        digits.parse().ok()
    }

    /// `[` items `]`, calling `item` for each.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if !self.eat('[') {
            return None;
        }
        if self.eat(']') {
            return Some(());
        }
        loop {
            item(self)?;
            if self.eat(']') {
                return Some(());
            }
            if !self.eat(',') {
                return None;
            }
        }
    }

    /// `{` `"key": value` … `}`, calling `field` with each key.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        if !self.eat('{') {
            return None;
        }
        loop {
            let key = self.string()?;
            if !self.eat(':') {
                return None;
            }
            field(self, key)?;
            if self.eat('}') {
                return Some(());
            }
            if !self.eat(',') {
                return None;
            }
        }
    }
}

fn parse_outcome(j: &mut Json<'_>) -> Option<Outcome> {
    match j.peek()? {
        // The core's names: "ok", or a failure's ("timeout" is a response timeout).
        '"' => match j.string()? {
            "ok" => Some(OK),
            name => Failure::from_name(name).map(Outcome::from),
        },
        '[' => {
            let mut pair: Vec<u64, 2> = Vec::new();
            j.array(|j| pair.push(j.number()?).ok())?;
            match pair.as_slice() {
                [code, ra] => Some(Outcome::status_after(u16::try_from(*code).ok()?, unit(*ra))),
                _ => None,
            }
        }
        _ => Some(s(u16::try_from(j.number()?).ok()?)),
    }
}

fn parse(line: &str) -> Option<Case<'_>> {
    let mut c = Case {
        name: "",
        op: None,
        outcomes: Vec::new(),
        draws: Vec::new(),
        policy: (Duration::ZERO, Duration::ZERO, Duration::ZERO),
        waits: Vec::new(),
        verdict: "",
        reason: None,
        asked: None,
    };
    let mut j = Json { rest: line };
    j.object(|j, key| {
        match key {
            "name" => c.name = j.string()?,
            "op" => c.op = Some(Operation::from_name(j.string()?)?),
            "outcomes" => j.array(|j| c.outcomes.push(parse_outcome(j)?).ok())?,
            "draws" => j.array(|j| {
                let d = Draw::percent(u8::try_from(j.number()?).ok()?).ok()?;
                c.draws.push(d).ok()
            })?,
            "waits" => j.array(|j| c.waits.push(unit(j.number()?)).ok())?,
            "policy" => j.object(|j, k| {
                let n = unit(j.number()?);
                match k {
                    "base" => c.policy.0 = n,
                    "cap" => c.policy.1 = n,
                    "budget" => c.policy.2 = n,
                    _ => return None,
                }
                Some(())
            })?,
            "verdict" => c.verdict = j.string()?,
            "reason" => c.reason = Some(j.string()?),
            "asked" => c.asked = Some(unit(j.number()?)),
            _ => return None,
        }
        Some(())
    })?;
    j.ws();
    j.rest.is_empty().then_some(c)
}

fn run_plan(op: Operation, outcomes: &[Outcome], percents: &[u8]) -> Option<Plan<CAPACITY>> {
    let mut draws = [Draw::ZERO; MAX_OUTCOMES];
    for (slot, &p) in draws.iter_mut().zip(percents) {
        *slot = Draw::percent(p).ok()?;
    }
    let draws = draws.get(..percents.len())?;
    match plan_static::<BasicPolicy, CAPACITY>(op, outcomes, draws) {
        Ok(plan) => Some(plan),
        Err(e) => {
            defmt::error!("plan refused its inputs: {}", e);
            None
        }
    }
}

/// Checks one parsed case against the core's plan.
fn holds(c: &Case<'_>) -> bool {
    let Some(op) = c.op else { return false };
    let (base, cap, budget) = c.policy;
    let b = Policy::builder(Preset::Basic).base(base).cap(cap).budget(budget);
    let plan = match b.plan::<MAX_OUTCOMES>(op, &c.outcomes, &c.draws) {
        Ok(p) => p,
        Err(e) => {
            defmt::error!("{=str}: plan refused its inputs: {}", c.name, e);
            return false;
        }
    };
    let reason_ok = match (plan.verdict, c.reason) {
        (Verdict::GaveUp(why), Some(r)) => {
            why.name() == r
                && match why {
                    GiveUp::RetryAfterTooLong { asked } => c.asked == Some(asked),
                    _ => true,
                }
        }
        (Verdict::GaveUp(_), None) => false,
        (_, reason) => reason.is_none(),
    };
    let ok = plan.waits.as_slice() == c.waits.as_slice() && plan.verdict.name() == c.verdict && reason_ok;
    if !ok {
        defmt::error!(
            "{=str}: expected {} {=str}, got {} {}",
            c.name,
            c.waits.as_slice(),
            c.verdict,
            plan.waits.as_slice(),
            plan.verdict
        );
    }
    // Under the basic policy itself, the compile-time-checked plan agrees too.
    if b.build().ok() == Some(BasicPolicy::POLICY) {
        let mut percents: Vec<u8, MAX_OUTCOMES> = Vec::new();
        for d in &c.draws {
            // The cases draw in whole percents.
            let Draw::Percent(p) = *d else { return false };
            if percents.push(p).is_err() {
                return false;
            }
        }
        match run_plan(op, &c.outcomes, &percents) {
            Some(p) if p.waits.as_slice() == plan.waits.as_slice() && p.verdict == plan.verdict => {}
            _ => {
                defmt::error!("{=str}: the static plan disagrees", c.name);
                return false;
            }
        }
    }
    ok
}

/// Every line of the data file, planned by the core and checked against its expected waits and
/// verdict; then one check that every line parsed.
pub fn conformance_cases(check: &mut impl FnMut(&str, bool)) {
    let (mut lines, mut parsed) = (0u32, 0u32);
    for line in CASES.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        match parse(line) {
            Some(case) => {
                parsed += 1;
                let ok = holds(&case);
                check(case.name, ok);
            }
            None => defmt::error!("unreadable conformance line {=u32}", lines),
        }
    }
    check("every conformance line parses", lines > 0 && parsed == lines);
}

/// xorshift32: a fixed sequence, so a failing generated case is the same on every run.
struct Gen(u32);

impl Gen {
    fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u32) -> u32 {
        self.next() % n
    }
}

/// Every kind of outcome `wary plan` speaks of, weighted towards failures that retry.
fn outcome(g: &mut Gen) -> Outcome {
    match g.below(12) {
        0 => OK,
        1 | 2 => TIMEOUT,
        3 => s(429),
        4 => Outcome::status_after(429, unit(u64::from(g.below(150)))),
        5 => s(500),
        6 => s(502),
        7 => s(503),
        8 => s(504),
        9 => s(599),
        10 => s(400),
        _ => s(401),
    }
}

fn is_5xx_or_timeout(o: &Outcome) -> bool {
    *o == TIMEOUT || matches!(o.code(), Some(500..=599))
}

const GENERATED: u32 = 2_000;

/// Properties every plan must have, over generated cases.
pub fn properties(check: &mut impl FnMut(&str, bool)) {
    let budget = BasicPolicy::POLICY.budget();
    let mut g = Gen(0x5eed_0000);
    let (mut within_budget, mut write_safe, mut four_xx_final, mut planned) = (true, true, true, true);
    // Coverage: the generator must reach the cases the properties are about.
    let (mut unknown_writes, mut budget_stops) = (0u32, 0u32);
    for i in 0..GENERATED {
        let len = 1 + g.below(MAX_OUTCOMES as u32) as usize;
        let mut outcomes = [OK; MAX_OUTCOMES];
        let mut percents = [0u8; MAX_OUTCOMES];
        for (o, p) in outcomes.iter_mut().zip(percents.iter_mut()).take(len) {
            *o = outcome(&mut g);
            *p = g.below(100) as u8;
        }
        let op = [Operation::Idempotent, Operation::KeyedWrite, Operation::Write][g.below(3) as usize];
        let (outcomes, percents) = (&outcomes[..len], &percents[..len - 1]);
        let Some(plan) = run_plan(op, outcomes, percents) else {
            defmt::error!("case {=u32}: no plan", i);
            planned = false;
            continue;
        };
        match plan.verdict {
            Verdict::Unknown => unknown_writes += 1,
            Verdict::GaveUp(GiveUp::Budget | GiveUp::RetryAfterTooLong { .. }) => budget_stops += 1,
            _ => {}
        }
        let retries = plan.waits.len();
        // Attempt k + 1 follows waits[k], so outcomes[..retries] are the ones that were retried.
        let retried = outcomes.get(..retries).unwrap_or(outcomes);
        let last = outcomes.get(retries);

        let waited = plan.waits.iter().fold(Duration::ZERO, |sum, w| sum + *w);
        if waited > budget {
            defmt::error!("case {=u32}: waits {} sum past the budget", i, plan.waits.as_slice());
            within_budget = false;
        }
        if op == Operation::Write {
            // A write with no key that may have landed is never sent again: a resend could record
            // a payment twice.
            let resent = retried.iter().any(is_5xx_or_timeout);
            let ends_unknown = last.is_none_or(|o| !is_5xx_or_timeout(o)) || plan.verdict == Verdict::Unknown;
            if resent || !ends_unknown {
                defmt::error!("case {=u32}: write {} -> {}", i, outcomes, plan.verdict);
                write_safe = false;
            }
        }
        // A 4xx other than 429 fails the same way every time: never retried, the call fails.
        let is_4xx = |o: &Outcome| matches!(o.code(), Some(400..=428 | 430..=499));
        if retried.iter().any(is_4xx) || last.is_some_and(|o| is_4xx(o) && plan.verdict != Verdict::Failed) {
            defmt::error!("case {=u32}: {} {} -> {}", i, op, outcomes, plan.verdict);
            four_xx_final = false;
        }
    }
    defmt::info!(
        "{=u32} generated cases: {=u32} unknown writes, {=u32} budget stops",
        GENERATED,
        unknown_writes,
        budget_stops
    );
    check("generated cases reach unknown writes", unknown_writes >= GENERATED / 20);
    check("generated cases reach the budget", budget_stops >= GENERATED / 100);
    check("every generated case plans", planned);
    check("waits never sum past the budget", within_budget);
    check("an unkeyed write is never resent after a 5xx or timeout", write_safe);
    check("a 4xx other than 429 is never retried", four_xx_final);
    // The same fingerprint as on the host, so a device's ledger replays on a laptop.
    let fingerprint = BasicPolicy::POLICY.fingerprint();
    if fingerprint != FINGERPRINT {
        defmt::error!("policy fingerprint {=u32:#010x}, the host's {=u32:#010x}", fingerprint, FINGERPRINT);
    }
    check("the policy fingerprint matches the host's", fingerprint == FINGERPRINT);
}

/// Four tokens, half a token back per success: retries stop once two failures have left it at
/// half (2 of 4).
static FLEET: FleetBudget = match FleetBudget::new(4, 500) {
    Ok(b) => b,
    Err(_) => panic!("the fleet budget's settings are refused"),
};

/// The fleet budget through a take/refund sequence whose results are known in advance, then
/// through `Policy::decide_with_fleet`. On thumbv6m (no compare-and-swap) each update is a
/// `fetch_update` inside the binary's critical section.
pub fn fleet(check: &mut impl FnMut(&str, bool)) {
    let fleet = &FLEET;
    let full = fleet.max_milli();
    // Two failures: 4 -> 3 tokens (a retry allowed), 3 -> 2 (at half: refused).
    let taken = [fleet.on_failure(), fleet.on_failure()];
    let after_taken = (fleet.tokens_milli(), fleet.allows_retry());
    // One success refunds half a token: 2.5 > 2, retries allowed again.
    fleet.on_success();
    let after_refund = (fleet.tokens_milli(), fleet.allows_retry());
    // Refunds stop at the maximum: 2.5 + 4 x 0.5 would be 4.5.
    for _ in 0..4 {
        fleet.on_success();
    }
    let capped = fleet.tokens_milli();
    let ok = full == 4_000
        && taken == [true, false]
        && after_taken == (2_000, false)
        && after_refund == (2_500, true)
        && capped == 4_000;
    if !ok {
        defmt::error!(
            "fleet: max {=u32}, failures allowed {}, then {}, after a refund {}, capped at {=u32}",
            full,
            taken,
            after_taken,
            after_refund,
            capped
        );
    }
    check("fleet budget: failures take a token, a success refunds its ratio, up to the maximum", ok);

    // The same bucket through the decision: a read's first 503 retries (4 -> 3 tokens), the
    // second is throttled (3 -> 2) although the call's own budget would allow it; a success on
    // the next call refunds half a token.
    let policy = BasicPolicy::POLICY;
    let op = Operation::Idempotent;
    let unavailable = s(503);
    // A unit draw, as a device's generator gives it (`Draw::from_rng`): the decision traced by
    // `decide-cost` is the one a device makes.
    let draw = Draw::unit(1 << 31);
    let mut state = CallState::new();
    let first =
        (policy.classify(op, &unavailable), decide_once(&policy, &mut state, op, &unavailable, draw, fleet));
    let second =
        (policy.classify(op, &unavailable), decide_once(&policy, &mut state, op, &unavailable, draw, fleet));
    let mut next_call = CallState::new();
    let third = (policy.classify(op, &OK), decide_once(&policy, &mut next_call, op, &OK, draw, fleet));
    let ok = matches!(first, (Class::Retry, Decision::Retry { .. }))
        && second == (Class::Retry, Decision::Done(Verdict::GaveUp(GiveUp::Throttled)))
        && third == (Class::Ok, Decision::Done(Verdict::Ok))
        && fleet.tokens_milli() == 2_500;
    if !ok {
        defmt::error!(
            "fleet: decisions {} {} {}, {=u32} milli-tokens left",
            first,
            second,
            third,
            fleet.tokens_milli()
        );
    }
    check("fleet budget: decide_with_fleet throttles the retry the bucket refuses", ok);
}

/// The device's send rate and circuit breaker (`PaceSettings::DEVICE`, `BreakerSettings::DEVICE`)
/// asked before each attempt and told after it, as the uplink's runner does, through
/// [`pace_once`]: an open pace lets the first attempt go and its 503 cuts the rate; the next
/// attempt's pace wait is longer than the call's budget, so the call ends before it; after the
/// wait the attempt goes and its success is heard; once refused connections have opened the
/// breaker, the next call ends at once.
pub fn pacing(check: &mut impl FnMut(&str, bool)) {
    let (Ok(mut pace), Ok(mut breaker)) =
        (Pace::new(PaceSettings::DEVICE), Breaker::new(BreakerSettings::DEVICE))
    else {
        check("pacing: the device settings are accepted", false);
        return;
    };
    let policy = BasicPolicy::POLICY;
    let draw = Draw::unit(1 << 31);
    let unavailable = Outcome::Failure(Failure::status(503));
    let at = Instant::from_millis;
    let first = pace_once(
        &mut Attempts::new(at(1_000)),
        &policy,
        &mut pace,
        &mut breaker,
        &unavailable,
        draw,
        at(1_000),
    );
    let cut = pace.rate_milli(at(1_000));
    let second =
        pace_once(&mut Attempts::new(at(1_010)), &policy, &mut pace, &mut breaker, &OK, draw, at(1_010));
    let third =
        pace_once(&mut Attempts::new(at(60_000)), &policy, &mut pace, &mut breaker, &OK, draw, at(60_000));
    for t in [60_100, 60_200] {
        Attempts::report(
            Some(&mut pace),
            Some(&mut breaker),
            &Outcome::Failure(Failure::Refused),
            draw,
            at(t),
        );
    }
    let fourth =
        pace_once(&mut Attempts::new(at(60_300)), &policy, &mut pace, &mut breaker, &OK, draw, at(60_300));
    let ok = first == Gate::Go
        && cut == Some(50)
        && second == Gate::Stop(GiveUp::Budget)
        && third == Gate::Go
        && fourth == Gate::Stop(GiveUp::CircuitOpen);
    if !ok {
        defmt::error!("pacing: gates {} {} {} {}, rate after the 503 {}", first, second, third, fourth, cut);
    }
    check("pacing: the pace and the breaker gate each attempt as the device runs them", ok);
}

/// One attempt's pacing, kept out of line like [`decide_once`] so `decide-cost` can count it:
/// the endpoint's breaker and pace asked before the attempt (`Attempts::admit`, which keeps
/// what they said for the ledger) and, when it goes, told its `outcome` after it
/// (`Attempts::report`).
#[inline(never)]
pub fn pace_once(
    call: &mut Attempts,
    policy: &Policy,
    pace: &mut Pace,
    breaker: &mut Breaker,
    outcome: &Outcome,
    draw: Draw,
    now: Instant,
) -> Gate {
    let gate = call.admit(policy, Some(&mut *pace), Some(&mut *breaker), now);
    if gate == Gate::Go {
        Attempts::report(Some(pace), Some(breaker), outcome, draw, now);
    }
    gate
}

/// One attempt's whole decision, `Policy::decide_with_fleet`, kept out of line: its first
/// instruction and its return mark one decision in an instruction trace of the binary, which is
/// how `decide-cost` reads its cost under QEMU (firmware/README.md).
#[inline(never)]
pub fn decide_once(
    policy: &Policy,
    state: &mut CallState,
    op: Operation,
    outcome: &Outcome,
    draw: Draw,
    fleet: &FleetBudget,
) -> Decision {
    policy.decide_with_fleet(state, op, outcome, draw, None, fleet)
}
