//! The threat model's rows (docs/security.md), one test each: what an attacker on the network
//! or a misbehaving device sends, what it is answered, and what the upstream saw (nothing, for
//! every refusal).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wary_cloud::{Cloud, Faults};
use wary_gateway::admission::Limits;
use wary_gateway::{Auth, Config, Credentials, Gateway};
use wary_host::spec::PolicySpec;

const TEST_LIMIT: Duration = Duration::from_secs(30);

async fn within(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, body).await.expect("test took too long");
}

/// A provisioned device: its id and its token.
struct Device {
    id: u64,
    token: String,
    line: String,
}

fn device(id: u64) -> Device {
    let (token, line) = Credentials::issue(id);
    Device { id, token, line }
}

fn credentials(devices: &[&Device]) -> Credentials {
    devices.iter().map(|d| d.line.as_str()).collect::<Vec<_>>().join("\n").parse().unwrap()
}

/// A key by the shared layout: device (16 hex) | boot (8 hex) | sequence (8 hex).
fn key(device: u64, boot: u32, seq: u32) -> String {
    format!("{device:016x}{boot:08x}{seq:08x}")
}

fn config(base: &str, devices: &[&Device]) -> Config {
    let mut c = Config::new(base);
    c.policy = PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(1_000),
        deadline: Some(3_000),
        min_attempt: Some(50),
        ..PolicySpec::default()
    };
    c.upstream.attempt_timeout = Duration::from_millis(500);
    c.fleet_max_tokens = 1000;
    c.fleet_ratio_milli = 1000;
    c.workers = 8;
    c.queue = 64;
    c.seed = Some(7);
    c.auth = Auth::Bearer(Arc::new(credentials(devices)));
    c
}

