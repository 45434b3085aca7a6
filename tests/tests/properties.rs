//! Properties of `plan::plan`, `Policy::decide` and `FleetBudget` over arbitrary valid policies,
//! outcomes, operations and draws.

use proptest::prelude::*;
use wary::{
    CallState, Decision, Draw, Duration, Failure, FleetBudget, GiveUp, Jitter, Operation, Outcome, Policy,
    Preset, RetryAfterMode, Verdict, plan::plan,
};

const CAPACITY: usize = 64;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Milliseconds as a number.
fn millis(d: Duration) -> u64 {
    u64::from(d.as_millis())
}

/// Settings in milliseconds.
#[derive(Debug, Clone)]
struct Settings {
    preset: Preset,
    base: u64,
    cap_over_base: u64,
    budget: u64,
    jitter: Option<Jitter>,
    max_attempts: Option<u32>,
}

impl Settings {
    fn build(&self) -> Option<Policy> {
        let mut b = Policy::builder(self.preset)
            .base(ms(self.base))
            .cap(ms(self.base.saturating_add(self.cap_over_base)))
            .budget(ms(self.budget));
        if let Some(j) = self.jitter {
            b = b.jitter(j);
        }
        if let Some(n) = self.max_attempts {
            b = b.max_attempts(n);
        }
        let p = b.build().ok()?;
        // Policies that allow more retries than the plan can hold are checked elsewhere.
        p.fits(CAPACITY).then_some(p)
    }
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        prop_oneof![Just(Preset::Default), Just(Preset::Basic), Just(Preset::Strict), Just(Preset::Coap)],
        1u64..=2_000,
        0u64..=60_000,
        1u64..=200_000,
        prop_oneof![
            Just(None),
            Just(Some(Jitter::Equal)),
            Just(Some(Jitter::Full)),
            Just(Some(Jitter::Decorrelated)),
            Just(Some(Jitter::None)),
            Just(Some(Jitter::Coap)),
        ],
        prop_oneof![Just(None), (1u32..=12).prop_map(Some)],
    )
        .prop_map(|(preset, base, cap_over_base, budget, jitter, max_attempts)| Settings {
            preset,
            base,
            cap_over_base,
            budget,
            jitter,
            max_attempts,
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    // Up to 300 of the policy's milliseconds or of the header's seconds, or anything at all
    // (saturating at what wary counts).
    let retry_after = prop_oneof![
        Just(None),
        (0u64..=300).prop_map(|n| Some(ms(n))),
        (0u64..=300).prop_map(|n| Some(Duration::from_secs(n))),
        any::<u64>().prop_map(|n| Some(ms(n))),
    ];
    let status = prop_oneof![
        Just(400u16),
        Just(408),
        Just(409),
        Just(429),
        Just(500),
        Just(501),
        Just(502),
        Just(503),
        Just(504),
        any::<u16>()
    ];
    prop_oneof![
        1 => Just(Outcome::Ok),
        3 => (status, retry_after).prop_map(|(code, retry_after)| Failure::Status { code, retry_after, unreadable: 0 }.into()),
        1 => Just(Failure::ConnectTimeout.into()),
        1 => Just(Failure::ResponseTimeout.into()),
        1 => Just(Failure::Refused.into()),
        1 => Just(Failure::Reset.into()),
        1 => Just(Failure::Tls.into()),
        1 => Just(Failure::BadBody.into()),
        1 => any::<bool>().prop_map(|forwarded| Failure::StreamBroken { forwarded }.into()),
        1 => Just(Failure::Cancelled.into()),
    ]
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![Just(Operation::Idempotent), Just(Operation::KeyedWrite), Just(Operation::Write)]
}

fn draw() -> impl Strategy<Value = Draw> {
    prop_oneof![(0u8..=99).prop_map(|p| Draw::percent(p).unwrap()), any::<u32>().prop_map(Draw::unit)]
}

/// A call's inputs: one draw per outcome, so a plan never runs out.
fn call() -> impl Strategy<Value = (Settings, Operation, Vec<Outcome>, Vec<Draw>)> {
    (settings(), operation(), prop::collection::vec(outcome(), 0..16)).prop_flat_map(|(s, op, o)| {
        let n = o.len();
        (Just(s), Just(op), Just(o), prop::collection::vec(draw(), n))
    })
}

/// The work may have landed: a resend of an unkeyed write could do it twice.
fn ambiguous(o: &Outcome) -> bool {
    match o {
        Outcome::Failure(
            Failure::ResponseTimeout | Failure::Reset | Failure::StreamBroken { forwarded: false },
        ) => true,
        Outcome::Failure(Failure::Status { code, .. }) => (500..=599).contains(code),
        _ => false,
    }
}

/// `min(cap, base·2^(k−1))` in milliseconds, computed here rather than by the core.
fn ceiling(base: u64, cap: u64, k: usize) -> u64 {
    let grown = if k > 64 { u64::MAX } else { base.saturating_mul(1u64 << (k - 1)) };
    grown.min(cap)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn waits_never_sum_past_the_budget((s, op, outcomes, draws) in call()) {
        let Some(p) = s.build() else { return Ok(()) };
        let r = plan::<CAPACITY>(&p, op, &outcomes, &draws).unwrap();
        prop_assert!(r.waits.iter().map(|w| millis(*w)).sum::<u64>() <= millis(p.budget()));
        prop_assert!(r.waits.len() as u64 <= u64::from(p.max_retries().unwrap()));
    }

    #[test]
    fn unkeyed_write_is_never_resent_after_an_ambiguous_failure((s, _, outcomes, draws) in call()) {
        let Some(p) = s.build() else { return Ok(()) };
        let r = plan::<CAPACITY>(&p, Operation::Write, &outcomes, &draws).unwrap();
        // A wait after outcome i means attempt i + 1 was sent.
        for (i, _) in r.waits.iter().enumerate() {
            prop_assert!(!ambiguous(&outcomes[i]), "resent after {:?}: {:?}", outcomes[i], r);
        }
        if let Some(first) = outcomes.iter().position(ambiguous) {
            prop_assert!(r.waits.len() <= first);
            if r.waits.len() == first {
                // Unknown, or failed where the table fails it outright (501 in the default table).
                prop_assert!(matches!(r.verdict, Verdict::Unknown | Verdict::Failed), "{:?}", r);
            }
        }
    }

    #[test]
    fn no_wait_exceeds_its_ceiling_unless_the_server_asked((s, op, outcomes, draws) in call()) {
        let Some(p) = s.build() else { return Ok(()) };
        let r = plan::<CAPACITY>(&p, op, &outcomes, &draws).unwrap();
        let b = p.backoff();
        let (base, cap) = (millis(b.base), millis(b.cap));
        for (i, w) in r.waits.iter().enumerate() {
            let w = millis(*w);
            let c = ceiling(base, cap, i + 1);
            // Decorrelated waits grow from the last one, bounded by the cap; CoAP's timeouts may
            // pass the ceiling by half.
            let limit = match b.jitter {
                Jitter::Decorrelated => cap,
                Jitter::Coap => c + c / 2,
                _ => c,
            };
            match outcomes[i].retry_after() {
                None => prop_assert!(w <= limit, "wait {} of retry {} above {}", w, i + 1, limit),
                Some(asked) => {
                    let asked = millis(asked);
                    prop_assert!(w >= asked, "Retry-After lowered the wait");
                    let spread = match p.retry_after_mode() {
                        RetryAfterMode::Max => 0,
                        RetryAfterMode::Spread => c,
                    };
                    prop_assert!(w <= limit.max(asked.saturating_add(spread)));
                }
            }
        }
    }

    #[test]
    fn equal_inputs_give_equal_schedules((s, op, outcomes, draws) in call()) {
        let Some(p) = s.build() else { return Ok(()) };
        let again = s.build().unwrap();
        prop_assert_eq!(p, again);
        let a = plan::<CAPACITY>(&p, op, &outcomes, &draws).unwrap();
        let b = plan::<CAPACITY>(&again, op, &outcomes, &draws).unwrap();
        prop_assert_eq!(&a, &b);
        // Deciding attempt by attempt gives the plan's schedule.
        let mut state = CallState::new();
        let mut waits = Vec::new();
        let mut verdict = Verdict::GaveUp(GiveUp::OutcomesExhausted);
        for (i, o) in outcomes.iter().enumerate() {
            if i + 1 == outcomes.len() && p.classify(op, o) == wary::Class::Retry {
                break;
            }
            match p.decide(&mut state, op, o, draws[i.min(waits.len())], None) {
                Decision::Retry { wait } => waits.push(wait),
                Decision::Done(v) => {
                    verdict = v;
                    break;
                }
            }
        }
        prop_assert_eq!(a.waits.as_slice(), waits.as_slice());
        prop_assert_eq!(a.verdict, verdict);
    }

    #[test]
    fn unit_draw_schedule_stays_within_min_and_max_wait(
        (s, op, outcomes, _) in call(),
        raw in prop::collection::vec(any::<u32>(), 16),
    ) {
        let Some(p) = s.build() else { return Ok(()) };
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::Failure(Failure::Status { code, .. }) => Outcome::status(code),
                o => o,
            })
            .collect();
        let draws: Vec<Draw> = raw.iter().map(|x| Draw::unit(*x)).collect();
        let r = plan::<CAPACITY>(&p, op, &outcomes, &draws).unwrap();
        let b = p.backoff();
        let (base, cap) = (millis(b.base), millis(b.cap));
        let mut previous = Duration::ZERO;
        for (i, &wait) in r.waits.iter().enumerate() {
            let k = u32::try_from(i + 1).unwrap();
            let (lo, hi) = (b.min_wait(k, previous), b.max_wait(k, previous));
            prop_assert!(lo <= wait && wait <= hi, "retry {}: {} outside [{}, {}]", k, wait, lo, hi);
            let (w, c) = (millis(wait), ceiling(base, cap, i + 1));
            match b.jitter {
                Jitter::Equal => prop_assert!(c / 2 <= w && w <= c),
                Jitter::Full => prop_assert!(w < c),
                Jitter::None => prop_assert_eq!(w, c),
                Jitter::Decorrelated => prop_assert!(base <= w && w <= cap),
                Jitter::Coap => prop_assert!(c <= w && w <= c + c / 2),
            }
            previous = wait;
        }
    }

    #[test]
    fn decide_never_starts_a_wait_past_the_deadline(
        (s, op, outcomes, draws) in call(),
        deadline in 1u64..=100_000,
        min_attempt in 0u64..=5_000,
        attempt_times in prop::collection::vec(0u64..=20_000, 16),
    ) {
        let Some(p) = s.build() else { return Ok(()) };
        let Ok(p) = Policy::builder(Preset::Default)
            .table(*p.table())
            .base(p.backoff().base)
            .cap(p.backoff().cap)
            .jitter(p.backoff().jitter)
            .budget(p.budget())
            .deadline(ms(deadline))
            .min_attempt(ms(min_attempt))
            .max_attempts(p.max_attempts().unwrap_or(20))
            .build()
        else {
            return Ok(());
        };
        let mut state = CallState::new();
        let mut elapsed = 0u64;
        for (i, o) in outcomes.iter().enumerate() {
            elapsed += attempt_times[i];
            match p.decide(&mut state, op, o, draws[i], Some(ms(elapsed))) {
                Decision::Retry { wait } => {
                    let wait = millis(wait);
                    let end = elapsed + wait + min_attempt;
                    prop_assert!(end <= deadline, "{} + {} + {} > {}", elapsed, wait, min_attempt, deadline);
                    prop_assert!(state.waited() <= p.budget());
                    elapsed += wait;
                }
                Decision::Done(_) => break,
            }
        }
    }

    #[test]
    fn fleet_budget_stays_between_zero_and_max(
        max_tokens in 1u32..=1000,
        ratio in 1u32..=1000,
        events in prop::collection::vec(any::<bool>(), 0..3_000),
    ) {
        let fleet = FleetBudget::new(max_tokens, ratio).unwrap();
        let max = i64::from(max_tokens) * 1000;
        prop_assert_eq!(i64::from(fleet.max_milli()), max);
        let mut model = max;
        for success in events {
            if success {
                fleet.on_success();
                model = (model + i64::from(ratio)).min(max);
            } else {
                let allowed = fleet.on_failure();
                model = (model - 1000).max(0);
                // No retries while the tokens are at or below half the maximum.
                prop_assert_eq!(allowed, model > max / 2);
            }
            let t = i64::from(fleet.tokens_milli());
            prop_assert!((0..=max).contains(&t));
            prop_assert_eq!(t, model);
            prop_assert_eq!(fleet.allows_retry(), t > max / 2);
        }
    }
}

