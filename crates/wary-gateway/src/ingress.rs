//! HTTP in: devices post to the gateway exactly what they would post to the cloud.
//!
//! `POST /readings` with an `Idempotency-Key` header and a JSON body. The gateway answers after
//! its own upstream verdict, so the device's one retry layer sees a real status:
//!
//! | verdict | status | headers |
//! |---|---|---|
//! | landed | the upstream's 2xx, its body and `Content-Type` | `Wary-Verdict: ok`; `Wary-Body-Check: failed` if the 2xx failed the body check |
//! | gave up (stop rules) | 503 | `Retry-After` (seconds), `Wary-Verdict: gave_up`, `Wary-Reason` |
//! | failed | 424 Failed Dependency | `Wary-Verdict: failed`, `Wary-Upstream-Status` if there was one |
//! | unknown (legacy upstream) | 409 Conflict | `Wary-Verdict: unknown` |
//! | queue full | 503 at once | `Retry-After: 1`, `Wary-Verdict: queue_full` |
//! | malformed | 400 with a reason; 404, 405, 413 | |
//!
//! 424 and 409 are in the "never resend" class of every device table (other 4xx): a failed
//! reading cannot be fixed by sending it again, and an unknown one may already have landed.
//! A key the gateway answered `unknown` is answered `unknown` again on a resend, never sent on.
//!
//! `GET /healthz` answers 200 for a load balancer's health checks. Header reads are bounded in
//! time, bodies in size; a device that hangs up does not cancel its reading's call (it lands
//! or not; the device's keyed resend is deduplicated upstream).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use wary::Key;

use crate::gateway::{Answer, Gateway, GatewayError, accept_loop};
use crate::upstream::Forward;

/// The path devices post readings to (the cloud's own).
pub const READINGS: &str = "/readings";
/// Longest idempotency key accepted, bytes (the cloud's limit).
pub const MAX_KEY_LEN: usize = 255;
/// How long a device may take to send its request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The verdict header on every answer to `POST /readings`.
pub const VERDICT: HeaderName = HeaderName::from_static("wary-verdict");

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

type Body = Full<Bytes>;

fn reply(status: StatusCode, verdict: Option<&'static str>, reason: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": reason }).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
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

/// The key and body of a well-formed `POST /readings`, read within `max_body` bytes.
pub async fn parse(req: Request<Incoming>, max_body: usize) -> Result<Forward, BadRequest> {
    let mut keys = req.headers().get_all(IDEMPOTENCY_KEY).iter();
    let key = keys.next().ok_or(BadRequest::MissingKey)?.clone();
    let ok = keys.next().is_none()
        && (1..=MAX_KEY_LEN).contains(&key.len())
        && key.as_bytes().iter().all(u8::is_ascii_graphic);
    let text = key.to_str().ok().filter(|_| ok).ok_or(BadRequest::BadKey)?;
    // A device's key is normally the core's 32 hex digits; any other key is digested so the
    // ledger still has a fixed-size key for it.
    let wary_key = Key::from_hex(text).unwrap_or_else(|| Key::from_payload(text.as_bytes()));
    let announced = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(BadRequest::TooLarge);
    }
    let content_type = req.headers().get(CONTENT_TYPE).cloned();
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(BadRequest::TooLarge),
        Err(_) => return Err(BadRequest::Broken),
    };
    if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
        return Err(BadRequest::NotJson);
    }
    Ok(Forward { key, wary_key, body, content_type })
}

/// The device's answer for the gateway's verdict.
pub fn respond(answer: Answer) -> Response<Body> {
    let status = answer.status();
    let name = answer.name();
    let mut r = match answer {
        Answer::Landed(d) => {
            let mut r = Response::new(Full::new(d.body));
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

/// Handles one request.
pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, READINGS) => {}
        (&Method::GET | &Method::HEAD, "/healthz") => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok\n")));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return Ok(r);
        }
        (_, READINGS) => {
            gw.count_refusal("bad_request");
            let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, None, "method not allowed");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
            return Ok(r);
        }
        _ => {
            gw.count_refusal("bad_request");
            return Ok(reply(StatusCode::NOT_FOUND, None, "no such route"));
        }
    }
    let reading = match parse(req, gw.config().max_body).await {
        Ok(r) => r,
        Err(e) => {
            gw.count_refusal("bad_request");
            return Ok(reply(e.status(), None, &e.to_string()));
        }
    };
    if gw.was_surfaced(reading.wary_key) {
        return Ok(respond(Answer::Unknown));
    }
    let rx = match gw.try_submit(reading) {
        Ok(rx) => rx,
        Err(GatewayError::Full) => {
            // Bounded memory: a full queue is answered now, not grown.
            gw.count_refusal("full");
            let mut r = reply(StatusCode::SERVICE_UNAVAILABLE, Some("queue_full"), "queue full");
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
            return Ok(r);
        }
        Err(_) => return Ok(respond(Answer::Cancelled)),
    };
    Ok(respond(rx.await.unwrap_or(Answer::Cancelled)))
}

/// Serves the device side on `listener` until the task is dropped. An accept error (out of
/// file descriptors, say) is waited out ([`crate::gateway::AcceptBackoff`]); its kind is
/// logged, never its text.
pub async fn serve(gw: Arc<Gateway>, listener: TcpListener) {
    let on_conn = |(sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
        let gw = gw.clone();
        let _ = sock.set_nodelay(true);
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(gw.clone(), req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(sock), svc);
            let _ = conn.await;
        });
    };
    let on_error = |e: &std::io::Error, d: wary::Duration| {
        eprintln!("wary-gateway: accept failed ({:?}); next try in {d}", e.kind());
    };
    accept_loop(|| listener.accept(), on_conn, on_error).await;
}

/// Serves `GET /metrics` (Prometheus text) on `listener`; bind it to loopback.
pub async fn serve_metrics(gw: Arc<Gateway>, listener: TcpListener) {
    let on_conn = |(sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
        let gw = gw.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let gw = gw.clone();
                async move {
                    let r = if req.method() == Method::GET && req.uri().path() == "/metrics" {
                        let mut r = Response::new(Full::new(Bytes::from(gw.prometheus())));
                        r.headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
                        r
                    } else {
                        reply(StatusCode::NOT_FOUND, None, "no such route")
                    };
                    Ok::<_, Infallible>(r)
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(sock), svc);
            let _ = conn.await;
        });
    };
    accept_loop(|| listener.accept(), on_conn, |_, _| {}).await;
}