async fn gateway(config: Config) -> (Arc<Gateway>, SocketAddr) {
    let gw = Arc::new(Gateway::start(config, Box::new(std::io::sink())).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    (gw, addr)
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

fn request(addr: SocketAddr, token: Option<&str>, key: &str, body: &str) -> Request<Full<Bytes>> {
    let mut b = Request::post(format!("http://{addr}/readings"))
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

async fn send_with(c: &HttpClient, req: Request<Full<Bytes>>) -> Reply {
    let resp = c.request(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply { status, headers, body }
}

async fn post(addr: SocketAddr, token: Option<&str>, key: &str, body: &str) -> Reply {
    send_with(&client(), request(addr, token, key, body)).await
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

/// Writes `raw`, then reads until the gateway closes or `wait` passes.
async fn raw(addr: SocketAddr, raw: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn refused(gw: &Gateway, why: &str) -> u64 {
    gw.metrics().refused.get(why).copied().unwrap_or(0)
}

/// An upstream that records every request's headers and body, and answers 201.
type Seen = Arc<Mutex<Vec<(BTreeMap<String, String>, Bytes)>>>;

async fn recording_upstream() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let log = log.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(n, v)| {
                                (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())
                            })
                            .collect();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        log.lock().unwrap().push((headers, body));
                        let mut r = Response::new(Full::new(Bytes::from_static(b"{\"id\":1}")));
                        *r.status_mut() = StatusCode::CREATED;
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn no_or_a_wrong_credential_is_401_and_nothing_goes_upstream() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let k = key(a.id, 1, 0);
        let stranger = device(0xa1); // the right device id, a token nobody admitted
        for token in [None, Some(stranger.token.as_str()), Some("00"), Some(&a.token[..63])] {
            let r = post(addr, token, &k, "{}").await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{token:?}");
            assert_eq!(header(&r, "www-authenticate"), Some("Bearer"));
        }
        // Another scheme carrying the right token is no bearer credential either.
        let basic = Request::post(format!("http://{addr}/readings"))
            .header("idempotency-key", &k)
            .header("authorization", format!("Basic {}", a.token))
            .body(Full::new(Bytes::from("{}")))
            .unwrap();
        assert_eq!(send_with(&client(), basic).await.status, StatusCode::UNAUTHORIZED);
        assert_eq!(cloud.stats().requests, 0, "a refusal reached the upstream");
        assert_eq!(refused(&gw, "unauthenticated"), 5);
        assert!(gw.prometheus().contains("wary_gateway_refused_total{reason=\"unauthenticated\"} 5\n"));
        // The device itself, with its token, lands.
        assert_eq!(post(addr, Some(&a.token), &k, "{}").await.status, StatusCode::CREATED);
        assert_eq!(cloud.stats().requests, 1);
    })
    .await;
}

/// A token rotation: the device's new line is added beside its old one and the file reloaded;
/// both tokens are good while the new one is rolled out; the old line deleted and the file
/// reloaded, the old token is refused (401) and the new one lands.
#[tokio::test]
async fn a_rotation_admits_the_old_and_the_new_token_until_the_old_line_is_deleted() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let old = device(0xa1);
        let (new_token, new_line) = Credentials::issue(0xa1);
        let other = device(0xb2);
        let (gw, addr) = gateway(config(&cloud.url(""), &[&old, &other])).await;
        assert_eq!(
            post(addr, Some(&new_token), &key(0xa1, 1, 0), "{}").await.status,
            StatusCode::UNAUTHORIZED
        );
        // Step 1: both lines in force.
        let both = format!("{}\n{}\n{new_line}\n", old.line, other.line);
        gw.set_credentials(both.parse().unwrap());
        assert_eq!(gw.credential_count(), 2);
        assert_eq!(post(addr, Some(&old.token), &key(0xa1, 1, 1), "{}").await.status, StatusCode::CREATED);
        assert_eq!(post(addr, Some(&new_token), &key(0xa1, 1, 2), "{}").await.status, StatusCode::CREATED);
        // The new token is the device's own, never a way into another device's keys.
        assert_eq!(post(addr, Some(&new_token), &key(0xb2, 1, 0), "{}").await.status, StatusCode::FORBIDDEN);
        // Step 2: the old line deleted.
        gw.set_credentials(format!("{}\n{new_line}\n", other.line).parse().unwrap());
        assert_eq!(
            post(addr, Some(&old.token), &key(0xa1, 1, 3), "{}").await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(post(addr, Some(&new_token), &key(0xa1, 1, 4), "{}").await.status, StatusCode::CREATED);
        assert!(cloud.key_stats(&key(0xa1, 1, 3)).is_none());
        assert!(cloud.key_stats(&key(0xb2, 1, 0)).is_none());
    })
    .await;
}

#[tokio::test]
async fn another_devices_credential_or_key_is_403_and_nothing_goes_upstream() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        // B's token (a stolen or a compromised device) on A's key: B may not write A's readings.
        let r = post(addr, Some(&b.token), &key(a.id, 1, 0), "{}").await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        // A, itself, posting a key that names B (a key B will use next: its reading would be
        // "deduplicated" away).
        assert_eq!(post(addr, Some(&a.token), &key(b.id, 1, 7), "{}").await.status, StatusCode::FORBIDDEN);
        // A key that names no device at all.
        assert_eq!(post(addr, Some(&a.token), "reading-1", "{}").await.status, StatusCode::FORBIDDEN);
        assert_eq!(cloud.stats().requests, 0, "a refusal reached the upstream");
        assert_eq!(refused(&gw, "forbidden"), 3);
        assert!(gw.prometheus().contains("wary_gateway_refused_total{reason=\"forbidden\"} 3\n"));
        // B's own next reading is still its own to write.
        assert_eq!(post(addr, Some(&b.token), &key(b.id, 1, 7), "{}").await.status, StatusCode::CREATED);
        assert_eq!(cloud.key_stats(&key(b.id, 1, 7)).unwrap().effects, 1);
    })
    .await;
}

#[tokio::test]
async fn a_replayed_request_gets_the_same_answer_and_no_second_effect() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let k = key(a.id, 1, 3);
        let first = post(addr, Some(&a.token), &k, r#"{"mC":21000}"#).await;
        assert_eq!(first.status, StatusCode::CREATED);
        // The same bytes again, as someone who recorded them (or the device itself) would send.
        let again = post(addr, Some(&a.token), &k, r#"{"mC":21000}"#).await;
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        let s = cloud.key_stats(&k).unwrap();
        assert_eq!((s.effects, s.replays), (1, 1), "answered from the store, applied once");
    })
    .await;
}

