//! HTTP- and TCP-level faults as a device sees them on the wire: raw sockets, hand-written
//! HTTP/1.1, and what arrives byte by byte (or as a reset, an end of stream, a refusal).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use wary_cloud::{Cloud, Faults, GarbageForm};

const LOOPBACK: &str = "127.0.0.1:0";
const IO_TIMEOUT: Duration = Duration::from_secs(10);

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

fn keyed_request(key: &str) -> Vec<u8> {
    request_bytes("POST", "/readings", &[("Idempotency-Key", key)], b"{\"t\":21.5}")
}

fn legacy_request(reading_id: &str) -> Vec<u8> {
    request_bytes("POST", "/legacy/readings", &[("X-Reading-Id", reading_id)], b"{\"t\":21.5}")
}

/// What came back on one connection: every byte read, and how reading ended (`Ok` for an end
/// of stream, the error otherwise).
struct Wire {
    bytes: Vec<u8>,
    end: std::io::Result<()>,
}

impl Wire {
    fn reset(&self) -> bool {
        matches!(&self.end, Err(e) if e.kind() == ErrorKind::ConnectionReset)
    }

    fn eof(&self) -> bool {
        self.end.is_ok()
    }

    /// The header block, status line to blank line included, if it is complete.
    fn head(&self) -> Option<&[u8]> {
        let end = self.bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
        self.bytes.get(..end + 4)
    }

    fn status(&self) -> Option<u16> {
        let head = std::str::from_utf8(self.head()?).ok()?;
        head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }

    fn header(&self, name: &str) -> Option<String> {
        let head = std::str::from_utf8(self.head()?).ok()?;
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    }

    fn body_json(&self) -> serde_json::Value {
        let head = self.head().expect("complete head").len();
        serde_json::from_slice(self.bytes.get(head..).unwrap_or_default()).expect("JSON body")
    }
}

/// Reads until the peer ends or resets the connection.
async fn read_all(stream: &mut TcpStream) -> Wire {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        match tokio::time::timeout(IO_TIMEOUT, stream.read(&mut chunk))
            .await
            .expect("the cloud ends the reply")
        {
            Ok(0) => break Ok(()),
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) => break Err(e),
        }
    };
    Wire { bytes, end }
}

async fn exchange(addr: SocketAddr, request: &[u8]) -> Wire {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    read_all(&mut stream).await
}

async fn start(spec: &str) -> Cloud {
    Cloud::start(LOOPBACK, spec.parse().expect("fault spec")).await.expect("cloud starts")
}

fn effects(cloud: &Cloud, key: &str) -> u64 {
    cloud.key_stats(key).map_or(0, |k| k.effects)
}

/// A clean resend of `key` gets the stored result and applies nothing.
async fn assert_replay(cloud: &Cloud, key: &str) {
    let before = cloud.stats().keyed_effects;
    let replay = exchange(cloud.addr(), &keyed_request(key)).await;
    assert_eq!(replay.status(), Some(201), "{key}");
    assert_eq!(replay.header("idempotent-replayed").as_deref(), Some("true"), "{key}");
    assert_eq!(replay.body_json()["id"].as_u64(), cloud.key_stats(key).and_then(|k| k.id), "{key}");
    assert_eq!(effects(cloud, key), 1, "{key}");
    assert_eq!(cloud.stats().keyed_effects, before, "a replay applies nothing");
}

