//! One upstream attempt, and the probe for legacy writes.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wary::run::{Landed, Probe, Runner};
use wary::{Key, Operation, Outcome, Policy, Preset};
use wary_host::draw::process_rng;
use wary_host::http::{error_outcome, outcome};
use wary_host::time::{MonotonicClock, TokioDelay, WallClock};

use crate::frame::Reading;

/// Largest response body read, bytes.
pub const MAX_RESPONSE: usize = 64 * 1024;

/// The HTTP client the gateway sends with.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with a connect timeout; no retries of its own (wary is the only retrying layer).
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(connect_timeout));
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).retry_canceled_requests(false).build(c)
}

/// Where and how readings go.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http://host:port`, no trailing slash.
    pub base: String,
    /// Legacy mode: `POST /legacy/readings` unkeyed, probe on `unknown`.
    pub legacy: bool,
    /// Time for one attempt, response body included.
    pub attempt_timeout: Duration,
    /// How long the legacy probe waits before its first read (`None`: [`Self::attempt_timeout`]).
    /// A write that timed out may still be in flight on the server; a read made at once could
    /// find nothing, and the resend it allows would apply the reading twice.
    pub probe_grace: Option<Duration>,
}

impl Upstream {
    /// The probe's wait before its first read.
    pub fn probe_grace(&self) -> Duration {
        self.probe_grace.unwrap_or(self.attempt_timeout)
    }

    /// Sends `reading` once; `Ok(id)` is the cloud's effect id. `remaining` is the call's time
    /// left before its deadline, in milliseconds: the attempt's timeout is capped to it.
    pub async fn send(
        &self,
        client: &HttpClient,
        policy: &Policy,
        reading: &Reading,
        remaining: Option<u64>,
    ) -> Result<u64, Outcome> {
        let body = serde_json::json!({"sensor": reading.sensor, "boot": reading.boot, "seq": reading.seq, "value": reading.value});
        let mut b = Request::builder().method(Method::POST).header("content-type", "application/json");
        b = if self.legacy {
            b.uri(format!("{}/legacy/readings", self.base)).header("x-reading-id", reading.reading_id())
        } else {
            b.uri(format!("{}/readings", self.base))
                .header("idempotency-key", reading.key().to_hex().as_str())
        };
        let req = b.body(Full::new(Bytes::from(body.to_string()))).map_err(|_| Outcome::BadBody)?;
        let attempt = async {
            let resp = client.request(req).await.map_err(|e| error_outcome(&e))?;
            let o = outcome(policy, resp.status(), resp.headers(), WallClock.unix_secs());
            let json = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            // Read the body under a size limit; a body that breaks is a broken stream.
            let bytes = match Limited::new(resp.into_body(), MAX_RESPONSE).collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) if o == Outcome::Ok => return Err(Outcome::Reset),
                Err(_) => Bytes::new(),
            };
            if o != Outcome::Ok {
                return Err(o);
            }
            if !json {
                return Err(Outcome::BadBody);
            }
            let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| Outcome::BadBody)?;
            v.get("id").and_then(serde_json::Value::as_u64).ok_or(Outcome::BadBody)
        };
        let limit =
            remaining.map_or(self.attempt_timeout, |ms| self.attempt_timeout.min(Duration::from_millis(ms)));
        match tokio::time::timeout(limit, attempt).await {
            Ok(r) => r,
            Err(_) => Err(Outcome::ResponseTimeout),
        }
    }
}

/// Asks `GET /legacy/readings/<id>` whether a legacy write landed: 200 yes, 404 no. The probe
/// is a read, so it is safe to repeat: it runs under its own small wary policy, and only when
/// that gives up is the answer unknown (surfaced to a person, never a blind resend).
///
/// It first waits [`Upstream::probe_grace()`]: the write it checks may have timed out on the
/// client while still being applied on the server, and a 404 read before that lands would
/// allow a resend that applies it twice. Its reads stop by the call's deadline; if the grace
/// and one read do not fit before it, the answer is unknown without a read.
pub struct LegacyProbe<'a> {
    /// The client.
    pub client: &'a HttpClient,
    /// The upstream.
    pub upstream: &'a Upstream,
    /// The reading.
    pub reading: Reading,
    /// When the call must be over (its deadline), if it has one.
    pub deadline: Option<tokio::time::Instant>,
}

/// The probe's own read timeout floor: a read given less than this is not worth starting.
const MIN_PROBE_READ: Duration = Duration::from_millis(10);

/// The probe's own policy: four reads at most, within three seconds of waiting, and by
/// `deadline_ms` from its first read when the call has a deadline.
fn probe_policy(deadline_ms: Option<u64>) -> Option<Policy> {
    let mut b = Policy::builder(Preset::Default).base(100).cap(1_000).budget(3_000).max_attempts(4);
    if let Some(d) = deadline_ms {
        b = b.deadline(d).min_attempt(MIN_PROBE_READ.as_millis() as u64);
    }
    b.build().ok()
}

impl LegacyProbe<'_> {
    /// One read: `Ok` with a definite answer, `Err` with the outcome that left it open.
    /// `remaining` (ms) caps its timeout.
    async fn check_once(&self, policy: &Policy, remaining: Option<u64>) -> Result<Landed<u64>, Outcome> {
        let uri = format!("{}/legacy/readings/{}", self.upstream.base, self.reading.reading_id());
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|_| Outcome::BadBody)?;
        let check = async {
            let resp = self.client.request(req).await.map_err(|e| error_outcome(&e))?;
            let status = resp.status();
            let o = outcome(policy, status, resp.headers(), WallClock.unix_secs());
            Limited::new(resp.into_body(), MAX_RESPONSE).collect().await.map_err(|_| Outcome::Reset)?;
            match status {
                StatusCode::OK => Ok(Landed::Yes(0)),
                StatusCode::NOT_FOUND => Ok(Landed::No),
                _ if o == Outcome::Ok => Err(Outcome::BadBody),
                _ => Err(o),
            }
        };
        let limit = remaining.map_or(self.upstream.attempt_timeout, |ms| {
            self.upstream.attempt_timeout.min(Duration::from_millis(ms))
        });
        match tokio::time::timeout(limit, check).await {
            Ok(r) => r,
            Err(_) => Err(Outcome::ResponseTimeout),
        }
    }
}

impl Probe<u64> for LegacyProbe<'_> {
    async fn landed(&mut self, key: Key) -> Landed<u64> {
        let grace = self.upstream.probe_grace();
        // Time left for reads after the grace, if the call has a deadline.
        let left = self
            .deadline
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()).saturating_sub(grace));
        if left.is_some_and(|l| l < MIN_PROBE_READ) {
            return Landed::Unknown;
        }
        tokio::time::sleep(grace).await;
        let left_ms = left.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
        let Some(policy) = probe_policy(left_ms) else { return Landed::Unknown };
        let clock = MonotonicClock::new();
        let mut runner = Runner::new(&policy, TokioDelay, &clock, process_rng());
        let this = &*self;
        match runner.call(Operation::Read, key, |a| this.check_once(&policy, a.remaining)).await {
            Ok(answer) => answer,
            Err(_) => Landed::Unknown,
        }
    }
}