#[tokio::test]
async fn the_same_key_with_another_body_gets_the_first_answer_and_changes_nothing() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let k = key(a.id, 1, 4);
        let first = post(addr, Some(&a.token), &k, r#"{"mC":1}"#).await;
        let other = post(addr, Some(&a.token), &k, r#"{"mC":999999}"#).await;
        // The gateway keeps no bodies: the second goes upstream under the same key, and the
        // upstream's idempotency store answers it with the first one's stored reply.
        assert_eq!(cloud.stats().requests, 2);
        assert_eq!((other.status, &other.body), (first.status, &first.body));
        let s = cloud.key_stats(&k).unwrap();
        assert_eq!(s.effects, 1);
        assert_eq!(s.body_len, r#"{"mC":1}"#.len(), "the first body stands");
    })
    .await;
}

#[tokio::test]
async fn device_controlled_fields_cannot_inject_headers_upstream() {
    within(async {
        let (up, seen) = recording_upstream().await;
        let a = device(0xa1);
        let (gw, addr) = gateway(config(&format!("http://{up}"), &[&a])).await;
        let auth = format!("Authorization: Bearer {}\r\n", a.token);
        let k = key(a.id, 1, 1);
        let head = |key_line: &str, extra: &str| {
            format!(
                "POST /readings HTTP/1.1\r\nHost: g\r\n{auth}{key_line}{extra}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
        };
        let wait = Duration::from_secs(3);
        // A bare CR inside the key, a control byte, a space, a key over 255 bytes, two keys. (A
        // bare LF ends the line: what follows is a header of its own, as below.)
        let bad = [
            head(&format!("Idempotency-Key: {k}\rX-Injected: 1\r\n"), ""),
            head(&format!("Idempotency-Key: {k}\x0bX\r\n"), ""),
            head(&format!("Idempotency-Key: {k} X-Injected\r\n"), ""),
            head(&format!("Idempotency-Key: {k}{}\r\n", "0".repeat(240)), ""),
            head(&format!("Idempotency-Key: {k}\r\nIdempotency-Key: {k}\r\n"), ""),
        ];
        for (i, req) in bad.iter().enumerate() {
            let out = raw(addr, req.as_bytes(), wait).await;
            assert!(out.starts_with("HTTP/1.1 400"), "case {i}: {out:?}");
        }
        assert!(seen.lock().unwrap().is_empty(), "a refusal reached the upstream");
        // A header line of its own is just another header from the device: never forwarded,
        // and a Content-Type is forwarded only as the one value the connection parsed.
        let ok = head(&format!("Idempotency-Key: {k}\nX-Injected: 1\r\n"), "Content-Type: application/json\r\n");
        let out = raw(addr, ok.as_bytes(), wait).await;
        assert!(out.starts_with("HTTP/1.1 201"), "{out:?}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let (headers, body) = &seen[0];
        assert_eq!(headers.get("idempotency-key"), Some(&k));
        assert_eq!(headers.get("content-type").map(String::as_str), Some("application/json"));
        assert!(!headers.contains_key("x-injected"), "{headers:?}");
        assert!(!headers.contains_key("authorization"), "the device's token went upstream");
        assert!(headers.values().all(|v| !v.contains(&a.token)));
        assert_eq!(&body[..], b"{}");
        // The space, the length and the second key reach the gateway's check (and its counter);
        // a bare CR and a control byte never parse as HTTP at all (the connection answers 400
        // itself, before any handler).
        assert_eq!(refused(&gw, "bad_request"), 3);
    })
    .await;
}

#[tokio::test]
async fn oversized_heads_and_bodies_are_refused_before_the_upstream() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let mut c = config(&cloud.url(""), &[&a]);
        c.max_body = 1024;
        let (gw, addr) = gateway(c).await;
        let k = key(a.id, 1, 2);
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2048));
        assert_eq!(post(addr, Some(&a.token), &k, &big).await.status, StatusCode::PAYLOAD_TOO_LARGE);
        // Announced small, sent large (chunked, no Content-Length): cut at the limit all the same.
        let chunked = format!(
            "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {k}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
            a.token,
            big.len()
        );
        let out = raw(addr, chunked.as_bytes(), Duration::from_secs(3)).await;
        assert!(out.starts_with("HTTP/1.1 413"), "{out:?}");
        // A head over 8 KiB, credential and all: 431 before the credential is even looked at.
        let head = format!(
            "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {k}\r\nX-Pad: {}\r\nContent-Length: 2\r\n\r\n{{}}",
            a.token,
            "p".repeat(9 * 1024)
        );
        let out = raw(addr, head.as_bytes(), Duration::from_secs(3)).await;
        assert!(out.starts_with("HTTP/1.1 431"), "{out:?}");
        // Past hyper's own 64 KiB read buffer the connection is refused before any handler.
        let huge = format!("POST /readings HTTP/1.1\r\nHost: g\r\nX-Pad: {}\r\n\r\n", "p".repeat(200 * 1024));
        let out = raw(addr, huge.as_bytes(), Duration::from_secs(3)).await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out:?}");
        assert_eq!(cloud.stats().requests, 0, "a refusal reached the upstream");
        assert_eq!(refused(&gw, "bad_request"), 3);
    })
    .await;
}

