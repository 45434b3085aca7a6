//! A test cloud for wary: an HTTP/1.1 server with a keyed endpoint backed by an idempotency
//! store, a legacy unkeyed endpoint that applies every copy it gets, a read endpoint to probe
//! whether a legacy write landed, and seeded, scriptable faults.
//!
//! | route | what it does |
//! |---|---|
//! | `POST /readings` | needs `Idempotency-Key` (400 without); the first request applies the effect and stores `201 {"id": n}`; a replay returns the stored result and applies nothing; 409 while a request with the same key is in flight |
//! | `POST /legacy/readings` | applies every request, `201 {"id": n}`; an optional `X-Reading-Id` labels the effect |
//! | `GET /legacy/readings/<reading-id>` | 200 if that reading landed at least once, else 404 |
//! | `GET /stats` | [`Stats`] as JSON |
//! | `GET`/`POST /admin/faults` | read or replace the [`Faults`] (JSON or compact form) |
//!
//! Faults on delivery (500, drop, slow, bad body, endless body) also apply to replays: they model
//! the path between the store and the client, so the store always keeps the genuine first result.
//! Request bodies are measured, never logged or kept.

mod faults;
mod state;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, DATE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

pub use faults::{BadBodyForm, Fault, Faults, RetryAfter, Rule, Scope};
use state::{Claim, State, Stored};
pub use state::{Duplicates, KeyStats, Stats};

/// Largest request body accepted (413 above).
pub const MAX_BODY: usize = 1 << 20;
/// Longest idempotency key or reading id accepted (400 above).
pub const MAX_KEY_LEN: usize = 255;

type Body = UnsyncBoxBody<Bytes, Infallible>;

struct Shared {
    state: Mutex<State>,
    faults: Mutex<Faults>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking handler leaves counters consistent enough for a test server.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Chooses this request's fault, if its endpoint is in scope.
    fn pick(&self, endpoint: Endpoint, stream: &str) -> Option<Fault> {
        let faults = self.faults();
        let in_scope = match endpoint {
            Endpoint::Keyed => faults.scope.keyed,
            Endpoint::Legacy => faults.scope.legacy,
            Endpoint::Read => faults.scope.read,
        };
        let mut state = self.state();
        let ordinal = state.next_ordinal(stream);
        if !in_scope {
            return None;
        }
        let fault = faults.pick(stream, ordinal).cloned();
        if let Some(f) = &fault {
            state.count_fault(f.name());
        }
        fault
    }
}

#[derive(Clone, Copy)]
enum Endpoint {
    Keyed,
    Legacy,
    Read,
}

/// A running test cloud. Dropping it also stops the server, without waiting for that.
pub struct Cloud {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Cloud {
    /// Binds `addr` (port 0 picks a free port) and serves until [`Cloud::shutdown`].
    pub async fn start(addr: impl ToSocketAddrs, faults: Faults) -> anyhow::Result<Cloud> {
        faults.validate().map_err(anyhow::Error::msg)?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), faults: Mutex::new(faults) });
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        Ok(Cloud { addr, shared, stop: Some(stop_tx), task: Some(task) })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.state().stats()
    }

    /// Counters of one idempotency key, if it was seen.
    pub fn key_stats(&self, key: &str) -> Option<KeyStats> {
        self.shared.state().key_stats(key)
    }

    /// How many times the legacy endpoint applied `reading_id`.
    pub fn reading_effects(&self, reading_id: &str) -> u64 {
        self.shared.state().readings.get(reading_id).copied().unwrap_or(0)
    }

    /// The fault script in force.
    pub fn faults(&self) -> Faults {
        self.shared.faults().clone()
    }

    /// Replaces the fault script; later requests use it. Per-stream ordinals keep counting.
    pub fn set_faults(&self, faults: Faults) -> anyhow::Result<()> {
        faults.validate().map_err(anyhow::Error::msg)?;
        *self.shared.faults() = faults;
        Ok(())
    }

    /// Stops accepting and closes every open connection, including endless bodies.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(shared.clone(), req));
                    // Errors here are clients going away or deliberate drops.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// Returned from the service to make hyper close the connection without a reply.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

