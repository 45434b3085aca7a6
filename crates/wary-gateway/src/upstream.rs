//! One upstream attempt, and the probe for unkeyed (legacy) upstreams.
//!
//! Any upstream: a 2xx means the effect landed. What the body of a 2xx looks like is the
//! upstream's business; a [`BodyCheck`] is opt-in, and a 2xx that fails it is still landed
//! (reported as [`Delivered::body_ok`] `false`), never resent: sending it again would do the
//! work twice and still not change the body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wary::{Failure, Key, Landed, Operation, Outcome, Policy, Preset, Probe, Runner};
use wary_host::draw::process_rng;
use wary_host::http::{error_failure, outcome};
use wary_host::time::{MonotonicClock, TokioDelay, WallClock};

/// Largest response body read, bytes.
pub const MAX_RESPONSE: usize = 64 * 1024;

/// The HTTP client the gateway sends with.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with a connect timeout; no retries of its own (wary is the only retrying layer).
///
/// This client is the gateway's own, built from its configuration: no user-made client is
/// replaced. Each attempt is further bounded by a timer around it ([`Upstream::send`]), the
/// attempt timeout capped to the time left before the call's deadline. A connect timeout is
/// told apart (never sent) only when it fires before that timer, that is when it is shorter
/// than the attempt timeout; when both are equal, a connect that hangs ends as a response
/// timeout (may have landed).
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(connect_timeout));
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).retry_canceled_requests(false).build(c)
}

/// What a 2xx body must look like to count as good, if anything. Opt-in: the default accepts
/// any body, because a success is the upstream's status, not its body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyCheck {
    /// Any body.
    #[default]
    None,
    /// The `Content-Type` must start with this media type (compared case-insensitively).
    ContentType(String),
    /// The body must be a JSON object holding this top-level field.
    JsonField(String),
}

impl BodyCheck {
    /// True if a 2xx with this content type and body passes.
    pub fn passes(&self, content_type: Option<&HeaderValue>, body: &[u8]) -> bool {
        match self {
            BodyCheck::None => true,
            BodyCheck::ContentType(want) => content_type.is_some_and(|v| {
                v.as_bytes().get(..want.len()).is_some_and(|p| p.eq_ignore_ascii_case(want.as_bytes()))
            }),
            BodyCheck::JsonField(field) => serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .is_some_and(|v| v.get(field.as_str()).is_some()),
        }
    }
}

/// A static header sent on every upstream request (an API token, say). Its value is marked
/// sensitive and never printed: `Debug` shows the name only.
#[derive(Clone)]
pub struct StaticHeader {
    /// The header's name.
    pub name: HeaderName,
    /// The header's value.
    pub value: HeaderValue,
}

impl StaticHeader {
    /// A header whose value is kept out of logs (and out of HPACK tables, for HTTP/2).
    pub fn new(name: HeaderName, mut value: HeaderValue) -> Self {
        value.set_sensitive(true);
        StaticHeader { name, value }
    }
}

impl std::fmt::Debug for StaticHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: <redacted>", self.name)
    }
}

/// Where and how readings go.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http://host:port`, no trailing slash.
    pub base: String,
    /// The path readings are posted to (`/readings`).
    pub path: String,
    /// The header carrying the idempotency key (`Idempotency-Key`).
    pub key_header: HeaderName,
    /// Sent on every request, after the gateway's own headers.
    pub headers: Vec<StaticHeader>,
    /// What a 2xx body must look like (opt-in).
    pub body_check: BodyCheck,
    /// Legacy mode: the upstream has no idempotency keys. The key goes in `X-Reading-Id` as a
    /// label only, the write is unkeyed (an `unknown` is never resent) and `GET <path>/<key>`
    /// probes whether it landed (200 yes, 404 no).
    pub legacy: bool,
    /// Time for one attempt, response body included.
    pub attempt_timeout: Duration,
    /// How long the legacy probe waits before its first read (`None`: [`Self::attempt_timeout`]).
    /// A write that timed out may still be in flight on the server; a read made at once could
    /// find nothing, and the resend it allows would apply the reading twice.
    pub probe_grace: Option<Duration>,
}

/// The header a legacy upstream labels a reading with.
pub const READING_ID: HeaderName = HeaderName::from_static("x-reading-id");

impl Upstream {
    /// An upstream at `base` with the defaults: `POST /readings`, `Idempotency-Key`, no extra
    /// headers, no body check, 5 s per attempt.
    pub fn new(base: &str) -> Self {
        Upstream {
            base: base.trim_end_matches('/').to_owned(),
            path: "/readings".to_owned(),
            key_header: HeaderName::from_static("idempotency-key"),
            headers: Vec::new(),
            body_check: BodyCheck::None,
            legacy: false,
            attempt_timeout: Duration::from_secs(5),
            probe_grace: None,
        }
    }