#[tokio::test]
async fn ambiguous_framing_is_refused_and_nothing_hidden_in_a_body_reaches_the_upstream() {
    within(async {
        let (up, seen) = recording_upstream().await;
        let a = device(0xa1);
        let (_gw, addr) = gateway(config(&format!("http://{up}"), &[&a])).await;
        let k = key(a.id, 1, 3);
        let hidden = format!(
            "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {}\r\nContent-Length: 2\r\n\r\n{{}}",
            a.token,
            key(a.id, 1, 4)
        );
        let head = |framing: &str, body: &str| {
            format!(
                "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {k}\r\n{framing}\r\n{body}",
                a.token
            )
        };
        let wait = Duration::from_secs(3);
        // Content-Length and chunked at once: which one ends the body is what a smuggler plays
        // on (a proxy in front may pick the other); refused, the connection closed, and the
        // request hidden behind the shorter reading never parsed.
        let both = head(
            "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
            &format!("2\r\n{{}}\r\n0\r\n\r\n{hidden}"),
        );
        let out = raw(addr, both.as_bytes(), wait).await;
        assert!(out.starts_with("HTTP/1.1 400 ") && out.matches("HTTP/1.1").count() == 1, "{out:?}");
        // Two lengths that disagree.
        let two = head("Content-Length: 2\r\nContent-Length: 40\r\n", &format!("{{}}{hidden}"));
        let out = raw(addr, two.as_bytes(), wait).await;
        assert!(out.starts_with("HTTP/1.1 400 ") && out.matches("HTTP/1.1").count() == 1, "{out:?}");
        // A coding the gateway does not decode.
        let gzip = head("Transfer-Encoding: gzip, chunked\r\n", &format!("2\r\n{{}}\r\n0\r\n\r\n{hidden}"));
        let out = raw(addr, gzip.as_bytes(), wait).await;
        assert!(out.starts_with("HTTP/1.1 501 ") && out.matches("HTTP/1.1").count() == 1, "{out:?}");
        assert!(seen.lock().unwrap().is_empty(), "a refusal reached the upstream");
        // The same reading framed once, followed by the same second request: both are answered,
        // in order, each on its own credential, and both land.
        let fine = format!("{}{hidden}", head("Content-Length: 2\r\n", "{}"));
        let out = raw(addr, fine.as_bytes(), Duration::from_millis(1500)).await;
        assert_eq!(out.matches("HTTP/1.1 201 ").count(), 2, "{out:?}");
        assert_eq!(seen.lock().unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn slowloris_on_the_head_or_the_body_is_cut() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let mut c = config(&cloud.url(""), &[&a]);
        c.header_timeout = Duration::from_millis(300);
        c.body_timeout = Duration::from_millis(300);
        let (gw, addr) = gateway(c).await;
        let k = key(a.id, 1, 9);
        // The head, a byte every 50 ms, never finished: the gateway hangs up (the test's own
        // limit would fail it otherwise).
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut closed = false;
        for b in b"POST /readings HTTP/1.1\r\nHost: g\r\nX-Slow: ".iter().chain([b'a'; 400].iter()) {
            if s.write_all(&[*b]).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut buf = [0u8; 256];
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await
                && (n == 0 || buf[..n].starts_with(b"HTTP/1.1 408"))
            {
                closed = true;
                break;
            }
        }
        assert!(closed, "a head that never ends kept its connection");
        // The body, a byte every 50 ms of 100 announced: 408, connection closed.
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {k}\r\nContent-Length: 100\r\n\r\n",
            a.token
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        for _ in 0..100 {
            if s.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut buf = [0u8; 512];
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert_eq!(refused(&gw, "body_timeout"), 1);
        assert_eq!(cloud.stats().requests, 0, "a refusal reached the upstream");
    })
    .await;
}

#[tokio::test]
async fn a_thousand_unfinished_requests_do_not_stop_others() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let mut held = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /readings HTTP/1.1\r\nHost: g\r\nIdempotency-Key: ").await.unwrap();
            held.push(s);
        }
        // All thousand are open (the header timeout is 10 s) while a device is served.
        let k = key(a.id, 1, 1);
        assert_eq!(post(addr, Some(&a.token), &k, "{}").await.status, StatusCode::CREATED);
        assert_eq!(cloud.key_stats(&k).unwrap().effects, 1);
        let mut probe = [0u8; 1];
        let open = held
            .iter_mut()
            .take(10)
            .map(|s| s.try_read(&mut probe))
            .filter(|r| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
            .count();
        assert_eq!(open, 10, "the unfinished connections were still open");
        assert_eq!(cloud.stats().requests, 1);
    })
    .await;
}

