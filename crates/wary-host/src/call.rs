//! One call driven by someone else's loop: a tower `Retry` service or a reqwest middleware
//! sends each attempt and asks after it, so they cannot hand the loop to the core's runner.
//! [`Adapter`] holds what the calls share (the policy, the rate-limit signals, a fleet budget,
//! a ledger, the draws, the clock); [`Call`] holds one call's state and asks the core's
//! [`Policy::decide_with_fleet`] after each attempt, writing the same ledger record the runner
//! writes. There is one decision, the core's; this module only carries it across attempts.
//!
//! The policy must count milliseconds (`tick_hz` 1000): the adapters' clock and sleeps do, and
//! [`Adapter::new`] refuses any other rate with [`TickRateError`].

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, StatusCode};
use rand::rngs::StdRng;
use wary::ledger::{Record, Sink};
use wary::{CallState, Class, Decision, Draw, FleetBudget, Key, Operation, Outcome, Policy, Verdict};

use crate::ratelimit::Signals;
use crate::time::{MonotonicClock, WallClock};

/// A ledger shared by every call of an adapter.
pub type SharedSink = Arc<Mutex<dyn Sink + Send>>;

/// A fleet retry budget shared with other users: behind an `Arc`, or a `static` that the
/// core's runner and the adapters can all borrow.
#[derive(Debug, Clone)]
pub enum Fleet {
    /// Shared by reference count.
    Shared(Arc<FleetBudget>),
    /// A `static` (or leaked) budget.
    Static(&'static FleetBudget),
}

impl Deref for Fleet {
    type Target = FleetBudget;
    fn deref(&self) -> &FleetBudget {
        match self {
            Fleet::Shared(a) => a,
            Fleet::Static(s) => s,
        }
    }
}

impl From<Arc<FleetBudget>> for Fleet {
    fn from(a: Arc<FleetBudget>) -> Self {
        Fleet::Shared(a)
    }
}

impl From<&'static FleetBudget> for Fleet {
    fn from(s: &'static FleetBudget) -> Self {
        Fleet::Static(s)
    }
}

/// The policy does not count milliseconds: the adapters' clock and sleeps do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the adapter's policy must count milliseconds (tick_hz 1000), not {0} ticks per second")]
pub struct TickRateError(pub u32);

/// The operation of a request under `policy` ([`Policy::operation`]: its method and whether it
/// carries an idempotency key), and its ledger key: a keyed write's own key (hex keys as is,
/// others hashed); for other requests a key from method and path, never from the body.
pub fn operation_and_key(
    policy: &Policy,
    method: &str,
    path: &str,
    key: Option<&http::HeaderValue>,
) -> (Operation, Key) {
    let op = policy.operation(method, key.is_some());
    let key = match key {
        Some(v) => v.to_str().ok().and_then(Key::from_hex).unwrap_or_else(|| Key::from_payload(v.as_bytes())),
        None => Key::from_payload(format!("{method} {path}").as_bytes()),
    };
    (op, key)
}

/// What the calls of one adapter share. Clones share the fleet budget, the ledger and the draws.
#[derive(Clone)]
pub struct Adapter {
    policy: Policy,
    signals: Signals,
    fleet: Option<Fleet>,
    ledger: Option<SharedSink>,
    rng: Arc<Mutex<StdRng>>,
    clock: MonotonicClock,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("policy", &self.policy)
            .field("signals", &self.signals)
            .field("fleet", &self.fleet)
            .field("ledger", &self.ledger.is_some())
            .finish()
    }
}

impl Adapter {
    /// For `policy`, with draws from a generator split from the process's own. A policy whose
    /// `tick_hz` is not 1000 is refused.
    pub fn new(policy: Policy) -> Result<Self, TickRateError> {
        Self::with_rng(policy, crate::draw::for_call())
    }

