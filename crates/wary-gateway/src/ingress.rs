//! HTTP in: devices post to the gateway exactly what they would post to the cloud.
//!
//! `POST /readings` with an `Idempotency-Key` header and a JSON body. The gateway answers after
//! its own upstream verdict, so the device's one retry layer sees a real status:
//!
//! | verdict | status | headers |
//! |---|---|---|
//! | landed | the upstream's 2xx, its body and `Content-Type` | `Wary-Verdict: ok`; `Wary-Body-Check: failed` if the 2xx failed the body check |
//! | gave up (stop rules) | 503 | `Retry-After` (seconds), `Wary-Verdict: gave_up`, `Wary-Reason` |
//! | held (the upstream's answer is the endpoint's fault by the core's table: [`crate::hold`]) | 503 | `Retry-After` (the upstream breaker's remaining open time, seconds), `Wary-Verdict: held; upstream=<status, tls or the failure's name>`, `Wary-Upstream-Status` if there was one |
//! | failed | 424 Failed Dependency | `Wary-Verdict: failed`, `Wary-Upstream-Status` if there was one |
//! | unknown (legacy upstream) | 409 Conflict | `Wary-Verdict: unknown` |
//! | queue full | 503 at once | `Retry-After: 1`, `Wary-Verdict: queue_full` |
//! | malformed | 400 with a reason; 404, 405, 413, 431 (a head over [`MAX_HEAD`]); 501 (a transfer coding other than `chunked`) | |
//! | no or a wrong credential | 401 | `WWW-Authenticate: Bearer` |
//! | another device's key | 403 | |
//! | the device is over its rate | 429 | `Retry-After` (seconds) |
//! | every admission bucket busy | 503 | `Retry-After: 1` |
//! | body not in within the body timeout | 408 | `Connection: close` |
//!
//! A request from an authenticated device may carry `Wary-Dead-Letters: held=<u32>,
//! dropped=<u32>` ([`crate::dead_letters`]): noted as that device's once its credential is
//! checked (before its key, rate and body, so a refused reading's report counts too), shown on
//! `/metrics`. It changes no answer: a malformed one is ignored, one from an unauthenticated
//! request (or any request to an open gateway) is not read.
//!
//! 424 and 409 are in the "never resend" class of every device table (other 4xx): a failed
//! reading cannot be fixed by sending it again, and an unknown one may already have landed.
//! A key the gateway answered `unknown` is answered `unknown` again on a resend, never sent on.
//!
//! `POST /readings/batch` carries several readings in one request (docs/batches.md): the
//! credential and the device's identity are checked once for the request, then every item
//! exactly as a single reading is (its key, that the key is the device's, the device's rate, the
//! body limit, the queue), and each item that passes goes upstream as a call of its own. The
//! answer is `200` with one status per item, in order: the status that item would have got
//! alone, with its Retry-After in seconds where it had one.
//!
//! Every refusal above the queue is answered before anything is queued or sent upstream, and
//! counted by reason in the metrics. `GET /healthz` answers 200 for a load balancer's health
//! checks. Header reads, TLS handshakes and the writing of each answer are bounded in time,
//! bodies in time and size; a device that hangs up does not cancel its reading's call (it lands
//! or not; the device's keyed resend is deduplicated upstream).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    ALLOW, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use http::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use wary::Key;
use wary_host::batch::ItemAnswer;

use crate::admission::Refused;
use crate::credentials::{Identity, device_hex, device_of_key};
use crate::gateway::{Answer, Gateway, GatewayError, accept_loop};
use crate::h1::{self, BodyError, ReadWhole};
use crate::tls::{Tls, device_of_certificate};
use crate::upstream::Forward;