type Reply = Result<Response<Body>, Dropped>;

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Reply {
    shared.state().requests += 1;
    let reply = route(&shared, req).await;
    shared.state().count_status(reply.as_ref().ok().map(|r| r.status().as_u16()));
    reply
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (path.as_str(), method) {
        ("/readings", Method::POST) => keyed(shared, req).await,
        ("/legacy/readings", Method::POST) => legacy_write(shared, req).await,
        ("/stats", Method::GET) => {
            let stats = shared.state().stats();
            Ok(json(StatusCode::OK, &stats))
        }
        ("/admin/faults", Method::GET) => {
            let faults = shared.faults().clone();
            Ok(json(StatusCode::OK, &faults))
        }
        ("/admin/faults", Method::POST) => set_faults(shared, req).await,
        (p, Method::GET) if p.starts_with("/legacy/readings/") => {
            let rid = p.trim_start_matches("/legacy/readings/").to_owned();
            legacy_read(shared, &rid).await
        }
        ("/readings" | "/legacy/readings" | "/stats" | "/admin/faults", _) => {
            Ok(error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"))
        }
        _ => Ok(error(StatusCode::NOT_FOUND, "no such route")),
    }
}

/// A header value usable as a key or reading id: visible ASCII, 1..=MAX_KEY_LEN bytes.
fn id_header(req: &Request<Incoming>, name: &str) -> Result<Option<String>, &'static str> {
    let Some(value) = req.headers().get(name) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| "header is not visible ASCII")?;
    if text.is_empty() || text.len() > MAX_KEY_LEN || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("header must be 1..=255 visible ASCII characters");
    }
    Ok(Some(text.to_owned()))
}

/// Reads the body and returns its length only.
async fn body_len(req: Request<Incoming>) -> Result<usize, Response<Body>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes().len()),
        Err(_) => Err(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or broken")),
    }
}

async fn keyed(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let key = match id_header(&req, "idempotency-key") {
        Ok(Some(key)) => key,
        Ok(None) => return Ok(error(StatusCode::BAD_REQUEST, "missing Idempotency-Key")),
        Err(why) => return Ok(error(StatusCode::BAD_REQUEST, why)),
    };
    let len = match body_len(req).await {
        Ok(len) => len,
        Err(resp) => return Ok(resp),
    };
    let fault = shared.pick(Endpoint::Keyed, &format!("k:{key}"));
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    let claim = shared.state().claim(&key);
    match claim {
        Claim::Busy => Ok(error(StatusCode::CONFLICT, "a request with this key is in flight")),
        Claim::Replay(stored) => {
            let mut resp = deliver(fault.as_ref(), Some(stored)).await?;
            resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(resp)
        }
        Claim::Fresh => {
            // Clears the busy mark even if the client hangs up and this future is dropped.
            let _busy = BusyGuard { shared: shared.clone(), key: key.clone() };
            slow_before(fault.as_ref()).await;
            let stored = applies(fault.as_ref()).then(|| shared.state().apply_keyed(&key, len));
            deliver(fault.as_ref(), stored).await
        }
    }
}

struct BusyGuard {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.shared.state().release(&self.key);
    }
}

async fn legacy_write(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let rid = match id_header(&req, "x-reading-id") {
        Ok(rid) => rid,
        Err(why) => return Ok(error(StatusCode::BAD_REQUEST, why)),
    };
    if let Err(resp) = body_len(req).await {
        return Ok(resp);
    }
    let stream = rid.as_ref().map_or_else(|| "legacy".to_owned(), |r| format!("r:{r}"));
    let fault = shared.pick(Endpoint::Legacy, &stream);
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    slow_before(fault.as_ref()).await;
    let stored = applies(fault.as_ref()).then(|| shared.state().apply_legacy(rid.as_deref()));
    deliver(fault.as_ref(), stored).await
}

async fn legacy_read(shared: &Arc<Shared>, rid: &str) -> Reply {
    let fault = shared.pick(Endpoint::Read, &format!("g:{rid}"));
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    slow_before(fault.as_ref()).await;
    let applied = shared.state().readings.get(rid).copied().unwrap_or(0);
    let stored = if applied > 0 {
        Stored {
            status: 200,
            body: Bytes::from(serde_json::json!({"reading_id": rid, "applied": applied}).to_string()),
        }
    } else {
        Stored { status: 404, body: Bytes::from_static(b"{\"error\":\"reading not found\"}") }
    };
    deliver(fault.as_ref(), Some(stored)).await
}

async fn set_faults(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or broken"));
        }
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "faults must be UTF-8"));
    };
    match Faults::parse_any(text) {
        Ok(faults) => {
            *shared.faults() = faults.clone();
            Ok(json(StatusCode::OK, &faults))
        }
        Err(why) => Ok(error(StatusCode::BAD_REQUEST, &why)),
    }
}

