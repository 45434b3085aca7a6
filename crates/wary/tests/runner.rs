//! The runner against recorded effects: every send, sleep and record is observed, and time is
//! a fake clock that only the attempts and the sleeps advance.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(clippy::arithmetic_side_effects, missing_docs)]

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::Poll;

use embassy_futures::block_on;
use embassy_futures::join::join;
use embedded_hal_async::delay::DelayNs;
use wary::{
    Attempt, Breaker, BreakerSettings, BreakerState, CancelToken, Clock, Duration, Failure, FleetBudget,
    GiveUp, Guards, Instant, Jitter, Key, Landed, Operation, Outcome, Pace, PaceSettings, Policy, Preset,
    Probe, Runner, Verdict, ledger::Ledger,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Milliseconds that only sleeps and attempts advance.
#[derive(Default)]
struct FakeClock(Cell<u64>);

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        Instant::from_millis(self.0.get())
    }
}

impl Clock for &FakeClock {
    fn now(&self) -> Instant {
        (**self).now()
    }
}

impl FakeClock {
    fn advance(&self, ms: u64) {
        self.0.set(self.0.get() + ms);
    }
}

/// Records each sleep (in ms) and advances the clock by it; optionally cancels during it.
struct Sleeps<'a> {
    clock: &'a FakeClock,
    log: &'a RefCell<Vec<u64>>,
    cancel_during: Option<&'a CancelToken>,
}

impl DelayNs for Sleeps<'_> {
    async fn delay_ns(&mut self, ns: u32) {
        let ms = u64::from(ns) / 1_000_000;
        self.log.borrow_mut().push(ms);
        self.clock.advance(ms);
        if let Some(c) = self.cancel_during {
            c.cancel();
        }
    }
    async fn delay_us(&mut self, us: u32) {
        let ms = u64::from(us) / 1000;
        self.log.borrow_mut().push(ms);
        self.clock.advance(ms);
        if let Some(c) = self.cancel_during {
            c.cancel();
        }
    }
    async fn delay_ms(&mut self, ms: u32) {
        let ms = u64::from(ms);
        self.log.borrow_mut().push(ms);
        self.clock.advance(ms);
        if let Some(c) = self.cancel_during {
            c.cancel();
        }
    }
}

/// A delay that never ends: only a cancel can end the wait.
struct Forever<'a>(&'a RefCell<Vec<u64>>);

impl DelayNs for Forever<'_> {
    async fn delay_ns(&mut self, _: u32) {
        self.0.borrow_mut().push(u64::MAX);
        core::future::pending::<()>().await;
    }
}

/// A small deterministic generator for draws (xorshift64*), seeded per worker.
struct Xorshift(u64);

impl rand_core::RngCore for Xorshift {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for b in dst {
            *b = self.next_u32() as u8;
        }
    }
}

/// Draws always at the top of the range.
struct Top;

impl rand_core::RngCore for Top {
    fn next_u32(&mut self) -> u32 {
        u32::MAX
    }
    fn next_u64(&mut self) -> u64 {
        u64::MAX
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        dst.fill(0xff);
    }
}

const KEY: Key = Key::from_bytes([7; 16]);

struct Scripted<'a> {
    outcomes: &'a [Outcome],
    sends: &'a RefCell<Vec<Attempt>>,
    clock: &'a FakeClock,
    attempt_ms: u64,
}

impl Scripted<'_> {
    fn attempt(&self, a: Attempt) -> impl Future<Output = Result<u32, Failure>> + use<'_> {
        self.sends.borrow_mut().push(a);
        self.clock.advance(self.attempt_ms);
        let i = (a.number - 1) as usize;
        let o = *self.outcomes.get(i).unwrap_or(&Outcome::Ok);
        core::future::ready(match o {
            Outcome::Ok => Ok(a.number),
            Outcome::Failure(f) => Err(f),
        })
    }
}

struct Harness {
    clock: FakeClock,
    sleeps: RefCell<Vec<u64>>,
    sends: RefCell<Vec<Attempt>>,
}

impl Harness {
    fn new() -> Self {
        Harness { clock: FakeClock::default(), sleeps: RefCell::default(), sends: RefCell::default() }
    }

    fn run(&self, policy: &Policy, op: Operation, outcomes: &[Outcome]) -> Result<u32, wary::Stopped> {
        let delay = Sleeps { clock: &self.clock, log: &self.sleeps, cancel_during: None };
        let mut runner = Runner::new(policy, delay, &self.clock, Xorshift(42));
        let s = Scripted { outcomes, sends: &self.sends, clock: &self.clock, attempt_ms: 0 };
        block_on(runner.call(op, KEY, |a| s.attempt(a)))
    }

    fn sends(&self) -> usize {
        self.sends.borrow().len()
    }

    fn sleeps(&self) -> Vec<u64> {
        self.sleeps.borrow().clone()
    }
}

fn strict() -> Policy {
    Policy::builder(Preset::Strict).build().unwrap()
}

// ---- the strict preset: reads only, integer seconds, three attempts ----

#[test]
fn an_unkeyed_post_that_fails_makes_one_send() {
    let h = Harness::new();
    let r = h.run(&strict(), Operation::Write, &[Outcome::status(503), Outcome::Ok]);
    assert_eq!(r.unwrap_err().verdict, Verdict::Unknown);
    assert_eq!(h.sends(), 1);
    assert!(h.sleeps().is_empty());
}

