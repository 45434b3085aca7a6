//! Every example and test the seeds state that the pure core can express, word for word in
//! meaning.

use wary::{Class, GiveUp, Operation, Outcome, Table, Verdict};
use wary_tests::{seed000_policy, solve};

const OK: Outcome = Outcome::Ok;
const TIMEOUT: Outcome = Outcome::ResponseTimeout;

fn s(code: u16) -> Outcome {
    Outcome::status(code)
}

fn check(outcomes: &[Outcome], op: Operation, draws: &[u8], waits: &[u64], verdict: &str) {
    let p = solve(outcomes, op, &seed000_policy(), draws);
    assert_eq!(p.waits.as_slice(), waits, "{outcomes:?} {op:?}");
    assert_eq!(p.verdict.name(), verdict, "{outcomes:?} {op:?}");
}

// ---- seed 000: the eleven cases that ran ----

#[test]
fn seed000_keyed_write_retries_5xx_to_ok() {
    check(&[s(500), s(500), OK], Operation::KeyedWrite, &[50, 50], &[1, 3], "ok");
}

#[test]
fn seed000_timeout_on_unkeyed_write_is_unknown() {
    check(&[TIMEOUT, OK], Operation::Write, &[50], &[], "unknown");
}

#[test]
fn seed000_retry_after_raises_the_wait_for_any_op() {
    check(&[Outcome::status_after(429, 30), OK], Operation::Write, &[0], &[30], "ok");
}

#[test]
fn seed000_budget_stops_a_503_storm() {
    check(&[s(503); 10], Operation::Read, &[99; 9], &[1, 3, 7, 15, 31, 59], "gave_up");
}

#[test]
fn seed000_400_fails_at_once() {
    check(&[s(400), OK], Operation::Read, &[0], &[], "failed");
}

#[test]
fn seed000_401_fails_at_once() {
    check(&[s(401)], Operation::KeyedWrite, &[], &[], "failed");
}

#[test]
fn seed000_fixed_half_bounds_the_attempts() {
    check(&[s(500); 10], Operation::Read, &[0; 9], &[1, 2, 4, 8, 16, 30, 30], "gave_up");
}

#[test]
fn seed000_retry_after_past_the_budget_gives_up_now() {
    check(&[Outcome::status_after(429, 200), OK], Operation::Read, &[0], &[], "gave_up");
    let p = solve(&[Outcome::status_after(429, 200), OK], Operation::Read, &seed000_policy(), &[0]);
    // And says how long the server asked for, so the caller can reschedule.
    assert_eq!(p.verdict, Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: 200 }));
}

#[test]
fn seed000_unkeyed_write_survives_429_but_stops_at_timeout() {
    check(&[s(429), TIMEOUT, OK], Operation::Write, &[0, 0], &[1], "unknown");
}

#[test]
fn seed000_outcomes_run_out_while_failing() {
    check(&[s(500), s(500)], Operation::Read, &[0, 0], &[1], "gave_up");
}

#[test]
fn seed000_keyed_write_retries_a_timeout() {
    check(&[TIMEOUT, s(502), OK], Operation::KeyedWrite, &[99, 99], &[1, 3], "ok");
}

// ---- seed 000's worked argument ----

#[test]
fn seed000_seven_retries_at_most_with_every_draw_at_zero() {
    assert_eq!(seed000_policy().max_retries(), Some(7));
    // 1 + 2 + 4 + 8 + 16 + 30 + 30 = 91; another 30 would pass 120.
    let p = solve(&[s(503); 30], Operation::Read, &seed000_policy(), &[0; 29]);
    assert_eq!(p.waits.iter().sum::<u64>(), 91);
    assert_eq!(p.verdict, Verdict::GaveUp(GiveUp::Budget));
}

// ---- seed 004's table ----

#[test]
fn seed004_classification_table() {
    let t = Table::DEFAULT;
    let class = |o: Outcome, op| t.classify(op, &o);
    for code in [400, 401, 403, 404, 422] {
        for op in [Operation::Read, Operation::KeyedWrite, Operation::Write] {
            assert_eq!(
                class(s(code), op),
                Class::Failed,
                "{code}: your request is wrong; it will stay wrong"
            );
        }
    }
    for code in [408, 429] {
        assert_eq!(class(s(code), Operation::Write), Class::Retry, "{code}: transient or throttled");
    }
    for code in [500, 502, 503, 504] {
        assert_eq!(class(s(code), Operation::Read), Class::Retry, "{code}: server-side, usually temporary");
    }
    for o in [TIMEOUT, Outcome::Reset] {
        assert_eq!(class(o, Operation::Read), Class::Retry, "yes, if idempotent");
        assert_eq!(class(o, Operation::KeyedWrite), Class::Retry, "yes, if idempotent");
        assert_eq!(class(o, Operation::Write), Class::Unknown, "you do not know whether it landed");
    }
    assert_eq!(class(Outcome::BadBody, Operation::Read), Class::Failed, "a validation bug, not transport");
}
