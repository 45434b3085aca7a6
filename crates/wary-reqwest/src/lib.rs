//! A [`reqwest_middleware::Middleware`] that runs a wary policy: a retry is a second copy of a
//! request, so whether it is sent depends on what the first copy may already have done.
//!
//! ```no_run
//! use std::time::Duration as StdDuration;
//!
//! use reqwest_middleware::ClientBuilder;
//! use wary::{Duration, Policy, Preset};
//! use wary_reqwest::WaryMiddleware;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::builder(Preset::Default).deadline(Duration::from_secs(10)).build()?;
//! // Each attempt: 2 s to connect, 3 s in all. A connect timeout shorter than the total is
//! // what lets a hung connect be told apart: it was never sent, so even a write is resent.
//! let http = reqwest::Client::builder()
//!     .connect_timeout(StdDuration::from_secs(2))
//!     .timeout(StdDuration::from_secs(3))
//!     .build()?;
//! let client = ClientBuilder::new(http)
//!     .with(WaryMiddleware::new(policy).add_idempotency_key())
//!     .build();
//! let resp = client.post("http://127.0.0.1:8080/readings").body("{\"t\":21}").send().await?;
//! # let _ = resp; Ok(()) }
//! ```
//!
//! - **The operation** comes from the method and an `Idempotency-Key` header
//!   ([`wary::Policy::operation`]): GET and HEAD are idempotent, and OPTIONS, TRACE, PUT and
//!   DELETE too unless the policy's table is strict; a write with a key is a keyed write; a write without one is never resent
//!   after a failure that may have landed: it ends `unknown`. With
//!   [`WaryMiddleware::add_idempotency_key`], a write without a key gets one, made once per
//!   call and sent on every attempt.
//! - **Retry-After** in both forms, read by the core's `Outcome::from_response`; a date is
//!   measured against the response's own `Date` header (else the wall clock). The wait is never
//!   shorter than the server asked; an ask longer than the call can afford ends the call at
//!   once (`gave_up (retry_after_too_long)`). Values that cannot be read are ignored and
//!   counted ([`WaryMiddleware::unreadable_retry_after`]). Other rate-limit headers are opt-in
//!   ([`WaryMiddleware::signals`]).
//! - **Your timeouts stand**: the client's timeout, its connect timeout and a request's own
//!   timeout are never replaced. The policy's deadline is a timer *around* each attempt, set to
//!   the time left, so an attempt ends at the earliest of your timeout and the deadline: a 1 s
//!   client timeout under a 12 s deadline gives attempts of about 1 s with backoff between, not
//!   one attempt of 12 s. The attempt that the deadline's timer ends fails with
//!   [`DeadlineElapsed`] (a response timeout) and the call ends `gave_up (deadline)` (an
//!   unkeyed write `unknown`). An attempt is the request until its response head arrives:
//!   reading the body afterwards is the caller's, bounded by the client's timeout only.
//! - **Connect-phase timeouts** are "never sent", so any operation may be resent after one.
//!   reqwest reports its connect timeout as a connect error (`is_connect()`), which this
//!   crate reads as [`wary::Failure::ConnectTimeout`]. Its total timeout (the client's
//!   `timeout` or a request's) fires from outside the connection, with nothing saying whether
//!   the connection was made: it is a [`wary::Failure::ResponseTimeout`] (may have landed),
//!   even when the connect was what hung. So set `connect_timeout` shorter than `timeout` (and
//!   than the deadline) when writes should be resent after a connect that hangs; without it,
//!   an unkeyed write whose connect hung ends `unknown`, and a keyed write or a read is resent
//!   as after any response timeout. The deadline's own timer is the same: it cannot see the
//!   phase, so it counts as a response timeout.
//! - **Fleet budget and ledger**, both optional and shared: [`WaryMiddleware::fleet`] (an
//!   `Arc` or a `&'static`), [`WaryMiddleware::ledger`] (any [`wary::Sink`], such as
//!   `wary_host::ledger::JsonLedger`).
//! - **A body that cannot be copied** (a stream) is sent once: the response carries
//!   [`SentOnce::BodyNotCloneable`] in its extensions (a [`CallError`] carries it on the error
//!   path), and a retry the policy would have made ends `gave_up (attempts)`.
//! - **The verdict** of every call is in the final response's extensions
//!   ([`wary::Verdict`]); a call that ends in a transport error returns
//!   [`reqwest_middleware::Error::Middleware`] holding a [`CallError`] with how the call
//!   stopped (the core's [`wary::Stopped`]) and the client's error as its source.

use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use wary::{Failure, Key, Operation, Outcome, Policy, Stopped, Verdict};
use wary_host::call::{Adapter, Call, Fleet, SharedEndpoint, SharedSink, Step};
use wary_host::ratelimit::Signals;
use wary_host::spec::{PolicySpec, SpecError};

/// The header that makes a write a keyed write.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Why a call was sent only once whatever the policy said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SentOnce {
    /// The request's body is a stream: it cannot be copied for a second attempt.
    BodyNotCloneable,
}