    /// The probe's wait before its first read.
    pub fn probe_grace(&self) -> Duration {
        self.probe_grace.unwrap_or(self.attempt_timeout)
    }

    /// Sends one reading once. `remaining` is the call's time left before its deadline: the
    /// attempt's timeout is capped to it. Retry-After values that cannot be read at all are
    /// added to `unreadable`.
    pub async fn send(
        &self,
        client: &HttpClient,
        policy: &Policy,
        reading: &Forward,
        remaining: Option<wary::Duration>,
        unreadable: &AtomicU64,
    ) -> Result<Delivered, Failure> {
        let mut b = Request::builder().method(Method::POST).uri(format!("{}{}", self.base, self.path));
        if let Some(ct) = &reading.content_type {
            b = b.header(CONTENT_TYPE, ct.clone());
        }
        b = if self.legacy {
            b.header(READING_ID, reading.key.clone())
        } else {
            b.header(self.key_header.clone(), reading.key.clone())
        };
        for h in &self.headers {
            b = b.header(h.name.clone(), h.value.clone());
        }
        let req = b.body(Full::new(reading.body.clone())).map_err(|_| Failure::BadBody)?;
        let attempt = async {
            let resp = client.request(req).await.map_err(|e| error_failure(&e))?;
            let status = resp.status();
            let o = read_outcome(policy, status, resp.headers(), unreadable);
            let content_type = resp.headers().get(CONTENT_TYPE).cloned();
            // Read the body under a size limit; a 2xx whose body breaks may have landed: a
            // reset, which a keyed write may resend and an unkeyed one never does.
            let body = match Limited::new(resp.into_body(), MAX_RESPONSE).collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) if o == Outcome::Ok => return Err(Failure::Reset),
                Err(_) => Bytes::new(),
            };
            o.into_result()?;
            let body_ok = self.body_check.passes(content_type.as_ref(), &body);
            Ok(Delivered { status, content_type, body, body_ok })
        };
        let limit = remaining.map_or(self.attempt_timeout, |left| self.attempt_timeout.min(left.into()));
        match tokio::time::timeout(limit, attempt).await {
            Ok(r) => r,
            Err(_) => Err(Failure::ResponseTimeout),
        }
    }
}

/// One reading as the gateway forwards it: the device's key and body, as they came.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The device's `Idempotency-Key`, sent upstream unchanged, so the upstream deduplicates a
    /// device's resend whichever gateway replica (or none) it went through.
    pub key: HeaderValue,
    /// The key the core and the ledger use: the header's 32 hex digits, or a digest of it.
    pub wary_key: Key,
    /// The request body, unchanged.
    pub body: Bytes,
    /// The request's `Content-Type`, if it had one.
    pub content_type: Option<HeaderValue>,
}

/// A landed reading: the upstream's 2xx answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The upstream's status (a 2xx).
    pub status: StatusCode,
    /// Its `Content-Type`, if any.
    pub content_type: Option<HeaderValue>,
    /// Its body (up to [`MAX_RESPONSE`] bytes).
    pub body: Bytes,
    /// False if the body failed the configured [`BodyCheck`]: landed all the same.
    pub body_ok: bool,
}

/// Asks `GET <path>/<key>` whether a legacy write landed: 200 yes, 404 no. The probe is a
/// read, so it is safe to repeat: it runs under its own small wary policy, and only when that
/// gives up is the answer unknown (surfaced to a person, never a blind resend).
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
    /// The reading id (the device's key).
    pub reading_id: &'a str,
    /// When the call must be over (its deadline), if it has one.
    pub deadline: Option<tokio::time::Instant>,
    /// Where Retry-After values that cannot be read at all are counted.
    pub unreadable: &'a AtomicU64,
}

/// A response's outcome through the core's `Outcome::from_response` (by way of
/// `wary_host::http::outcome`), its unreadable Retry-After values counted.
fn read_outcome(
    policy: &Policy,
    status: StatusCode,
    headers: &http::HeaderMap,
    unreadable: &AtomicU64,
) -> Outcome {
    let (o, reading) = outcome(policy, status, headers, WallClock.unix_secs());
    if reading.unreadable > 0 {
        unreadable.fetch_add(u64::from(reading.unreadable), Ordering::Relaxed);
    }
    o
}

/// The probe's own read timeout floor: a read given less than this is not worth starting.
const MIN_PROBE_READ: Duration = Duration::from_millis(10);

/// The probe's own policy: four reads at most, within three seconds of waiting, and by
/// `deadline` from its first read when the call has a deadline.
fn probe_policy(deadline: Option<wary::Duration>) -> Option<Policy> {
    let ms = wary::Duration::from_millis;
    let mut b =
        Policy::builder(Preset::Default).base(ms(100)).cap(ms(1_000)).budget(ms(3_000)).max_attempts(4);
    if let Some(d) = deadline {
        b = b.deadline(d).min_attempt(MIN_PROBE_READ.into());
    }
    b.build().ok()
}

