//! The gateway over HTTP: devices' requests in, the test cloud or an upstream of the test's own
//! out, and what each verdict looks like to the device. The binary is run once, for its
//! command line and for what it keeps out of its output.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use wary::Key;
use wary_cloud::{Cloud, Faults};
use wary_gateway::{BodyCheck, Config, Gateway, StaticHeader};
use wary_host::spec::PolicySpec;

const BIN: &str = env!("CARGO_BIN_EXE_wary-gateway");
const TEST_LIMIT: Duration = Duration::from_secs(15);

async fn within(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, body).await.expect("test took too long");
}

fn config(base: &str) -> Config {
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
    c.workers = 4;
    c.queue = 16;
    c.seed = Some(7);
    // These tests are about verdicts; credentials have their own (tests/security.rs).
    c.auth = wary_gateway::Auth::Open;
    c
}

/// Starts a gateway serving HTTP on a free loopback port.
async fn gateway(config: Config) -> (Arc<Gateway>, SocketAddr) {
    let gw = Arc::new(Gateway::start(config, Box::new(std::io::sink())).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    (gw, addr)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn send(req: Request<Full<Bytes>>) -> Reply {
    let resp = client().request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply { status, headers, body }
}

/// `POST /readings` as a device sends it.
async fn post(addr: SocketAddr, key: &str, body: &str) -> Reply {
    let req = Request::post(format!("http://{addr}/readings"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(req).await
}

fn key(n: u64) -> String {
    Key::from_parts(1, 1, u32::try_from(n).expect("a test key's sequence fits 32 bits"))
        .to_hex()
        .as_str()
        .to_owned()
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_landed_reading_gets_the_upstreams_status_and_a_resend_is_deduplicated() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (_gw, addr) = gateway(config(&cloud.url(""))).await;
        let r = post(addr, &key(1), r#"{"seq":1,"mC":21000}"#).await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert_eq!(header(&r, "wary-verdict"), Some("ok"));
        let first: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        // The same key again (a device that lost the answer): the cloud's stored answer, no effect.
        let again = post(addr, &key(1), r#"{"seq":1,"mC":21000}"#).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&again.body).unwrap(), first);
        assert_eq!(cloud.key_stats(&key(1)).unwrap().effects, 1);
        assert_eq!(cloud.stats().requests, 2);
    })
    .await;
}

#[tokio::test]
async fn malformed_requests_get_a_reason_and_never_reach_the_upstream() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let mut c = config(&cloud.url(""));
        c.max_body = 64;
        let (gw, addr) = gateway(c).await;
        let no_key =
            Request::post(format!("http://{addr}/readings")).body(Full::new(Bytes::from("{}"))).unwrap();
        let r = send(no_key).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&r.body).contains("missing Idempotency-Key"));
        let r = post(addr, "has space", "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&r.body).contains("Idempotency-Key"));
        let r = post(addr, &key(2), "seq=1").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&r.body).contains("not JSON"));
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
        assert_eq!(post(addr, &key(3), &big).await.status, StatusCode::PAYLOAD_TOO_LARGE);
        let get = Request::get(format!("http://{addr}/readings")).body(Full::new(Bytes::new())).unwrap();
        let r = send(get).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(header(&r, "allow"), Some("POST"));
        let other = Request::post(format!("http://{addr}/elsewhere")).body(Full::new(Bytes::new())).unwrap();
        assert_eq!(send(other).await.status, StatusCode::NOT_FOUND);
        let health = Request::get(format!("http://{addr}/healthz")).body(Full::new(Bytes::new())).unwrap();
        assert_eq!(send(health).await.status, StatusCode::OK);
        assert_eq!(cloud.stats().requests, 0, "nothing malformed went upstream");
        assert_eq!(gw.metrics().refused.get("bad_request"), Some(&6));
    })
    .await;
}

