//! One call driven by someone else's loop: a tower `Retry` service or a reqwest middleware
//! sends each attempt and asks after it, so they cannot hand the loop to the core's runner.
//! [`Adapter`] holds what the calls share (the policy, the rate-limit signals, a fleet budget,
//! a ledger, the draws, the clock); [`Call`] holds one call's core attempt step
//! ([`Attempts`]), the same the core's runner drives: it numbers and times the attempts, asks
//! the decision and builds the ledger record. There is one decision and one step, the core's;
//! this module reads the clock and the draw, and writes the record.
//!
//! An adapter may also carry its endpoint's send rate and circuit breaker ([`SharedEndpoint`],
//! off unless given): [`Call::before_first`] asks them before the first attempt, and
//! [`Call::after`] tells them every outcome and asks them before each retry, at the instant
//! the retry would go (after its backoff wait), through the core's attempt step
//! ([`Attempts::admit`]). A retry they refuse ends the call `gave_up` (circuit_open, budget or
//! deadline) with no further attempt.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{HeaderMap, StatusCode};
use rand::rngs::StdRng;
use wary::{
    Attempts, Breaker, Decision, Draw, Duration, Endpoint, FleetBudget, Gate, GiveUp, Instant, Key,
    Operation, Outcome, Pace, Policy, Sink, Verdict, ledger::Record,
};

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

/// One endpoint's send rate and circuit breaker, each optional, shared by every call and task
/// that sends to it (clones share them). The lock is held for the few instructions of one
/// question or one report, never across an await.
#[derive(Debug, Clone, Default)]
pub struct SharedEndpoint(Arc<Mutex<Guarded>>);

#[derive(Debug, Default)]
struct Guarded {
    pace: Option<Pace>,
    breaker: Option<Breaker>,
}