/// A deadline bounds `max_retries`, so a plan of that many waits must hold the call: `plan`
/// stops at the deadline too, and `plan_static`'s compile-time capacity check holds.
#[test]
fn plan_with_a_deadline_stays_within_max_retries() {
    use wary::StaticPolicy;
    struct WithDeadline;
    impl StaticPolicy for WithDeadline {
        const POLICY: Policy = match Policy::builder(Preset::Basic)
            .base(Duration::from_millis(2))
            .cap(Duration::from_millis(60))
            .budget(Duration::from_millis(120))
            .deadline(Duration::from_millis(3))
            .build()
        {
            Ok(p) => p,
            Err(_) => panic!(),
        };
    }
    // Waits of 1 and 2 fill the deadline of 3: two retries at most.
    assert_eq!(WithDeadline::MAX_RETRIES, 2);
    let outcomes = [Outcome::status(503); 10];
    let r = wary::plan::plan_static::<WithDeadline, 2>(Operation::Idempotent, &outcomes, &[Draw::ZERO; 9]);
    assert!(r.is_ok(), "{r:?}");
    assert!(r.unwrap().waits.iter().map(|w| millis(*w)).sum::<u64>() <= 3);
}

/// Past the deadline no attempt can finish in time, whatever the wait: not even a wait of 0.
#[test]
fn no_retry_once_the_deadline_has_passed() {
    let p = Policy::builder(Preset::Default)
        .jitter(Jitter::Full)
        .max_attempts(5)
        .deadline(ms(100))
        .build()
        .unwrap();
    let mut s = CallState::new();
    let d = p.decide(&mut s, Operation::Idempotent, &Outcome::status(503), Draw::ZERO, Some(ms(150)));
    assert_eq!(d, Decision::Done(Verdict::GaveUp(GiveUp::Deadline)));
}