#[test]
fn a_retry_after_of_2s_with_a_half_second_budget_stops_before_sleeping() {
    let h = Harness::new();
    let p = Policy::builder(Preset::Strict).budget(ms(500)).build().unwrap();
    let r =
        h.run(&p, Operation::Idempotent, &[Outcome::status_after(503, Duration::from_secs(2)), Outcome::Ok]);
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: ms(2000) }));
    assert_eq!(h.sends(), 1);
    assert!(h.sleeps().is_empty());
}

#[test]
fn a_cancel_raised_during_the_wait_prevents_the_next_request() {
    let clock = FakeClock::default();
    let log = RefCell::default();
    let sends = RefCell::default();
    let token = CancelToken::new();
    let delay = Sleeps { clock: &clock, log: &log, cancel_during: Some(&token) };
    let p = strict();
    let mut runner = Runner::new(&p, delay, &clock, Xorshift(1)).cancel(&token);
    let s = Scripted { outcomes: &[Outcome::status(503); 3], sends: &sends, clock: &clock, attempt_ms: 0 };
    let r = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap_err().verdict, Verdict::Cancelled);
    assert_eq!(sends.borrow().len(), 1);
    assert_eq!(log.borrow().len(), 1);
}

#[test]
fn a_cancel_ends_a_wait_that_would_never_end_by_itself() {
    let clock = FakeClock::default();
    let log = RefCell::default();
    let sends = RefCell::default();
    let token = CancelToken::new();
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut runner = Runner::new(&p, Forever(&log), &clock, Xorshift(1)).cancel(&token);
    let s = Scripted { outcomes: &[Outcome::status(503); 3], sends: &sends, clock: &clock, attempt_ms: 0 };
    let call = runner.call(Operation::Idempotent, KEY, |a| s.attempt(a));
    let canceller = async {
        // Let the runner reach its wait, then cancel.
        let mut polled = false;
        core::future::poll_fn(|cx| {
            if polled {
                Poll::Ready(())
            } else {
                polled = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await;
        token.cancel();
    };
    let (r, ()) = block_on(join(call, canceller));
    assert_eq!(r.unwrap_err().verdict, Verdict::Cancelled);
    assert_eq!(sends.borrow().len(), 1);
    assert_eq!(log.borrow().as_slice(), &[u64::MAX]);
}

#[test]
fn a_response_after_a_cancel_is_not_accepted() {
    let clock = FakeClock::default();
    let log = RefCell::default();
    let token = CancelToken::new();
    let p = strict();
    let delay = Sleeps { clock: &clock, log: &log, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &clock, Xorshift(1)).cancel(&token);
    let r = block_on(runner.call(Operation::Idempotent, KEY, |_| {
        // The cancel arrives while the attempt is in flight.
        token.cancel();
        core::future::ready(Ok::<u32, Failure>(200))
    }));
    let stop = r.unwrap_err();
    assert_eq!(stop.verdict, Verdict::Cancelled);
    assert_eq!(stop.last, Some(Failure::Cancelled));
}

#[test]
fn a_cancel_before_the_first_send_sends_nothing() {
    let h = Harness::new();
    let token = CancelToken::new();
    token.cancel();
    let p = strict();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(1)).cancel(&token);
    let s = Scripted { outcomes: &[], sends: &h.sends, clock: &h.clock, attempt_ms: 0 };
    let r = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap_err().verdict, Verdict::Cancelled);
    assert_eq!(h.sends(), 0);
}

#[test]
fn invalid_json_in_a_200_is_not_retried() {
    let h = Harness::new();
    let r = h.run(&strict(), Operation::Idempotent, &[Outcome::Failure(Failure::BadBody), Outcome::Ok]);
    assert_eq!(r.unwrap_err().verdict, Verdict::Failed);
    assert_eq!(h.sends(), 1);
}

#[test]
fn waits_that_add_up_exactly_then_the_attempt_cap_ends_the_call() {
    let h = Harness::new();
    let r = h.run(&strict(), Operation::Idempotent, &[Outcome::Failure(Failure::ResponseTimeout); 5]);
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::Attempts));
    assert_eq!(h.sleeps(), [100, 200]);
    assert_eq!(h.sends(), 3);
}

// ---- doubling, capped ceilings under the default preset ----

fn doubling() -> wary::PolicyBuilder {
    // base 0.2 s, cap 1 s, six attempts.
    Policy::builder(Preset::Default).base(ms(200)).cap(ms(1000)).budget(ms(60_000)).max_attempts(6)
}

#[test]
fn the_backoff_doubles_then_caps() {
    let h = Harness::new();
    // No jitter: each wait is its ceiling.
    let p = doubling().jitter(Jitter::None).build().unwrap();
    let r = h.run(&p, Operation::Idempotent, &[Outcome::status(503); 10]);
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::Attempts));
    assert_eq!(h.sends(), 6);
    assert_eq!(h.sleeps(), [200, 400, 800, 1000, 1000]);
    // Full jitter drawn at the top stays just under each ceiling.
    let clock = FakeClock::default();
    let log = RefCell::default();
    let sends = RefCell::default();
    let p = doubling().jitter(Jitter::Full).build().unwrap();
    let mut runner = Runner::new(&p, Sleeps { clock: &clock, log: &log, cancel_during: None }, &clock, Top);
    let s = Scripted { outcomes: &[Outcome::status(503); 10], sends: &sends, clock: &clock, attempt_ms: 0 };
    let _ = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(log.borrow().as_slice(), &[199, 399, 799, 999, 999]);
}

