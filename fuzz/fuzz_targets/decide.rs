//! Arbitrary policies, outcomes, operations and draws through `plan` and `Policy::decide`.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use wary::{
    CallState, Decision, Draw, Duration, Failure, Jitter, Operation, Outcome, Policy, Preset, RetryAfterMode,
    Rule, TableError, Verdict,
    plan::{PlanError, plan},
};

const CAPACITY: usize = 64;

#[derive(Arbitrary, Debug)]
enum OutcomeIn {
    Ok,
    /// A status and its Retry-After in ms.
    Status(u16, Option<u64>),
    ConnectTimeout,
    ResponseTimeout,
    Refused,
    Reset,
    Tls,
    BadBody,
    StreamBroken(bool),
    Cancelled,
}

#[derive(Arbitrary, Debug)]
enum DrawIn {
    Percent(u8),
    Unit(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    preset: u8,
    /// Durations in ms.
    base: Option<u64>,
    cap: Option<u64>,
    budget: Option<u64>,
    deadline: Option<u64>,
    max_attempts: Option<u32>,
    min_attempt: Option<u64>,
    max_retry_after: Option<u64>,
    jitter: Option<u8>,
    spread: Option<bool>,
    /// Extra status rules: a caller's API table. Only rules that keep an ambiguous failure of an
    /// unkeyed write unresent are drawn here (moving a 5xx to retry-any is a caller's explicit
    /// statement that it was not processed).
    rules: Vec<(u16, bool)>,
    op: u8,
    outcomes: Vec<OutcomeIn>,
    draws: Vec<DrawIn>,
    attempt_times: Vec<u32>,
}

fn outcome(o: &OutcomeIn) -> Outcome {
    let f = match *o {
        OutcomeIn::Ok => return Outcome::Ok,
        OutcomeIn::Status(code, retry_after) => {
            Failure::Status { code, retry_after: retry_after.map(Duration::from_millis), unreadable: 0 }
        }
        OutcomeIn::ConnectTimeout => Failure::ConnectTimeout,
        OutcomeIn::ResponseTimeout => Failure::ResponseTimeout,
        OutcomeIn::Refused => Failure::Refused,
        OutcomeIn::Reset => Failure::Reset,
        OutcomeIn::Tls => Failure::Tls,
        OutcomeIn::BadBody => Failure::BadBody,
        OutcomeIn::StreamBroken(forwarded) => Failure::StreamBroken { forwarded },
        OutcomeIn::Cancelled => Failure::Cancelled,
    };
    Outcome::Failure(f)
}

fn draw(d: &DrawIn) -> Draw {
    match *d {
        DrawIn::Percent(p) => match Draw::percent(p) {
            Ok(d) => d,
            Err(_) => {
                assert!(p > 99, "percent draw {p} refused");
                Draw::unit(u32::from(p))
            }
        },
        DrawIn::Unit(x) => Draw::unit(x),
    }
}

/// The work may have landed: a resend of an unkeyed write could do it twice.
fn ambiguous(o: &Outcome) -> bool {
    match o.failure() {
        Some(Failure::ResponseTimeout | Failure::Reset | Failure::StreamBroken { forwarded: false }) => true,
        Some(Failure::Status { code, .. }) => (500..=599).contains(code),
        _ => false,
    }
}

fn build(input: &Input) -> Option<Policy> {
    let preset = Preset::ALL[usize::from(input.preset) % Preset::ALL.len()];
    let mut b = Policy::builder(preset);
    let mut table = *Policy::builder(preset).build().ok()?.table();
    for &(code, idempotent) in input.rules.iter().take(16) {
        let rule = match (idempotent, code) {
            (true, _) => Rule::RetryIdempotent,
            (false, 400..=499) => Rule::RetryAny,
            (false, _) => Rule::Fail,
        };
        match table.with_status(code, rule) {
            Ok(t) => table = t,
            Err(e) => assert!(
                !(400..=599).contains(&code) && e == TableError::BadStatus,
                "status {code} refused: {e:?}"
            ),
        }
    }
    b = b.table(table);
    if let Some(v) = input.base {
        b = b.base(ms(v));
    }
    if let Some(v) = input.cap {
        b = b.cap(ms(v));
    }
    if let Some(v) = input.budget {
        b = b.budget(ms(v));
    }
    if let Some(v) = input.deadline {
        b = b.deadline(ms(v));
    }
    if let Some(v) = input.max_attempts {
        b = b.max_attempts(v);
    }
    if let Some(v) = input.min_attempt {
        b = b.min_attempt(ms(v));
    }
    if let Some(v) = input.max_retry_after {
        b = b.max_retry_after(ms(v));
    }
    if let Some(j) = input.jitter {
        b = b.jitter(Jitter::ALL[usize::from(j) % Jitter::ALL.len()]);
    }
    if let Some(s) = input.spread {
        b = b.retry_after_mode(if s { RetryAfterMode::Spread } else { RetryAfterMode::Max });
    }
    // A refused setting is the builder doing its job.
    b.build().ok()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fuzz_target!(|input: Input| {
    let Some(p) = build(&input) else { return };
    let op = Operation::ALL[usize::from(input.op) % Operation::ALL.len()];
    let outcomes: Vec<Outcome> = input.outcomes.iter().take(CAPACITY + 8).map(outcome).collect();
    let draws: Vec<Draw> = input.draws.iter().take(CAPACITY + 8).map(draw).collect();
    let max_retries = p.max_retries().expect("a built policy bounds its retries");

    match plan::<CAPACITY>(&p, op, &outcomes, &draws) {
        Ok(r) => {
            let total: u64 = r.waits.iter().map(|w| u64::from(w.as_millis())).sum();
            let budget = u64::from(p.budget().as_millis());
            assert!(total <= budget, "waits {total} ms past budget {budget} ms");
            // `plan` has no clock, so a deadline does not stop it though `max_retries` counts one.
            if p.deadline().is_none() {
                assert!(r.waits.len() as u64 <= u64::from(max_retries));
            }
            for (i, &w) in r.waits.iter().enumerate() {
                let o = &outcomes[i];
                if op == Operation::Write {
                    assert!(!ambiguous(o), "unkeyed write resent after {o:?}");
                }
                if let Some(asked) = o.retry_after() {
                    assert!(w >= asked, "Retry-After lowered the wait");
                }
            }
            if op == Operation::Write && r.waits.len() < outcomes.len() && ambiguous(&outcomes[r.waits.len()])
            {
                assert!(matches!(r.verdict, Verdict::Unknown | Verdict::Failed), "{:?}", r.verdict);
            }
        }
        Err(PlanError::CapacityExceeded { .. }) => {
            assert!(
                !p.fits(CAPACITY) || p.deadline().is_some(),
                "a policy that fits {CAPACITY} overflowed it"
            );
        }
        Err(_) => {}
    }

    // The same call decided attempt by attempt against a clock.
    let mut state = CallState::new();
    let mut elapsed = Duration::ZERO;
    for (i, o) in outcomes.iter().enumerate() {
        // An attempt takes at least `min_attempt`: the policy's own promise about its link.
        let spent = ms(u64::from(input.attempt_times.get(i).copied().unwrap_or(0))).max(p.min_attempt());
        elapsed = elapsed.saturating_add(spent);
        let d = draws.get(i).copied().unwrap_or(Draw::ZERO);
        match p.decide(&mut state, op, o, d, Some(elapsed)) {
            Decision::Retry { wait } => {
                if let Some(deadline) = p.deadline() {
                    // Wide arithmetic: a saturated sum would hide a wait past the deadline.
                    let end = u64::from(elapsed.as_millis())
                        + u64::from(wait.as_millis())
                        + u64::from(p.min_attempt().as_millis());
                    assert!(end <= u64::from(deadline.as_millis()), "started a wait past the deadline");
                }
                assert!(state.waited() <= p.budget());
                assert!(state.attempts() <= max_retries);
                if op == Operation::Write {
                    assert!(!ambiguous(o), "unkeyed write resent after {o:?}");
                }
                elapsed = elapsed.saturating_add(wait);
            }
            Decision::Done(_) => break,
        }
    }
});
