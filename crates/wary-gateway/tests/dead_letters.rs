//! `Wary-Dead-Letters: held=<u32>, dropped=<u32>` on a device's request: the authenticated
//! device's last report on `/metrics`, a malformed one ignored, and none ever filed under a
//! device the request only names.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wary_cloud::{Cloud, Faults};
use wary_gateway::dead_letters::Report;
use wary_gateway::{Auth, Config, Credentials, Gateway};
use wary_host::batch::{Item, encode};
use wary_host::spec::PolicySpec;

const TEST_LIMIT: Duration = Duration::from_secs(30);

async fn within(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, body).await.expect("test took too long");
}

struct Device {
    id: u64,
    token: String,
    line: String,
}

fn device(id: u64) -> Device {
    let (token, line) = Credentials::issue(id);
    Device { id, token, line }
}

fn key(device: u64, seq: u32) -> String {
    format!("{device:016x}{:08x}{seq:08x}", 1)
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
    c.workers = 4;
    c.queue = 16;
    c.seed = Some(7);
    let lines = devices.iter().map(|d| d.line.as_str()).collect::<Vec<_>>().join("\n");
    c.auth = Auth::Bearer(Arc::new(lines.parse().unwrap()));
    c
}

async fn gateway(config: Config) -> (Arc<Gateway>, SocketAddr) {
    let gw = Arc::new(Gateway::start(config, Box::new(std::io::sink())).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    (gw, addr)
}

/// `POST /readings` with `token` (if any), `key` and each `(name, value)` header as given.
async fn post(addr: SocketAddr, token: Option<&str>, key: &str, headers: &[(&str, &str)]) -> StatusCode {
    let mut b = Request::post(format!("http://{addr}/readings"))
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let req = b.body(Full::new(Bytes::from_static(b"{\"mC\":21000}"))).unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

/// One request written byte for byte (the header's name in whatever case the test chose); the
/// answer's status line.
async fn raw(addr: SocketAddr, head: &str) -> String {
    let body = "{}";
    let req = format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_owned()
}

/// The value of the one row of `name` for `device`, if there is one (and there is never two).
fn row(text: &str, name: &str, device: u64) -> Option<String> {
    let prefix = format!("{name}{{device=\"{device:016x}\"}} ");
    let rows: Vec<_> = text.lines().filter_map(|l| l.strip_prefix(prefix.as_str())).collect();
    assert!(rows.len() <= 1, "{rows:?}\n{text}");
    rows.first().map(|v| (*v).to_owned())
}

/// `device`'s `(held, dropped)` as `/metrics` shows them.
fn shown(gw: &Gateway, device: u64) -> (Option<String>, Option<String>) {
    let text = gw.prometheus();
    (
        row(&text, "wary_gateway_device_dead_letters", device),
        row(&text, "wary_gateway_device_dead_letters_dropped", device),
    )
}

fn values(held: u32, dropped: u32) -> (Option<String>, Option<String>) {
    (Some(held.to_string()), Some(dropped.to_string()))
}

fn device_rows(gw: &Gateway) -> usize {
    gw.prometheus().lines().filter(|l| l.starts_with("wary_gateway_device_dead_letters")).count()
}

const HEADER: &str = "wary-dead-letters";

#[tokio::test]
async fn a_devices_report_shows_on_metrics_and_the_next_one_replaces_it() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        let text = gw.prometheus();
        for (name, kind) in [
            ("wary_gateway_device_dead_letters", "gauge"),
            ("wary_gateway_device_dead_letters_dropped", "gauge"),
            ("wary_gateway_dead_letter_reports_total", "counter"),
        ] {
            assert!(text.contains(&format!("\n# HELP {name} ")), "{text}");
            assert!(text.contains(&format!("\n# TYPE {name} {kind}\n")), "{text}");
        }
        assert_eq!(device_rows(&gw), 0, "no device reported yet");

        let s = post(addr, Some(&a.token), &key(a.id, 0), &[(HEADER, "held=3, dropped=1")]).await;
        assert_eq!(s, StatusCode::CREATED);
        assert_eq!(shown(&gw, a.id), values(3, 1));
        assert_eq!(gw.dead_letters(a.id), Some(Report { held: 3, dropped: 1 }));
        // The next report replaces the last: members in the other order, other spacing, the
        // field's name in another case, up to u32::MAX.
        let head = format!(
            "POST /readings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {}\r\nIdempotency-Key: {}\r\nContent-Type: application/json\r\nWARY-Dead-LETTERS: dropped=4294967295 ,\theld=0\r\n",
            a.token,
            key(a.id, 1)
        );
        assert_eq!(raw(addr, &head).await, "HTTP/1.1 201 Created");
        assert_eq!(shown(&gw, a.id), values(0, u32::MAX));
        // A reading without the field changes nothing; another device's report is its own row.
        assert_eq!(post(addr, Some(&a.token), &key(a.id, 2), &[]).await, StatusCode::CREATED);
        assert_eq!(shown(&gw, a.id), values(0, u32::MAX));
        assert_eq!(shown(&gw, b.id), (None, None));
        let s = post(addr, Some(&b.token), &key(b.id, 0), &[(HEADER, "held=12, dropped=0")]).await;
        assert_eq!(s, StatusCode::CREATED);
        assert_eq!((shown(&gw, a.id), shown(&gw, b.id)), (values(0, u32::MAX), values(12, 0)));
        assert_eq!(device_rows(&gw), 4);
        assert!(gw.prometheus().contains("\nwary_gateway_dead_letter_reports_total{result=\"tracked\"} 3\n"));
        // A batch's head reports too.
        let items = [Item { key: key(b.id, 1), body: b"{}".to_vec() }];
        let req = Request::post(format!("http://{addr}/readings/batch"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", b.token))
            .header(HEADER, "held=5, dropped=2")
            .body(Full::new(Bytes::from(encode(&items))))
            .unwrap();
        let resp = Client::builder(TokioExecutor::new()).build_http().request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(shown(&gw, b.id), values(5, 2));
        // A device whose line is deleted no longer shows.
        gw.set_credentials(a.line.parse().unwrap());
        assert_eq!((shown(&gw, a.id), shown(&gw, b.id)), (values(0, u32::MAX), (None, None)));
        assert_eq!(cloud.stats().requests, 5);
    })
    .await;
}

#[tokio::test]
async fn a_malformed_report_is_ignored_and_the_reading_still_lands() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        assert_eq!(
            post(addr, Some(&a.token), &key(a.id, 0), &[(HEADER, "held=2, dropped=0")]).await,
            StatusCode::CREATED
        );
        let bad = [
            "held=7",
            "dropped=7",
            "held=-1, dropped=7",
            "held=4294967296, dropped=7",
            "held=7.0, dropped=7",
            "held=\"7\", dropped=7",
            "Held=7, Dropped=7",
            "held=7 dropped=7",
            "held=7, dropped=7,",
            "held=7;dropped=7",
            "7",
            "",
            "garbage \u{7f}",
        ];
        for (n, v) in bad.iter().enumerate() {
            let k = key(a.id, u32::try_from(n).unwrap() + 1);
            let Ok(value) = http::HeaderValue::from_str(v) else { continue };
            let mut b = Request::post(format!("http://{addr}/readings"))
                .header("content-type", "application/json")
                .header("idempotency-key", &k)
                .header("authorization", format!("Bearer {}", a.token));
            b = b.header(HEADER, value);
            let req = b.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
            let resp = Client::builder(TokioExecutor::new()).build_http().request(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::CREATED, "{v:?}");
            assert_eq!(cloud.key_stats(&k).unwrap().effects, 1, "{v:?}");
            assert_eq!(shown(&gw, a.id), values(2, 0), "{v:?} changed the last good report");
        }
        let malformed = gw.dead_letter_reports().malformed;
        assert!(malformed >= 12, "{malformed}");
        assert!(gw.prometheus().contains(&format!(
            "\nwary_gateway_dead_letter_reports_total{{result=\"malformed\"}} {malformed}\n"
        )));
        // A device whose only report is malformed shows no row at all.
        assert_eq!(
            post(addr, Some(&b.token), &key(b.id, 0), &[(HEADER, "held=1")]).await,
            StatusCode::CREATED
        );
        assert_eq!(shown(&gw, b.id), (None, None));
        assert_eq!(gw.metrics().refused.values().sum::<u64>(), 0, "a report refused a reading");
    })
    .await;
}

