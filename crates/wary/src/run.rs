//! The async runner: wary's decisions as a retry loop, with every effect injected.
//!
//! The runner takes the wait from an `embedded_hal_async::delay::DelayNs`, the time from a
//! [`Clock`], the draws from a `rand_core::RngCore`, a [`Cancel`] signal, and optionally a
//! [`FleetBudget`] and a ledger [`Sink`]: nothing global, nothing sleeps that a test cannot
//! record. The same code runs on embassy firmware and, through the host adapters, on tokio.
//!
//! - The idempotency key is made by the caller once, before the first attempt, and handed to
//!   every attempt.
//! - Cancellation is checked before sending, after receiving (a response that arrives after a
//!   cancel is not accepted), before sleeping and after sleeping; a cancel during a wait ends
//!   the wait at once, and the next request is never sent. A cancel cannot roll back a request
//!   already sent.
//! - A retry refused by the fleet budget ends `gave_up` (throttled).
//! - With an [`Endpoint`]'s [`Pace`] (off unless given: [`Runner::endpoint`]), every attempt, the first included, waits for the send
//!   rate's token, through the same delay and cancel checks as a backoff wait; a pace wait that
//!   would pass the wait budget or the deadline ends the call `gave_up` (budget or deadline).
//!   With its [`Breaker`], a call that meets it open ends at once `gave_up` (circuit_open),
//!   with no attempt. Every attempt's outcome is reported to both ([`Attempts::report`]).
//!   A retry is asked about at the instant its backoff wait ends, before its record is written:
//!   one they refuse ends the call there, and that record carries the verdict. A call they end
//!   before its first attempt writes no record (see docs/pacing.md).
//! - An `unknown` (a write that may have landed) goes to the caller's [`Probe`]: landed → ok
//!   with no resend; not landed → one resend, counted as a retry; still unknown → `unknown`.
//!   Never a blind resend.

use core::future::Future;
use core::pin::pin;
use core::task::Poll;

use atomic_waker::AtomicWaker;
use embassy_futures::select::{Either, select};
use embedded_hal_async::delay::DelayNs;
use portable_atomic::{AtomicBool, Ordering};
use rand_core::RngCore;

use crate::backoff::Draw;
#[cfg(doc)]
use crate::breaker::Breaker;
use crate::classify::{Failure, Operation, Outcome};
use crate::decide::{Decision, Verdict};
use crate::key::Key;
use crate::ledger::Sink;
#[cfg(doc)]
use crate::pace::Pace;
use crate::policy::Policy;
use crate::step::{Attempts, Endpoint};
use crate::throttle::FleetBudget;
use crate::time::{Duration, Instant};

/// A monotonic clock. Any closure returning an [`Instant`] is one.
///
/// ```
/// use wary::{Clock, Instant};
/// let fixed = || Instant::from_millis(42);
/// assert_eq!(fixed.now(), Instant::from_millis(42));
/// ```
pub trait Clock {
    /// The time now.
    fn now(&self) -> Instant;
}

impl<F: Fn() -> Instant> Clock for F {
    fn now(&self) -> Instant {
        self()
    }
}

/// `embassy_time::Instant::now()`.
#[cfg(feature = "embassy-time")]
#[cfg_attr(docsrs, doc(cfg(all(feature = "runner", feature = "embassy-time"))))]
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EmbassyClock;

#[cfg(feature = "embassy-time")]
impl Clock for EmbassyClock {
    fn now(&self) -> Instant {
        embassy_time::Instant::now().into()
    }
}

/// A cancel signal.
pub trait Cancel {
    /// True once the call is cancelled.
    fn is_cancelled(&self) -> bool;
    /// Completes when the call is cancelled.
    fn cancelled(&self) -> impl Future<Output = ()>;
}

impl<X: Cancel + ?Sized> Cancel for &X {
    fn is_cancelled(&self) -> bool {
        (**self).is_cancelled()
    }
    fn cancelled(&self) -> impl Future<Output = ()> {
        (**self).cancelled()
    }
}