#[tokio::test]
async fn giving_up_is_a_503_with_retry_after_and_the_device_resend_lands_once() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "503=1.0".parse::<Faults>().unwrap()).await.unwrap();
        let (gw, addr) = gateway(config(&cloud.url(""))).await;
        let r = post(addr, &key(5), "{}").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&r, "wary-verdict"), Some("gave_up"));
        assert_eq!(header(&r, "wary-reason"), Some("budget"));
        // The policy's cap is 100 ms: the earliest worthwhile resend rounds up to 1 s.
        assert_eq!(header(&r, "retry-after"), Some("1"));
        let attempts = cloud.stats().requests;
        assert!(attempts > 1, "the gateway retried 503s itself ({attempts} requests)");
        cloud.set_faults(Faults::none()).unwrap();
        let r = post(addr, &key(5), "{}").await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert_eq!(cloud.key_stats(&key(5)).unwrap().effects, 1);
        assert_eq!(gw.metrics().verdicts.get("gave_up"), Some(&1));
    })
    .await;
}

#[tokio::test]
async fn a_4xx_upstream_is_failed_424_never_resent() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let mut c = config(&cloud.url(""));
        // The cloud answers 400 to a keyed write without its key header.
        c.upstream.key_header = http::HeaderName::from_static("x-other-key");
        let (_gw, addr) = gateway(c).await;
        let r = post(addr, &key(6), "{}").await;
        assert_eq!(r.status, StatusCode::FAILED_DEPENDENCY);
        assert_eq!(header(&r, "wary-verdict"), Some("failed"));
        assert_eq!(header(&r, "wary-upstream-status"), Some("400"));
        assert_eq!(cloud.stats().requests, 1, "a failed call is not retried");
    })
    .await;
}

fn retry_after(r: &Reply) -> u64 {
    header(r, "retry-after").expect("a Retry-After").parse().expect("whole seconds")
}

/// The upstream refuses the gateway's own credential (401) for 3 s: every device is held (503,
/// a Retry-After from the breaker, `held; upstream=401`), never failed (424); the breaker opens
/// at the first 401, so the upstream sees its probes only, not the devices' requests; once the
/// credential is good again the same keys land, once each.
#[tokio::test]
async fn an_upstream_refusing_the_gateways_credential_holds_devices_and_opens_the_breaker() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let cloud = Cloud::start("127.0.0.1:0", "outage=0:ms=3000:status=401".parse::<Faults>().unwrap())
            .await
            .unwrap();
        let (gw, addr) = gateway(config(&cloud.url(""))).await;
        let started = std::time::Instant::now();
        let mut sent = 0u64;
        let mut held = Vec::new();
        // Devices that ignore Retry-After and keep sending, new keys and old: 2.5 s of them.
        while started.elapsed() < Duration::from_millis(2_500) {
            let k = key(100 + sent % 5);
            let r = post(addr, &k, "{}").await;
            sent += 1;
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
            assert_eq!(header(&r, "wary-verdict"), Some("held; upstream=401"));
            assert_eq!(header(&r, "wary-upstream-status"), Some("401"));
            let ra = retry_after(&r);
            // The breaker's open time left: 1-2 s at first, 2-4 s after a probe met the 401 again.
            assert!((1..=4).contains(&ra), "Retry-After {ra}");
            held.push(ra);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(sent >= 20, "only {sent} requests sent");
        // The first 401, and at most one probe after each open time (1-2 s, then 2-4 s).
        let upstream = cloud.stats().requests;
        assert!((1..=3).contains(&upstream), "{upstream} requests reached the upstream for {sent} held");
        assert_eq!(cloud.stats().requests_by_status.get("401").copied(), Some(upstream));
        assert_eq!(cloud.stats().effects_total, 0);
        let text = gw.prometheus();
        assert!(
            text.contains(&format!(
                "\nwary_gateway_upstream_endpoint_faults_total{{status=\"401\"}} {upstream}\n"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("\nwary_gateway_held_total{{status=\"401\"}} {sent}\n")), "{text}");
        // The credential is good again (the outage's end): devices that wait as told land.
        let mut landed = 0;
        for n in 0..5u64 {
            let k = key(100 + n);
            let mut tries = 0;
            loop {
                let r = post(addr, &k, "{}").await;
                if r.status == StatusCode::CREATED {
                    assert_eq!(header(&r, "wary-verdict"), Some("ok"));
                    landed += 1;
                    break;
                }
                assert_eq!(header(&r, "wary-verdict"), Some("held; upstream=401"), "{:?}", r.status);
                tries += 1;
                assert!(tries < 10, "{k} never landed");
                tokio::time::sleep(Duration::from_secs(retry_after(&r))).await;
            }
        }
        assert_eq!(landed, 5);
        for n in 0..5u64 {
            assert_eq!(cloud.key_stats(&key(100 + n)).unwrap().effects, 1);
        }
        assert!(started.elapsed() >= Duration::from_secs(3), "landed inside the outage");
        assert_eq!(gw.holds().cause(), None, "a success clears the cause");
    })
    .await
    .expect("test took too long");
}

