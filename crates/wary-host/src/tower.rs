//! A `tower::retry::Policy` that runs a wary policy, so any tower or hyper client service can
//! retry with it: `tower::retry::Retry::new(WaryPolicy::new(policy)?, client)`.
//!
//! Per request the adapter keeps a [`CallState`]; each response or error is decided by the
//! core's [`Policy::decide_with_fleet`] with the operation the policy derives from the request
//! ([`Policy::operation`]: its method, and whether it carries an `Idempotency-Key`; under the
//! `strict` preset only GET and HEAD are reads), so an unkeyed POST is never resent after an
//! ambiguous failure. Waits are tokio sleeps;
//! a shared [`FleetBudget`] and a ledger [`Sink`] are optional. A final response carries its
//! [`Verdict`] in its extensions (an `unknown` 500 is told apart from a `failed` one).
//!
//! The policy must count milliseconds (`tick_hz` 1000), like the gateway's: [`WaryPolicy::new`]
//! refuses any other rate with [`TickRateError`].
//!
//! Requests are cloned for resending, so the body type must be `Clone` (`Full<Bytes>`,
//! `String`). Cancellation is dropping the response future.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use rand::rngs::StdRng;
use tower::retry::Policy as TowerPolicy;
use wary::ledger::{Record, Sink};
use wary::{CallState, Decision, Draw, FleetBudget, Key, Operation, Outcome, Policy, Verdict};

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

/// The policy does not count milliseconds: the adapter's clock and sleeps do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tower adapter's policy must count milliseconds (tick_hz 1000), not {0} ticks per second")]
pub struct TickRateError(pub u32);

impl WaryPolicy {
    /// The adapter for `policy`, with draws from the OS-seeded process generator. A policy
    /// whose `tick_hz` is not 1000 is refused.
    pub fn new(policy: Policy) -> Result<Self, TickRateError> {
        Self::with_rng(policy, crate::draw::process_rng())
    }

