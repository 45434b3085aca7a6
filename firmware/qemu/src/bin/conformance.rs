//! wary's conformance cases on the Cortex-M4: seed 000's eleven examples through the core's
//! `plan`, then properties over generated cases. Exit 0 only if every check passed.

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use wary::plan::{Plan, plan_static};
use wary::policy::StaticPolicy;
use wary::{Draw, GiveUp, Operation, Outcome, Policy, Preset, Verdict};
use wary_qemu::Tally;

/// Seed 000's policy, in the seed's own unit (seconds, so one tick per second).
struct Seed000;

impl StaticPolicy for Seed000 {
    const POLICY: Policy =
        match Policy::builder(Preset::Exercise).tick_hz(1).base(2).cap(60).budget(120).build() {
            Ok(p) => p,
            Err(_) => panic!("seed 000's policy is refused"),
        };
}

/// Holds every retry the policy can make (checked at compile time by `plan_static`).
const CAPACITY: usize = Seed000::MAX_RETRIES;
/// More than any case needs.
const MAX_OUTCOMES: usize = 16;

struct Case {
    name: &'static str,
    outcomes: &'static [Outcome],
    op: Operation,
    /// Whole percentages, one per retry.
    draws: &'static [u8],
    waits: &'static [u64],
    verdict: Verdict,
}

const OK: Outcome = Outcome::Ok;
const TIMEOUT: Outcome = Outcome::ResponseTimeout;
const fn s(code: u16) -> Outcome {
    Outcome::status(code)
}

/// The `TESTS` list of seed 000, in its order. The seed says only `gave_up`; the reason is the
/// core's, checked too.
const CASES: &[Case] = &[
    Case {
        name: "keyed write retries two 500s",
        outcomes: &[s(500), s(500), OK],
        op: Operation::KeyedWrite,
        draws: &[50, 50],
        waits: &[1, 3],
        verdict: Verdict::Ok,
    },
    Case {
        name: "unkeyed write stops at a timeout",
        outcomes: &[TIMEOUT, OK],
        op: Operation::Write,
        draws: &[50],
        waits: &[],
        verdict: Verdict::Unknown,
    },
    Case {
        name: "Retry-After raises a write's wait",
        outcomes: &[Outcome::status_after(429, 30), OK],
        op: Operation::Write,
        draws: &[0],
        waits: &[30],
        verdict: Verdict::Ok,
    },
    Case {
        name: "ten 503s give up at the budget",
        outcomes: &[s(503); 10],
        op: Operation::Read,
        draws: &[99; 9],
        waits: &[1, 3, 7, 15, 31, 59],
        verdict: Verdict::GaveUp(GiveUp::Budget),
    },
    Case {
        name: "a 400 fails at once",
        outcomes: &[s(400), OK],
        op: Operation::Read,
        draws: &[0],
        waits: &[],
        verdict: Verdict::Failed,
    },
    Case {
        name: "a 401 fails at once",
        outcomes: &[s(401)],
        op: Operation::KeyedWrite,
        draws: &[],
        waits: &[],
        verdict: Verdict::Failed,
    },
    Case {
        name: "draws of 0 still spend the budget",
        outcomes: &[s(500); 10],
        op: Operation::Read,
        draws: &[0; 9],
        waits: &[1, 2, 4, 8, 16, 30, 30],
        verdict: Verdict::GaveUp(GiveUp::Budget),
    },
    Case {
        name: "Retry-After past the budget gives up now",
        outcomes: &[Outcome::status_after(429, 200), OK],
        op: Operation::Read,
        draws: &[0],
        waits: &[],
        verdict: Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: 200 }),
    },
    Case {
        name: "unkeyed write survives a 429, stops at a timeout",
        outcomes: &[s(429), TIMEOUT, OK],
        op: Operation::Write,
        draws: &[0, 0],
        waits: &[1],
        verdict: Verdict::Unknown,
    },
    Case {
        name: "outcomes run out while failing",
        outcomes: &[s(500), s(500)],
        op: Operation::Read,
        draws: &[0, 0],
        waits: &[1],
        verdict: Verdict::GaveUp(GiveUp::OutcomesExhausted),
    },
    Case {
        name: "keyed write retries a timeout",
        outcomes: &[TIMEOUT, s(502), OK],
        op: Operation::KeyedWrite,
        draws: &[99, 99],
        waits: &[1, 3],
        verdict: Verdict::Ok,
    },
];