#[test]
fn a_permanent_error_is_not_retried() {
    let h = Harness::new();
    let r = h.run(&doubling().build().unwrap(), Operation::Idempotent, &[Outcome::status(422), Outcome::Ok]);
    assert_eq!(r.unwrap_err().verdict, Verdict::Failed);
    assert_eq!((h.sends(), h.sleeps()), (1, vec![]));
}

#[test]
fn a_retry_after_past_max_retry_after_fails_at_once() {
    let h = Harness::new();
    let p = doubling().max_retry_after(ms(20_000)).build().unwrap();
    let r = h.run(&p, Operation::Idempotent, &[Outcome::status_after(429, Duration::from_secs(120)); 3]);
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: ms(120_000) }));
    assert!(h.sleeps().is_empty());
}

// ---- jitter: a fleet that failed together does not come back together ----

#[test]
fn twenty_workers_failing_at_once_do_not_retry_at_identical_gaps() {
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut schedules = Vec::new();
    for worker in 0..20u64 {
        let h = Harness::new();
        let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
        // An RNG seeded per device: one fixed RNG seed for the whole fleet would draw the same
        // waits everywhere.
        let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(0x9e37_79b9_7f4a_7c15 ^ (worker + 1)));
        let s = Scripted {
            outcomes: &[Outcome::status(503); 4],
            sends: &h.sends,
            clock: &h.clock,
            attempt_ms: 0,
        };
        let _ = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
        schedules.push(h.sleeps());
    }
    let mut first_gaps: Vec<u64> = schedules.iter().map(|s| s[0]).collect();
    first_gaps.sort_unstable();
    first_gaps.dedup();
    assert!(first_gaps.len() >= 15, "first gaps collide: {first_gaps:?}");
    let mut whole = schedules.clone();
    whole.sort();
    whole.dedup();
    assert_eq!(whole.len(), 20, "two workers share a schedule");
    // Equal jitter: every gap is at least half its ceiling (100 ms base, so ≥ 50 ms first).
    assert!(schedules.iter().all(|s| s[0] >= 50 && s[0] < 100));
}

#[test]
fn fleet_budget_holds_amplification_during_a_total_outage() {
    // gRPC A6 defaults: 10 tokens, 0.1 per success. A total outage: every attempt fails.
    let fleet = FleetBudget::new(10, 100).unwrap();
    let p = Policy::builder(Preset::Default).max_attempts(4).build().unwrap();
    let h = Harness::new();
    let calls = 200;
    for _ in 0..calls {
        let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
        let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(3)).fleet(&fleet);
        let s = Scripted {
            outcomes: &[Outcome::status(503); 4],
            sends: &h.sends,
            clock: &h.clock,
            attempt_ms: 0,
        };
        let _ = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    }
    let attempts = h.sends();
    // Without the budget: 4 attempts a call. With it: the bucket's start (half of 10 tokens)
    // and nothing more, since no success refills it.
    assert!(attempts <= calls + 5, "{attempts} attempts for {calls} calls");
    assert!(attempts > calls, "the bucket's start allows a few retries");
    // Later calls end throttled.
    assert_eq!(fleet.tokens_milli(), 0);
}

#[test]
fn fleet_budget_refills_with_successes() {
    let p = Policy::builder(Preset::Default).max_attempts(4).build().unwrap();
    // Eight calls that each fail once then succeed drain a 10-token bucket by 0.9 a call with
    // 0.1 back; with 1.0 back (ratio 1000) the successes pay for every failure.
    let run = |ratio: u32| {
        let fleet = FleetBudget::new(10, ratio).unwrap();
        let h = Harness::new();
        let mut throttled = 0;
        for i in 0..8 {
            let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
            let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(i + 1)).fleet(&fleet);
            let s = Scripted {
                outcomes: &[Outcome::status(503), Outcome::Ok],
                sends: &h.sends,
                clock: &h.clock,
                attempt_ms: 0,
            };
            if let Err(e) = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a))) {
                assert_eq!(e.verdict, Verdict::GaveUp(GiveUp::Throttled));
                throttled += 1;
            }
        }
        (fleet.tokens_milli(), throttled)
    };
    // 10 → 9.1 → 8.2 → 7.3 → 6.4 → 5.5, then the sixth failure leaves 4.5: throttled from then on.
    let (tokens, throttled) = run(100);
    assert_eq!(throttled, 3);
    assert!(tokens < 5_000, "{tokens}");
    // Refilled by every success: never throttled, and back at the maximum.
    assert_eq!(run(1000), (10_000, 0));
}