    /// With an explicit generator (tests). A policy whose `tick_hz` is not 1000 is refused.
    pub fn with_rng(policy: Policy, rng: StdRng) -> Result<Self, TickRateError> {
        if policy.tick_hz() != 1000 {
            return Err(TickRateError(policy.tick_hz()));
        }
        Ok(WaryPolicy {
            policy,
            fleet: None,
            ledger: None,
            rng: Arc::new(Mutex::new(rng)),
            clock: MonotonicClock::new(),
            state: CallState::new(),
            started: 0,
            attempt_started: 0,
        })
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
        // Milliseconds: the policy's tick rate was checked in `with_rng`.
        self.clock.millis()
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

    /// Decides after one attempt with the core's own decision; `Some(wait)` to retry.
    fn after(&mut self, op: Operation, key: Key, outcome: Outcome) -> (Option<u64>, Verdict) {
        let t1 = self.now();
        let draw = self.draw();
        let elapsed = t1.saturating_sub(self.started);
        let number = self.state.attempts().saturating_add(1);
        let (class, decision) = self.policy.decide_with_fleet(
            &mut self.state,
            op,
            &outcome,
            draw,
            Some(elapsed),
            self.fleet.as_deref(),
        );
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

/// The operation of a request under `policy` ([`Policy::operation`]), and its ledger key:
/// keyed writes use their key (hex keys as is, others hashed); other requests a key derived
/// from method and path, never from the body.
pub fn request_op<B>(policy: &Policy, req: &Request<B>) -> (Operation, Key) {
    let header = req.headers().get(IDEMPOTENCY_KEY);
    let op = policy.operation(req.method().as_str(), header.is_some());
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
        let (op, key) = request_op(&self.policy, req);
        let o = match result {
            Ok(resp) => outcome(&self.policy, resp.status(), resp.headers(), WallClock.unix_secs()),
            Err(e) => e.outcome(),
        };
        let (wait, verdict) = self.after(op, key, o);
        match wait {
            Some(ms) => Some(tokio::time::sleep(Duration::from_millis(ms))),
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

#[cfg(test)]
mod tests {
    use std::io;

    use http::{Method, StatusCode};
    use wary::{Class, GiveUp, Preset};

    use super::*;

    fn req(method: Method, key: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri("http://127.0.0.1/x");
        if let Some(k) = key {
            b = b.header(IDEMPOTENCY_KEY, k);
        }
        b.body(()).unwrap()
    }

    fn rng() -> StdRng {
        crate::draw::seeded(5)
    }

    #[test]
    fn the_operation_comes_from_the_policy_table() {
        let default = Policy::builder(Preset::Default).build().unwrap();
        let strict = Policy::builder(Preset::Strict).build().unwrap();
        // PUT is idempotent by default; under `strict` only GET and HEAD are reads.
        assert_eq!(request_op(&default, &req(Method::PUT, None)).0, Operation::Read);
        assert_eq!(request_op(&strict, &req(Method::PUT, None)).0, Operation::Write);
        assert_eq!(request_op(&strict, &req(Method::DELETE, Some("k"))).0, Operation::KeyedWrite);
        assert_eq!(request_op(&strict, &req(Method::HEAD, None)).0, Operation::Read);
        assert_eq!(request_op(&default, &req(Method::POST, Some("k"))).0, Operation::KeyedWrite);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_strict_put_is_not_resent_after_a_timeout() {
        let strict = Policy::builder(Preset::Strict).build().unwrap();
        let mut p = WaryPolicy::with_rng(strict, rng()).unwrap();
        let mut r = req(Method::PUT, None);
        let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut p, &r);
        let mut result: Result<Response<()>, io::Error> = Err(io::Error::from(io::ErrorKind::TimedOut));
        assert!(p.retry(&mut r, &mut result).is_none(), "a strict PUT was resent");
        // The same PUT under the default table is a read, and retried.
        let mut p = WaryPolicy::with_rng(Policy::builder(Preset::Default).build().unwrap(), rng()).unwrap();
        let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut p, &r);
        let mut result: Result<Response<()>, io::Error> = Err(io::Error::from(io::ErrorKind::TimedOut));
        assert!(p.retry(&mut r, &mut result).is_some());
    }

    /// The adapter's decision is the core's: the same class, wait and verdict as
    /// `decide_with_fleet` with the same draws, including a retry the fleet refuses.
    #[tokio::test(flavor = "current_thread")]
    async fn decisions_are_the_cores_own_including_the_fleet() {
        let policy = Policy::builder(Preset::Default).base(10).cap(40).build().unwrap();
        let fleet = Arc::new(FleetBudget::new(4, 100).unwrap());
        let shadow_fleet = FleetBudget::new(4, 100).unwrap();
        let ledger = Arc::new(Mutex::new(wary::ledger::Ledger::<16>::new()));
        let mut p = WaryPolicy::with_rng(policy, rng()).unwrap().fleet(fleet.clone()).ledger(ledger.clone());
        let mut draws = rng();
        let mut shadow = CallState::new();
        let mut r = req(Method::GET, None);
        let mut last = None;
        for _ in 0..4 {
            let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut p, &r);
            let resp = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).body(()).unwrap();
            let mut result: Result<Response<()>, io::Error> = Ok(resp);
            let waited = p.retry(&mut r, &mut result).map(|s| s.deadline());
            let want = policy.decide_with_fleet(
                &mut shadow,
                Operation::Read,
                &Outcome::status(503),
                Draw::from_rng(&mut draws),
                Some(0),
                Some(&shadow_fleet),
            );
            assert_eq!(want.0, Class::Retry);
            let rec = ledger.lock().unwrap().records().last().copied().unwrap();
            match want.1 {
                Decision::Retry { wait } => {
                    assert!(waited.is_some());
                    assert_eq!(rec.wait, wait);
                }
                Decision::Done(v) => {
                    assert!(waited.is_none());
                    assert_eq!(result.unwrap().extensions().get::<Verdict>(), Some(&v));
                    last = Some(v);
                    break;
                }
            }
        }
        // 4 tokens: two failures bring them to the half, so the second retry is refused.
        assert_eq!(last, Some(Verdict::GaveUp(GiveUp::Throttled)));
        assert_eq!(fleet.tokens_milli(), shadow_fleet.tokens_milli());
    }

    #[test]
    fn a_policy_not_in_milliseconds_is_refused() {
        let p = Policy::builder(Preset::Default).tick_hz(1).base(1).cap(4).budget(10).build().unwrap();
        assert_eq!(WaryPolicy::with_rng(p, rng()).err(), Some(TickRateError(1)));
        assert!(WaryPolicy::new(Policy::builder(Preset::Default).build().unwrap()).is_ok());
    }
}