/// A call that ended without a response: how it stopped (the verdict, the attempts, the last
/// failure) and the client's own error as the [`source`](std::error::Error::source). Its text
/// is the core's [`Stopped`], never the client error's text.
#[derive(Debug, thiserror::Error)]
#[error("{stopped}{}", if .sent_once.is_some() { " (sent once: the body cannot be copied)" } else { "" })]
pub struct CallError {
    /// How the call stopped.
    pub stopped: Stopped,
    /// Set when the request could be sent only once.
    pub sent_once: Option<SentOnce>,
    /// The client's error.
    #[source]
    pub error: reqwest_middleware::Error,
}

/// The call ended before its first attempt: the endpoint's circuit breaker was open, or its
/// send rate's wait was more than the call's budget or deadline allowed. Nothing was sent.
#[derive(Debug, thiserror::Error)]
#[error("the call ended before its first attempt; nothing was sent")]
pub struct NotSent;

/// The policy's deadline passed while an attempt was in flight: the middleware's own timer
/// around the attempt fired before the client answered or failed. It counts as a response
/// timeout (the request may have been sent), so an unkeyed write ends `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call's deadline passed during the attempt")]
pub struct DeadlineElapsed;

/// Why a middleware could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The spec is not a valid policy.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// The middleware. Clones share the fleet budget, the ledger and the draws.
#[derive(Debug, Clone)]
pub struct WaryMiddleware {
    adapter: Adapter,
    add_key: bool,
}

impl WaryMiddleware {
    /// Runs `policy`, with draws split from the process's generator.
    pub fn new(policy: Policy) -> Self {
        WaryMiddleware { adapter: Adapter::new(policy), add_key: false }
    }

    /// Runs the policy of a spec (a policy file), with its rate-limit signals and its fleet
    /// budget, if it names one.
    pub fn from_spec(spec: &PolicySpec) -> Result<Self, BuildError> {
        let mut m = Self::new(spec.build()?).signals(spec.signals());
        if let Some(f) = &spec.fleet {
            m = m.fleet(std::sync::Arc::new(f.build()?));
        }
        Ok(m)
    }

    /// Gives a write without an `Idempotency-Key` a fresh key, made once per call and sent on
    /// every attempt, so it is retried as a keyed write.
    pub fn add_idempotency_key(mut self) -> Self {
        self.add_key = true;
        self
    }

    /// Shares a fleet retry budget: an `Arc<FleetBudget>` or a `&'static FleetBudget`.
    pub fn fleet(mut self, fleet: impl Into<Fleet>) -> Self {
        self.adapter = self.adapter.fleet(fleet);
        self
    }

    /// Writes one ledger record per attempt.
    pub fn ledger(mut self, ledger: SharedSink) -> Self {
        self.adapter = self.adapter.ledger(ledger);
        self
    }

    /// Reads these rate-limit headers beside Retry-After (`wary_host::ratelimit`).
    pub fn signals(mut self, signals: Signals) -> Self {
        self.adapter = self.adapter.signals(signals);
        self
    }

    /// Asks the endpoint's send rate and circuit breaker before every attempt, the first
    /// included, and tells them every outcome. A call they end before its first attempt fails
    /// with a [`CallError`] whose error is [`NotSent`].
    pub fn endpoint(mut self, endpoint: SharedEndpoint) -> Self {
        self.adapter = self.adapter.endpoint(endpoint);
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        self.adapter.policy()
    }

    /// Retry-After values this middleware and its clones could not read at all (neither a
    /// number nor an HTTP-date), and so ignored: a server sending garbage shows here.
    pub fn unreadable_retry_after(&self) -> u64 {
        self.adapter.unreadable_retry_after()
    }
}

/// The operation of a request under `policy`, and its ledger key: a keyed write's key (hex
/// keys as is, others hashed); for other requests a key from method and path, never the body.
pub fn request_op(policy: &Policy, req: &Request) -> (Operation, Key) {
    let header = req.headers().get(IDEMPOTENCY_KEY);
    wary_host::call::operation_and_key(policy, req.method().as_str(), req.url().path(), header)
}

/// The failure a reqwest error stands for: timeouts by whether the connection was made, the
/// rest by the error's source chain (`wary_host::http::error_failure`): connect failures were
/// never sent, anything later may have landed.
pub fn error_failure(err: &reqwest::Error) -> Failure {
    match (err.is_timeout(), err.is_connect()) {
        (true, true) => Failure::ConnectTimeout,
        (true, false) => Failure::ResponseTimeout,
        _ => wary_host::http::error_failure(err),
    }
}

fn middleware_error_failure(err: &reqwest_middleware::Error) -> Failure {
    match err {
        reqwest_middleware::Error::Reqwest(e) => error_failure(e),
        // Where the attempt was when the deadline's timer fired is not known from outside the
        // client: it may have been sent, so it may have landed.
        reqwest_middleware::Error::Middleware(e) if e.is::<DeadlineElapsed>() => Failure::ResponseTimeout,
        reqwest_middleware::Error::Middleware(e) => wary_host::http::error_failure(e.as_ref()),
    }
}