#[test]
fn cancelled_calls_end_with_a_cancelled_record() {
    let clock = FakeClock::default();
    let log = RefCell::default();
    let sends = RefCell::default();
    let token = CancelToken::new();
    let p = strict();
    let mut ledger = Ledger::<8>::new();
    let delay = Sleeps { clock: &clock, log: &log, cancel_during: Some(&token) };
    let mut runner = Runner::new(&p, delay, &clock, Xorshift(1)).cancel(&token).ledger(&mut ledger);
    let s = Scripted { outcomes: &[Outcome::status(503); 3], sends: &sends, clock: &clock, attempt_ms: 0 };
    let r = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap_err().verdict, Verdict::Cancelled);
    let recs: Vec<_> = ledger.records().copied().collect();
    assert_eq!(recs.len(), 2, "the attempt, then the cancel");
    assert_eq!((recs[1].attempt, recs[1].verdict), (1, Some(Verdict::Cancelled)));
    assert_eq!(recs[1].outcome, Outcome::Failure(Failure::Cancelled));
    assert_eq!(ledger.stats().calls(), 1);
    assert_eq!(ledger.stats().attempts(), 1, "the cancel sent nothing");
}

// ---- probes, streams, deadline, keys, ledger ----

struct FixedProbe {
    answer: Landed<u32>,
    asked: Cell<u32>,
}

impl Probe<u32> for &FixedProbe {
    fn landed(&mut self, key: Key) -> impl Future<Output = Landed<u32>> {
        assert_eq!(key, KEY);
        self.asked.set(self.asked.get() + 1);
        core::future::ready(self.answer)
    }
}

fn run_probe(answer: Landed<u32>, outcomes: &[Outcome]) -> (Result<u32, wary::Stopped>, usize, u32) {
    let h = Harness::new();
    let probe = FixedProbe { answer, asked: Cell::new(0) };
    let p = Policy::builder(Preset::Default).build().unwrap();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(5));
    let s = Scripted { outcomes, sends: &h.sends, clock: &h.clock, attempt_ms: 0 };
    let r = block_on(runner.call_with_probe(Operation::Write, KEY, |a| s.attempt(a), &probe));
    (r, h.sends(), probe.asked.get())
}

#[test]
fn unknown_that_landed_is_ok_with_no_resend() {
    let (r, sends, asked) =
        run_probe(Landed::Yes(77), &[Outcome::Failure(Failure::ResponseTimeout), Outcome::Ok]);
    assert_eq!((r.unwrap(), sends, asked), (77, 1, 1));
}

#[test]
fn unknown_that_did_not_land_is_resent_once() {
    let (r, sends, _) = run_probe(Landed::No, &[Outcome::Failure(Failure::ResponseTimeout), Outcome::Ok]);
    assert_eq!((r.unwrap(), sends), (2, 2));
    // A second ambiguous failure is not resent again.
    let (r, sends, asked) = run_probe(Landed::No, &[Outcome::Failure(Failure::ResponseTimeout); 4]);
    assert_eq!((r.unwrap_err().verdict, sends, asked), (Verdict::Unknown, 2, 2));
}

#[test]
fn unknown_the_probe_cannot_tell_stays_unknown() {
    let (r, sends, asked) = run_probe(Landed::Unknown, &[Outcome::status(502), Outcome::Ok]);
    assert_eq!((r.unwrap_err().verdict, sends, asked), (Verdict::Unknown, 1, 1));
}

#[test]
fn a_stream_that_forwarded_bytes_is_never_retried() {
    let h = Harness::new();
    let p = Policy::builder(Preset::Default).build().unwrap();
    let r = h.run(
        &p,
        Operation::Idempotent,
        &[Outcome::Failure(Failure::StreamBroken { forwarded: true }), Outcome::Ok],
    );
    assert_eq!((r.unwrap_err().verdict, h.sends()), (Verdict::Failed, 1));
    let h = Harness::new();
    let r = h.run(
        &p,
        Operation::Idempotent,
        &[Outcome::Failure(Failure::StreamBroken { forwarded: false }), Outcome::Ok],
    );
    assert_eq!((r.unwrap(), h.sends()), (2, 2));
}

#[test]
fn deadline_counts_attempt_time_and_no_sleep_starts_past_it() {
    let h = Harness::new();
    let p = Policy::builder(Preset::Default)
        .base(ms(100))
        .cap(ms(1000))
        .deadline(ms(1000))
        .min_attempt(ms(300))
        .build()
        .unwrap();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(9));
    let s =
        Scripted { outcomes: &[Outcome::status(503); 10], sends: &h.sends, clock: &h.clock, attempt_ms: 300 };
    let r = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::Deadline));
    // Every attempt started early enough to end (at 300 ms each) by the deadline.
    let sleeps: u64 = h.sleeps().iter().sum();
    assert!(sleeps + 300 * h.sends() as u64 <= 1000, "{:?} {}", h.sleeps(), h.sends());
    // Each attempt is told how long it has left: the first the whole deadline, later ones less
    // by the attempts and waits before them.
    let sent = h.sends.borrow();
    assert_eq!(sent[0].remaining, Some(ms(1000)));
    let mut spent = 300;
    for (a, wait) in sent.iter().skip(1).zip(h.sleeps()) {
        spent += wait;
        assert_eq!(a.remaining, Some(ms(1000 - spent)));
        spent += 300;
    }
    assert!(h.sends() >= 2);
}