/// The path devices post readings to (the cloud's own).
pub const READINGS: &str = "/readings";
/// The path devices post batches of readings to (the cloud's own).
pub const BATCH: &str = wary_host::batch::BATCH_PATH;
/// Longest idempotency key accepted, bytes (the cloud's limit).
pub const MAX_KEY_LEN: usize = 255;
/// How long a device may take to send its request head, by default ([`crate::Config`]'s
/// `header_timeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted on `POST /readings`, bytes of header names and values (431
/// above): a reading's head is a few hundred bytes.
pub const MAX_HEAD: usize = 8 * 1024;
/// The verdict header on every answer to `POST /readings`.
pub const VERDICT: HeaderName = HeaderName::from_static("wary-verdict");

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

fn reply(status: StatusCode, verdict: Option<&'static str>, reason: &str) -> Response<Bytes> {
    let body = serde_json::json!({ "error": reason }).to_string();
    let mut r = Response::new(Bytes::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(v) = verdict {
        r.headers_mut().insert(VERDICT, HeaderValue::from_static(v));
    }
    r
}

/// Why a request was refused before it reached the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadRequest {
    /// No `Idempotency-Key` header.
    #[error("missing Idempotency-Key")]
    MissingKey,
    /// The key is not 1..=255 visible ASCII characters, or there are two.
    #[error("Idempotency-Key must be one value of 1..=255 visible ASCII characters")]
    BadKey,
    /// The body is larger than the gateway accepts.
    #[error("body too large")]
    TooLarge,
    /// The body broke off before its end.
    #[error("body broken or cut short")]
    Broken,
    /// The body is empty or not JSON.
    #[error("body is not JSON")]
    NotJson,
}

impl BadRequest {
    fn status(self) -> StatusCode {
        match self {
            BadRequest::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The request's idempotency key, if it is one value of 1..=[`MAX_KEY_LEN`] visible ASCII
/// characters (so nothing a device sends can split a header upstream).
pub fn key_of(headers: &http::HeaderMap) -> Result<HeaderValue, BadRequest> {
    let mut keys = headers.get_all(IDEMPOTENCY_KEY).iter();
    let key = keys.next().ok_or(BadRequest::MissingKey)?;
    let ok = keys.next().is_none()
        && (1..=MAX_KEY_LEN).contains(&key.len())
        && key.as_bytes().iter().all(u8::is_ascii_graphic);
    if ok { Ok(key.clone()) } else { Err(BadRequest::BadKey) }
}

/// The core's key for a forwarded key: its own 32 hex digits, or a digest of any other key so
/// the ledger still has a fixed-size key for it.
pub(crate) fn wary_key(key: &HeaderValue) -> Key {
    let text = key.to_str().unwrap_or_default();
    Key::from_hex(text).unwrap_or_else(|| Key::from_payload(text.as_bytes()))
}

/// The body of a request whose head has been checked, read within `max_body` bytes.
pub async fn read_body(
    parts: &http::request::Parts,
    body: impl ReadWhole,
    max_body: usize,
) -> Result<Bytes, BadRequest> {
    let announced = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(BadRequest::TooLarge);
    }
    let body = match body.read_whole(max_body).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return Err(BadRequest::TooLarge),
        Err(BodyError::Broken) => return Err(BadRequest::Broken),
    };
    if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
        return Err(BadRequest::NotJson);
    }
    Ok(body)
}

