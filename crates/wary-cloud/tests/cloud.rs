//! End-to-end tests of the test cloud over raw HTTP/1.1 on loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use wary_cloud::{Cloud, Fault, Faults};

const LOOPBACK: &str = "127.0.0.1:0";
const IO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Sends one request on a fresh connection; `None` if the server closed it without a byte.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Resp> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(&request_bytes(method, path, headers, body)).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(IO_TIMEOUT, stream.read_to_end(&mut raw))
        .await
        .expect("response within timeout")
        .expect("read");
    if raw.is_empty() {
        return None;
    }
    Some(parse(&raw))
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of head");
    let head = std::str::from_utf8(&raw[..split]).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Resp { status, headers, body: raw[split + 4..].to_vec() }
}

async fn post_keyed(addr: SocketAddr, key: &str, body: &[u8]) -> Option<Resp> {
    send(addr, "POST", "/readings", &[("Idempotency-Key", key)], body).await
}

async fn post_legacy(addr: SocketAddr, reading_id: &str, body: &[u8]) -> Option<Resp> {
    send(addr, "POST", "/legacy/readings", &[("X-Reading-Id", reading_id)], body).await
}

async fn probe(addr: SocketAddr, reading_id: &str) -> u16 {
    send(addr, "GET", &format!("/legacy/readings/{reading_id}"), &[], b"")
        .await
        .expect("probe answered")
        .status
}

async fn start(spec: &str) -> Cloud {
    Cloud::start(LOOPBACK, spec.parse().expect("fault spec")).await.expect("cloud starts")
}