/// An attempt's result as the one-line entry point wants it: the response if it is a success,
/// else the failure (`policy.retry(op, |a| async { check(&policy, send(a).await) })`).
pub fn check(policy: &Policy, sent: Result<Response, reqwest::Error>) -> Result<Response, Failure> {
    match sent {
        Ok(r) => match wary_host::http::outcome_now(policy, r.status(), r.headers()).0 {
            Outcome::Ok => Ok(r),
            Outcome::Failure(f) => Err(f),
        },
        Err(e) => Err(error_failure(&e)),
    }
}

#[async_trait::async_trait]
impl Middleware for WaryMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let policy = self.adapter.policy();
        let keyed = req.headers().contains_key(IDEMPOTENCY_KEY);
        if !keyed && self.add_key && !policy.operation(req.method().as_str(), false).is_idempotent() {
            // Made once, before the first attempt: every copy below carries the same key.
            let hex = wary_host::draw::new_key().to_hex();
            if let Ok(v) = http::HeaderValue::from_str(hex.as_str()) {
                req.headers_mut().insert(IDEMPOTENCY_KEY, v);
            }
        }
        let (op, key) = request_op(policy, &req);
        let mut call = self.adapter.begin();
        match call.before_first(&self.adapter) {
            Ok(wait) if wait > wary::Duration::ZERO => wary_host::time::sleep(wait).await,
            Ok(_) => {}
            Err(why) => {
                let stopped = Stopped { verdict: Verdict::GaveUp(why), attempts: 0, last: None };
                let error = reqwest_middleware::Error::middleware(NotSent);
                return Err(reqwest_middleware::Error::middleware(CallError {
                    stopped,
                    sent_once: None,
                    error,
                }));
            }
        }
        let mut attempt = Attempt { call: &mut call, op, key, sent_once: None };
        // A copy for each attempt while the body can be copied.
        while let Some(copy) = req.try_clone() {
            if let Some(done) = self.send(&mut attempt, copy, &mut *extensions, next.clone()).await {
                return done;
            }
        }
        // A body that cannot be copied (a stream) is sent itself, once.
        attempt.sent_once = Some(SentOnce::BodyNotCloneable);
        match self.send(&mut attempt, req, extensions, next).await {
            Some(done) => done,
            // `send` always ends the call on an attempt it cannot repeat; this arm is for the
            // type only, and still answers with a typed error rather than a panic.
            None => Err(reqwest_middleware::Error::middleware(std::io::Error::other(
                "wary: a request that cannot be copied was not ended after its one attempt",
            ))),
        }
    }
}

/// One call's attempt context.
struct Attempt<'c> {
    call: &'c mut Call,
    op: Operation,
    key: Key,
    sent_once: Option<SentOnce>,
}

impl WaryMiddleware {
    /// Sends one attempt and decides after it: `None` after the wait for a retry, else the
    /// call's result with its verdict.
    async fn send(
        &self,
        a: &mut Attempt<'_>,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Option<reqwest_middleware::Result<Response>> {
        // The request goes on as the user built it: its own timeout, and the client's timeout
        // and connect timeout, all still apply. The deadline is a timer around the attempt, so
        // the attempt ends at the earliest of them.
        let left = a.call.start_attempt(&self.adapter);
        let sent = next.run(req, extensions);
        let result = match left {
            Some(left) => {
                let left = Duration::from(left).max(Duration::from_millis(1));
                match tokio::time::timeout(left, sent).await {
                    Ok(result) => result,
                    Err(_) => Err(reqwest_middleware::Error::middleware(DeadlineElapsed)),
                }
            }
            None => sent.await,
        };
        let outcome = match &result {
            Ok(r) => self.adapter.outcome(r.status(), r.headers()),
            Err(e) => middleware_error_failure(e).into(),
        };
        let verdict = match a.sent_once {
            None => match a.call.after(&self.adapter, a.op, a.key, outcome) {
                Step::Retry { wait } => {
                    drop(result);
                    wary_host::time::sleep(wait).await;
                    return None;
                }
                Step::Done(v) => v,
            },
            // Never a retry here: what the policy would retry ends `gave_up (attempts)`.
            Some(_) => match a.call.after_last(&self.adapter, a.op, a.key, outcome) {
                Step::Done(v) => v,
                Step::Retry { .. } => Verdict::GaveUp(wary::GiveUp::Attempts),
            },
        };
        Some(match result {
            Ok(mut r) => {
                r.extensions_mut().insert(verdict);
                if let Some(s) = a.sent_once {
                    r.extensions_mut().insert(s);
                }
                Ok(r)
            }
            Err(error) => Err(reqwest_middleware::Error::middleware(CallError {
                stopped: Stopped { verdict, attempts: a.call.attempts(), last: outcome.failure().copied() },
                sent_once: a.sent_once,
                error,
            })),
        })
    }
}