#[tokio::test]
async fn only_an_authenticated_device_reports_and_only_as_itself() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        let report = [(HEADER, "held=9, dropped=9")];
        // No credential, a token nobody was given, half a token: 401, and nobody's report.
        let stranger = device(0xa1);
        for token in [None, Some(stranger.token.as_str()), Some(&a.token[..63])] {
            assert_eq!(post(addr, token, &key(a.id, 0), &report).await, StatusCode::UNAUTHORIZED);
        }
        assert_eq!(device_rows(&gw), 0, "{}", gw.prometheus());
        // B's token on A's key: refused 403, and B's report, filed under B, never under A.
        let s = post(addr, Some(&b.token), &key(a.id, 1), &[(HEADER, "held=7, dropped=1")]).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert_eq!(shown(&gw, a.id), (None, None));
        assert_eq!(shown(&gw, b.id), values(7, 1));
        // A's token on B's key: A's report, B's row untouched.
        let s = post(addr, Some(&a.token), &key(b.id, 2), &[(HEADER, "held=4, dropped=0")]).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert_eq!((shown(&gw, a.id), shown(&gw, b.id)), (values(4, 0), values(7, 1)));
        // A field naming a device is just an unknown member.
        let naming = [(HEADER, "device=\"00000000000000b2\", held=6, dropped=6")];
        assert_eq!(post(addr, Some(&a.token), &key(a.id, 3), &naming).await, StatusCode::CREATED);
        assert_eq!((shown(&gw, a.id), shown(&gw, b.id)), (values(6, 6), values(7, 1)));
        assert_eq!(device_rows(&gw), 4);
        assert_eq!(cloud.stats().requests, 1);

        // An open gateway authenticates nobody: no report is kept.
        let mut open = config(&cloud.url(""), &[]);
        open.auth = Auth::Open;
        let (gw, addr) = gateway(open).await;
        assert_eq!(post(addr, None, &key(a.id, 9), &report).await, StatusCode::CREATED);
        assert_eq!(device_rows(&gw), 0, "{}", gw.prometheus());
        assert_eq!(gw.dead_letter_reports().tracked, 0);
    })
    .await;
}