#[tokio::test]
async fn reset_after_effect_resets_where_drop_closes() {
    let cloud = start("reset_after_effect=1").await;
    let keyed = exchange(cloud.addr(), &keyed_request("k-rst")).await;
    assert!(keyed.reset(), "expected a reset, got {:?} after {} bytes", keyed.end, keyed.bytes.len());
    assert!(keyed.bytes.is_empty(), "no reply byte before the reset");
    assert_eq!(effects(&cloud, "k-rst"), 1);
    let legacy = exchange(cloud.addr(), &legacy_request("r-rst")).await;
    assert!(legacy.reset() && legacy.bytes.is_empty());
    assert_eq!(cloud.reading_effects("r-rst"), 1);
    let stats = cloud.stats();
    assert_eq!(stats.faults_injected.get("reset_after_effect"), Some(&2));
    assert_eq!(stats.requests_by_status.get("reset"), Some(&2));

    // The existing drop stays a graceful close: an end of stream, not a reset.
    cloud.set_faults("drop_after_effect=1".parse().unwrap()).unwrap();
    let dropped = exchange(cloud.addr(), &keyed_request("k-fin")).await;
    assert!(dropped.eof() && dropped.bytes.is_empty(), "{:?}", dropped.end);
    assert_eq!(effects(&cloud, "k-fin"), 1);

    cloud.set_faults(Faults::none()).unwrap();
    assert_replay(&cloud, "k-rst").await;
    assert_replay(&cloud, "k-fin").await;
    assert_eq!(cloud.stats().keyed_effects, 2);
    cloud.shutdown().await;
}