fn run_plan(op: Operation, outcomes: &[Outcome], percents: &[u8]) -> Option<Plan<CAPACITY>> {
    let mut draws = [Draw::ZERO; MAX_OUTCOMES];
    for (slot, &p) in draws.iter_mut().zip(percents) {
        *slot = Draw::percent(p).ok()?;
    }
    let draws = draws.get(..percents.len())?;
    match plan_static::<Seed000, CAPACITY>(op, outcomes, draws) {
        Ok(plan) => Some(plan),
        Err(e) => {
            defmt::error!("plan refused its inputs: {}", e);
            None
        }
    }
}

fn seed_cases(tally: &mut Tally) {
    for case in CASES {
        let ok = match run_plan(case.op, case.outcomes, case.draws) {
            Some(plan) => {
                let ok = plan.waits.as_slice() == case.waits && plan.verdict == case.verdict;
                if !ok {
                    defmt::error!(
                        "{=str}: expected {} {}, got {} {}",
                        case.name,
                        case.waits,
                        case.verdict,
                        plan.waits.as_slice(),
                        plan.verdict
                    );
                }
                ok
            }
            None => false,
        };
        tally.check(case.name, ok);
    }
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

/// Every kind of outcome seed 000 speaks of, weighted towards failures that retry.
fn outcome(g: &mut Gen) -> Outcome {
    match g.below(12) {
        0 => OK,
        1 | 2 => TIMEOUT,
        3 => s(429),
        4 => Outcome::status_after(429, u64::from(g.below(150))),
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
    matches!(o, Outcome::ResponseTimeout) || matches!(o.code(), Some(500..=599))
}

const GENERATED: u32 = 2_000;

/// Properties every plan must have, over generated cases.
fn properties(tally: &mut Tally) {
    let budget = Seed000::POLICY.budget();
    let mut g = Gen(0x5eed_0000);
    let (mut within_budget, mut write_safe, mut four_xx_final, mut planned) = (true, true, true, true);
    // Coverage: the generator must reach the cases the properties are about.
    let (mut unknown_writes, mut budget_stops) = (0u32, 0u32);
    let started = embassy_time::Instant::now();
    for i in 0..GENERATED {
        let len = 1 + g.below(MAX_OUTCOMES as u32) as usize;
        let mut outcomes = [OK; MAX_OUTCOMES];
        let mut percents = [0u8; MAX_OUTCOMES];
        for (o, p) in outcomes.iter_mut().zip(percents.iter_mut()).take(len) {
            *o = outcome(&mut g);
            *p = g.below(100) as u8;
        }
        let op = [Operation::Read, Operation::KeyedWrite, Operation::Write][g.below(3) as usize];
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

        let waited: u64 = plan.waits.iter().sum();
        if waited > budget {
            defmt::error!("case {=u32}: waits {} sum past the budget", i, plan.waits.as_slice());
            within_budget = false;
        }
        if op == Operation::Write {
            // Seed 000's $4,200: a write with no key that may have landed is never sent again.
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
        "{=u32} generated cases in {=u64} ms of guest time: {=u32} unknown writes, {=u32} budget stops",
        GENERATED,
        started.elapsed().as_millis(),
        unknown_writes,
        budget_stops
    );
    tally.check("generated cases reach unknown writes", unknown_writes >= GENERATED / 20);
    tally.check("generated cases reach the budget", budget_stops >= GENERATED / 100);
    tally.check("every generated case plans", planned);
    tally.check("waits never sum past the budget", within_budget);
    tally.check("an unkeyed write is never resent after a 5xx or timeout", write_safe);
    tally.check("a 4xx other than 429 is never retried", four_xx_final);
    // The same fingerprint as on the host (crates/wary/src/policy.rs pins it), so a device's
    // ledger replays on a laptop.
    tally.check("the policy fingerprint matches the host's", Seed000::POLICY.fingerprint() == 0x5924_342a);
}

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let _board = mps2_an386::init();
    let mut tally = Tally::new();
    seed_cases(&mut tally);
    properties(&mut tally);
    tally.finish()
}