    /// With an explicit generator (tests, replays).
    pub fn with_rng(policy: Policy, rng: StdRng) -> Result<Self, TickRateError> {
        if policy.tick_hz() != 1000 {
            return Err(TickRateError(policy.tick_hz()));
        }
        Ok(Adapter {
            policy,
            signals: Signals::NONE,
            fleet: None,
            ledger: None,
            rng: Arc::new(Mutex::new(rng)),
            clock: MonotonicClock::new(),
        })
    }

    /// Shares a fleet retry budget (an `Arc` or a `&'static`).
    pub fn fleet(mut self, fleet: impl Into<Fleet>) -> Self {
        self.fleet = Some(fleet.into());
        self
    }

    /// Writes one ledger record per attempt.
    pub fn ledger(mut self, ledger: SharedSink) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// Reads these rate-limit headers beside Retry-After ([`crate::ratelimit`]).
    pub fn signals(mut self, signals: Signals) -> Self {
        self.signals = signals;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The outcome of a response under the policy and its signals, the wall clock read here.
    pub fn outcome(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        crate::http::outcome_with(&self.policy, &self.signals, status, headers, WallClock.unix_secs())
    }

    /// A call starting now.
    pub fn begin(&self) -> Call {
        let now = self.now();
        Call { state: CallState::new(), started: now, attempt_started: now }
    }

    fn now(&self) -> u64 {
        // Milliseconds: the tick rate was checked when the adapter was made.
        self.clock.millis()
    }

    fn draw(&self) -> Draw {
        let mut r = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        Draw::from_rng(&mut *r)
    }

    /// Writes a record to the ledger, if any.
    pub fn record(&self, record: &Record) {
        if let Some(l) = &self.ledger {
            l.lock().unwrap_or_else(|e| e.into_inner()).record(record);
        }
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Wait this many milliseconds, then send again.
    Retry {
        /// The wait, milliseconds.
        wait_ms: u64,
    },
    /// The call is over.
    Done(Verdict),
}

/// One call's state across its attempts.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    state: CallState,
    started: u64,
    attempt_started: u64,
}

impl Default for Call {
    fn default() -> Self {
        Call { state: CallState::new(), started: 0, attempt_started: 0 }
    }
}

impl Call {
    /// Attempts decided so far.
    pub fn attempts(&self) -> u32 {
        self.state.attempts()
    }

    /// Marks an attempt's start (restarting the call's clock before the first); returns the
    /// milliseconds left before the call's deadline, `None` without one.
    pub fn start_attempt(&mut self, adapter: &Adapter) -> Option<u64> {
        let now = adapter.now();
        if self.state.attempts() == 0 {
            self.started = now;
        }
        self.attempt_started = now;
        let elapsed = now.saturating_sub(self.started);
        adapter.policy.deadline().map(|d| d.saturating_sub(elapsed))
    }

    /// Decides after one attempt with the core's decision and writes its ledger record.
    pub fn after(&mut self, adapter: &Adapter, op: Operation, key: Key, outcome: Outcome) -> Step {
        self.after_capped(adapter, op, key, outcome, false)
    }

    /// As [`Call::after`], for an attempt that cannot be sent again (a body that cannot be
    /// copied): a retry the policy would make ends the call `gave_up (attempts)` instead, as
    /// if the attempt cap were one.
    pub fn after_last(&mut self, adapter: &Adapter, op: Operation, key: Key, outcome: Outcome) -> Step {
        self.after_capped(adapter, op, key, outcome, true)
    }