#[tokio::test]
async fn stall_after_effect_sends_nothing_then_the_reply_and_a_resend_is_a_replay() {
    let cloud = start("stall=1:ms=800").await;
    let started = Instant::now();
    let mut stalled = TcpStream::connect(cloud.addr()).await.unwrap();
    stalled.write_all(&keyed_request("k-stall")).await.unwrap();
    // A device with a 200 ms timeout hears nothing at all.
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(200), stalled.read(&mut byte)).await;
    assert!(early.is_err(), "nothing may arrive during the stall: {early:?}");
    // The effect landed before the stall, and the key is settled: the device's resend is a replay.
    let deadline = Instant::now() + IO_TIMEOUT;
    while effects(&cloud, "k-stall") == 0 {
        assert!(Instant::now() < deadline, "the effect never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cloud.set_faults(Faults::none()).unwrap();
    assert_replay(&cloud, "k-stall").await;

    // The stalled connection gets the genuine reply in the end.
    let late = read_all(&mut stalled).await;
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(late.status(), Some(201));
    assert_eq!(late.body_json()["id"].as_u64(), cloud.key_stats("k-stall").unwrap().id);
    assert_eq!(effects(&cloud, "k-stall"), 1);
    assert_eq!(cloud.stats().faults_injected.get("stall"), Some(&1));
    cloud.shutdown().await;
}

#[tokio::test]
async fn stall_without_effect_closes_or_answers_504() {
    let cloud = start("stall=1:ms=300:effect=false:then=close").await;
    let started = Instant::now();
    let closed = exchange(cloud.addr(), &keyed_request("k-void")).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(closed.eof() && closed.bytes.is_empty(), "{:?} {:?}", closed.end, closed.bytes);
    assert_eq!(effects(&cloud, "k-void"), 0);

    cloud.set_faults("stall=1:ms=300:effect=false".parse().unwrap()).unwrap();
    let started = Instant::now();
    let answered = exchange(cloud.addr(), &legacy_request("r-void")).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(answered.status(), Some(504));
    assert_eq!(cloud.reading_effects("r-void"), 0);

    // Nothing was stored, so the resend is the first effect.
    cloud.set_faults(Faults::none()).unwrap();
    let resend = exchange(cloud.addr(), &keyed_request("k-void")).await;
    assert_eq!(resend.status(), Some(201));
    assert_eq!(resend.header("idempotent-replayed"), None);
    assert_eq!(effects(&cloud, "k-void"), 1);
    assert_eq!(cloud.stats().effects_total, 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn truncated_reply_ends_inside_the_header_block() {
    let cloud = start("truncated_reply=1").await;
    let cut = exchange(cloud.addr(), &keyed_request("k-cut")).await;
    assert!(cut.eof(), "an end of stream, not a reset: {:?}", cut.end);
    let text = String::from_utf8(cut.bytes.clone()).expect("ASCII");
    assert!(text.starts_with("HTTP/1.1 201 Created\r\n"), "{text:?}");
    assert!(text.len() > "HTTP/1.1 201 Created\r\n".len(), "part of the header block follows: {text:?}");
    assert!(cut.head().is_none(), "the header block never ends: {text:?}");
    assert_eq!(effects(&cloud, "k-cut"), 1);
    let stats = cloud.stats();
    assert_eq!(stats.requests_by_status.get("truncated"), Some(&1));
    assert_eq!(stats.faults_injected.get("truncated_reply"), Some(&1));
    cloud.set_faults(Faults::none()).unwrap();
    assert_replay(&cloud, "k-cut").await;
    cloud.shutdown().await;
}

#[tokio::test]
async fn garbage_status_lines_with_and_without_effect() {
    let cloud = start("garbage_status=1").await;
    let bad_code = exchange(cloud.addr(), &keyed_request("k-2x0")).await;
    assert!(bad_code.eof(), "{:?}", bad_code.end);
    assert_eq!(bad_code.bytes, GarbageForm::BadCode.bytes());
    let first_line = bad_code.bytes.split(|b| *b == b'\r').next().unwrap();
    assert_eq!(first_line, b"HTTP/1.1 2x0 OK");
    assert_eq!(bad_code.status(), None, "no three-digit status code");
    assert_eq!(effects(&cloud, "k-2x0"), 1);

    cloud.set_faults("garbage_status=1:form=binary:effect=false".parse().unwrap()).unwrap();
    let noise = exchange(cloud.addr(), &keyed_request("k-noise")).await;
    assert!(noise.eof(), "{:?}", noise.end);
    assert_eq!(noise.bytes, GarbageForm::Binary.bytes());
    assert!(!noise.bytes.starts_with(b"HTTP/"));
    assert_eq!(effects(&cloud, "k-noise"), 0, "effect=false applies nothing");
    let stats = cloud.stats();
    assert_eq!(stats.requests_by_status.get("garbage"), Some(&2));
    assert_eq!(stats.faults_injected.get("garbage_status"), Some(&2));

    cloud.set_faults(Faults::none()).unwrap();
    assert_replay(&cloud, "k-2x0").await;
    let fresh = exchange(cloud.addr(), &keyed_request("k-noise")).await;
    assert_eq!(fresh.status(), Some(201));
    assert_eq!(fresh.header("idempotent-replayed"), None);
    assert_eq!(effects(&cloud, "k-noise"), 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn huge_header_block_does_not_fit_a_small_buffer() {
    let cloud = start("huge_header=1").await;
    let big = exchange(cloud.addr(), &keyed_request("k-big")).await;
    assert!(big.eof(), "{:?}", big.end);
    assert_eq!(big.status(), Some(201), "a real reply");
    let head = big.head().expect("a complete header block").len();
    assert!(head > 8192, "header block of {head} bytes");
    assert_eq!(big.header("x-padding").map(|v| v.len()), Some(8192));
    assert_eq!(big.body_json()["id"].as_u64(), cloud.key_stats("k-big").unwrap().id);
    assert_eq!(effects(&cloud, "k-big"), 1);

    // Sized by the script; replays go through the same path and apply nothing.
    cloud.set_faults("huge_header=1:bytes=20000".parse().unwrap()).unwrap();
    let bigger = exchange(cloud.addr(), &keyed_request("k-big")).await;
    assert_eq!(bigger.status(), Some(201));
    assert!(bigger.head().unwrap().len() > 20_000);
    assert_eq!(bigger.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(effects(&cloud, "k-big"), 1);
    assert_eq!(cloud.stats().faults_injected.get("huge_header"), Some(&2));
    cloud.shutdown().await;
}

/// Connects until the listener takes the connection again; returns when it did.
/// Held by the tests that close a listener and expect connects to be refused, and by the tests
/// that start processes: a process being started holds a copy of every descriptor of this one
/// until it executes its program, a listening socket closed meanwhile included, and connects
/// to the closed port are accepted until then (and reset after). Each test binary is its own
/// process, so only the tests in this file need it.
static NO_SPAWN_WHILE_REFUSING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn connect_when_reopened(addr: SocketAddr) -> (TcpStream, Instant) {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        match TcpStream::connect(addr).await {
            Ok(stream) => return (stream, Instant::now()),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                assert!(Instant::now() < deadline, "never reopened");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

#[tokio::test]
async fn scripted_refusal_window_then_the_same_port_serves_again() {
    let _no_spawn = NO_SPAWN_WHILE_REFUSING.lock().await;
    let cloud = start("refuse_at=2:ms=600").await;
    let addr = cloud.addr();
    assert_eq!(exchange(addr, &keyed_request("k-1")).await.status(), Some(201));
    // Open before the window: such a connection is served through it.
    let mut early = TcpStream::connect(addr).await.unwrap();

    let started = Instant::now();
    let second = exchange(addr, &keyed_request("k-2")).await;
    assert_eq!(second.status(), Some(201), "the request that opens the window is served");
    let refused = TcpStream::connect(addr).await.map(|_| ()).expect_err("refused during the window");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    early.write_all(&keyed_request("k-early")).await.unwrap();
    assert_eq!(read_all(&mut early).await.status(), Some(201));

    let (mut again, at) = connect_when_reopened(addr).await;
    assert!(at - started >= Duration::from_millis(600), "reopened after {:?}", at - started);
    again.write_all(&keyed_request("k-3")).await.unwrap();
    assert_eq!(read_all(&mut again).await.status(), Some(201));
    for key in ["k-1", "k-2", "k-early", "k-3"] {
        assert_eq!(effects(&cloud, key), 1, "{key}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.faults_injected.get("refuse"), Some(&1));
    // Request 2 only: later requests are served without a new window.
    assert_eq!(exchange(addr, &keyed_request("k-4")).await.status(), Some(201));
    assert!(TcpStream::connect(addr).await.is_ok());

    // A script put in force later numbers its requests from 1 (admin requests are not counted).
    let set = exchange(addr, &request_bytes("POST", "/admin/faults", &[], b"refuse_at=1:ms=300")).await;
    assert_eq!(set.status(), Some(200));
    assert_eq!(exchange(addr, &keyed_request("k-5")).await.status(), Some(201));
    assert!(TcpStream::connect(addr).await.is_err(), "refused after request 1 of the new script");
    connect_when_reopened(addr).await;
    assert_eq!(cloud.stats().faults_injected.get("refuse"), Some(&2));
    cloud.shutdown().await;
}

#[tokio::test]
async fn refusal_on_demand_over_http_and_from_the_library() {
    let _no_spawn = NO_SPAWN_WHILE_REFUSING.lock().await;
    let cloud = start("").await;
    let addr = cloud.addr();
    for bad in ["/admin/refuse", "/admin/refuse?ms=0", "/admin/refuse?ms=soon", "/admin/refuse?ms=3600001"] {
        let resp = exchange(addr, &request_bytes("POST", bad, &[], b"")).await;
        assert_eq!(resp.status(), Some(400), "{bad}");
    }
    // Windows of a second or two: long enough that a loaded machine cannot let one run out
    // between the answer and the next connect.
    let started = Instant::now();
    let resp = exchange(addr, &request_bytes("POST", "/admin/refuse?ms=2000", &[], b"")).await;
    assert_eq!(resp.status(), Some(200));
    assert_eq!(resp.body_json()["refusing_ms"], 2000);
    // Answered once the listener is closed, so the next connect is refused at once.
    let refused = TcpStream::connect(addr).await.map(|_| ()).expect_err("refused");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    let (mut again, at) = connect_when_reopened(addr).await;
    assert!(at - started >= Duration::from_millis(2000));
    again.write_all(&legacy_request("r-after")).await.unwrap();
    assert_eq!(read_all(&mut again).await.status(), Some(201));

    assert!(cloud.refuse_for(Duration::ZERO).await.is_err());
    assert!(cloud.refuse_for(Duration::from_secs(3601)).await.is_err());
    cloud.refuse_for(Duration::from_millis(1000)).await.unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    connect_when_reopened(addr).await;
    assert_eq!(cloud.stats().faults_injected.get("refuse"), Some(&2));
    assert_eq!(cloud.reading_effects("r-after"), 1);
    cloud.shutdown().await;
}

#[tokio::test]
async fn report_lists_every_key_and_reading() {
    let cloud = start("reset_after_effect=1,seed=5").await;
    exchange(cloud.addr(), &keyed_request("k-a")).await;
    exchange(cloud.addr(), &legacy_request("r-a")).await;
    cloud.set_faults(Faults::none()).unwrap();
    exchange(cloud.addr(), &keyed_request("k-a")).await;
    exchange(cloud.addr(), &keyed_request("k-b")).await;
    let over_http = exchange(cloud.addr(), &request_bytes("GET", "/report", &[], b"")).await.body_json();
    let report = cloud.shutdown_with_report().await;
    assert_eq!(report.keys.len(), 2);
    assert_eq!((report.keys["k-a"].effects, report.keys["k-a"].replays), (1, 1));
    assert_eq!(report.keys["k-b"].effects, 1);
    assert_eq!(report.readings.get("r-a"), Some(&1));
    assert_eq!(report.cloud.keyed_effects, 2);
    assert_eq!(report.faults, "seed=0");
    assert_eq!(over_http["keys"]["k-a"]["effects"], 1);
    assert_eq!(over_http["cloud"]["faults_injected"]["reset_after_effect"], 2);
    assert_eq!(over_http["readings"]["r-a"], 1);
}

/// Spawns the binary; returns it with its stdout reader, past the address line.
async fn spawn_binary(
    args: &[&str],
) -> (tokio::process::Child, BufReader<tokio::process::ChildStdout>, SocketAddr) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wary-cloud"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn wary-cloud");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(IO_TIMEOUT, stdout.read_line(&mut line)).await.expect("address in time").unwrap();
    let addr = line.trim().parse().expect("first line is the address");
    (child, stdout, addr)
}

/// The rest of stdout once the binary has exited: one JSON line.
async fn final_report(
    mut child: tokio::process::Child,
    mut stdout: BufReader<tokio::process::ChildStdout>,
) -> serde_json::Value {
    let mut rest = String::new();
    tokio::time::timeout(IO_TIMEOUT, stdout.read_to_string(&mut rest))
        .await
        .expect("report in time")
        .unwrap();
    let status = tokio::time::timeout(IO_TIMEOUT, child.wait()).await.expect("exits").unwrap();
    assert!(status.success(), "{status}");
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines.len(), 1, "one report line: {rest:?}");
    serde_json::from_str(lines[0]).expect("JSON report")
}

#[tokio::test]
async fn binary_prints_a_report_on_sigterm_and_sigint() {
    let _no_spawn = NO_SPAWN_WHILE_REFUSING.lock().await;
    for signal in ["TERM", "INT"] {
        let (child, stdout, addr) =
            spawn_binary(&["--listen", "127.0.0.1:0", "--faults", "reset=1,seed=2"]).await;
        assert!(exchange(addr, &keyed_request("k-sig")).await.reset());
        let pid = child.id().expect("running").to_string();
        let sent = tokio::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().await;
        assert!(sent.unwrap().success());
        let report = final_report(child, stdout).await;
        assert_eq!(report["keys"]["k-sig"]["effects"], 1, "{signal}: {report}");
        assert_eq!(report["cloud"]["keyed_effects"], 1);
        assert_eq!(report["cloud"]["duplicates"]["keys"], 0);
        assert_eq!(report["cloud"]["faults_injected"]["reset_after_effect"], 1);
        assert_eq!(report["faults"], "seed=2,reset_after_effect=1");
        assert!(TcpStream::connect(addr).await.is_err(), "stopped listening");
    }
}

#[tokio::test]
async fn binary_stops_when_stdin_closes_if_asked() {
    let _no_spawn = NO_SPAWN_WHILE_REFUSING.lock().await;
    let (mut child, stdout, addr) =
        spawn_binary(&["--exit-on-stdin-close", "--faults", "huge_header=1:bytes=64"]).await;
    let resp = exchange(addr, &legacy_request("r-bin")).await;
    assert_eq!(resp.status(), Some(201));
    drop(child.stdin.take());
    let report = final_report(child, stdout).await;
    assert_eq!(report["readings"]["r-bin"], 1);
    assert_eq!(report["cloud"]["legacy_effects"], 1);
    assert_eq!(report["cloud"]["faults_injected"]["huge_header"], 1);
}