#[tokio::test]
async fn two_devices_sharing_their_low_32_bits_land_as_two_keys() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        // Same low 32 bits (the nRF52840's first FICR word alone would make them one device).
        let (a, b) = (device(0x0000_0001_dead_beef), device(0x0000_0002_dead_beef));
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        let (ka, kb) = (key(a.id, 1, 0), key(b.id, 1, 0));
        assert_ne!(ka, kb);
        let ra = post(addr, Some(&a.token), &ka, r#"{"mC":1}"#).await;
        let rb = post(addr, Some(&b.token), &kb, r#"{"mC":2}"#).await;
        assert_eq!((ra.status, rb.status), (StatusCode::CREATED, StatusCode::CREATED));
        assert_ne!(ra.body, rb.body, "the second was not answered with the first one's reply");
        assert_eq!(cloud.key_stats(&ka).unwrap().effects, 1);
        assert_eq!(cloud.key_stats(&kb).unwrap().effects, 1);
        assert_eq!(cloud.stats().keys, 2);
    })
    .await;
}

#[tokio::test]
async fn the_device_prefix_keeps_devices_foreign_keys_apart_upstream() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let mut c = config(&cloud.url(""), &[&a, &b]);
        c.device_prefix = true;
        let (_gw, addr) = gateway(c).await;
        // Two devices whose own key scheme is a counter: the same key from both.
        let ra = post(addr, Some(&a.token), "reading-1", "{}").await;
        let rb = post(addr, Some(&b.token), "reading-1", "{}").await;
        assert_eq!((ra.status, rb.status), (StatusCode::CREATED, StatusCode::CREATED));
        assert_eq!(cloud.key_stats("00000000000000a1:reading-1").unwrap().effects, 1);
        assert_eq!(cloud.key_stats("00000000000000b2:reading-1").unwrap().effects, 1);
        assert!(cloud.key_stats("reading-1").is_none());
        // A key too long once prefixed is refused, not cut.
        let long = "k".repeat(250);
        assert_eq!(post(addr, Some(&a.token), &long, "{}").await.status, StatusCode::BAD_REQUEST);
        assert_eq!(cloud.stats().requests, 2);
    })
    .await;
}

