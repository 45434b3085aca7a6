//! A `tower::retry::Policy` that runs a wary policy, so any tower or hyper client service can
//! retry with it: `tower::retry::Retry::new(WaryPolicy::new(policy), client)`.
//!
//! Per request the adapter keeps a [`CallState`]; each response or error is classified with the
//! operation derived from the request (its method, and whether it carries an `Idempotency-Key`),
//! so an unkeyed POST is never resent after an ambiguous failure. Waits are tokio sleeps;
//! a shared [`FleetBudget`] and a ledger [`Sink`] are optional. A final response carries its
//! [`Verdict`] in its extensions (an `unknown` 500 is told apart from a `failed` one).
//!
//! Requests are cloned for resending, so the body type must be `Clone` (`Full<Bytes>`,
//! `String`). Cancellation is dropping the response future.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use rand::rngs::StdRng;
use tower::retry::Policy as TowerPolicy;
use wary::ledger::{Record, Sink};
use wary::{CallState, Class, Decision, Draw, FleetBudget, GiveUp, Key, Operation, Outcome, Policy, Verdict};

use crate::http::{ErrorOutcome, outcome};
use crate::time::{MonotonicClock, WallClock};

/// The header that makes a write a keyed write.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A ledger shared by every request of a service.
pub type SharedSink = Arc<Mutex<dyn Sink + Send>>;

/// A wary policy as a tower retry policy. Clone it freely: clones share the fleet budget, the
/// ledger and the draws; each request gets its own call state.
#[derive(Clone)]
pub struct WaryPolicy {
    policy: Policy,
    fleet: Option<Arc<FleetBudget>>,
    ledger: Option<SharedSink>,
    rng: Arc<Mutex<StdRng>>,
    clock: MonotonicClock,
    // Per request: the service-level value stays fresh because only clones see `retry`.
    state: CallState,
    started: u64,
    attempt_started: u64,
}

impl std::fmt::Debug for WaryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaryPolicy").field("policy", &self.policy).field("state", &self.state).finish()
    }
}

impl WaryPolicy {
    /// The adapter for `policy`, with draws from the OS-seeded process generator.
    pub fn new(policy: Policy) -> Self {
        Self::with_rng(policy, crate::draw::process_rng())
    }

    /// With an explicit generator (tests).
    pub fn with_rng(policy: Policy, rng: StdRng) -> Self {
        WaryPolicy {
            policy,
            fleet: None,
            ledger: None,
            rng: Arc::new(Mutex::new(rng)),
            clock: MonotonicClock::new(),
            state: CallState::new(),
            started: 0,
            attempt_started: 0,
        }
    }

    /// Shares a fleet retry budget.
    pub fn fleet(mut self, fleet: Arc<FleetBudget>) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// Writes one ledger record per attempt.
    pub fn ledger(mut self, ledger: SharedSink) -> Self {
        self.ledger = Some(ledger);
        self
    }

    fn now(&self) -> u64 {
        self.clock.ticks(self.policy.tick_hz())
    }

    fn draw(&self) -> Draw {
        match self.rng.lock() {
            Ok(mut r) => Draw::from_rng(&mut *r),
            Err(poisoned) => Draw::from_rng(&mut *poisoned.into_inner()),
        }
    }

    fn record(&self, record: &Record) {
        if let Some(l) = &self.ledger {
            let mut g = l.lock().unwrap_or_else(|e| e.into_inner());
            g.record(record);
        }
    }

    /// Decides after one attempt; `Some(wait)` to retry.
    fn after(&mut self, op: Operation, key: Key, outcome: Outcome) -> (Option<u64>, Verdict) {
        let t1 = self.now();
        let class = self.policy.classify(op, &outcome);
        let fleet_allows = match (class, &self.fleet) {
            (Class::Ok, Some(f)) => {
                f.on_success();
                true
            }
            (Class::Retry | Class::Unknown, Some(f)) => f.on_failure(),
            _ => true,
        };
        let draw = self.draw();
        let elapsed = t1.saturating_sub(self.started);
        let number = self.state.attempts().saturating_add(1);
        let mut decision = self.policy.decide(&mut self.state, op, &outcome, draw, Some(elapsed));
        if matches!(decision, Decision::Retry { .. }) && !fleet_allows {
            decision = Decision::Done(Verdict::GaveUp(GiveUp::Throttled));
        }
        let (wait, verdict) = match decision {
            Decision::Retry { wait } => (Some(wait), None),
            Decision::Done(v) => (None, Some(v)),
        };
        self.record(&Record {
            key,
            attempt: number,
            op,
            outcome,
            class,
            draw: wait.map(|_| draw),
            wait: wait.unwrap_or(0),
            attempt_ticks: t1.saturating_sub(self.attempt_started),
            total_ticks: elapsed,
            verdict,
            policy: self.policy.fingerprint(),
        });
        (wait, verdict.unwrap_or(Verdict::Ok))
    }
}

/// The operation and ledger key of a request: keyed writes use their key (hex keys as is,
/// others hashed); other requests a key derived from method and path, never from the body.
pub fn request_op<B>(req: &Request<B>) -> (Operation, Key) {
    let header = req.headers().get(IDEMPOTENCY_KEY);
    let op = Operation::from_method(req.method().as_str(), header.is_some());
    let key = match header {
        Some(v) => v.to_str().ok().and_then(Key::from_hex).unwrap_or_else(|| Key::from_payload(v.as_bytes())),
        None => {
            let label = format!("{} {}", req.method(), req.uri().path());
            Key::from_payload(label.as_bytes())
        }
    };
    (op, key)
}

impl<B, R, E> TowerPolicy<Request<B>, Response<R>, E> for WaryPolicy
where
    B: Clone,
    E: ErrorOutcome,
{
    type Future = tokio::time::Sleep;

    fn retry(&mut self, req: &mut Request<B>, result: &mut Result<Response<R>, E>) -> Option<Self::Future> {
        let (op, key) = request_op(req);
        let o = match result {
            Ok(resp) => outcome(&self.policy, resp.status(), resp.headers(), WallClock.unix_secs()),
            Err(e) => e.outcome(),
        };
        let (wait, verdict) = self.after(op, key, o);
        match wait {
            Some(ticks) => {
                let us =
                    u128::from(ticks).saturating_mul(1_000_000) / u128::from(self.policy.tick_hz().max(1));
                let us = u64::try_from(us).unwrap_or(u64::MAX);
                Some(tokio::time::sleep(Duration::from_micros(us)))
            }
            None => {
                if let Ok(resp) = result {
                    resp.extensions_mut().insert(verdict);
                }
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        let now = self.now();
        if self.state.attempts() == 0 {
            // The service-level policy (never retried) or a fresh call: the call starts now.
            self.started = now;
        }
        self.attempt_started = now;
        let mut out = Request::new(req.body().clone());
        *out.method_mut() = req.method().clone();
        *out.uri_mut() = req.uri().clone();
        *out.version_mut() = req.version();
        *out.headers_mut() = req.headers().clone();
        Some(out)
    }
}