    fn after_capped(
        &mut self,
        adapter: &Adapter,
        op: Operation,
        key: Key,
        outcome: Outcome,
        last: bool,
    ) -> Step {
        let t1 = adapter.now();
        let draw = adapter.draw();
        let elapsed = t1.saturating_sub(self.started);
        let number = self.state.attempts().saturating_add(1);
        let (class, decision) = adapter.policy.decide_with_fleet(
            &mut self.state,
            op,
            &outcome,
            draw,
            Some(elapsed),
            adapter.fleet.as_deref(),
        );
        let step = match decision {
            Decision::Retry { .. } if last => Step::Done(Verdict::GaveUp(wary::GiveUp::Attempts)),
            Decision::Retry { wait } => Step::Retry { wait_ms: wait },
            Decision::Done(v) => Step::Done(v),
        };
        adapter.record(&Record {
            key,
            attempt: number,
            op,
            outcome,
            class,
            // As the runner does: whenever a wait was computed the draw decided it.
            draw: (class == Class::Retry).then_some(draw),
            wait: match step {
                Step::Retry { wait_ms } => wait_ms,
                Step::Done(_) => 0,
            },
            attempt_ticks: t1.saturating_sub(self.attempt_started),
            total_ticks: elapsed,
            verdict: match step {
                Step::Done(v) => Some(v),
                Step::Retry { .. } => None,
            },
            policy: adapter.policy.fingerprint(),
        });
        step
    }
}

#[cfg(test)]
mod tests {
    use wary::ledger::Ledger;
    use wary::{GiveUp, Preset};

    use super::*;

    static STATIC_FLEET: FleetBudget = match FleetBudget::new(10, 100) {
        Ok(f) => f,
        Err(_) => panic!("a valid fleet budget"),
    };

    #[test]
    fn a_last_attempt_never_retries_and_the_ledger_says_why() {
        let policy = Policy::builder(Preset::Default).base(10).cap(40).deadline(5_000).build().unwrap();
        let ledger = Arc::new(Mutex::new(Ledger::<8>::new()));
        let a = Adapter::with_rng(policy, crate::draw::seeded(1)).unwrap().ledger(ledger.clone());
        let (op, key) = operation_and_key(&policy, "POST", "/x", Some(&http::HeaderValue::from_static("k")));
        assert_eq!(op, Operation::KeyedWrite);
        let mut call = a.begin();
        let left = call.start_attempt(&a).unwrap();
        assert!(left <= 5_000 && left > 4_000, "{left}");
        // The same 503 is a retry for an attempt that can be resent, and ends the call for one
        // that cannot.
        assert!(matches!(call.clone().after(&a, op, key, Outcome::status(503)), Step::Retry { .. }));
        let step = call.after_last(&a, op, key, Outcome::status(503));
        assert_eq!(step, Step::Done(Verdict::GaveUp(GiveUp::Attempts)));
        let last = ledger.lock().unwrap().records().last().copied().unwrap();
        assert_eq!(last.verdict, Some(Verdict::GaveUp(GiveUp::Attempts)));
        assert_eq!(last.wait, 0);
        // An unkeyed write's key comes from method and path, never the body.
        let (op, k1) = operation_and_key(&policy, "POST", "/x", None);
        assert_eq!(op, Operation::Write);
        assert_eq!(k1, operation_and_key(&policy, "POST", "/x", None).1);
        assert_ne!(k1, operation_and_key(&policy, "POST", "/y", None).1);
    }

    #[test]
    fn a_fleet_is_an_arc_or_a_static_and_both_are_charged() {
        let shared = Arc::new(FleetBudget::new(10, 100).unwrap());
        let policy = Policy::builder(Preset::Default).build().unwrap();
        for fleet in [Fleet::from(shared.clone()), Fleet::from(&STATIC_FLEET)] {
            let a = Adapter::with_rng(policy, crate::draw::seeded(2)).unwrap().fleet(fleet.clone());
            let mut call = a.begin();
            call.start_attempt(&a);
            let before = fleet.tokens_milli();
            let _ = call.after(&a, Operation::Read, Key::from_parts(1, 1, 1), Outcome::status(503));
            assert_eq!(fleet.tokens_milli(), before - 1_000);
        }
        assert_eq!(shared.tokens_milli(), 9_000);
        assert_eq!(STATIC_FLEET.tokens_milli(), 9_000);
        assert!(
            Adapter::new(Policy::builder(Preset::Default).tick_hz(10).base(1).cap(2).build().unwrap())
                .is_err()
        );
    }
}