/// One device at 1,000 requests a second beside 50 at 1 a second, for 2 s rather than 10 (the
/// same rates, a fifth of the time): every honest reading lands, none is refused, and all the
/// flood beyond its bucket is answered 429 without reaching the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_flooding_device_does_not_crowd_out_fifty_honest_ones() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let flood = device(0xf100d);
        let honest: Vec<Device> = (1..=50u64).map(|n| device(0x1000 + n)).collect();
        let mut all: Vec<&Device> = honest.iter().collect();
        all.push(&flood);
        let mut c = config(&cloud.url(""), &all);
        let limits = Limits { rate_per_sec: 2, burst: 4, max_devices: 1000 };
        c.admission = limits;
        c.workers = 16;
        c.queue = 256;
        // A debug build under a flood on a shared machine: room for slow attempts, so that a
        // give-up cannot pass for unfairness.
        c.upstream.attempt_timeout = Duration::from_secs(5);
        c.policy.budget = Some(10_000);
        c.policy.deadline = Some(20_000);
        let (gw, addr) = gateway(c).await;
        const SECONDS: u32 = 2;
        const FLOOD: u32 = 1000 * SECONDS;
        let started = std::time::Instant::now();
        let honest_runs = honest.iter().map(|d| {
            let (id, token) = (d.id, d.token.clone());
            tokio::spawn(async move {
                let c = client();
                let mut statuses = Vec::new();
                for seq in 0..SECONDS {
                    let r = send_with(&c, request(addr, Some(&token), &key(id, 1, seq), "{}")).await;
                    statuses.push((r.status, header(&r, "wary-verdict").map(str::to_owned)));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                statuses
            })
        });
        let honest_runs: Vec<_> = honest_runs.collect();
        let token = flood.token.clone();
        let flood_run = tokio::spawn(async move {
            let c = client();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut set = tokio::task::JoinSet::new();
            for seq in 0..FLOOD {
                tick.tick().await;
                let req = request(addr, Some(&token), &key(0xf100d, 1, seq), "{}");
                let c = c.clone();
                set.spawn(async move {
                    let r = send_with(&c, req).await;
                    (r.status, header(&r, "retry-after").map(str::to_owned))
                });
            }
            set.join_all().await
        });
        let mut honest_statuses = Vec::new();
        for h in honest_runs {
            honest_statuses.extend(h.await.unwrap());
        }
        let flood_answers = flood_run.await.unwrap();
        let elapsed = started.elapsed().as_secs() + 1;
        assert_eq!(honest_statuses.len(), 100);
        assert!(honest_statuses.iter().all(|s| s.0 == StatusCode::CREATED), "{honest_statuses:?}");
        for d in &honest {
            for seq in 0..SECONDS {
                assert_eq!(cloud.key_stats(&key(d.id, 1, seq)).unwrap().effects, 1);
            }
        }
        let landed = flood_answers.iter().filter(|a| a.0 == StatusCode::CREATED).count() as u64;
        let limited: Vec<_> = flood_answers.iter().filter(|a| a.0 == StatusCode::TOO_MANY_REQUESTS).collect();
        assert_eq!(landed + limited.len() as u64, u64::from(FLOOD), "every flood request is landed or 429");
        // At most its burst and its rate over the run's whole seconds got through.
        assert!(landed <= u64::from(limits.burst) + u64::from(limits.rate_per_sec) * elapsed, "{landed}");
        assert!(limited.iter().all(|a| a.1.as_deref() == Some("1")));
        assert_eq!(refused(&gw, "rate_limited"), limited.len() as u64);
        assert_eq!(cloud.stats().requests, 100 + landed, "a 429 reached the upstream");
        assert_eq!(gw.admission_buckets(), 51);
    })
    .await;
}

// ---- TLS on the device side ----

#[path = "common/tls.rs"]
mod tls;