/// A reading the upstream can never take (422: the reading's own fault) is still failed (424),
/// with the upstream's status, and holds nothing: the breaker stays closed for the next one.
#[tokio::test]
async fn a_poisoned_reading_is_failed_424_and_holds_no_other() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "poison=1".parse::<Faults>().unwrap()).await.unwrap();
        let (gw, addr) = gateway(config(&cloud.url(""))).await;
        for _ in 0..2 {
            let r = post(addr, &key(200), "{}").await;
            assert_eq!(r.status, StatusCode::FAILED_DEPENDENCY);
            assert_eq!(header(&r, "wary-verdict"), Some("failed"));
            assert_eq!(header(&r, "wary-upstream-status"), Some("422"));
            assert!(header(&r, "retry-after").is_none());
        }
        for n in 201..206 {
            let r = post(addr, &key(n), "{}").await;
            assert_eq!(r.status, StatusCode::CREATED, "{n}");
        }
        assert_eq!(cloud.stats().requests, 7, "each poisoned call sent once, every other one landed");
        assert_eq!(cloud.stats().faults_injected.get("poison"), Some(&2));
        assert!(gw.holds().faults().is_empty());
        assert!(!gw.prometheus().contains("wary_gateway_held_total{"));
    })
    .await;
}

/// A gateway pointed at a path the upstream does not have (404) holds the device rather than
/// failing a reading that is fine, and the breaker keeps the next calls off the upstream.
#[tokio::test]
async fn a_wrong_upstream_path_holds_rather_than_fails() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let mut c = config(&cloud.url(""));
        c.upstream.path = "/nowhere".to_owned();
        let (gw, addr) = gateway(c).await;
        for n in 0..4 {
            let r = post(addr, &key(300 + n), "{}").await;
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(header(&r, "wary-verdict"), Some("held; upstream=404"));
            assert!((1..=2).contains(&retry_after(&r)));
        }
        assert_eq!(cloud.stats().requests, 1, "the breaker opened at the first 404");
        assert_eq!(gw.holds().held_counts().get(&wary_gateway::EndpointFault::Status(404)), Some(&4));
    })
    .await;
}

