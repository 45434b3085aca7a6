//! A `tower::retry::Policy` that runs a wary policy, so any tower or hyper client service can
//! retry with it: `tower::retry::Retry::new(WaryPolicy::new(policy)?, client)`, or
//! [`WaryRetry::new`] to get the verdict on the error path too.
//!
//! Per request the adapter keeps a [`Call`], the core's attempt step ([`wary::Attempts`]);
//! each response or error is decided by the core's decision with the operation the policy derives from the request
//! ([`Policy::operation`]: its method, and whether it carries an `Idempotency-Key`; under the
//! `strict` preset only GET and HEAD are reads), so an unkeyed POST is never resent after an
//! ambiguous failure. Waits are tokio sleeps; a shared [`FleetBudget`](wary::FleetBudget) (an `Arc` or a
//! `&'static`, so one static budget serves the runner and the adapter), rate-limit
//! [`Signals`] and a ledger [`Sink`](wary::Sink) are optional. Responses become outcomes through
//! the core's [`Outcome::from_response`](wary::Outcome::from_response); Retry-After values that
//! cannot be read are counted ([`WaryPolicy::unreadable_retry_after`]).
//!
//! **The verdict.** A final response carries its [`Verdict`] in its extensions (an `unknown`
//! 500 is told apart from a `failed` one). A call that ends in a client error (refused, reset,
//! timed out) has no response to carry it: wrap the client in [`WaryRetry`], whose error is a
//! [`CallError`] holding the core's [`Stopped`] (the verdict, the attempts, the last failure)
//! and the client's own error as its source. A bare `Retry<WaryPolicy, _>` returns the client's
//! error unchanged.
//!
//! **Deadlines and a per-attempt `timeout` layer.** The policy's deadline bounds the *call*:
//! after each attempt, a retry is refused when its wait plus the policy's `min_attempt` would
//! end past the deadline (`gave_up (deadline)`). The adapter does not interrupt an attempt in
//! flight: bound each attempt with a `tower::timeout::TimeoutLayer` *inside* the retry
//! (`Retry<WaryPolicy, Timeout<Client>>`), whose elapsed error counts as a response timeout
//! (retried for reads and keyed writes, `unknown` for an unkeyed write). A call then takes at
//! most the deadline plus one attempt timeout; choose an attempt timeout no longer than the
//! deadline, and a `min_attempt` near the attempt time you expect. A timeout layer *outside*
//! the retry bounds the whole call instead, and cancels it (dropping the future) without a
//! verdict.
//!
//! **Your settings stand.** The adapter sets no timeout and adds or changes no header: every
//! attempt is a clone of the request as it came (method, URI, version, headers, extensions,
//! body), and the client's own settings (a connector's connect timeout, a timeout layer) apply
//! to each attempt unchanged. A connect timeout set on hyper-util's `HttpConnector` fails as a
//! connect error, a connect timeout (never sent); a timeout layer cannot see the phase, so its
//! elapsed error is a response timeout.
//!
//! Requests are cloned for resending (their extensions too), so the body type must be `Clone`
//! (`Full<Bytes>`, `String`). Cancellation is dropping the response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use rand::rngs::StdRng;
use tower::Service;
use tower::retry::Policy as TowerPolicy;
use tower::retry::Retry;
use wary::{Key, Operation, Policy, Stopped, Verdict};

pub use crate::call::SharedSink;
use crate::call::{Adapter, Call, Fleet, Step};
use crate::http::ErrorFailure;
use crate::ratelimit::Signals;

/// The header that makes a write a keyed write.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A wary policy as a tower retry policy. Clone it freely: clones share the fleet budget, the
/// ledger and the draws; each request gets its own call state.
#[derive(Clone, Debug)]
pub struct WaryPolicy {
    adapter: Adapter,
    // Per request: the service-level value stays fresh because only clones see `retry`.
    call: Call,
}

impl WaryPolicy {
    /// The adapter for `policy`, with draws from the OS-seeded process generator.
    pub fn new(policy: Policy) -> Self {
        WaryPolicy { adapter: Adapter::new(policy), call: Call::default() }
    }

    /// With an explicit generator (tests).
    pub fn with_rng(policy: Policy, rng: StdRng) -> Self {
        WaryPolicy { adapter: Adapter::with_rng(policy, rng), call: Call::default() }
    }

    /// Retry-After values this policy and its clones could not read at all, and so ignored.
    pub fn unreadable_retry_after(&self) -> u64 {
        self.adapter.unreadable_retry_after()
    }

    /// Shares a fleet retry budget: an `Arc<FleetBudget>` or a `&'static FleetBudget`.
    pub fn fleet(mut self, fleet: impl Into<Fleet>) -> Self {
        self.adapter = self.adapter.fleet(fleet);
        self
    }