/// The device's answer for the gateway's verdict.
pub fn respond(answer: Answer) -> Response<Bytes> {
    let status = answer.status();
    let name = answer.name();
    let mut r = match answer {
        Answer::Landed(d) => {
            let mut r = Response::new(d.body);
            if let Some(ct) = d.content_type {
                r.headers_mut().insert(CONTENT_TYPE, ct);
            }
            if !d.body_ok {
                r.headers_mut().insert("wary-body-check", HeaderValue::from_static("failed"));
            }
            r
        }
        Answer::GaveUp { reason, retry_after_secs } => {
            let mut r = reply(status, None, "the gateway gave up for now; send it again later, same key");
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            r.headers_mut().insert("wary-reason", HeaderValue::from_static(reason.name()));
            r
        }
        Answer::Held { fault, retry_after_secs } => {
            let mut r = reply(
                status,
                None,
                "the upstream's answer is the endpoint's fault, not this reading's; send it again later, same key",
            );
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            if let Some(s) = fault.status() {
                r.headers_mut().insert("wary-upstream-status", HeaderValue::from(s));
            }
            // `held; upstream=401`: the verdict's name first, as in every other answer.
            let verdict = format!("{name}; upstream={fault}");
            if let Ok(v) = HeaderValue::from_str(&verdict) {
                r.headers_mut().insert(VERDICT, v);
            }
            *r.status_mut() = status;
            return r;
        }
        Answer::Failed { upstream_status } => {
            let mut r = reply(status, None, "the upstream refused it; a resend cannot help");
            if let Some(s) = upstream_status {
                r.headers_mut().insert("wary-upstream-status", HeaderValue::from(s));
            }
            r
        }
        Answer::Unknown => {
            reply(status, None, "may have landed; surfaced for a person to check; do not resend")
        }
        Answer::Cancelled => {
            let mut r = reply(status, None, "cancelled; send it again later, same key");
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
            r
        }
    };
    *r.status_mut() = status;
    r.headers_mut().insert(VERDICT, HeaderValue::from_static(name));
    r
}

fn refuse(gw: &Gateway, what: &'static str, status: StatusCode, reason: &str) -> Response<Bytes> {
    gw.count_refusal(what);
    reply(status, None, reason)
}