/// Faults that answer before any effect.
fn before_effect(fault: Option<&Fault>) -> Option<Reply> {
    match fault? {
        Fault::Unavailable { retry_after } => {
            Some(Ok(with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"), *retry_after)))
        }
        Fault::TooManyRequests { retry_after } => {
            Some(Ok(with_retry_after(error(StatusCode::TOO_MANY_REQUESTS, "slow down"), *retry_after)))
        }
        Fault::BadRequest => Some(Ok(error(StatusCode::BAD_REQUEST, "rejected"))),
        Fault::DropBeforeEffect => Some(Err(Dropped)),
        _ => None,
    }
}

async fn slow_before(fault: Option<&Fault>) {
    if let Some(Fault::Slow { ms, before_effect: true }) = fault {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
}

/// Whether the effect is applied under this fault.
fn applies(fault: Option<&Fault>) -> bool {
    !matches!(fault, Some(Fault::BadBody { effect: false, .. } | Fault::EndlessBody { effect: false, .. }))
}

/// Turns the result (or its absence, for faults that skip the effect) into what the client gets.
async fn deliver(fault: Option<&Fault>, stored: Option<Stored>) -> Reply {
    match fault {
        Some(Fault::ErrorAfterEffect) => Ok(error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")),
        Some(Fault::DropAfterEffect) => Err(Dropped),
        Some(Fault::Slow { ms, before_effect: false }) => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            Ok(from_stored(stored))
        }
        Some(Fault::BadBody { form, .. }) => {
            let (content_type, body): (&str, &[u8]) = match form {
                BadBodyForm::NotJson => {
                    ("application/json", b"<html><body>502 upstream hiccup</body></html>")
                }
                BadBodyForm::WrongType => ("text/html", b"{\"id\":0}"),
            };
            Ok(response(StatusCode::OK, content_type, Bytes::from_static(body)))
        }
        Some(Fault::EndlessBody { ms, .. }) => {
            let body = Trickle {
                period: Duration::from_millis(*ms),
                sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            };
            let mut resp = Response::new(body.boxed_unsync());
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Ok(resp)
        }
        _ => Ok(from_stored(stored)),
    }
}

fn from_stored(stored: Option<Stored>) -> Response<Body> {
    match stored {
        Some(s) => response(
            StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "application/json",
            s.body,
        ),
        None => error(StatusCode::INTERNAL_SERVER_ERROR, "no result"),
    }
}

fn with_retry_after(mut resp: Response<Body>, retry_after: Option<RetryAfter>) -> Response<Body> {
    let Some(ra) = retry_after else { return resp };
    let now = SystemTime::now();
    let headers = resp.headers_mut();
    let date_value = |t: SystemTime| {
        HeaderValue::from_str(&httpdate::fmt_http_date(t)).expect("IMF-fixdate is a valid header")
    };
    match ra {
        RetryAfter::Seconds(n) => {
            headers.insert(RETRY_AFTER, HeaderValue::from(n));
        }
        RetryAfter::Date(offset) => {
            let delta = Duration::from_secs(offset.unsigned_abs());
            let at = if offset >= 0 { now + delta } else { now - delta };
            // Both from the same instant, so `Retry-After - Date` is exactly the offset.
            headers.insert(DATE, date_value(now));
            headers.insert(RETRY_AFTER, date_value(at));
        }
        RetryAfter::Garbage => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("soon-ish, maybe -1"));
        }
        RetryAfter::GarbageDate => {
            headers.insert(DATE, HeaderValue::from_static("the day after yesterday"));
            headers.insert(RETRY_AFTER, date_value(now + Duration::from_secs(5)));
        }
        RetryAfter::Duplicate => {
            headers.append(RETRY_AFTER, HeaderValue::from_static("1"));
            headers.append(RETRY_AFTER, HeaderValue::from_static("3600"));
        }
    }
    resp
}

fn response(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body).boxed_unsync());
    *resp.status_mut() = status;
    if let Ok(ct) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, ct);
    }
    resp
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    response(status, "application/json", Bytes::from(body))
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

/// A body that never ends: one space every `period`.
struct Trickle {
    period: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl HttpBody for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let next = tokio::time::Instant::now() + self.period;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b" ")))))
    }
}