    /// Tells the endpoint's send rate and circuit breaker every outcome and asks them before
    /// each retry ([`Call::after`]): a retry they refuse ends the call `gave_up`. tower's
    /// `Retry` sends the first attempt itself, with no hook to wait before it: pace first
    /// attempts with the reqwest middleware or the core's runner.
    pub fn endpoint(mut self, endpoint: crate::call::SharedEndpoint) -> Self {
        self.adapter = self.adapter.endpoint(endpoint);
        self
    }

    /// Writes one ledger record per attempt.
    pub fn ledger(mut self, ledger: SharedSink) -> Self {
        self.adapter = self.adapter.ledger(ledger);
        self
    }

    /// Reads these rate-limit headers beside Retry-After ([`crate::ratelimit`]).
    pub fn signals(mut self, signals: Signals) -> Self {
        self.adapter = self.adapter.signals(signals);
        self
    }
}

/// The operation of a request under `policy` ([`Policy::operation`]), and its ledger key:
/// keyed writes use their key (hex keys as is, others hashed); other requests a key derived
/// from method and path, never from the body.
pub fn request_op<B>(policy: &Policy, req: &Request<B>) -> (Operation, Key) {
    let header = req.headers().get(IDEMPOTENCY_KEY);
    crate::call::operation_and_key(policy, req.method().as_str(), req.uri().path(), header)
}

/// Where [`WaryRetry`] receives how a call stopped from the policy: a request extension, copied
/// onto every attempt's request.
#[derive(Debug, Clone, Default)]
struct VerdictSlot(Arc<Mutex<Option<Stopped>>>);

impl<B, R, E> TowerPolicy<Request<B>, Response<R>, E> for WaryPolicy
where
    B: Clone,
    E: ErrorFailure,
{
    type Future = tokio::time::Sleep;

    fn retry(&mut self, req: &mut Request<B>, result: &mut Result<Response<R>, E>) -> Option<Self::Future> {
        let (op, key) = request_op(self.adapter.policy(), req);
        let o = match result {
            Ok(resp) => self.adapter.outcome(resp.status(), resp.headers()),
            Err(e) => e.failure().into(),
        };
        match self.call.after(&self.adapter, op, key, o) {
            Step::Retry { wait } => Some(tokio::time::sleep(wait.into())),
            Step::Done(verdict) => {
                match result {
                    Ok(resp) => {
                        resp.extensions_mut().insert(verdict);
                    }
                    Err(_) => {
                        if let Some(slot) = req.extensions().get::<VerdictSlot>() {
                            let stopped = Stopped {
                                verdict,
                                attempts: self.call.attempts(),
                                last: o.failure().copied(),
                            };
                            *slot.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(stopped);
                        }
                    }
                }
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        self.call.start_attempt(&self.adapter);
        let mut out = Request::new(req.body().clone());
        *out.method_mut() = req.method().clone();
        *out.uri_mut() = req.uri().clone();
        *out.version_mut() = req.version();
        *out.headers_mut() = req.headers().clone();
        *out.extensions_mut() = req.extensions().clone();
        Some(out)
    }
}

/// A client error with how the call stopped: what a [`WaryRetry`] call that ended without a
/// response returns. It shows the core's [`Stopped`] (`gave_up (deadline) after 3 attempts, the
/// last a response_timeout`), never the client error's text; that error is its
/// [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct CallError<E> {
    /// How the call stopped; `None` only if the retry policy never decided (a request whose
    /// body could not be cloned, or an error the service returned before the retry layer).
    pub stopped: Option<Stopped>,
    /// The client's own error.
    pub error: E,
}

impl<E> CallError<E> {
    /// The call's verdict, when the policy decided one.
    pub fn verdict(&self) -> Option<Verdict> {
        self.stopped.map(|s| s.verdict)
    }
}

impl<E> std::fmt::Display for CallError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.stopped {
            Some(s) => s.fmt(f),
            None => f.write_str("the call ended in a client error before wary decided"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CallError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// `tower::retry::Retry` with a [`WaryPolicy`], whose error carries the call's verdict
/// ([`CallError`]). Responses carry it in their extensions, as with the bare `Retry`.
#[derive(Clone, Debug)]
pub struct WaryRetry<S> {
    inner: Retry<WaryPolicy, S>,
}

impl<S> WaryRetry<S> {
    /// `service` retried under `policy`.
    pub fn new(policy: WaryPolicy, service: S) -> Self {
        WaryRetry { inner: Retry::new(policy, service) }
    }
}

/// The future of a [`WaryRetry`] call.
pub struct CallFuture<F> {
    inner: Pin<Box<F>>,
    slot: VerdictSlot,
}

impl<F> std::fmt::Debug for CallFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for CallFuture<F>
where
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<R, CallError<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.inner.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(r)) => Poll::Ready(Ok(r)),
            Poll::Ready(Err(error)) => {
                let stopped = *self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
                Poll::Ready(Err(CallError { stopped, error }))
            }
        }
    }
}