/// Handles one request: route, credential (401), key (400) and whose it is (403), the
/// device's rate (429), body (408, 413, 400), then the queue (503) and the verdict.
/// `certified` is the device the connection's client certificate named, if any (mutual TLS):
/// that device is authenticated if the credentials file still lists it (deleting its line
/// revokes the certificate too); a bearer token is then not needed.
pub async fn handle_as<B: ReadWhole + Send>(
    gw: Arc<Gateway>,
    certified: Option<u64>,
    req: Request<B>,
) -> Response<Bytes> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, READINGS | BATCH) => {}
        (&Method::GET | &Method::HEAD, "/healthz") => {
            let mut r = Response::new(Bytes::from_static(b"ok\n"));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return r;
        }
        (_, READINGS | BATCH) => {
            let mut r = refuse(&gw, "bad_request", StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        _ => return refuse(&gw, "bad_request", StatusCode::NOT_FOUND, "no such route"),
    }
    let head: usize = req.headers().iter().map(|(n, v)| n.as_str().len().saturating_add(v.len())).sum();
    if head > MAX_HEAD {
        return refuse(
            &gw,
            "bad_request",
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request head too large",
        );
    }
    if req.uri().path() == BATCH {
        return handle_batch(&gw, certified, req).await;
    }
    let (parts, body) = req.into_parts();
    let claimed = parts.headers.get(IDEMPOTENCY_KEY).and_then(|k| device_of_key(k.as_bytes()));
    let identity = match certified.filter(|d| gw.admits(*d)) {
        // Listed in the file, so the gateway is not open.
        Some(d) => Some(Identity::Device(d)),
        None => gw.identify(parts.headers.get(AUTHORIZATION).map(HeaderValue::as_bytes), claimed),
    };
    let device = match identity {
        None => None,
        Some(Identity::Device(d)) => Some(d),
        Some(Identity::Nobody) => {
            let mut r =
                refuse(&gw, "unauthenticated", StatusCode::UNAUTHORIZED, "a device credential is required");
            r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    };
    if let Some(d) = device {
        // The authenticated device's own report, whatever becomes of the reading.
        gw.note_dead_letters(d, &parts.headers);
    }
    let mut key = match key_of(&parts.headers) {
        Ok(k) => k,
        Err(e) => return refuse(&gw, "bad_request", e.status(), &e.to_string()),
    };
    if let Some(d) = device {
        if gw.config().device_prefix {
            // The device's own namespace upstream, whatever its keys look like.
            let scoped = [device_hex(d).as_bytes(), b":", key.as_bytes()].concat();
            match HeaderValue::from_bytes(&scoped).ok().filter(|v| v.len() <= MAX_KEY_LEN) {
                Some(v) => key = v,
                None => {
                    let e = BadRequest::BadKey;
                    return refuse(&gw, "bad_request", e.status(), &e.to_string());
                }
            }
        } else if device_of_key(key.as_bytes()) != Some(d) {
            return refuse(&gw, "forbidden", StatusCode::FORBIDDEN, "this key is not this device's");
        }
        match gw.admit(d) {
            Ok(()) => {}
            Err(Refused::Rate { retry_after_secs }) => {
                let mut r = refuse(
                    &gw,
                    "rate_limited",
                    StatusCode::TOO_MANY_REQUESTS,
                    "over this device's rate; same key later",
                );
                r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
                return r;
            }
            Err(Refused::Full) => {
                let mut r =
                    refuse(&gw, "admission_full", StatusCode::SERVICE_UNAVAILABLE, "busy; same key later");
                r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
                return r;
            }
        }
    }
    let content_type = parts.headers.get(CONTENT_TYPE).cloned();
    let body =
        match tokio::time::timeout(gw.config().body_timeout, read_body(&parts, body, gw.config().max_body))
            .await
        {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return refuse(&gw, "bad_request", e.status(), &e.to_string()),
            Err(_) => {
                // A body that trickles holds a connection and a buffer: cut at the deadline.
                let mut r =
                    refuse(&gw, "body_timeout", StatusCode::REQUEST_TIMEOUT, "body not received in time");
                r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
        };
    // The head is not kept while the reading waits for its verdict.
    drop(parts);
    let reading = Forward { wary_key: wary_key(&key), key, body, content_type };
    if gw.was_surfaced(reading.wary_key) {
        return respond(Answer::Unknown);
    }
    let rx = match gw.try_submit(reading) {
        Ok(rx) => rx,
        Err(GatewayError::Full) => {
            // Bounded memory: a full queue is answered now, not grown.
            gw.count_refusal("full");
            let mut r = reply(StatusCode::SERVICE_UNAVAILABLE, Some("queue_full"), "queue full");
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
            return r;
        }
        Err(_) => return respond(Answer::Cancelled),
    };
    respond(rx.await.unwrap_or(Answer::Cancelled))
}

/// `POST /readings/batch`, past its route and head checks: the credential (401), the batch's
/// shape and limits (400, 413, 408), then each item as [`handle_as`] treats a reading.
async fn handle_batch(
    gw: &Arc<Gateway>,
    certified: Option<u64>,
    req: Request<impl ReadWhole>,
) -> Response<Bytes> {
    let (parts, body) = req.into_parts();
    let identity = match certified.filter(|d| gw.admits(*d)) {
        Some(d) => Some(Identity::Device(d)),
        None => gw.identify(parts.headers.get(AUTHORIZATION).map(HeaderValue::as_bytes), None),
    };
    let device = match identity {
        None => None,
        Some(Identity::Device(d)) => Some(d),
        Some(Identity::Nobody) => {
            let mut r =
                refuse(gw, "unauthenticated", StatusCode::UNAUTHORIZED, "a device credential is required");
            r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    };
    if let Some(d) = device {
        // The authenticated device's own report, whatever becomes of the reading.
        gw.note_dead_letters(d, &parts.headers);
    }
    let limits = gw.config().batch;
    let announced = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_bytes as u64) {
        return refuse(gw, "bad_request", StatusCode::PAYLOAD_TOO_LARGE, "batch body too large");
    }
    let read = body.read_whole(limits.max_bytes);
    let bytes = match tokio::time::timeout(gw.config().body_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(BodyError::TooLarge)) => {
            return refuse(gw, "bad_request", StatusCode::PAYLOAD_TOO_LARGE, "batch body too large");
        }
        Ok(Err(BodyError::Broken)) => {
            return refuse(gw, "bad_request", StatusCode::BAD_REQUEST, "body broken or cut short");
        }
        Err(_) => {
            let mut r = refuse(gw, "body_timeout", StatusCode::REQUEST_TIMEOUT, "body not received in time");
            r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    let items = match wary_host::batch::parse(&bytes, &limits) {
        Ok(items) => items,
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            return refuse(gw, "bad_request", status, &e.to_string());
        }
    };
    // Every item is checked and queued before any answer is awaited: they go upstream side by side.
    let pending: Vec<Result<tokio::sync::oneshot::Receiver<Answer>, ItemAnswer>> =
        items.into_iter().map(|item| batch_item(gw, device, item)).collect();
    let mut answers = Vec::with_capacity(pending.len());
    for p in pending {
        answers.push(match p {
            Ok(rx) => item_answer(&rx.await.unwrap_or(Answer::Cancelled)),
            Err(refused) => refused,
        });
    }
    let mut r = Response::new(Bytes::from(wary_host::batch::answers(&answers)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The status an item's verdict answers it with: what [`respond`] would give it alone, its
/// Retry-After in seconds where it has one.
fn item_answer(answer: &Answer) -> ItemAnswer {
    let retry_after_secs = match answer {
        Answer::GaveUp { retry_after_secs, .. } | Answer::Held { retry_after_secs, .. } => {
            Some(*retry_after_secs)
        }
        Answer::Cancelled => Some(1),
        _ => None,
    };
    ItemAnswer { status: answer.status().as_u16(), retry_after_secs }
}

/// One item of a batch, checked as [`handle_as`] checks a reading (key 400, another device's 403,
/// the device's rate 429, body 413, queue 503) and queued; `Err` is its refusal.
fn batch_item(
    gw: &Gateway,
    device: Option<u64>,
    item: wary_host::batch::Item,
) -> Result<tokio::sync::oneshot::Receiver<Answer>, ItemAnswer> {
    let refused = |what: &'static str, status: StatusCode, retry_after_secs: Option<u64>| {
        gw.count_refusal(what);
        ItemAnswer { status: status.as_u16(), retry_after_secs }
    };
    let mut key = HeaderValue::from_str(&item.key)
        .ok()
        .filter(|k| (1..=MAX_KEY_LEN).contains(&k.len()) && k.as_bytes().iter().all(u8::is_ascii_graphic))
        .ok_or_else(|| refused("bad_request", StatusCode::BAD_REQUEST, None))?;
    if let Some(d) = device {
        if gw.config().device_prefix {
            let scoped = [device_hex(d).as_bytes(), b":", key.as_bytes()].concat();
            key = HeaderValue::from_bytes(&scoped)
                .ok()
                .filter(|v| v.len() <= MAX_KEY_LEN)
                .ok_or_else(|| refused("bad_request", StatusCode::BAD_REQUEST, None))?;
        } else if device_of_key(key.as_bytes()) != Some(d) {
            return Err(refused("forbidden", StatusCode::FORBIDDEN, None));
        }
        match gw.admit(d) {
            Ok(()) => {}
            Err(Refused::Rate { retry_after_secs }) => {
                return Err(refused("rate_limited", StatusCode::TOO_MANY_REQUESTS, Some(retry_after_secs)));
            }
            Err(Refused::Full) => {
                return Err(refused("admission_full", StatusCode::SERVICE_UNAVAILABLE, Some(1)));
            }
        }
    }
    if item.body.len() > gw.config().max_body {
        return Err(refused("bad_request", StatusCode::PAYLOAD_TOO_LARGE, None));
    }
    let reading = Forward {
        wary_key: wary_key(&key),
        key,
        body: Bytes::from(item.body),
        content_type: Some(HeaderValue::from_static("application/json")),
    };
    if gw.was_surfaced(reading.wary_key) {
        return Err(item_answer(&Answer::Unknown));
    }
    match gw.try_submit(reading) {
        Ok(rx) => Ok(rx),
        Err(GatewayError::Full) => Err(refused("full", StatusCode::SERVICE_UNAVAILABLE, Some(1))),
        Err(_) => Err(item_answer(&Answer::Cancelled)),
    }
}

/// Serves one device connection (plain or TLS) until it closes.
pub async fn serve_connection<S>(gw: Arc<Gateway>, io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    serve_connection_as(gw, None, io).await;
}

/// [`serve_connection`] for a connection whose client certificate named `certified`.
pub async fn serve_connection_as<S>(gw: Arc<Gateway>, certified: Option<u64>, io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_timeout = gw.config().header_timeout;
    h1::serve(io, header_timeout, Device { gw, certified }).await;
}

/// The device side's handler on an [`h1`] connection.
struct Device {
    gw: Arc<Gateway>,
    certified: Option<u64>,
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> h1::Handler<S> for Device {
    async fn call<'a>(&'a self, req: Request<h1::Body<'a, S>>) -> Response<Bytes> {
        handle_as(self.gw.clone(), self.certified, req).await
    }
}

fn accept_failed(e: &std::io::Error, d: wary::Duration) {
    eprintln!("wary-gateway: accept failed ({:?}); next try in {d}", e.kind());
}

/// Serves the device side over plain HTTP on `listener` until the task is dropped. An accept
/// error (out of file descriptors, say) is waited out ([`crate::gateway::AcceptBackoff`]); its
/// kind is logged, never its text.
pub async fn serve(gw: Arc<Gateway>, listener: TcpListener) {
    let on_conn = |(sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
        let _ = sock.set_nodelay(true);
        tokio::spawn(serve_connection(gw.clone(), sock));
    };
    accept_loop(|| listener.accept(), on_conn, accept_failed).await;
}

/// Serves the device side over TLS on `listener`: each connection is handed the configuration
/// in force when it is accepted ([`Tls::acceptor`]), and must finish its handshake within the
/// header timeout. A client that does not speak TLS is dropped at the handshake.
pub async fn serve_tls(gw: Arc<Gateway>, listener: TcpListener, tls: Arc<Tls>) {
    let on_conn = |(sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
        let _ = sock.set_nodelay(true);
        let (gw, acceptor) = (gw.clone(), tls.acceptor());
        tokio::spawn(async move {
            let limit = gw.config().header_timeout;
            if let Ok(Ok(stream)) = tokio::time::timeout(limit, acceptor.accept(sock)).await {
                let certified = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(device_of_certificate);
                serve_connection_as(gw, certified, stream).await;
            }
        });
    };
    accept_loop(|| listener.accept(), on_conn, accept_failed).await;
}

/// The metrics listener's handler on an [`h1`] connection: `GET /metrics`, nothing else.
struct MetricsRoute {
    gw: Arc<Gateway>,
}

impl<S: Send> h1::Handler<S> for MetricsRoute {
    async fn call<'a>(&'a self, req: Request<h1::Body<'a, S>>) -> Response<Bytes> {
        if req.method() != Method::GET || req.uri().path() != "/metrics" {
            return reply(StatusCode::NOT_FOUND, None, "no such route");
        }
        let mut r = Response::new(Bytes::from(self.gw.prometheus()));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
        r
    }
}

/// Serves `GET /metrics` (Prometheus text) on `listener` over the gateway's own HTTP/1.1
/// connection ([`h1`], as the device side), each head within [`HEADER_TIMEOUT`]; bind it to
/// loopback.
pub async fn serve_metrics(gw: Arc<Gateway>, listener: TcpListener) {
    let on_conn = |(sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
        tokio::spawn(h1::serve(sock, HEADER_TIMEOUT, MetricsRoute { gw: gw.clone() }));
    };
    accept_loop(|| listener.accept(), on_conn, |_, _| {}).await;
}