#[tokio::test]
async fn keyed_replay_applies_nothing_and_returns_first_response() {
    let cloud = start("").await;
    let first = post_keyed(cloud.addr(), "key-1", b"{\"t\":21.5}").await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.header("idempotent-replayed"), None);
    // A different body under the same key must still get the first result.
    let replay = post_keyed(cloud.addr(), "key-1", b"{\"t\":99}").await.unwrap();
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    let other = post_keyed(cloud.addr(), "key-2", b"{}").await.unwrap();
    assert_ne!(other.json()["id"], first.json()["id"]);

    let k = cloud.key_stats("key-1").unwrap();
    assert_eq!((k.effects, k.replays, k.body_len), (1, 1, 10));
    assert_eq!(k.id, first.json()["id"].as_u64());
    let stats = cloud.stats();
    assert_eq!(stats.effects_total, 2);
    assert_eq!(stats.replays, 1);
    assert_eq!(stats.duplicates.keys, 0);
    assert_eq!(stats.effects_per_key.get("1"), Some(&2));
    assert_eq!(stats.requests_by_status.get("201"), Some(&3));

    // The same numbers over HTTP.
    let over_http = send(cloud.addr(), "GET", "/stats", &[], b"").await.unwrap();
    assert_eq!(over_http.json()["effects_total"], 2);
    assert_eq!(over_http.json()["replays"], 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn keyed_without_key_is_400_and_applies_nothing() {
    let cloud = start("").await;
    let resp = send(cloud.addr(), "POST", "/readings", &[], b"{}").await.unwrap();
    assert_eq!(resp.status, 400);
    let resp = post_keyed(cloud.addr(), &"x".repeat(300), b"{}").await.unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(cloud.stats().effects_total, 0);
    cloud.shutdown().await;
}

#[tokio::test]
async fn legacy_endpoint_double_applies_and_probe_sees_it() {
    let cloud = start("").await;
    assert_eq!(probe(cloud.addr(), "r-1").await, 404);
    let a = post_legacy(cloud.addr(), "r-1", b"{}").await.unwrap();
    let b = post_legacy(cloud.addr(), "r-1", b"{}").await.unwrap();
    assert_eq!((a.status, b.status), (201, 201));
    assert_ne!(a.json()["id"], b.json()["id"], "each copy does the work again");
    assert_eq!(cloud.reading_effects("r-1"), 2);
    assert_eq!(probe(cloud.addr(), "r-1").await, 200);
    assert_eq!(probe(cloud.addr(), "r-2").await, 404);
    let stats = cloud.stats();
    assert_eq!(stats.legacy_effects, 2);
    assert_eq!(stats.duplicates.reading_ids, 1);
    assert_eq!(stats.duplicates.reading_id_sample, vec!["r-1".to_owned()]);
    cloud.shutdown().await;
}

#[tokio::test]
async fn drop_after_effect_applies_but_sends_nothing() {
    let cloud = start("drop_after_effect=1,seed=1").await;
    assert!(post_keyed(cloud.addr(), "k-drop", b"{}").await.is_none());
    assert_eq!(cloud.key_stats("k-drop").unwrap().effects, 1);
    assert!(post_legacy(cloud.addr(), "r-drop", b"{}").await.is_none());
    assert_eq!(cloud.reading_effects("r-drop"), 1);
    assert_eq!(cloud.stats().requests_by_status.get("dropped"), Some(&2));

    cloud.set_faults(Faults::none()).unwrap();
    // The keyed retry is safe: it gets the stored result and applies nothing.
    let retry = post_keyed(cloud.addr(), "k-drop", b"{}").await.unwrap();
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(cloud.key_stats("k-drop").unwrap().effects, 1);
    // The legacy write landed although its client saw nothing: the probe says so.
    assert_eq!(probe(cloud.addr(), "r-drop").await, 200);
    cloud.shutdown().await;
}

#[tokio::test]
async fn drop_before_effect_applies_nothing() {
    let cloud = start("drop_before_effect=1").await;
    assert!(post_legacy(cloud.addr(), "r-early", b"{}").await.is_none());
    assert!(post_keyed(cloud.addr(), "k-early", b"{}").await.is_none());
    cloud.set_faults(Faults::none()).unwrap();
    assert_eq!(probe(cloud.addr(), "r-early").await, 404);
    assert_eq!(cloud.stats().effects_total, 0);
    cloud.shutdown().await;
}

#[tokio::test]
async fn error_after_effect_is_500_and_keyed_retry_gets_stored_success() {
    let cloud = start("500=1").await;
    let resp = post_keyed(cloud.addr(), "k-500", b"{}").await.unwrap();
    assert_eq!(resp.status, 500);
    assert_eq!(cloud.key_stats("k-500").unwrap().effects, 1);
    cloud.set_faults(Faults::none()).unwrap();
    let retry = post_keyed(cloud.addr(), "k-500", b"{}").await.unwrap();
    assert_eq!(retry.status, 201);
    assert_eq!(retry.json()["id"].as_u64(), cloud.key_stats("k-500").unwrap().id);
    assert_eq!(cloud.stats().effects_total, 1);
    cloud.shutdown().await;
}

/// Statuses of a fixed request sequence: 8 keys, 4 attempts each, then 16 legacy writes.
async fn status_sequence(spec: &str) -> Vec<Option<u16>> {
    let cloud = start(spec).await;
    let mut seen = Vec::new();
    for _attempt in 0..4 {
        for k in 0..8 {
            let r = post_keyed(cloud.addr(), &format!("key-{k}"), b"{}").await;
            seen.push(r.map(|r| r.status));
        }
    }
    for n in 0..16 {
        let r = post_legacy(cloud.addr(), &format!("r-{n}"), b"{}").await;
        seen.push(r.map(|r| r.status));
    }
    cloud.shutdown().await;
    seen
}

#[tokio::test]
async fn seeded_fault_choice_is_reproducible() {
    let spec = "503=0.3,429=0.2:ra=1,drop_after_effect=0.1,500=0.1,seed=42";
    let a = status_sequence(spec).await;
    let b = status_sequence(spec).await;
    assert_eq!(a, b, "same seed, same faults");
    for expected in [Some(201), Some(503), Some(429), Some(500), None] {
        assert!(a.contains(&expected), "{expected:?} missing from {a:?}");
    }
    let c = status_sequence(&spec.replace("seed=42", "seed=43")).await;
    assert_ne!(a, c, "another seed, another sequence");

    // The library's own choice predicts the server, stream by stream (`k:<key>`).
    let f: Faults = spec.parse().unwrap();
    for k in 0..8 {
        for attempt in 0..4u64 {
            let expected = match f.pick(&format!("k:key-{k}"), attempt).map(Fault::name) {
                None => Some(201),
                Some("drop_after_effect") => None,
                Some(code) => Some(code.parse().unwrap()),
            };
            assert_eq!(a[attempt as usize * 8 + k], expected, "key-{k} attempt {attempt}");
        }
    }
    // A stream's n-th request gets the same fault whatever other streams do.
    let lone = start(spec).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(post_keyed(lone.addr(), "key-5", b"{}").await.map(|r| r.status));
    }
    let from_full: Vec<_> = (0..4).map(|attempt| a[attempt * 8 + 5]).collect();
    assert_eq!(got, from_full);
    lone.shutdown().await;
}