/// A signal that never fires.
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Never;

impl Cancel for Never {
    fn is_cancelled(&self) -> bool {
        false
    }
    fn cancelled(&self) -> impl Future<Output = ()> {
        core::future::pending()
    }
}

/// A cancel signal that can be set from another task or an interrupt: lock-free, `no_std`.
#[derive(Debug, Default)]
pub struct CancelToken {
    flag: AtomicBool,
    waker: AtomicWaker,
}

#[cfg(feature = "defmt")]
impl defmt::Format for CancelToken {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "CancelToken {{ cancelled: {=bool} }}", self.is_cancelled());
    }
}

impl CancelToken {
    /// A token not yet cancelled.
    pub const fn new() -> Self {
        CancelToken { flag: AtomicBool::new(false), waker: AtomicWaker::new() }
    }

    /// Cancels, waking a runner that waits.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Clears the signal for the next call.
    pub fn reset(&self) {
        self.flag.store(false, Ordering::Release);
    }
}

impl Cancel for CancelToken {
    fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
    fn cancelled(&self) -> impl Future<Output = ()> {
        core::future::poll_fn(|cx| {
            // Register before checking, so a cancel between the two still wakes us.
            self.waker.register(cx.waker());
            if self.flag.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }
        })
    }
}

/// What one attempt is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Attempt {
    /// The attempt number, from 1.
    pub number: u32,
    /// The call's idempotency key: send it on every attempt.
    pub key: Key,
    /// Time left before the call's deadline as this attempt starts (`None` without a
    /// deadline): an attempt caps its own timeout to it, so a slow answer cannot hold the call
    /// past its deadline.
    pub remaining: Option<Duration>,
}

/// What a probe found out about a write that may have landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Landed<T> {
    /// It landed; here is its result.
    Yes(T),
    /// It did not land: one resend is safe.
    No,
    /// The probe could not tell: surface it to a person.
    Unknown,
}

/// A read that checks whether a write landed (for a payment, fetching the invoice it paid).
pub trait Probe<T> {
    /// Checks the call with this key.
    fn landed(&mut self, key: Key) -> impl Future<Output = Landed<T>>;
}

/// No probe: an `unknown` stays unknown.
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NoProbe;

impl<T> Probe<T> for NoProbe {
    fn landed(&mut self, _: Key) -> impl Future<Output = Landed<T>> {
        core::future::ready(Landed::Unknown)
    }
}

/// Why a call returned no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stopped {
    /// The verdict (never `Ok`).
    pub verdict: Verdict,
    /// Attempts sent.
    pub attempts: u32,
    /// How the last attempt failed, if any was sent.
    pub last: Option<Failure>,
}

impl core::fmt::Display for Stopped {
    /// `gave_up (budget) after 3 attempts, the last a status 503`: names and numbers only.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} after {} attempt{}",
            self.verdict,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" }
        )?;
        match self.last {
            Some(Failure::Status { code, .. }) => write!(f, ", the last a status {code}"),
            Some(other) => write!(f, ", the last a {}", other.name()),
            None => Ok(()),
        }
    }
}

impl core::error::Error for Stopped {}

/// The retry loop, holding its effects.
pub struct Runner<'a, D, C, R, X = Never, L = (), E = ()> {
    policy: &'a Policy,
    delay: D,
    clock: C,
    rng: R,
    cancel: X,
    fleet: Option<&'a FleetBudget>,
    ledger: L,
    endpoint: E,
}

impl<'a, D: DelayNs, C: Clock, R: RngCore> Runner<'a, D, C, R> {
    /// A runner with no cancel signal, no fleet budget, no ledger, no pace and no breaker.
    pub fn new(policy: &'a Policy, delay: D, clock: C, rng: R) -> Self {
        Runner { policy, delay, clock, rng, cancel: Never, fleet: None, ledger: (), endpoint: () }
    }
}