#[test]
fn every_attempt_carries_the_same_key_and_the_ledger_has_one_record_each() {
    let h = Harness::new();
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut ledger = Ledger::<8>::new();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(11)).ledger(&mut ledger);
    let s = Scripted {
        outcomes: &[Outcome::status(503), Outcome::status_after(429, Duration::from_secs(1)), Outcome::Ok],
        sends: &h.sends,
        clock: &h.clock,
        attempt_ms: 5,
    };
    let r = block_on(runner.call(Operation::KeyedWrite, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap(), 3);
    assert!(h.sends.borrow().iter().all(|a| a.key == KEY && a.remaining.is_none()));
    assert_eq!(h.sends.borrow().iter().map(|a| a.number).collect::<Vec<_>>(), [1, 2, 3]);
    let recs: Vec<_> = ledger.records().copied().collect();
    assert_eq!(recs.len(), 3);
    assert_eq!(recs[1].outcome, Outcome::status_after(429, Duration::from_secs(1)));
    assert!(recs[1].wait >= ms(1000), "Retry-After raises the wait");
    assert_eq!(
        recs.iter().map(|r| u64::from(r.wait.as_millis())).sum::<u64>(),
        h.sleeps().iter().sum::<u64>()
    );
    assert_eq!(recs[2].verdict, Some(Verdict::Ok));
    assert!(recs[..2].iter().all(|r| r.verdict.is_none() && r.draw.is_some()));
    assert_eq!(recs[2].total_time, h.clock.now().duration_since(Instant::ZERO));
    assert_eq!(recs[0].policy, p.fingerprint());
    assert_eq!(ledger.stats().calls(), 1);
    assert_eq!(ledger.stats().mean_milli(), 3000);
}

#[test]
fn runner_future_is_small() {
    let clock = FakeClock::default();
    let log = RefCell::default();
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut runner =
        Runner::new(&p, Sleeps { clock: &clock, log: &log, cancel_during: None }, &clock, Xorshift(1));
    let fut = runner.call(Operation::Idempotent, KEY, |_| core::future::ready(Ok::<u32, Failure>(1)));
    let size = core::mem::size_of_val(&fut);
    println!("runner future for a typical call: {size} bytes");
    assert!(size < 1024, "{size}");
    drop(fut);
}

#[test]
fn a_resend_after_the_probe_obeys_the_fleet_budget_and_the_deadline() {
    // Throttled: the bucket is at its threshold, so the write stays unknown, never resent.
    let fleet = FleetBudget::new(2, 100).unwrap();
    let h = Harness::new();
    let probe = FixedProbe { answer: Landed::No, asked: Cell::new(0) };
    let p = Policy::builder(Preset::Default).build().unwrap();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(5)).fleet(&fleet);
    let s = Scripted {
        outcomes: &[Outcome::Failure(Failure::ResponseTimeout), Outcome::Ok],
        sends: &h.sends,
        clock: &h.clock,
        attempt_ms: 0,
    };
    let r = block_on(runner.call_with_probe(Operation::Write, KEY, |a| s.attempt(a), &probe));
    assert_eq!((r.unwrap_err().verdict, h.sends(), probe.asked.get()), (Verdict::Unknown, 1, 1));

    // Past the deadline once the probe has answered: not resent either.
    let h = Harness::new();
    struct SlowProbe<'a>(&'a FakeClock);
    impl Probe<u32> for SlowProbe<'_> {
        fn landed(&mut self, _: Key) -> impl Future<Output = Landed<u32>> {
            self.0.advance(900);
            core::future::ready(Landed::No)
        }
    }
    let p = Policy::builder(Preset::Default).deadline(ms(1_000)).min_attempt(ms(200)).build().unwrap();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(5));
    let s = Scripted {
        outcomes: &[Outcome::Failure(Failure::ResponseTimeout), Outcome::Ok],
        sends: &h.sends,
        clock: &h.clock,
        attempt_ms: 0,
    };
    let r = block_on(runner.call_with_probe(Operation::Write, KEY, |a| s.attempt(a), SlowProbe(&h.clock)));
    assert_eq!((r.unwrap_err().verdict, h.sends()), (Verdict::Unknown, 1));
}