#[tokio::test]
async fn retry_after_forms_and_hostile_headers() {
    let cloud = start("429=1:ra=date+120").await;
    let resp = post_keyed(cloud.addr(), "k-ra", b"{}").await.unwrap();
    assert_eq!(resp.status, 429);
    let date = httpdate::parse_http_date(resp.header("date").expect("Date header")).unwrap();
    let ra = httpdate::parse_http_date(resp.header("retry-after").expect("Retry-After")).unwrap();
    assert_eq!(ra.duration_since(date).unwrap(), Duration::from_secs(120));
    let skew = SystemTime::now().duration_since(date).unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_secs(5), "Date is the server's now");
    assert!(resp.header("retry-after").unwrap().ends_with(" GMT"));
    assert_eq!(cloud.stats().effects_total, 0, "429 comes before any effect");

    let expect = [
        ("429=1:ra=2", vec!["2"]),
        ("503=1:ra=year", vec!["31536000"]),
        ("429=1:ra=garbage", vec!["soon-ish, maybe -1"]),
        ("429=1:ra=dup", vec!["1", "3600"]),
    ];
    for (spec, values) in expect {
        cloud.set_faults(spec.parse().unwrap()).unwrap();
        let resp = post_keyed(cloud.addr(), "k-ra", b"{}").await.unwrap();
        assert_eq!(resp.all("retry-after"), values, "{spec}");
    }
    cloud.set_faults("429=1:ra=garbage_date".parse().unwrap()).unwrap();
    let resp = post_keyed(cloud.addr(), "k-ra", b"{}").await.unwrap();
    assert!(httpdate::parse_http_date(resp.header("date").unwrap()).is_err());
    assert!(httpdate::parse_http_date(resp.header("retry-after").unwrap()).is_ok());
    assert_eq!(cloud.stats().effects_total, 0);
    cloud.shutdown().await;
}