impl SharedEndpoint {
    /// An endpoint with this pace and breaker.
    pub fn new(pace: Option<Pace>, breaker: Option<Breaker>) -> Self {
        SharedEndpoint(Arc::new(Mutex::new(Guarded { pace, breaker })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Guarded> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pace as it stands (a copy).
    pub fn pace(&self) -> Option<Pace> {
        self.lock().pace
    }

    /// The breaker as it stands (a copy).
    pub fn breaker(&self) -> Option<Breaker> {
        self.lock().breaker
    }
}

impl Endpoint for SharedEndpoint {
    fn admit(&mut self, call: &mut Attempts, policy: &Policy, now: Instant) -> Gate {
        let mut g = self.lock();
        let Guarded { pace, breaker } = &mut *g;
        call.admit(policy, pace.as_mut(), breaker.as_mut(), now)
    }
    fn report(&mut self, outcome: &Outcome, draw: Draw, now: Instant) {
        let mut g = self.lock();
        let Guarded { pace, breaker } = &mut *g;
        Attempts::report(pace.as_mut(), breaker.as_mut(), outcome, draw, now);
    }
    fn is_active(&self) -> bool {
        let g = self.lock();
        g.pace.is_some() || g.breaker.is_some()
    }
}

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
    endpoint: Option<SharedEndpoint>,
    rng: Arc<Mutex<StdRng>>,
    clock: MonotonicClock,
    unreadable: Arc<AtomicU64>,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("policy", &self.policy)
            .field("signals", &self.signals)
            .field("fleet", &self.fleet)
            .field("ledger", &self.ledger.is_some())
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Adapter {
    /// For `policy`, with draws from a generator split from the process's own.
    pub fn new(policy: Policy) -> Self {
        Self::with_rng(policy, crate::draw::for_call())
    }

    /// With an explicit generator (tests, replays).
    pub fn with_rng(policy: Policy, rng: StdRng) -> Self {
        Adapter {
            policy,
            signals: Signals::NONE,
            fleet: None,
            ledger: None,
            endpoint: None,
            rng: Arc::new(Mutex::new(rng)),
            clock: MonotonicClock::new(),
            unreadable: Arc::new(AtomicU64::new(0)),
        }
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

    /// Asks this endpoint's pace and breaker before every attempt and tells them every outcome.
    pub fn endpoint(mut self, endpoint: SharedEndpoint) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// The endpoint's pace and breaker, if any.
    pub fn endpoint_ref(&self) -> Option<&SharedEndpoint> {
        self.endpoint.as_ref()
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The outcome of a response under the policy and its signals, the wall clock read here.
    /// Retry-After values that could not be read at all are counted
    /// ([`Adapter::unreadable_retry_after`]).
    pub fn outcome(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        let (outcome, reading) =
            crate::http::outcome_with(&self.policy, &self.signals, status, headers, WallClock.unix_secs());
        if reading.unreadable > 0 {
            self.unreadable.fetch_add(u64::from(reading.unreadable), Ordering::Relaxed);
        }
        outcome
    }

    /// Retry-After values this adapter and its clones could not read at all (neither a number
    /// nor an HTTP-date) and so ignored: a server sending garbage shows here.
    pub fn unreadable_retry_after(&self) -> u64 {
        self.unreadable.load(Ordering::Relaxed)
    }

    /// A call starting now.
    pub fn begin(&self) -> Call {
        Call { attempts: Attempts::new(self.now()), gated: false }
    }

    fn now(&self) -> Instant {
        self.clock.now()
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
    /// Wait, then send again.
    Retry {
        /// The wait.
        wait: Duration,
    },
    /// The call is over.
    Done(Verdict),
}

/// One call's state across its attempts: the core's attempt step ([`Attempts`]) with this
/// adapter's clock, draws, fleet budget and ledger.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    attempts: Attempts,
    /// The clock was started by [`Call::before_first`].
    gated: bool,
}

impl Default for Call {
    fn default() -> Self {
        Call { attempts: Attempts::new(Instant::from_millis(0)), gated: false }
    }
}

impl Call {
    /// Attempts decided so far.
    pub fn attempts(&self) -> u32 {
        self.attempts.attempts()
    }

    /// Marks an attempt's start (restarting the call's clock before the first, unless
    /// [`Call::before_first`] started it); returns the time left before the call's deadline,
    /// `None` without one.
    pub fn start_attempt(&mut self, adapter: &Adapter) -> Option<Duration> {
        let now = adapter.now();
        if self.attempts.attempts() == 0 && !self.gated {
            self.attempts = Attempts::new(now);
        }
        self.attempts.start(&adapter.policy, now)
    }

    /// Asks the adapter's endpoint, if any, whether the first attempt may go: the wait before
    /// it (zero without a pace, or with a token at hand), or why the call ends unsent (an open
    /// breaker, or a pace wait the budget or the deadline cannot pay). Starts the call's clock.
    pub fn before_first(&mut self, adapter: &Adapter) -> Result<Duration, GiveUp> {
        let now = adapter.now();
        self.attempts = Attempts::new(now);
        self.gated = true;
        self.gate(adapter, now)
    }

    /// Asks the endpoint at `at` (now, or when a retry's backoff wait is over): the time from
    /// `at` until the attempt may go (the pace's token is taken for then).
    fn gate(&mut self, adapter: &Adapter, at: Instant) -> Result<Duration, GiveUp> {
        let Some(endpoint) = &adapter.endpoint else { return Ok(Duration::ZERO) };
        self.attempts.admit_at(&mut endpoint.clone(), &adapter.policy, at)
    }

    /// Decides after one attempt with the core's attempt step and writes its ledger record.
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
        let now = adapter.now();
        let draw = adapter.draw();
        if let Some(endpoint) = &adapter.endpoint {
            // A draw of its own: a plain call's draws stay as they were.
            endpoint.clone().report(&outcome, adapter.draw(), now);
        }
        let step = self.attempts.end(&adapter.policy, adapter.fleet.as_deref(), op, key, outcome, draw, now);
        let (decision, record) = if last { Attempts::unrepeatable(step) } else { step };
        match decision {
            // The retry goes when its backoff wait is over, if the endpoint lets it; a retry it
            // refuses ends the call, and the record says so.
            Decision::Retry { wait } => {
                let at = Instant::from_millis(now.as_millis().saturating_add(u64::from(wait.as_millis())));
                match self.gate(adapter, at) {
                    Ok(more) => {
                        adapter.record(&record);
                        Step::Retry { wait: wait.saturating_add(more) }
                    }
                    Err(why) => {
                        adapter.record(&self.attempts.refused(record, why));
                        Step::Done(Verdict::GaveUp(why))
                    }
                }
            }
            Decision::Done(v) => {
                adapter.record(&record);
                Step::Done(v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use wary::{GiveUp, Preset, ledger::Ledger};

    use super::*;

    static STATIC_FLEET: FleetBudget = match FleetBudget::new(10, 100) {
        Ok(f) => f,
        Err(_) => panic!("a valid fleet budget"),
    };

    #[test]
    fn a_last_attempt_never_retries_and_the_ledger_says_why() {
        let ms = Duration::from_millis;
        let policy =
            Policy::builder(Preset::Default).base(ms(10)).cap(ms(40)).deadline(ms(5_000)).build().unwrap();
        let ledger = Arc::new(Mutex::new(Ledger::<8>::new()));
        let a = Adapter::with_rng(policy, crate::draw::seeded(1)).ledger(ledger.clone());
        let (op, key) = operation_and_key(&policy, "POST", "/x", Some(&http::HeaderValue::from_static("k")));
        assert_eq!(op, Operation::KeyedWrite);
        let mut call = a.begin();
        let left = call.start_attempt(&a).unwrap();
        assert!(left <= ms(5_000) && left > ms(4_000), "{left}");
        // The same 503 is a retry for an attempt that can be resent, and ends the call for one
        // that cannot.
        assert!(matches!(call.clone().after(&a, op, key, Outcome::status(503)), Step::Retry { .. }));
        let step = call.after_last(&a, op, key, Outcome::status(503));
        assert_eq!(step, Step::Done(Verdict::GaveUp(GiveUp::Attempts)));
        let last = ledger.lock().unwrap().records().last().copied().unwrap();
        assert_eq!(last.verdict, Some(Verdict::GaveUp(GiveUp::Attempts)));
        assert_eq!(last.wait, Duration::ZERO);
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
            let a = Adapter::with_rng(policy, crate::draw::seeded(2)).fleet(fleet.clone());
            let mut call = a.begin();
            call.start_attempt(&a);
            let before = fleet.tokens_milli();
            let _ = call.after(&a, Operation::Idempotent, Key::from_parts(1, 1, 1), Outcome::status(503));
            assert_eq!(fleet.tokens_milli(), before - 1_000);
        }
        assert_eq!(shared.tokens_milli(), 9_000);
        assert_eq!(STATIC_FLEET.tokens_milli(), 9_000);
    }

    #[test]
    fn the_endpoint_paces_the_first_attempt_and_a_budget_that_cannot_pay_ends_it_unsent() {
        let s = wary::PaceSettings { start_milli: 10, burst: 1, ..wary::PaceSettings::DEVICE };
        let mut pace = Pace::new(s).unwrap();
        // At the floor, 0.01/s: the next request goes 50 s to 150 s after the cut.
        pace.on_throttled(Instant::from_millis(0), Draw::ZERO);
        let endpoint = SharedEndpoint::new(Some(pace), None);
        let roomy = Policy::builder(Preset::Default).budget(Duration::from_secs(200)).build().unwrap();
        let a = Adapter::with_rng(roomy, crate::draw::seeded(4)).endpoint(endpoint.clone());
        let wait = a.begin().before_first(&a).unwrap();
        assert!(wait >= Duration::from_secs(49) && wait <= Duration::from_secs(50), "{wait}");
        // The token was taken for then: the next call waits a whole interval (100 s) more.
        let next = a.begin().before_first(&a).unwrap();
        assert!(next >= Duration::from_secs(149), "{next}");
        // A call whose budget cannot pay the wait ends unsent.
        let tight = Policy::builder(Preset::Default).budget(Duration::from_secs(10)).build().unwrap();
        let b = Adapter::with_rng(tight, crate::draw::seeded(4)).endpoint(endpoint.clone());
        assert_eq!(b.begin().before_first(&b), Err(GiveUp::Budget));
        // No endpoint, no wait.
        let plain = Adapter::with_rng(roomy, crate::draw::seeded(4));
        assert_eq!(plain.begin().before_first(&plain), Ok(Duration::ZERO));
    }

    #[test]
    fn an_open_breaker_ends_the_retry_and_the_next_call_at_once() {
        let policy = Policy::builder(Preset::Default).build().unwrap();
        let endpoint = SharedEndpoint::new(None, Some(Breaker::new(wary::BreakerSettings::DEVICE).unwrap()));
        let ledger = Arc::new(Mutex::new(Ledger::<8>::new()));
        let a = Adapter::with_rng(policy, crate::draw::seeded(6))
            .endpoint(endpoint.clone())
            .ledger(ledger.clone());
        let key = Key::from_parts(1, 1, 1);
        let refused = Outcome::Failure(wary::Failure::Refused);
        let mut call = a.begin();
        assert_eq!(call.before_first(&a), Ok(Duration::ZERO));
        call.start_attempt(&a);
        assert!(matches!(call.after(&a, Operation::Idempotent, key, refused), Step::Retry { .. }));
        call.start_attempt(&a);
        // The second refusal opens it (threshold 2): the retry would meet it open.
        let step = call.after(&a, Operation::Idempotent, key, refused);
        assert_eq!(step, Step::Done(Verdict::GaveUp(GiveUp::CircuitOpen)));
        assert_eq!(endpoint.breaker().unwrap().state().name(), "open");
        assert_eq!(a.begin().before_first(&a), Err(GiveUp::CircuitOpen));
        // One record per attempt sent, the last with the verdict; none for the unsent call.
        let records: Vec<_> = ledger.lock().unwrap().records().copied().collect();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].verdict, Some(Verdict::GaveUp(GiveUp::CircuitOpen)));
        assert_eq!(records[0].verdict, None);
        // A throttle leaves a closed breaker closed.
        let b = Breaker::new(wary::BreakerSettings::DEVICE).unwrap();
        let e2 = SharedEndpoint::new(None, Some(b));
        let a2 = Adapter::with_rng(policy, crate::draw::seeded(6)).endpoint(e2.clone());
        let mut call = a2.begin();
        for _ in 0..3 {
            call.start_attempt(&a2);
            assert!(matches!(
                call.after(&a2, Operation::Idempotent, key, Outcome::status(503)),
                Step::Retry { .. }
            ));
        }
        assert_eq!(e2.breaker().unwrap().state().name(), "closed");
    }

    #[test]
    fn unreadable_retry_after_values_are_counted_across_clones() {
        let policy = Policy::builder(Preset::Default).build().unwrap();
        let a = Adapter::with_rng(policy, crate::draw::seeded(3));
        let b = a.clone();
        let mut h = HeaderMap::new();
        h.append("retry-after", http::HeaderValue::from_static("soon"));
        h.append("retry-after", http::HeaderValue::from_static("2"));
        let o = a.outcome(StatusCode::SERVICE_UNAVAILABLE, &h);
        assert_eq!(o.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(o.failure().map(wary::Failure::unreadable_retry_after), Some(1));
        assert_eq!(b.outcome(StatusCode::OK, &h), Outcome::Ok);
        let _ = b.outcome(StatusCode::TOO_MANY_REQUESTS, &h);
        assert_eq!((a.unreadable_retry_after(), b.unreadable_retry_after()), (2, 2));
    }
}