#[test]
fn a_cancel_ends_a_probe_that_would_never_answer() {
    struct Stuck;
    impl Probe<u32> for Stuck {
        fn landed(&mut self, _: Key) -> impl Future<Output = Landed<u32>> {
            core::future::pending()
        }
    }
    let h = Harness::new();
    let token = CancelToken::new();
    let p = Policy::builder(Preset::Default).build().unwrap();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Xorshift(5)).cancel(&token);
    let s = Scripted {
        outcomes: &[Outcome::Failure(Failure::ResponseTimeout), Outcome::Ok],
        sends: &h.sends,
        clock: &h.clock,
        attempt_ms: 0,
    };
    let call = runner.call_with_probe(Operation::Write, KEY, |a| s.attempt(a), Stuck);
    let canceller = async {
        let mut polled = false;
        core::future::poll_fn(|cx| {
            if polled {
                Poll::Ready(())
            } else {
                polled = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await;
        token.cancel();
    };
    let (r, ()) = block_on(join(call, canceller));
    assert_eq!((r.unwrap_err().verdict, h.sends()), (Verdict::Cancelled, 1));
}

#[test]
fn a_give_up_that_depended_on_the_draw_records_the_draw() {
    // Budget 250 ms, base 100: with draws at the top the first wait is 99 ms and the second
    // (100..199 ms) does not fit at 199; at zero (100) it would. The record must say which draw.
    let p = Policy::builder(Preset::Default).base(ms(100)).cap(ms(1_000)).budget(ms(250)).build().unwrap();
    let h = Harness::new();
    let mut ledger = Ledger::<8>::new();
    let delay = Sleeps { clock: &h.clock, log: &h.sleeps, cancel_during: None };
    let mut runner = Runner::new(&p, delay, &h.clock, Top).ledger(&mut ledger);
    let s =
        Scripted { outcomes: &[Outcome::status(503); 4], sends: &h.sends, clock: &h.clock, attempt_ms: 0 };
    let r = block_on(runner.call(Operation::Idempotent, KEY, |a| s.attempt(a)));
    assert_eq!(r.unwrap_err().verdict, Verdict::GaveUp(GiveUp::Budget));
    let last = *ledger.last().unwrap();
    assert_eq!(last.draw, Some(wary::Draw::unit(u32::MAX)));
    // Replaying that decision with the recorded draw gives the same verdict; with a zero draw
    // it would not.
    let mut state = wary::CallState::new();
    let first = ledger.records().next().copied().unwrap();
    let _ = p.decide(&mut state, first.op, &first.outcome, first.draw.unwrap(), None);
    let mut zero = state;
    assert_eq!(
        p.decide(&mut state, last.op, &last.outcome, last.draw.unwrap(), None),
        wary::Decision::Done(Verdict::GaveUp(GiveUp::Budget))
    );
    assert!(matches!(
        p.decide(&mut zero, last.op, &last.outcome, wary::Draw::ZERO, None),
        wary::Decision::Retry { .. }
    ));
}

// ---- the send rate and the circuit breaker ----

/// One request/s assumed at the first throttle, no burst: a throttle leaves 0.5/s.
fn pace_settings() -> PaceSettings {
    PaceSettings { start_milli: 1_000, burst: 1, ..PaceSettings::DEVICE }
}

/// Runs calls on one runner with the given pace and breaker; each call's outcomes are scripted
/// and every send's time is recorded.
struct Paced {
    clock: FakeClock,
    sleeps: RefCell<Vec<u64>>,
    sent_at: RefCell<Vec<u64>>,
}

impl Paced {
    fn new() -> Self {
        Paced { clock: FakeClock::default(), sleeps: RefCell::default(), sent_at: RefCell::default() }
    }

    fn call(
        &self,
        runner: &mut Runner<'_, Sleeps<'_>, &FakeClock, Xorshift, wary::Never, (), impl wary::Endpoint>,
        outcomes: &[Outcome],
    ) -> Result<u32, wary::Stopped> {
        let attempt = |a: Attempt| {
            self.sent_at.borrow_mut().push(self.clock.0.get());
            let o = *outcomes.get((a.number - 1) as usize).unwrap_or(&Outcome::Ok);
            core::future::ready(match o {
                Outcome::Ok => Ok(a.number),
                Outcome::Failure(f) => Err(f),
            })
        };
        block_on(runner.call(Operation::Idempotent, KEY, attempt))
    }

    fn delay(&self) -> Sleeps<'_> {
        Sleeps { clock: &self.clock, log: &self.sleeps, cancel_during: None }
    }
}

#[test]
fn a_paced_runner_paces_first_attempts_and_a_plain_one_does_not() {
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut pace = Pace::new(pace_settings()).unwrap();
    // Throttled before these calls: 0.5/s, the next request placed 1 s ahead (lowest draw).
    pace.on_throttled(Instant::from_millis(0), wary::Draw::ZERO);
    let h = Paced::new();
    let mut runner = Runner::new(&p, h.delay(), &h.clock, Xorshift(1))
        .endpoint(Guards { pace: Some(&mut pace), breaker: None });
    for _ in 0..4 {
        assert_eq!(h.call(&mut runner, &[Outcome::Ok]), Ok(1));
    }
    let sent = h.sent_at.borrow().clone();
    // Each call's only attempt (a first attempt) waited for its token: the first at 1 s, then
    // at most one a second (the rate climbs back from 0.5/s toward 1/s).
    assert_eq!(sent[0], 1_000);
    assert!(sent.windows(2).all(|w| w[1] - w[0] >= 1_000), "{sent:?}");
    assert_eq!(h.sleeps().len(), 4, "one pace wait before each call's attempt");
    assert_eq!(h.sleeps().iter().sum::<u64>(), sent[3], "the clock moved only by the sleeps");
    assert!(!runner.endpoint_ref().pace.as_deref().unwrap().is_open());
    // The same calls without a pace go at once.
    let plain = Paced::new();
    let mut runner = Runner::new(&p, plain.delay(), &plain.clock, Xorshift(1));
    for _ in 0..4 {
        assert_eq!(plain.call(&mut runner, &[Outcome::Ok]), Ok(1));
    }
    assert_eq!(*plain.sent_at.borrow(), vec![0, 0, 0, 0]);
    assert!(plain.sleeps().is_empty());
}

#[test]
fn a_closure_is_a_clock_a_token_resets_and_a_stop_says_what_ended_the_call() {
    let clock = || Instant::from_millis(1_234);
    assert_eq!(Clock::now(&clock), Instant::from_millis(1_234));
    let token = CancelToken::new();
    token.cancel();
    assert!(wary::Cancel::is_cancelled(&token));
    token.reset();
    assert!(!wary::Cancel::is_cancelled(&token));
    let h = Harness::new();
    let stopped =
        h.run(&doubling().build().unwrap(), Operation::Idempotent, &[Outcome::status(503); 10]).unwrap_err();
    assert_eq!(stopped.to_string(), "gave_up (attempts) after 6 attempts, the last a status 503");
    let h = Harness::new();
    let p = Policy::builder(Preset::Default).max_attempts(1).build().unwrap();
    let stopped = h.run(&p, Operation::Idempotent, &[Outcome::Failure(Failure::Reset)]).unwrap_err();
    assert_eq!(stopped.to_string(), "gave_up (attempts) after 1 attempt, the last a reset");
}

#[test]
fn a_call_with_nothing_to_pace_or_break_draws_once_a_decision() {
    // The pace and the breaker take draws of their own; with neither, a call's waits are the
    // ones its decisions draw from the generator, in order, as a plain call's always were.
    let p = doubling().jitter(Jitter::Full).build().unwrap();
    let failing = [Outcome::status(503); 10];
    let mut rng = Xorshift(1);
    let mut state = wary::CallState::new();
    let expected: Vec<u64> = (0..5)
        .map(|_| {
            match p.decide(
                &mut state,
                Operation::Idempotent,
                &failing[0],
                wary::Draw::from_rng(&mut rng),
                None,
            ) {
                wary::Decision::Retry { wait } => u64::from(wait.as_millis()),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let plain = Paced::new();
    let mut runner = Runner::new(&p, plain.delay(), &plain.clock, Xorshift(1));
    assert!(plain.call(&mut runner, &failing).is_err());
    assert_eq!(plain.sleeps(), expected);
    let empty = Paced::new();
    let mut runner = Runner::new(&p, empty.delay(), &empty.clock, Xorshift(1)).endpoint(Guards::default());
    assert!(empty.call(&mut runner, &failing).is_err());
    assert_eq!(empty.sleeps(), expected);
}

impl Paced {
    fn sleeps(&self) -> Vec<u64> {
        self.sleeps.borrow().clone()
    }
}

#[test]
fn a_throttle_cuts_the_rate_and_the_retry_waits_for_the_pace_after_its_backoff() {
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut pace = Pace::new(pace_settings()).unwrap();
    let h = Paced::new();
    let mut runner = Runner::new(&p, h.delay(), &h.clock, Xorshift(7))
        .endpoint(Guards { pace: Some(&mut pace), breaker: None });
    // Open: the first attempt goes at once; its 429 cuts the rate to 0.5/s.
    assert_eq!(h.call(&mut runner, &[Outcome::status(429), Outcome::Ok]), Ok(2));
    let sent = h.sent_at.borrow().clone();
    let sleeps = h.sleeps();
    assert_eq!(sent[0], 0);
    // One sleep: the backoff's wait (equal jitter on 100 ms: 50..100), stretched to when the
    // pace lets the retry go: the first request after a cut goes between half an interval and
    // one and a half (1 s..3 s from the cut), far past the backoff's.
    assert_eq!(sleeps.len(), 1, "{sleeps:?}");
    assert!((1_000..=3_000).contains(&sent[1]), "{sent:?}");
    assert_eq!(sent[1], sleeps[0]);
    let pace = runner.endpoint_ref().pace.as_deref().unwrap();
    assert!(!pace.is_open());
    assert!(pace.rate_milli(Instant::from_millis(sent[1])).unwrap() < 1_000);
}

#[test]
fn a_breaker_opens_ends_calls_at_once_lets_one_probe_through_and_closes() {
    let p = Policy::builder(Preset::Default).build().unwrap();
    let mut breaker = Breaker::new(BreakerSettings::DEVICE).unwrap();
    let mut pace = Pace::new(pace_settings()).unwrap();
    let h = Paced::new();
    let mut runner =
        Runner::new(&p, h.delay(), &h.clock, Xorshift(3)).endpoint(Guards::new(&mut pace, &mut breaker));
    let refused = Outcome::Failure(Failure::Refused);
    // Two refused connections open it; the call's third attempt meets it open.
    let r = h.call(&mut runner, &[refused, refused, refused]).unwrap_err();
    assert_eq!((r.verdict, r.attempts), (Verdict::GaveUp(GiveUp::CircuitOpen), 2));
    assert_eq!(h.sent_at.borrow().len(), 2);
    let Some(BreakerState::Open { until, trips: 1 }) =
        runner.endpoint_ref().breaker.as_deref().map(Breaker::state)
    else {
        panic!("{:?}", runner.endpoint_ref())
    };
    // The pace, open until now, reads the breaker's opening as an outage: paced from here.
    let pace = *runner.endpoint_ref().pace.as_deref().unwrap();
    assert!(pace.in_outage() && !pace.is_open());
    // The next call ends at once: no attempt, no sleep.
    let before = h.sleeps().len();
    let r = h.call(&mut runner, &[Outcome::Ok]).unwrap_err();
    assert_eq!((r.verdict, r.attempts, r.last), (Verdict::GaveUp(GiveUp::CircuitOpen), 0, None));
    assert_eq!((h.sent_at.borrow().len(), h.sleeps().len()), (2, before));
    // When the open time and the pace's wait are over (an outbox waits for the pace between
    // calls), one probe goes; it fails, and the breaker opens for longer. The pace is not cut
    // again: it reads the same outage.
    let ready = |until: Instant, pace: &Pace| {
        let now = Instant::from_millis(h.clock.0.get());
        until.as_millis().max(now.as_millis() + u64::from(pace.view(now).wait().as_millis()))
    };
    h.clock.0.set(ready(until, &pace));
    let r = h.call(&mut runner, &[refused, Outcome::Ok]).unwrap_err();
    assert_eq!((r.verdict, r.attempts), (Verdict::GaveUp(GiveUp::CircuitOpen), 1));
    let Some(BreakerState::Open { until, trips: 2 }) =
        runner.endpoint_ref().breaker.as_deref().map(Breaker::state)
    else {
        panic!("{:?}", runner.endpoint_ref())
    };
    let after_probe = *runner.endpoint_ref().pace.as_deref().unwrap();
    assert!(after_probe.in_outage());
    let now = Instant::from_millis(h.clock.0.get());
    assert_eq!(after_probe.rate_milli(now), pace.rate_milli(now));
    // The next probe succeeds: closed, and the pace starts again from its outage, paced.
    h.clock.0.set(ready(until, &after_probe));
    assert_eq!(h.call(&mut runner, &[Outcome::Ok]), Ok(1));
    assert_eq!(
        runner.endpoint_ref().breaker.as_deref().unwrap().state(),
        BreakerState::Closed { failures: 0 }
    );
    let pace = runner.endpoint_ref().pace.as_deref().unwrap();
    assert!(!pace.is_open() && !pace.in_outage());
    assert_eq!(h.sent_at.borrow().len(), 4);
}

#[test]
fn a_throttle_does_not_open_the_breaker() {
    let p = Policy::builder(Preset::Default).max_attempts(5).build().unwrap();
    let mut breaker = Breaker::new(BreakerSettings::DEVICE).unwrap();
    let h = Paced::new();
    let mut runner = Runner::new(&p, h.delay(), &h.clock, Xorshift(5))
        .endpoint(Guards { pace: None, breaker: Some(&mut breaker) });
    let busy = Outcome::status(503);
    let r = h.call(&mut runner, &[busy, busy, busy, busy, busy]).unwrap_err();
    assert_eq!((r.verdict, r.attempts), (Verdict::GaveUp(GiveUp::Attempts), 5));
    assert_eq!(
        runner.endpoint_ref().breaker.as_deref().unwrap().state(),
        BreakerState::Closed { failures: 0 }
    );
}

#[test]
fn a_pace_wait_the_budget_or_the_deadline_cannot_pay_ends_the_call_unsent() {
    // At the floor (0.01/s), the next request is 50 s to 150 s away.
    let mut slow = Pace::new(PaceSettings { start_milli: 10, ..pace_settings() }).unwrap();
    slow.on_throttled(Instant::from_millis(0), wary::Draw::ZERO);
    assert_eq!(slow.clone().acquire(Instant::from_millis(0)), Err(ms(50_000)));
    let cases = [
        (Policy::builder(Preset::Default).budget(ms(10_000)).build().unwrap(), GiveUp::Budget),
        (
            Policy::builder(Preset::Default).budget(ms(100_000)).deadline(ms(20_000)).build().unwrap(),
            GiveUp::Deadline,
        ),
    ];
    for (p, why) in cases {
        let mut pace = slow;
        let h = Paced::new();
        let mut runner = Runner::new(&p, h.delay(), &h.clock, Xorshift(9))
            .endpoint(Guards { pace: Some(&mut pace), breaker: None });
        let r = h.call(&mut runner, &[Outcome::Ok]).unwrap_err();
        assert_eq!((r.verdict, r.attempts), (Verdict::GaveUp(why), 0));
        assert!(h.sleeps().is_empty(), "no sleep past what the call may spend");
        assert!(h.sent_at.borrow().is_empty());
    }
    // A budget that can pay for it waits, and the wait counts: 50 s of a 60 s budget leaves
    // too little for a 20 s Retry-After.
    let p = Policy::builder(Preset::Default).budget(ms(60_000)).build().unwrap();
    let mut pace = slow;
    let h = Paced::new();
    let mut runner = Runner::new(&p, h.delay(), &h.clock, Xorshift(9))
        .endpoint(Guards { pace: Some(&mut pace), breaker: None });
    let asked = Outcome::status_after(503, Duration::from_secs(20));
    let r = h.call(&mut runner, &[asked, Outcome::Ok]).unwrap_err();
    assert_eq!(h.sleeps(), vec![50_000]);
    assert_eq!(r.attempts, 1);
    // Uncharged, 60 s would have paid for the 20 s and the call would have retried.
    assert_eq!(r.verdict, Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: ms(20_000) }));
}