impl LegacyProbe<'_> {
    /// One read: `Ok` with a definite answer, `Err` with the failure that left it open.
    /// `remaining` caps its timeout.
    async fn check_once(
        &self,
        policy: &Policy,
        remaining: Option<wary::Duration>,
    ) -> Result<Landed<()>, Failure> {
        let uri = format!("{}{}/{}", self.upstream.base, self.upstream.path, self.reading_id);
        let mut b = Request::builder().method(Method::GET).uri(uri);
        for h in &self.upstream.headers {
            b = b.header(h.name.clone(), h.value.clone());
        }
        let req = b.body(Full::new(Bytes::new())).map_err(|_| Failure::BadBody)?;
        let check = async {
            let resp = self.client.request(req).await.map_err(|e| error_failure(&e))?;
            let status = resp.status();
            let o = read_outcome(policy, status, resp.headers(), self.unreadable);
            Limited::new(resp.into_body(), MAX_RESPONSE).collect().await.map_err(|_| Failure::Reset)?;
            match (status, o) {
                (StatusCode::OK, _) => Ok(Landed::Yes(())),
                (StatusCode::NOT_FOUND, _) => Ok(Landed::No),
                // Another 2xx answers neither yes nor no.
                (_, Outcome::Ok) => Err(Failure::BadBody),
                (_, Outcome::Failure(f)) => Err(f),
            }
        };
        let limit = remaining
            .map_or(self.upstream.attempt_timeout, |left| self.upstream.attempt_timeout.min(left.into()));
        match tokio::time::timeout(limit, check).await {
            Ok(r) => r,
            Err(_) => Err(Failure::ResponseTimeout),
        }
    }
}

impl Probe<Delivered> for LegacyProbe<'_> {
    async fn landed(&mut self, key: Key) -> Landed<Delivered> {
        let grace = self.upstream.probe_grace();
        // Time left for reads after the grace, if the call has a deadline.
        let left = self
            .deadline
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()).saturating_sub(grace));
        if left.is_some_and(|l| l < MIN_PROBE_READ) {
            return Landed::Unknown;
        }
        tokio::time::sleep(grace).await;
        let Some(policy) = probe_policy(left.map(wary::Duration::from)) else { return Landed::Unknown };
        let clock = MonotonicClock::new();
        let mut runner = Runner::new(&policy, TokioDelay, clock, process_rng());
        let this = &*self;
        match runner.call(Operation::Idempotent, key, |a| this.check_once(&policy, a.remaining)).await {
            // The write's own answer was lost; the read says it landed. No upstream body to
            // hand on: the device gets a plain 200.
            Ok(Landed::Yes(())) => Landed::Yes(Delivered {
                status: StatusCode::OK,
                content_type: None,
                body: Bytes::new(),
                body_ok: true,
            }),
            Ok(Landed::No) => Landed::No,
            Ok(Landed::Unknown) | Err(_) => Landed::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_checks_are_opt_in_and_typed() {
        let json = HeaderValue::from_static("Application/JSON; charset=utf-8");
        assert!(BodyCheck::None.passes(None, b"not json at all"));
        let ct = BodyCheck::ContentType("application/json".into());
        assert!(ct.passes(Some(&json), b""));
        assert!(!ct.passes(Some(&HeaderValue::from_static("text/plain")), b"{}"));
        assert!(!ct.passes(None, b"{}"));
        let field = BodyCheck::JsonField("id".into());
        assert!(field.passes(None, br#"{"id": 7}"#));
        assert!(!field.passes(None, br#"{"ID": 7}"#));
        assert!(!field.passes(None, b"created"));
    }

    #[test]
    fn unreadable_retry_after_values_are_counted() {
        let policy = Policy::builder(Preset::Default).build().unwrap();
        let n = AtomicU64::new(0);
        let mut h = http::HeaderMap::new();
        h.append("retry-after", HeaderValue::from_static("whenever"));
        h.append("retry-after", HeaderValue::from_static("3"));
        let o = read_outcome(&policy, StatusCode::SERVICE_UNAVAILABLE, &h, &n);
        assert_eq!(o.retry_after(), Some(wary::Duration::from_secs(3)));
        assert_eq!(o.failure().map(wary::Failure::unreadable_retry_after), Some(1), "the ledger's count");
        assert_eq!(n.load(Ordering::Relaxed), 1);
        // A 2xx reads no Retry-After at all.
        assert_eq!(read_outcome(&policy, StatusCode::CREATED, &h, &n), Outcome::Ok);
        assert_eq!(n.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_static_header_never_prints_its_value() {
        let h = StaticHeader::new(
            HeaderName::from_static("authorization"),
            HeaderValue::from_static("Bearer s3cret"),
        );
        let shown = format!("{h:?}");
        assert!(shown.contains("authorization") && !shown.contains("s3cret"), "{shown}");
        assert!(h.value.is_sensitive());
    }
}