#[tokio::test]
async fn tls_with_the_pinned_ca_lands_and_plain_http_or_a_wrong_ca_reach_nothing() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let a = device(0xa1);
        let dir = tls::temp_dir("tls");
        let (ca, cert, key_file) = tls::issue(&dir, "gw");
        let (rogue_ca, _, _) = tls::issue(&dir, "rogue");
        let mut c = config(&cloud.url(""), &[&a]);
        c.header_timeout = Duration::from_millis(300);
        let gw = Arc::new(Gateway::start(c, Box::new(std::io::sink())).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let t = Arc::new(wary_gateway::tls::Tls::load(&cert, &key_file).unwrap());
        tokio::spawn(wary_gateway::ingress::serve_tls(gw.clone(), listener, t));
        let k = key(a.id, 1, 0);
        // Plain HTTP to the TLS port: no HTTP answer, nothing upstream.
        let plain = format!(
            "POST /readings HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {k}\r\nContent-Length: 2\r\n\r\n{{}}",
            a.token
        );
        let out = raw(addr, plain.as_bytes(), Duration::from_secs(3)).await;
        assert!(!out.contains("HTTP/1.1"), "{out:?}");
        // A client that opens the connection and never starts its handshake is hung up on.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let hung_up = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
        assert!(matches!(hung_up, Ok(Ok(0)) | Ok(Err(_))), "{hung_up:?}");
        // A client that pins another CA refuses the gateway's certificate: its token never leaves.
        let e = tls::connect(addr, &rogue_ca).await.expect_err("a wrong CA was trusted");
        assert!(e.contains("certificate"), "{e}");
        assert_eq!(cloud.stats().requests, 0, "a refusal reached the upstream");
        // The pinned CA: the reading lands, once.
        let mut s = tls::connect(addr, &ca).await.unwrap();
        let (status, _) = tls::send(&mut s, request(addr, Some(&a.token), &k, "{}")).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(cloud.key_stats(&k).unwrap().effects, 1);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_client_certificate_naming_the_device_stands_for_its_token() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let dir = tls::temp_dir("mtls");
        let (ca, cert, key_file) = tls::issue(&dir, "gw");
        let (client_ca, a_cert) = tls::device_certificate(&dir, "devices", a.id);
        // The same device named by a CA the gateway does not trust.
        let (_, stranger_cert) = tls::device_certificate(&dir, "stranger", a.id);
        let gw =
            Arc::new(Gateway::start(config(&cloud.url(""), &[&a, &b]), Box::new(std::io::sink())).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let t = Arc::new(wary_gateway::tls::Tls::load_with(&cert, &key_file, Some(&client_ca)).unwrap());
        tokio::spawn(wary_gateway::ingress::serve_tls(gw.clone(), listener, t));

        // A's certificate, no token: A's own key lands, B's key is 403.
        let mut s = tls::connect_as(addr, &ca, Some(a_cert)).await.unwrap();
        let (status, _) = tls::send(&mut s, request(addr, None, &key(a.id, 1, 0), "{}")).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, _) = tls::send(&mut s, request(addr, None, &key(b.id, 1, 0), "{}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        // The untrusted CA's certificate: the connection fails, nothing is answered.
        let refused_conn = match tls::connect_as(addr, &ca, Some(stranger_cert)).await {
            Err(_) => true,
            Ok(mut s) => s.send_request(request(addr, None, &key(a.id, 1, 1), "{}")).await.is_err(),
        };
        assert!(refused_conn, "a certificate from an untrusted CA was served");
        // Without a certificate the token still works.
        let mut plain = tls::connect(addr, &ca).await.unwrap();
        let (status, _) = tls::send(&mut plain, request(addr, Some(&b.token), &key(b.id, 1, 0), "{}")).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, _) = tls::send(&mut plain, request(addr, None, &key(a.id, 1, 2), "{}")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // Deleting A's line revokes its certificate too.
        gw.set_credentials(credentials(&[&b]));
        let (status, _) = tls::send(&mut s, request(addr, None, &key(a.id, 1, 3), "{}")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(cloud.stats().requests, 2, "a refusal reached the upstream");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