impl<S, B, R> Service<Request<B>> for WaryRetry<S>
where
    B: Clone,
    S: Service<Request<B>, Response = Response<R>> + Clone,
    S::Error: ErrorFailure,
{
    type Response = Response<R>;
    type Error = CallError<S::Error>;
    type Future = CallFuture<<Retry<WaryPolicy, S> as Service<Request<B>>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(|error| CallError { stopped: None, error })
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let slot = VerdictSlot::default();
        req.extensions_mut().insert(slot.clone());
        CallFuture { inner: Box::pin(self.inner.call(req)), slot }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use http::{Method, StatusCode};
    use wary::{CallState, Class, Decision, Draw, Duration, FleetBudget, GiveUp, Outcome, Preset};

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
        assert_eq!(request_op(&default, &req(Method::PUT, None)).0, Operation::Idempotent);
        assert_eq!(request_op(&strict, &req(Method::PUT, None)).0, Operation::Write);
        assert_eq!(request_op(&strict, &req(Method::DELETE, Some("k"))).0, Operation::KeyedWrite);
        assert_eq!(request_op(&strict, &req(Method::HEAD, None)).0, Operation::Idempotent);
        assert_eq!(request_op(&default, &req(Method::POST, Some("k"))).0, Operation::KeyedWrite);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_strict_put_is_not_resent_after_a_timeout() {
        let strict = Policy::builder(Preset::Strict).build().unwrap();
        let mut p = WaryPolicy::with_rng(strict, rng());
        let mut r = req(Method::PUT, None);
        let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut p, &r);
        let mut result: Result<Response<()>, io::Error> = Err(io::Error::from(io::ErrorKind::TimedOut));
        assert!(p.retry(&mut r, &mut result).is_none(), "a strict PUT was resent");
        // The same PUT under the default table is a read, and retried.
        let mut p = WaryPolicy::with_rng(Policy::builder(Preset::Default).build().unwrap(), rng());
        let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut p, &r);
        let mut result: Result<Response<()>, io::Error> = Err(io::Error::from(io::ErrorKind::TimedOut));
        assert!(p.retry(&mut r, &mut result).is_some());
    }

    /// The adapter's decision is the core's: the same class, wait and verdict as
    /// `decide_with_fleet` with the same draws, including a retry the fleet refuses.
    #[tokio::test(flavor = "current_thread")]
    async fn decisions_are_the_cores_own_including_the_fleet() {
        let ms = Duration::from_millis;
        let policy = Policy::builder(Preset::Default).base(ms(10)).cap(ms(40)).build().unwrap();
        let fleet = Arc::new(FleetBudget::new(4, 100).unwrap());
        let shadow_fleet = FleetBudget::new(4, 100).unwrap();
        let ledger = Arc::new(Mutex::new(wary::ledger::Ledger::<16>::new()));
        let mut p = WaryPolicy::with_rng(policy, rng()).fleet(fleet.clone()).ledger(ledger.clone());
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
                Operation::Idempotent,
                &Outcome::status(503),
                Draw::from_rng(&mut draws),
                Some(Duration::ZERO),
                &shadow_fleet,
            );
            assert_eq!(policy.classify(Operation::Idempotent, &Outcome::status(503)), Class::Retry);
            let rec = ledger.lock().unwrap().records().last().copied().unwrap();
            assert_eq!(rec.class, Class::Retry);
            match want {
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

    /// Any policy is taken: waits are the core's durations, slept as they are. A policy in
    /// seconds (base 1 s) waits whole seconds on tokio's clock.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn any_policy_is_taken_and_its_waits_are_slept_as_they_are() {
        let secs = Duration::from_secs;
        let p = Policy::builder(Preset::Default).base(secs(1)).cap(secs(4)).budget(secs(10)).build().unwrap();
        let mut w = WaryPolicy::with_rng(p, rng());
        let mut r = req(Method::GET, None);
        let _ = TowerPolicy::<_, Response<()>, io::Error>::clone_request(&mut w, &r);
        let mut result: Result<Response<()>, io::Error> = Err(io::Error::from(io::ErrorKind::TimedOut));
        let sleep = w.retry(&mut r, &mut result).expect("a timed-out read is retried");
        let t0 = tokio::time::Instant::now();
        sleep.await;
        // Equal jitter on a 1 s ceiling: between half of it and all of it.
        let slept = t0.elapsed();
        assert!(
            slept >= std::time::Duration::from_millis(500) && slept <= std::time::Duration::from_secs(1),
            "{slept:?}"
        );
    }
}