#[tokio::test]
async fn concurrent_duplicate_gets_409_while_first_is_in_flight() {
    let cloud = start("slow=1:ms=1000,scope=keyed").await;
    let addr = cloud.addr();
    let first = tokio::spawn(async move { post_keyed(addr, "k-busy", b"{}").await });
    // Wait until the first request holds the key, not for a guessed time.
    let t0 = Instant::now();
    while cloud.key_stats("k-busy").is_none() {
        assert!(t0.elapsed() < IO_TIMEOUT, "first request never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = post_keyed(addr, "k-busy", b"{}").await.unwrap();
    assert_eq!(second.status, 409);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status, 201);
    let k = cloud.key_stats("k-busy").unwrap();
    assert_eq!((k.effects, k.conflicts), (1, 1));
    cloud.shutdown().await;
}

#[tokio::test]
async fn client_hanging_up_mid_flight_does_not_wedge_the_key() {
    let cloud = start("slow=1:ms=300:before=true").await;
    let mut stream = TcpStream::connect(cloud.addr()).await.unwrap();
    stream
        .write_all(&request_bytes("POST", "/readings", &[("Idempotency-Key", "k-gone")], b"{}"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cloud.set_faults(Faults::none()).unwrap();
    let retry = post_keyed(cloud.addr(), "k-gone", b"{}").await.unwrap();
    assert_eq!(retry.status, 201, "the key is no longer in flight");
    assert_eq!(cloud.key_stats("k-gone").unwrap().effects, 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn slow_response_takes_at_least_the_delay() {
    let cloud = start("slow=1:ms=300").await;
    let t0 = Instant::now();
    let resp = post_legacy(cloud.addr(), "r-slow", b"{}").await.unwrap();
    assert_eq!(resp.status, 201);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    cloud.shutdown().await;
}

#[tokio::test]
async fn bad_bodies_with_and_without_effect() {
    let cloud = start("bad_body=1").await;
    let resp = post_keyed(cloud.addr(), "k-bad", b"{}").await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert!(serde_json::from_slice::<serde_json::Value>(&resp.body).is_err());
    assert_eq!(cloud.key_stats("k-bad").unwrap().effects, 1);

    cloud.set_faults("bad_body=1:form=wrong_type:effect=false".parse().unwrap()).unwrap();
    let resp = post_legacy(cloud.addr(), "r-bad", b"{}").await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/html"));
    assert_eq!(cloud.reading_effects("r-bad"), 0);
    cloud.shutdown().await;
}

#[tokio::test]
async fn endless_body_trickles_until_the_client_gives_up() {
    let cloud = start("endless_body=1:ms=50,scope=legacy").await;
    let mut stream = TcpStream::connect(cloud.addr()).await.unwrap();
    stream.write_all(&request_bytes("POST", "/legacy/readings", &[], b"{}")).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // Still trickling after several periods: a client needs its own deadline.
    let mut sink = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_millis(500), reader.read_to_end(&mut sink)).await;
    assert!(outcome.is_err(), "body must not end");
    assert!(sink.len() >= 5, "got {} bytes", sink.len());
    assert_eq!(cloud.stats().legacy_effects, 1);
    // Shutdown closes the open connection instead of waiting for the body.
    tokio::time::timeout(Duration::from_secs(5), cloud.shutdown()).await.expect("shutdown is prompt");
}

#[tokio::test]
async fn faults_change_at_runtime_over_http() {
    let cloud = start("").await;
    let set = send(
        cloud.addr(),
        "POST",
        "/admin/faults",
        &[("Content-Type", "application/json")],
        br#"{"seed":3,"rules":[{"kind":"503","p":1.0,"retry_after":"5"}],"scope":{"keyed":true,"legacy":false,"read":false}}"#,
    )
    .await
    .unwrap();
    assert_eq!(set.status, 200);
    let resp = post_keyed(cloud.addr(), "k-admin", b"{}").await.unwrap();
    assert_eq!((resp.status, resp.header("retry-after")), (503, Some("5")));
    assert_eq!(post_legacy(cloud.addr(), "r-admin", b"{}").await.unwrap().status, 201);
    assert_eq!(cloud.stats().faults_injected.get("503"), Some(&1));

    let set = send(cloud.addr(), "POST", "/admin/faults", &[], b"400=1").await.unwrap();
    assert_eq!(set.status, 200);
    assert_eq!(cloud.faults().rules.len(), 1);
    let resp = post_keyed(cloud.addr(), "k-admin", b"{}").await.unwrap();
    assert_eq!(resp.status, 400);

    let rejected = send(cloud.addr(), "POST", "/admin/faults", &[], b"503=2").await.unwrap();
    assert_eq!(rejected.status, 400);
    let current = send(cloud.addr(), "GET", "/admin/faults", &[], b"").await.unwrap();
    assert_eq!(current.json()["rules"][0]["kind"], "400");
    assert_eq!(cloud.stats().effects_total, 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_listening() {
    let cloud = start("").await;
    let addr = cloud.addr();
    assert!(addr.ip().is_loopback());
    cloud.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn binary_prints_address_and_serves_faults() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wary-cloud"))
        .args(["--listen", "127.0.0.1:0", "--faults", "503=1:ra=7,seed=1"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn wary-cloud");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(IO_TIMEOUT, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("address line in time")
        .unwrap();
    let addr: SocketAddr = line.trim().parse().expect("first line is the address");
    let resp = post_keyed(addr, "k-bin", b"{}").await.unwrap();
    assert_eq!((resp.status, resp.header("retry-after")), (503, Some("7")));
    child.kill().await.unwrap();
}

#[tokio::test]
async fn binary_rejects_bad_fault_spec() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wary-cloud"))
        .args(["--faults", "503=1.5"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

/// Reads one response with a `Content-Length` body off a kept connection.
async fn read_framed(stream: &mut BufReader<TcpStream>) -> Option<Resp> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(IO_TIMEOUT, stream.read_line(&mut line)).await.expect("in time").ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    let resp = parse(&head);
    let len: usize = resp.header("content-length").and_then(|v| v.parse().ok()).expect("framed");
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await.expect("body");
    Some(Resp { body, ..resp })
}

fn keyed_request(key: &str) -> Vec<u8> {
    let body = br#"{"v":1}"#;
    let mut req = format!(
        "POST /readings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

#[tokio::test]
async fn keeps_connections_and_closes_idle_ones_when_scripted() {
    // Without the fault, one connection carries several requests.
    let cloud = Cloud::start(LOOPBACK, Faults::none()).await.unwrap();
    let mut kept = BufReader::new(TcpStream::connect(cloud.addr()).await.unwrap());
    for n in 0..3 {
        kept.get_mut().write_all(&keyed_request(&format!("keep{n}"))).await.unwrap();
        assert_eq!(read_framed(&mut kept).await.expect("a reply").status, 201);
    }
    assert_eq!(cloud.stats().faults_injected.get("idle_close"), None);

    // With every reply followed by an idle close after 20..=40 ms: a request sent at once is
    // answered on the same connection, and one sent after the idle time finds it closed.
    let faults: Faults = "seed=1,idle_close=1:min=20:max=40".parse().unwrap();
    let cloud = Cloud::start(LOOPBACK, faults).await.unwrap();
    let mut conn = BufReader::new(TcpStream::connect(cloud.addr()).await.unwrap());
    conn.get_mut().write_all(&keyed_request("idle0")).await.unwrap();
    assert_eq!(read_framed(&mut conn).await.expect("a reply").status, 201);
    conn.get_mut().write_all(&keyed_request("idle1")).await.unwrap();
    assert_eq!(read_framed(&mut conn).await.expect("a reply on the kept connection").status, 201);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut rest = Vec::new();
    let n = tokio::time::timeout(IO_TIMEOUT, conn.read_to_end(&mut rest)).await.expect("closed in time");
    assert!(matches!(n, Ok(0)) || n.is_err(), "the idle connection was closed without a byte");
    assert_eq!(cloud.stats().faults_injected.get("idle_close"), Some(&1));
}

#[tokio::test]
async fn a_racing_idle_close_resets_the_connection_with_the_request_unread() {
    // Every close races the next request (the idle time is long, so the request comes first).
    let faults: Faults = "seed=2,idle_close=1:min=5000:max=5000:race=1".parse().unwrap();
    let cloud = Cloud::start(LOOPBACK, faults).await.unwrap();
    let mut conn = BufReader::new(TcpStream::connect(cloud.addr()).await.unwrap());
    conn.get_mut().write_all(&keyed_request("race0")).await.unwrap();
    assert_eq!(read_framed(&mut conn).await.expect("a reply").status, 201);
    tokio::time::sleep(Duration::from_millis(50)).await;
    conn.get_mut().write_all(&keyed_request("race1")).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(IO_TIMEOUT, conn.read_to_end(&mut rest)).await.expect("closed in time");
    assert!(rest.is_empty(), "no byte of reply");
    assert!(read.is_err() || matches!(read, Ok(0)));
    let stats = cloud.stats();
    assert_eq!(stats.faults_injected.get("idle_close_race"), Some(&1));
    // The second request was never read: one request served, one key applied.
    assert_eq!(stats.requests, 1, "{stats:?}");
}

async fn post_batch(addr: SocketAddr, body: &[u8]) -> Option<Resp> {
    send(addr, "POST", "/readings/batch", &[("Content-Type", "application/json")], body).await
}

fn batch_of(keys: &[&str]) -> Vec<u8> {
    let items: Vec<wary_host::batch::Item> = keys
        .iter()
        .enumerate()
        .map(|(n, k)| wary_host::batch::Item {
            key: (*k).to_owned(),
            body: format!("{{\"v\":{n}}}").into_bytes(),
        })
        .collect();
    wary_host::batch::encode(&items)
}

#[tokio::test]
async fn a_batch_applies_each_item_once_and_answers_in_order() {
    let cloud = start("").await;
    let addr = cloud.addr();
    // "b" landed before on its own: in the batch it is a replay, applied once in all.
    assert_eq!(post_keyed(addr, "b", br#"{"v":9}"#).await.unwrap().status, 201);
    let r = post_batch(addr, &batch_of(&["a", "b", "bad key", "c"])).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"[201,201,400,201]");
    for key in ["a", "b", "c"] {
        assert_eq!(cloud.key_stats(key).unwrap().effects, 1, "{key}");
    }
    assert_eq!(cloud.key_stats("b").unwrap().replays, 1);
    assert_eq!(cloud.key_stats("a").unwrap().body_len, br#"{"v":0}"#.len());
    // The same batch again changes nothing: every item is a replay.
    let again = post_batch(addr, &batch_of(&["a", "b", "c"])).await.unwrap();
    assert_eq!(again.body, b"[201,201,201]");
    let s = cloud.stats();
    assert_eq!((s.keyed_effects, s.batches, s.batch_items), (3, 2, 7));
    assert_eq!(s.duplicates.keys, 0);
}

#[tokio::test]
async fn batch_items_draw_their_own_faults_and_a_break_loses_the_rest() {
    // Every item of the keyed stream is refused with a Retry-After: positional 503s, nothing applied.
    let cloud = start("503=1:ra=4").await;
    let r = post_batch(cloud.addr(), &batch_of(&["a", "b"])).await.unwrap();
    assert_eq!(r.body, b"[[503,4],[503,4]]");
    assert_eq!(cloud.stats().keyed_effects, 0);
    // A connection break at the first item: the whole reply is lost; that item was applied
    // (drop after effect), the later ones were never read.
    cloud.set_faults("drop_after_effect=1".parse().unwrap()).unwrap();
    assert!(post_batch(cloud.addr(), &batch_of(&["x", "y"])).await.is_none());
    assert_eq!(cloud.key_stats("x").map(|k| k.effects), Some(1));
    assert_eq!(cloud.key_stats("y"), None);
    // The resend with the same keys, once the path is well: "x" from the store, "y" applied.
    cloud.set_faults(Faults::default()).unwrap();
    let r = post_batch(cloud.addr(), &batch_of(&["x", "y"])).await.unwrap();
    assert_eq!(r.body, b"[201,201]");
    assert_eq!((cloud.key_stats("x").unwrap().effects, cloud.key_stats("y").unwrap().effects), (1, 1));
}

#[tokio::test]
async fn malformed_or_oversized_batches_are_refused_whole() {
    let cloud = start("").await;
    for bad in [&b"[]"[..], b"{\"a\":1}", br#"[["a"]]"#, b"not json"] {
        let r = post_batch(cloud.addr(), bad).await.unwrap();
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(bad));
    }
    let keys: Vec<String> = (0..=wary_cloud::MAX_BATCH_ITEMS).map(|n| format!("k{n}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(post_batch(cloud.addr(), &batch_of(&refs)).await.unwrap().status, 413);
    assert_eq!(cloud.stats().keyed_effects, 0);
    let r = send(cloud.addr(), "GET", "/readings/batch", &[], b"").await.unwrap();
    assert_eq!(r.status, 405);
}

#[tokio::test]
async fn an_outage_answers_503_to_everything_and_applies_nothing() {
    let cloud = start("outage=0:ms=3600000").await;
    for n in 0..4 {
        let resp = post_keyed(cloud.addr(), &format!("outage-{n}"), b"{}").await.expect("a reply");
        assert_eq!(resp.status, 503);
        assert!(resp.header("retry-after").is_none(), "{resp:?}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.effects_total, 0);
    assert_eq!(stats.faults_injected.get("outage"), Some(&4));
    let arrivals: u64 = stats.load.iter().map(|b| b.arrivals).sum();
    let accepted: u64 = stats.load.iter().map(|b| b.accepted).sum();
    assert_eq!((arrivals, accepted), (4, 0));
    // Outside the script's scope nothing is gated: the probe still answers.
    cloud.set_faults("outage=0:ms=3600000,scope=keyed".parse().unwrap()).unwrap();
    assert_eq!(probe(cloud.addr(), "never-written").await, 404);
    assert!(cloud.stats().load.is_empty(), "a new script counts from nothing");
    cloud.shutdown().await;
}

#[tokio::test]
async fn an_outage_with_a_status_answers_it_to_everything_and_applies_nothing() {
    // An upstream refusing its client's credential for a while, then well again.
    let cloud = start("outage=0:ms=3600000:status=401").await;
    for n in 0..3 {
        let resp = post_keyed(cloud.addr(), &format!("cred-{n}"), b"{}").await.expect("a reply");
        assert_eq!(resp.status, 401);
        assert!(resp.header("retry-after").is_none(), "{resp:?}");
    }
    let r = post_batch(cloud.addr(), &batch_of(&["cred-0", "cred-9"])).await.unwrap();
    assert_eq!(r.body, b"[401,401]");
    let stats = cloud.stats();
    assert_eq!(stats.effects_total, 0);
    assert_eq!(stats.faults_injected.get("outage"), Some(&5));
    assert_eq!(stats.requests_by_status.get("401"), Some(&3));
    cloud.set_faults(Faults::none()).unwrap();
    assert_eq!(post_keyed(cloud.addr(), "cred-0", b"{}").await.unwrap().status, 201);
    assert_eq!(cloud.key_stats("cred-0").unwrap().effects, 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn a_poison_refuses_the_nth_distinct_key_on_every_request_and_nothing_else() {
    let cloud = start("poison=2,poison=3:status=400").await;
    let addr = cloud.addr();
    assert_eq!(post_keyed(addr, "first", b"{}").await.unwrap().status, 201);
    // The second distinct key, however often it is sent, never lands.
    for _ in 0..3 {
        assert_eq!(post_keyed(addr, "second", b"{}").await.unwrap().status, 422);
    }
    // A key seen before keeps its number: the first is a replay, not the third key.
    assert_eq!(post_keyed(addr, "first", b"{}").await.unwrap().status, 201);
    // A batch's items number their keys as they come: "third" is the third, "fourth" lands.
    let r = post_batch(addr, &batch_of(&["third", "second", "fourth"])).await.unwrap();
    assert_eq!(r.body, b"[400,422,201]");
    assert!(cloud.key_stats("second").is_none_or(|k| k.effects == 0));
    assert!(cloud.key_stats("third").is_none_or(|k| k.effects == 0));
    let stats = cloud.stats();
    assert_eq!(stats.effects_total, 2);
    assert_eq!(stats.faults_injected.get("poison"), Some(&5));
    // A new script numbers keys from 1 again: "second" is now the first key seen, and lands.
    cloud.set_faults("poison=2".parse().unwrap()).unwrap();
    assert_eq!(post_keyed(addr, "second", b"{}").await.unwrap().status, 201);
    assert_eq!(post_keyed(addr, "fifth", b"{}").await.unwrap().status, 422);
    cloud.shutdown().await;
}

#[tokio::test]
async fn a_capacity_accepts_at_most_its_rate_in_each_second_and_refuses_the_rest_at_once() {
    let cloud = start("capacity=2:ra=9").await;
    let mut refused = 0;
    for n in 0..8 {
        let resp = post_keyed(cloud.addr(), &format!("cap-{n}"), b"{}").await.expect("a reply");
        match resp.status {
            201 => {}
            503 => {
                assert_eq!(resp.header("retry-after"), Some("9"));
                refused += 1;
            }
            other => panic!("status {other}"),
        }
    }
    let stats = cloud.stats();
    // However the requests fell into seconds: in each, the first 2 accepted and the rest refused;
    // every accepted one applied, every other refused before its effect.
    assert!(stats.load.iter().all(|b| b.accepted == b.arrivals.min(2)), "{:?}", stats.load);
    let accepted: u64 = stats.load.iter().map(|b| b.accepted).sum();
    let arrivals: u64 = stats.load.iter().map(|b| b.arrivals).sum();
    assert_eq!(arrivals, 8);
    assert_eq!(stats.keyed_effects, accepted);
    assert_eq!(arrivals - accepted, refused);
    assert_eq!(stats.faults_injected.get("capacity").copied().unwrap_or(0), refused);
    cloud.shutdown().await;
}