/// Raw HTTP/1.1 requests on one connection to `addr`, and everything it answered until it
/// closed.
async fn raw_exchange(addr: SocketAddr, requests: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(requests.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.unwrap().unwrap();
    String::from_utf8(out).unwrap()
}

/// Whose fault an answer is, the core's table says (`Table::blame`): 406 and 431 (what the
/// gateway speaks does not suit the upstream) and 510 are the endpoint's, so the devices are
/// held, the breaker opens at the first, and `/metrics`, served over the gateway's own HTTP/1.1
/// connection, counts them by status.
#[tokio::test]
async fn an_answer_the_core_table_blames_on_the_endpoint_holds_and_metrics_show_it() {
    within(async {
        for status in [406u16, 431, 510] {
            let (up, seen) = foreign_upstream(StatusCode::from_u16(status).unwrap(), "no").await;
            let (gw, addr) = gateway(config(&format!("http://{up}"))).await;
            for n in 0..3 {
                let r = post(addr, &key(400 + n), "{}").await;
                assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{status}");
                assert_eq!(header(&r, "wary-verdict"), Some(format!("held; upstream={status}").as_str()));
                assert_eq!(header(&r, "wary-upstream-status"), Some(status.to_string().as_str()));
                assert!((1..=2).contains(&retry_after(&r)), "{status}");
            }
            assert_eq!(seen.lock().unwrap().len(), 1, "{status}: the breaker opened at the first");

            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let metrics = listener.local_addr().unwrap();
            tokio::spawn(wary_gateway::ingress::serve_metrics(gw.clone(), listener));
            // Two requests on one connection: the scrape, then a route that is not there.
            let text = raw_exchange(
                metrics,
                "GET /metrics HTTP/1.1\r\nHost: m\r\n\r\nGET /readings HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
            )
            .await;
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            assert!(text.to_ascii_lowercase().contains("\r\ncontent-type: text/plain; version=0.0.4\r\n"), "{text}");
            let rows = [
                format!("\nwary_gateway_upstream_endpoint_faults_total{{status=\"{status}\"}} 1\n"),
                format!("\nwary_gateway_held_total{{status=\"{status}\"}} 3\n"),
            ];
            for row in rows {
                assert!(text.contains(&row), "{row:?} in {text}");
            }
            let second = text.split("HTTP/1.1 ").nth(2).unwrap_or_default();
            assert!(second.starts_with("404 Not Found\r\n"), "{text}");
            // HTTP/1.0, as a scraper may send it: answered, then closed.
            let old = raw_exchange(metrics, "GET /metrics HTTP/1.0\r\n\r\n").await;
            assert!(old.starts_with("HTTP/1.1 200 OK\r\n") && old.contains("wary_gateway_held_total"), "{old}");
            let post = raw_exchange(metrics, "POST /metrics HTTP/1.1\r\nHost: m\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
            assert!(post.starts_with("HTTP/1.1 404 Not Found\r\n"), "{post}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_legacy_unknown_is_409_and_a_resend_of_it_is_never_forwarded() {
    within(async {
        // Every write's answer is lost after the effect, and every probe read too: unknown.
        let cloud =
            Cloud::start("127.0.0.1:0", "drop_after_effect=1.0".parse::<Faults>().unwrap()).await.unwrap();
        let mut c = config(&cloud.url(""));
        c.upstream.legacy = true;
        c.upstream.path = "/legacy/readings".into();
        c.upstream.probe_grace = Some(Duration::from_millis(10));
        let (gw, addr) = gateway(c).await;
        let r = post(addr, &key(7), "{}").await;
        let verdict = header(&r, "wary-verdict").unwrap().to_owned();
        assert_eq!((r.status, verdict.as_str()), (StatusCode::CONFLICT, "unknown"));
        let effects = cloud.reading_effects(&key(7));
        let requests = cloud.stats().requests;
        let again = post(addr, &key(7), "{}").await;
        assert_eq!(again.status, StatusCode::CONFLICT);
        assert_eq!(cloud.stats().requests, requests, "the resend of a surfaced key went nowhere");
        assert_eq!((effects, cloud.reading_effects(&key(7))), (1, 1), "sent once, landed once");
        assert_eq!(gw.metrics().surfaced_total, 1);
    })
    .await;
}

/// An upstream wary did not write: `204 No Content` or `200 text/plain`, and it wants a token.
async fn foreign_upstream(
    status: StatusCode,
    body: &'static str,
) -> (SocketAddr, Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
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
                        let h = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
                        log.lock().unwrap().push((
                            req.uri().path().to_owned(),
                            h("x-request-key"),
                            h("authorization"),
                        ));
                        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        *r.status_mut() = status;
                        r.headers_mut().insert("content-type", "text/plain".parse().unwrap());
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
async fn any_upstream_a_2xx_is_landed_whatever_its_body() {
    within(async {
        let (up, seen) = foreign_upstream(StatusCode::OK, "created").await;
        let mut c = config(&format!("http://{up}"));
        c.upstream.path = "/v2/ingest".into();
        c.upstream.key_header = http::HeaderName::from_static("x-request-key");
        c.upstream.headers = vec![StaticHeader::new(
            http::HeaderName::from_static("authorization"),
            "Bearer t0ken".parse().unwrap(),
        )];
        let (_gw, addr) = gateway(c.clone()).await;
        let r = post(addr, &key(8), "{}").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(&r.body[..], b"created");
        assert_eq!(header(&r, "wary-body-check"), None);
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            [("/v2/ingest".to_owned(), Some(key(8)), Some("Bearer t0ken".to_owned()))]
        );

        // Opt in to a JSON body check: the same 2xx is landed with a bad body, and not resent.
        c.upstream.body_check = BodyCheck::JsonField("id".into());
        let (gw, addr) = gateway(c).await;
        let r = post(addr, &key(9), "{}").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(header(&r, "wary-verdict"), Some("ok"));
        assert_eq!(header(&r, "wary-body-check"), Some("failed"));
        assert_eq!(seen.lock().unwrap().len(), 2, "a landed bad body is never resent");
        assert_eq!(gw.metrics().landed_bad_body, 1);

        let (up, _) = foreign_upstream(StatusCode::NO_CONTENT, "").await;
        let (_gw, addr) = gateway(config(&format!("http://{up}"))).await;
        assert_eq!(post(addr, &key(10), "{}").await.status, StatusCode::NO_CONTENT);
    })
    .await;
}

#[tokio::test]
async fn a_full_queue_answers_503_at_once() {
    within(async {
        // A slow upstream holds the one worker; the queue holds one more; the rest are refused.
        let cloud = Cloud::start("127.0.0.1:0", "slow=1.0:ms=800".parse::<Faults>().unwrap()).await.unwrap();
        let mut c = config(&cloud.url(""));
        c.workers = 1;
        c.queue = 1;
        c.upstream.attempt_timeout = Duration::from_secs(2);
        let (gw, addr) = gateway(c).await;
        let mut posts = tokio::task::JoinSet::new();
        for n in 0..6 {
            posts.spawn(async move {
                let t = std::time::Instant::now();
                let r = post(addr, &key(100 + n), "{}").await;
                (
                    r.status,
                    header(&r, "wary-verdict").map(str::to_owned),
                    header(&r, "retry-after").map(str::to_owned),
                    t.elapsed(),
                )
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = posts.join_all().await;
        let full: Vec<_> = all.iter().filter(|r| r.1.as_deref() == Some("queue_full")).collect();
        assert!(full.len() >= 3, "{all:?}");
        for (status, _, ra, took) in &full {
            assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(ra.as_deref(), Some("1"));
            assert!(*took < Duration::from_millis(700), "refused at once, not after the slow call: {took:?}");
        }
        assert_eq!(all.iter().filter(|r| r.0 == StatusCode::CREATED).count() + full.len(), 6, "{all:?}");
        assert_eq!(gw.metrics().refused.get("full").copied(), Some(full.len() as u64));
    })
    .await;
}

#[tokio::test]
async fn the_binary_serves_http_and_never_prints_its_token() {
    within(async {
        let (up, seen) = foreign_upstream(StatusCode::ACCEPTED, "queued").await;
        let dir = std::env::temp_dir().join(format!("wary-gw-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "s3cret-from-file\n").unwrap();
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let mut child = Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--upstream", &format!("http://{up}")])
            .args(["--no-metrics", "--path", "/in", "--header", "X-Tenant: t1"])
            .arg(format!("--header-file=Authorization={}", token_file.display()))
            .args(["--header-env", "X-Api-Key=WARY_TEST_TOKEN", "--workers", "2"])
            .args(["--insecure-no-auth", "--insecure-plain-http"])
            .env("WARY_TEST_TOKEN", "s3cret-from-env")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut up_yet = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                up_yet = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(up_yet, "the gateway did not start listening");
        let r = post(addr, &key(11), r#"{"seq":11}"#).await;
        assert_eq!(r.status, StatusCode::ACCEPTED);
        assert_eq!(&r.body[..], b"queued");
        assert_eq!(seen.lock().unwrap()[0].2.as_deref(), Some("s3cret-from-file"));
        child.kill().unwrap();
        child.wait().unwrap();
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(err.contains("listening on"), "{err}");
        assert!(!(out + &err).contains("s3cret"), "a token reached the output");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