impl<'a, D: DelayNs, C: Clock, R: RngCore, X: Cancel, L: Sink, E: Endpoint> Runner<'a, D, C, R, X, L, E> {
    /// With a cancel signal.
    pub fn cancel<X2: Cancel>(self, cancel: X2) -> Runner<'a, D, C, R, X2, L, E> {
        let Runner { policy, delay, clock, rng, fleet, ledger, endpoint, .. } = self;
        Runner { policy, delay, clock, rng, cancel, fleet, ledger, endpoint }
    }

    /// With a fleet retry budget shared with other runners.
    pub fn fleet(mut self, fleet: &'a FleetBudget) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// With the endpoint's send rate and circuit breaker ([`Guards`](crate::Guards) for ones
    /// this task owns): the pace is asked before every attempt and the breaker before every
    /// call's attempts, and both are told every outcome.
    pub fn endpoint<E2: Endpoint>(self, endpoint: E2) -> Runner<'a, D, C, R, X, L, E2> {
        let Runner { policy, delay, clock, rng, cancel, fleet, ledger, .. } = self;
        Runner { policy, delay, clock, rng, cancel, fleet, ledger, endpoint }
    }

    /// The endpoint, to read its pace and breaker back.
    pub fn endpoint_ref(&self) -> &E {
        &self.endpoint
    }

    /// The endpoint, to consult its pace between calls (an outbox that waits for the pace
    /// before a call, so the call's wait budget is left for its retries).
    pub fn endpoint_mut(&mut self) -> &mut E {
        &mut self.endpoint
    }

    /// With a ledger.
    pub fn ledger<L2: Sink>(self, ledger: L2) -> Runner<'a, D, C, R, X, L2, E> {
        let Runner { policy, delay, clock, rng, cancel, fleet, endpoint, .. } = self;
        Runner { policy, delay, clock, rng, cancel, fleet, ledger, endpoint }
    }

    /// The ledger, to read it back.
    pub fn ledger_ref(&self) -> &L {
        &self.ledger
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        self.policy
    }

    /// Runs one call with no probe: `attempt` is called with the attempt number and the key,
    /// and returns the value or how it failed.
    pub async fn call<T, F, Fut>(&mut self, op: Operation, key: Key, attempt: F) -> Result<T, Stopped>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.call_with_probe(op, key, attempt, NoProbe).await
    }

    /// Runs one call; an `unknown` is handed to `probe`.
    pub async fn call_with_probe<T, F, Fut, P>(
        &mut self,
        op: Operation,
        key: Key,
        mut attempt: F,
        mut probe: P,
    ) -> Result<T, Stopped>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
        P: Probe<T>,
    {
        let mut call = Attempts::new(self.clock.now());
        let mut resent = false;
        let mut admitted = false;
        let mut last: Option<Failure> = None;
        let (policy, fleet) = (self.policy, self.fleet);
        loop {
            // Before sending.
            if self.cancel.is_cancelled() {
                return Err(self.cancelled_call(key, op, &call, last));
            }
            // The breaker and the send rate, before every attempt: here before the first (and a
            // resend after a probe), at the instant its wait ends for a retry (below).
            if !admitted && self.endpoint.is_active() {
                match call.admit_at(&mut self.endpoint, policy, self.clock.now()) {
                    Ok(Duration::ZERO) => {}
                    Ok(wait) => {
                        let sleep = self.delay.delay_ms(wait.as_millis());
                        let woke = select(pin!(sleep), pin!(self.cancel.cancelled())).await;
                        if let Either::Second(()) = woke {
                            return Err(self.cancelled_call(key, op, &call, last));
                        }
                        if self.cancel.is_cancelled() {
                            return Err(self.cancelled_call(key, op, &call, last));
                        }
                    }
                    // Nothing sent: no record (see docs/pacing.md).
                    Err(why) => return Err(stopped(Verdict::GaveUp(why), &call, last)),
                }
            }
            admitted = false;
            let number = call.number();
            let remaining = call.start(policy, self.clock.now());
            let result = attempt(Attempt { number, key, remaining }).await;
            let t1 = self.clock.now();
            // After receiving: a response that arrives after a cancel is not accepted.
            let (outcome, value) = match result {
                _ if self.cancel.is_cancelled() => (Outcome::Failure(Failure::Cancelled), None),
                Ok(v) => (Outcome::Ok, Some(v)),
                Err(f) => (Outcome::Failure(f), None),
            };
            last = outcome.failure().copied();
            let draw = Draw::from_rng(&mut self.rng);
            if self.endpoint.is_active() {
                // A draw of their own: a plain call's draws stay as they were.
                let draw = Draw::from_rng(&mut self.rng);
                self.endpoint.report(&outcome, draw, t1);
            }
            let (decision, record) = call.end(policy, fleet, op, key, outcome, draw, t1);
            match decision {
                Decision::Retry { mut wait } => {
                    if self.endpoint.is_active() {
                        // Asked for the instant the backoff wait ends: a retry it refuses ends
                        // the call here, and the record says so.
                        let at =
                            Instant::from_millis(t1.as_millis().saturating_add(u64::from(wait.as_millis())));
                        match call.admit_at(&mut self.endpoint, policy, at) {
                            Ok(more) => wait = wait.saturating_add(more),
                            Err(why) => {
                                self.ledger.record(&call.refused(record, why));
                                return Err(stopped(Verdict::GaveUp(why), &call, last));
                            }
                        }
                        admitted = true;
                    }
                    self.ledger.record(&record);
                    // Before sleeping.
                    if self.cancel.is_cancelled() {
                        return Err(self.cancelled_call(key, op, &call, last));
                    }
                    let sleep = self.delay.delay_ms(wait.as_millis());
                    let woke = select(pin!(sleep), pin!(self.cancel.cancelled())).await;
                    if let Either::Second(()) = woke {
                        return Err(self.cancelled_call(key, op, &call, last));
                    }
                    // After sleeping: checked at the top of the loop, before the next send.
                }
                Decision::Done(Verdict::Ok) => {
                    self.ledger.record(&record);
                    if let Some(v) = value {
                        return Ok(v);
                    }
                    return Err(stopped(Verdict::Failed, &call, last));
                }
                Decision::Done(Verdict::Unknown) => {
                    // The probe is raced against the cancel signal like any wait.
                    let raced = select(pin!(probe.landed(key)), pin!(self.cancel.cancelled())).await;
                    let landed = match raced {
                        Either::First(landed) => landed,
                        Either::Second(()) => {
                            self.ledger.record(&record.with_verdict(None));
                            return Err(self.cancelled_call(key, op, &call, last));
                        }
                    };
                    match landed {
                        Landed::Yes(v) => {
                            self.ledger.record(&record.with_verdict(Some(Verdict::Ok)));
                            return Ok(v);
                        }
                        // Confirmed not landed: one resend, counted as a retry, so the decision's
                        // stop rules for a retry decide it (the probe's time counted).
                        Landed::No if !resent && call.may_resend(policy, fleet, self.clock.now()) => {
                            resent = true;
                            self.ledger.record(&record.with_verdict(None));
                        }
                        Landed::No | Landed::Unknown => {
                            self.ledger.record(&record);
                            return Err(stopped(Verdict::Unknown, &call, last));
                        }
                    }
                }
                Decision::Done(verdict) => {
                    self.ledger.record(&record);
                    return Err(stopped(verdict, &call, last));
                }
            }
        }
    }
}

impl<D: DelayNs, C: Clock, R: RngCore, X: Cancel, L: Sink, E: Endpoint> Runner<'_, D, C, R, X, L, E> {
    /// Ends a cancelled call: its last ledger record says so, carrying the attempts sent.
    fn cancelled_call(&mut self, key: Key, op: Operation, call: &Attempts, last: Option<Failure>) -> Stopped {
        self.ledger.record(&call.cancelled(self.policy, op, key, self.clock.now()));
        stopped(Verdict::Cancelled, call, last)
    }
}

fn stopped(verdict: Verdict, call: &Attempts, last: Option<Failure>) -> Stopped {
    Stopped { verdict, attempts: call.attempts(), last }
}
