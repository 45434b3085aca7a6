//! The `wary-gateway` binary, as a process: frames on stdin/stdout or a Unix socket, the test
//! cloud on 127.0.0.1, the ledger file, `GET /metrics`, and what it does with bad frames.
//!
//! Frames are encoded and decoded by hand here (big-endian `u32` length, then JSON), so a codec
//! that is wrong in the same way on both sides cannot pass.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use wary_cloud::{Cloud, Faults};
use wary_gateway::MAX_FRAME;
use wary_gateway::Reading;
use wary_host::ledger::{Line, read_lines};
use wary_host::spec::PolicySpec;

const BIN: &str = env!("CARGO_BIN_EXE_wary-gateway");
/// Bound on any one wait (a frame, an exit, a connection).
const LIMIT: Duration = Duration::from_secs(8);
/// Bound on a whole test.
const TEST_LIMIT: Duration = Duration::from_secs(15);
/// Reading values start here; the ledger and stderr must never show one (no payload bytes).
const VALUE_BASE: i64 = 314_159_265_000;

/// Runs a test body under [`TEST_LIMIT`]; a child still running is killed when its `Gw` drops.
async fn within(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, body).await.expect("test took too long");
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("wary-gw-bin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fast policy, so a test run takes well under a second.
fn policy() -> PolicySpec {
    PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(2_000),
        deadline: Some(4_000),
        min_attempt: Some(50),
        ..PolicySpec::default()
    }
}

/// The usual arguments: the cloud, a free loopback metrics port, the fast policy, the ledger.
fn args(cloud: &Cloud, dir: &Scratch) -> Vec<String> {
    let policy_file = dir.path("policy.json");
    std::fs::write(&policy_file, serde_json::to_string(&policy()).unwrap()).unwrap();
    [
        "--upstream",
        &cloud.url(""),
        "--metrics",
        "127.0.0.1:0",
        "--policy",
        policy_file.to_str().unwrap(),
        "--ledger",
        dir.path("ledger.jsonl").to_str().unwrap(),
        "--attempt-timeout-ms",
        "400",
        "--workers",
        "4",
        "--queue",
        "64",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn readings(sensors: std::ops::Range<u32>, per: u64) -> Vec<Reading> {
    sensors
        .flat_map(|s| {
            (0..per).map(move |q| Reading {
                sensor: s,
                boot: 2,
                seq: q,
                value: VALUE_BASE + i64::from(s) * 1000 + q as i64,
            })
        })
        .collect()
}

/// A frame around `body`.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A reading's frame, its JSON written out field by field.
fn reading_frame(r: &Reading) -> Vec<u8> {
    let body = json!({"sensor": r.sensor, "boot": r.boot, "seq": r.seq, "value": r.value});
    frame(body.to_string().as_bytes())
}

/// Reads one frame from a blocking reader: `Ok(None)` at a clean end.
fn read_frame_sync(r: &mut impl Read) -> Result<Option<Value>, String> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(format!("stream ended after {got} bytes of a length prefix")),
            Ok(n) => got += n,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(format!("ack frame of {len} bytes"));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(|e| format!("ack body: {e}"))?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|_| format!("ack not JSON: {}", String::from_utf8_lossy(&body)))
}

/// The binary, running. Killed (and reaped) on drop.
struct Gw {
    child: Child,
    stdin: Option<ChildStdin>,
    acks: UnboundedReceiver<Result<Value, String>>,
    stderr_rx: UnboundedReceiver<String>,
    stderr: Vec<String>,
}

impl Gw {
    fn spawn(args: &[String]) -> Gw {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn wary-gateway");
        let mut out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let (ack_tx, acks) = unbounded_channel();
        std::thread::spawn(move || {
            loop {
                match read_frame_sync(&mut out) {
                    Ok(Some(v)) => {
                        let _ = ack_tx.send(Ok(v));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = ack_tx.send(Err(e));
                        break;
                    }
                }
            }
        });
        let (line_tx, stderr_rx) = unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let _ = line_tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Gw { child, stdin, acks, stderr_rx, stderr: Vec::new() }
    }

    /// Waits for a stderr line containing `pat`.
    async fn stderr_line(&mut self, pat: &str) -> String {
        if let Some(l) = self.stderr.iter().find(|l| l.contains(pat)) {
            return l.clone();
        }
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.stderr_rx.recv()).await {
                Ok(Some(line)) => {
                    self.stderr.push(line.clone());
                    if line.contains(pat) {
                        return line;
                    }
                }
                Ok(None) => panic!("stderr closed without {pat:?}: {:?}", self.stderr),
                Err(_) => panic!("no {pat:?} on stderr within {LIMIT:?}: {:?}", self.stderr),
            }
        }
    }

    /// The metrics address the binary printed.
    async fn metrics_addr(&mut self) -> SocketAddr {
        let line = self.stderr_line("metrics on http://").await;
        let rest = line.split("http://").nth(1).unwrap();
        rest.trim_end_matches("/metrics").parse().unwrap()
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next ack frame; `None` when stdout ends cleanly.
    async fn next_ack(&mut self) -> Option<Value> {
        match tokio::time::timeout(LIMIT, self.acks.recv()).await {
            Ok(Some(Ok(v))) => Some(v),
            Ok(Some(Err(e))) => panic!("bad stdout: {e}; stderr {:?}", self.stderr),
            Ok(None) => None,
            Err(_) => panic!("no ack within {LIMIT:?}; stderr {:?}", self.stderr),
        }
    }

    async fn acks(&mut self, n: usize) -> Vec<Value> {
        let mut v = Vec::new();
        while v.len() < n {
            match self.next_ack().await {
                Some(a) => v.push(a),
                None => panic!("stdout ended after {} of {n} acks; stderr {:?}", v.len(), self.stderr),
            }
        }
        v
    }

    /// Waits for the process to exit; the exit status and all of stderr.
    async fn wait(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "still running after {LIMIT:?}; stderr {:?}", self.stderr);
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        while let Ok(Some(line)) = tokio::time::timeout(LIMIT, self.stderr_rx.recv()).await {
            self.stderr.push(line);
        }
        (status, self.stderr.join("\n"))
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Id = (u32, u32, u64);

fn id(r: &Reading) -> Id {
    (r.sensor, r.boot, r.seq)
}

/// Every reading acked exactly once, `ok` and done, with its own sensor, boot and sequence.
fn check_acks(acks: &[Value], sent: &[Reading]) {
    let mut seen = BTreeSet::new();
    for a in acks {
        let sensor = u32::try_from(a["sensor"].as_u64().expect("sensor")).unwrap();
        let boot = u32::try_from(a["boot"].as_u64().expect("boot")).unwrap();
        let seq = a["seq"].as_u64().expect("seq");
        assert_eq!(a["verdict"], "ok", "{a}");
        assert_eq!(a["done"], true, "{a}");
        assert!(a.get("reason").is_none(), "{a}");
        assert!(a.get("surfaced").is_none(), "{a}");
        assert!(seen.insert((sensor, boot, seq)), "acked twice: {a}");
    }
    let want: BTreeSet<Id> = sent.iter().map(id).collect();
    assert_eq!(seen, want, "acks are not one per reading sent");
}

/// The cloud applied every reading's key exactly once, and the faults did hit.
fn check_cloud(cloud: &Cloud, sent: &[Reading]) {
    for r in sent {
        let ks = cloud.key_stats(r.key().to_hex().as_str()).expect("key reached the cloud");
        assert_eq!(ks.effects, 1, "{r:?}: {ks:?}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.keyed_effects, sent.len() as u64, "{stats:?}");
    assert_eq!(stats.duplicates.keys, 0, "{stats:?}");
    assert!(stats.faults_injected.get("503").copied().unwrap_or(0) > 0, "{stats:?}");
}

/// What the ledger says.
struct LedgerSummary {
    /// Attempt lines.
    attempts: u64,
    /// Attempts per call, one per key.
    per_call: Vec<u32>,
}

/// One policy line (the fast policy), then one attempt line per request the cloud got; each
/// call's lines numbered from 1, the verdict (`ok`) on its last line only. Every line parses.
fn check_ledger(path: &Path, cloud: &Cloud, sent: &[Reading]) -> LedgerSummary {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.ends_with('\n'), "last ledger line not ended");
    assert!(!text.contains("314159265"), "a reading's value is in the ledger");
    let lines: Vec<Line> =
        read_lines(&text).map(|(n, l)| l.unwrap_or_else(|e| panic!("ledger line {n}: {e}"))).collect();
    assert_eq!(lines.len(), text.lines().count(), "blank lines in the ledger");
    let Some(Line::Policy { fingerprint, policy: spec }) = lines.first() else {
        panic!("first ledger line is not the policy: {:?}", lines.first());
    };
    assert_eq!(spec, &policy());
    let keys: BTreeSet<String> = sent.iter().map(|r| r.key().to_hex().as_str().to_owned()).collect();
    let mut calls: BTreeMap<String, Vec<&wary_host::ledger::AttemptLine>> = BTreeMap::new();
    for l in &lines[1..] {
        let Line::Attempt(a) = l else { panic!("a second policy line: {l:?}") };
        assert_eq!(&a.policy, fingerprint);
        assert_eq!(a.op, "keyed_write");
        assert!(keys.contains(&a.key), "ledger key {} was never sent", a.key);
        a.to_record().unwrap();
        calls.entry(a.key.clone()).or_default().push(a);
    }
    assert_eq!(calls.len(), sent.len(), "calls in the ledger");
    let mut per_call = Vec::new();
    for (key, call) in &calls {
        for (i, a) in call.iter().enumerate() {
            assert_eq!(a.attempt as usize, i + 1, "{key}: attempts out of order");
            let last = i + 1 == call.len();
            assert_eq!(a.verdict.as_deref(), last.then_some("ok"), "{key}: attempt {}", a.attempt);
        }
        per_call.push(u32::try_from(call.len()).unwrap());
    }
    let attempts = (lines.len() - 1) as u64;
    let stats = cloud.stats();
    assert_eq!(attempts, stats.requests, "one ledger line per request the cloud got");
    let ledger_503 = lines
        .iter()
        .filter(|l| matches!(l, Line::Attempt(a) if a.outcome == "status" && a.status == Some(503)))
        .count() as u64;
    assert_eq!(Some(&ledger_503), stats.requests_by_status.get("503"), "{stats:?}");
    LedgerSummary { attempts, per_call }
}

fn assert_clean_stderr(stderr: &str) {
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("RUST_BACKTRACE"), "{stderr}");
    assert!(!stderr.contains("SECRET"), "payload bytes echoed: {stderr}");
    assert!(!stderr.contains("314159265"), "a reading's value echoed: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_mode_acks_every_reading_once_after_exactly_one_effect() {
    within(async {
        let faults: Faults = "503=0.3,drop_after_effect=0.1,seed=3".parse().unwrap();
        let cloud = Cloud::start("127.0.0.1:0", faults).await.unwrap();
        let dir = Scratch::new("stdin");
        let mut gw = Gw::spawn(&args(&cloud, &dir));
        let sent = readings(0..4, 10);
        for r in &sent {
            gw.send(&reading_frame(r));
        }
        gw.close_stdin();
        let acks = gw.acks(sent.len()).await;
        assert_eq!(gw.next_ack().await, None, "more acks than readings");
        let (status, stderr) = gw.wait().await;
        assert!(status.success(), "{status}: {stderr}");
        assert!(stderr.contains("wary-gateway: 40 readings, stream closed"), "{stderr}");
        assert_clean_stderr(&stderr);
        check_acks(&acks, &sent);
        check_cloud(&cloud, &sent);
        // Answers lost after the effect were retried and answered from the idempotency store.
        assert!(cloud.stats().replays > 0, "{:?}", cloud.stats());
        let ledger = check_ledger(&dir.path("ledger.jsonl"), &cloud, &sent);
        assert!(ledger.attempts > sent.len() as u64, "no retries: the faults missed");
        cloud.shutdown().await;
    })
    .await;
}

/// Writes `batch` on a new connection, closes its write half, reads acks until the gateway
/// closes the stream.
async fn unix_batch(path: &Path, batch: &[u8]) -> Vec<Value> {
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    s.write_all(batch).await.unwrap();
    let (mut r, mut w) = s.into_split();
    w.shutdown().await.unwrap();
    let mut acks = Vec::new();
    let read = async {
        while let Some(a) = wary_gateway::frame::read_frame::<_, Value>(&mut r).await.unwrap() {
            acks.push(a);
        }
    };
    tokio::time::timeout(LIMIT, read).await.expect("unix stream not closed in time");
    // Nothing after the last frame.
    assert_eq!(r.read(&mut [0u8; 1]).await.unwrap(), 0);
    acks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_mode_acks_each_connection_its_own_readings() {
    within(async {
        let faults: Faults = "503=0.3,drop_after_effect=0.1,seed=5".parse().unwrap();
        let cloud = Cloud::start("127.0.0.1:0", faults).await.unwrap();
        let dir = Scratch::new("unix");
        let sock = dir.path("gw.sock");
        let mut a = args(&cloud, &dir);
        a.extend(["--unix".to_owned(), sock.to_str().unwrap().to_owned()]);
        let mut gw = Gw::spawn(&a);
        gw.metrics_addr().await;
        let t0 = Instant::now();
        while tokio::net::UnixStream::connect(&sock).await.is_err() {
            assert!(t0.elapsed() < LIMIT, "socket never accepted; stderr {:?}", gw.stderr);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Two sensors' connections at once: each gets exactly its own acks.
        let (first, second) = (readings(0..3, 8), readings(10..13, 8));
        let enc = |rs: &[Reading]| rs.iter().flat_map(reading_frame).collect::<Vec<u8>>();
        let (bytes1, bytes2) = (enc(&first), enc(&second));
        let (acks1, acks2) = tokio::join!(unix_batch(&sock, &bytes1), unix_batch(&sock, &bytes2));
        check_acks(&acks1, &first);
        check_acks(&acks2, &second);

        // A bad frame closes that connection only, after acking what came before it.
        let before = readings(20..21, 1);
        let mut bad = enc(&before);
        bad.extend(frame(b"SECRET-GARBAGE\xff{"));
        let acks3 = unix_batch(&sock, &bad).await;
        check_acks(&acks3, &before);
        let line = gw.stderr_line("stream closed").await;
        assert_eq!(line, "wary-gateway: stream closed: frame is not a valid message");

        // The gateway still serves new connections.
        let after = readings(30..31, 2);
        check_acks(&unix_batch(&sock, &enc(&after)).await, &after);

        // SIGINT: a clean exit.
        let pid = gw.child.id().to_string();
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
        let (status, stderr) = gw.wait().await;
        assert!(status.success(), "{status}: {stderr}");
        assert_clean_stderr(&stderr);

        let all: Vec<Reading> = [first, second, before, after].concat();
        check_cloud(&cloud, &all);
        check_ledger(&dir.path("ledger.jsonl"), &cloud, &all);
        cloud.shutdown().await;
    })
    .await;
}

/// A plain HTTP/1.1 GET; the status line, headers (lowercased names) and body.
async fn http_get(addr: SocketAddr, path: &str) -> (String, BTreeMap<String, String>, String) {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        buf
    };
    let buf = tokio::time::timeout(LIMIT, get).await.expect("metrics answer in time");
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    (status, headers, body.to_owned())
}

/// `GET /metrics`, checked as an HTTP answer, parsed to series → value. Every series has a TYPE.
async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (status, headers, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(headers["content-type"], "text/plain; version=0.0.4");
    assert_eq!(headers["content-length"], body.len().to_string());
    let typed: BTreeSet<&str> =
        body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let mut series = BTreeMap::new();
    for l in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (name, v) = l.rsplit_once(' ').unwrap();
        let base = name.split('{').next().unwrap();
        assert!(typed.contains(base), "{base} has no TYPE line");
        assert!(series.insert(name.to_owned(), v.parse::<f64>().unwrap()).is_none(), "{name} twice");
    }
    series
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_agrees_with_what_was_sent() {
    within(async {
        let faults: Faults = "503=0.3,seed=11".parse().unwrap();
        let cloud = Cloud::start("127.0.0.1:0", faults).await.unwrap();
        let dir = Scratch::new("metrics");
        let mut gw = Gw::spawn(&args(&cloud, &dir));
        let addr = gw.metrics_addr().await;
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

        let m = scrape(addr).await;
        assert_eq!(m["wary_gateway_calls_total{verdict=\"ok\"}"], 0.0);
        assert_eq!(m["wary_gateway_attempts_total"], 0.0);
        assert_eq!(m["wary_gateway_fleet_tokens"], 100.0);
        assert_eq!(m["wary_gateway_fleet_tokens_max"], 100.0);
        assert_eq!(m["wary_gateway_queue_capacity"], 64.0);

        let sent = readings(0..5, 8);
        let n = sent.len();
        for r in &sent {
            gw.send(&reading_frame(r));
        }
        // Stdin stays open: the gateway is still running while it is scraped.
        let acks = gw.acks(n).await;
        check_acks(&acks, &sent);
        let m = scrape(addr).await;
        let (not_found, _, _) = http_get(addr, "/nope").await;
        assert_eq!(not_found, "HTTP/1.1 404 Not Found");
        gw.close_stdin();
        let (status, stderr) = gw.wait().await;
        assert!(status.success(), "{status}: {stderr}");
        assert_clean_stderr(&stderr);
        check_cloud(&cloud, &sent);
        let ledger = check_ledger(&dir.path("ledger.jsonl"), &cloud, &sent);

        assert_eq!(m["wary_gateway_calls_total{verdict=\"ok\"}"], n as f64);
        for v in ["failed", "unknown", "gave_up", "cancelled"] {
            assert_eq!(m[&format!("wary_gateway_calls_total{{verdict=\"{v}\"}}")], 0.0, "{v}");
        }
        assert!(!m.keys().any(|k| k.starts_with("wary_gateway_gave_up_total")), "{m:?}");
        let attempts = ledger.attempts as f64;
        assert!(ledger.attempts > n as u64, "no retries: the faults missed");
        assert_eq!(m["wary_gateway_attempts_total"], attempts);
        assert!((m["wary_gateway_attempts_per_call_mean"] - attempts / n as f64).abs() < 0.0015, "{m:?}");
        let mut per_call = ledger.per_call.clone();
        per_call.sort_unstable();
        let p95 = per_call[(n * 95).div_ceil(100) - 1];
        assert_eq!(m["wary_gateway_attempts_per_call_p95"], f64::from(p95));
        assert_eq!(m["wary_gateway_attempts_per_call_max"], f64::from(*per_call.last().unwrap()));
        // Each failed attempt cost a token, each success gave 0.1 back (up to the maximum of 100).
        let failures = ledger.attempts as f64 - n as f64;
        let tokens = m["wary_gateway_fleet_tokens"];
        assert!(tokens >= 100.0 - failures - 1e-9, "{tokens} tokens after {failures} failures");
        assert!(tokens <= (100.0 - failures + 0.1 * n as f64).min(100.0) + 1e-9, "{tokens} tokens");
        assert_eq!(m["wary_gateway_fleet_tokens_max"], 100.0);
        assert_eq!(m["wary_gateway_queue_depth"], 0.0);
        assert_eq!(m["wary_gateway_queue_capacity"], 64.0);
        for p in ["landed", "not_landed", "unknown"] {
            assert_eq!(m[&format!("wary_gateway_probes_total{{result=\"{p}\"}}")], 0.0, "{p}");
        }
        assert_eq!(m["wary_gateway_surfaced_total"], 0.0);
        cloud.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_on_stdin_end_the_run_with_a_typed_error() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::default()).await.unwrap();
        let mut oversized = (MAX_FRAME + 1).to_be_bytes().to_vec();
        oversized.extend_from_slice(b"{\"SECRET-OVERSIZED\": 1}");
        let unknown_field = br#"{"sensor":1,"seq":1,"value":1,"SECRET-FIELD":2}"#;
        let cases: [(&str, Vec<u8>, &str, bool); 4] = [
            ("garbage", frame(b"SECRET-GARBAGE\xff{\"sensor\""), "frame is not a valid message", false),
            ("unknown-field", frame(unknown_field), "frame is not a valid message", false),
            ("oversized", oversized, "frame of 4097 bytes exceeds the 4096-byte limit", false),
            // A stream that ends inside a length prefix.
            ("truncated", vec![0, 0], "stream ended inside a frame", true),
        ];
        let mut total = Vec::new();
        for (i, (name, bad, message, close)) in cases.into_iter().enumerate() {
            let dir = Scratch::new(&format!("bad-{name}"));
            let mut gw = Gw::spawn(&args(&cloud, &dir));
            let good = readings(100 + u32::try_from(i).unwrap()..101 + u32::try_from(i).unwrap(), 2);
            for r in &good {
                gw.send(&reading_frame(r));
            }
            gw.send(&bad);
            if close {
                gw.close_stdin();
            }
            // The readings before the bad frame are still acked, then stdout ends; stdin is left
            // open (except for the truncated case), so the exit is the bad frame's doing.
            let acks = gw.acks(good.len()).await;
            check_acks(&acks, &good);
            assert_eq!(gw.next_ack().await, None, "{name}: more on stdout");
            let (status, stderr) = gw.wait().await;
            assert_eq!(status.code(), Some(1), "{name}: {status}: {stderr}");
            assert!(stderr.contains(&format!("Error: {message}")), "{name}: {stderr}");
            assert_clean_stderr(&stderr);
            total.extend(good);
        }
        for r in &total {
            assert_eq!(cloud.key_stats(r.key().to_hex().as_str()).unwrap().effects, 1, "{r:?}");
        }
        assert_eq!(cloud.stats().keyed_effects, total.len() as u64);
        cloud.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_loopback_is_refused() {
    within(async {
        let a = ["--upstream", "http://127.0.0.1:9", "--metrics", "0.0.0.0:0"].map(str::to_owned);
        let mut gw = Gw::spawn(&a);
        let (status, stderr) = gw.wait().await;
        assert_eq!(status.code(), Some(1), "{status}: {stderr}");
        assert!(stderr.contains("Error: the metrics endpoint is served on loopback only"), "{stderr}");
        assert_eq!(gw.next_ack().await, None, "stdout not empty");
        assert_clean_stderr(&stderr);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_table_in_the_policy_spec_sets_the_gateway_budget() {
    use wary_gateway::{Config, Gateway, GatewayError};
    use wary_host::spec::FleetSpec;
    let mut c = Config::new("http://127.0.0.1:9");
    c.policy.fleet = Some(FleetSpec { tokens: 3, ratio_milli: 250 });
    let gw = Gateway::start(c, Box::new(std::io::sink())).unwrap();
    assert_eq!(gw.fleet_tokens_milli(), 3_000, "the spec's 3 tokens, not the config's 100");
    gw.shutdown().await;
    let mut c = Config::new("http://127.0.0.1:9");
    c.policy.fleet = Some(FleetSpec { tokens: 0, ratio_milli: 250 });
    assert!(matches!(Gateway::start(c, Box::new(std::io::sink())), Err(GatewayError::Fleet(_))));
}

#[test]
fn no_metrics_serves_no_endpoint() {
    let out = Command::new(env!("CARGO_BIN_EXE_wary-gateway"))
        .args(["--upstream", "http://127.0.0.1:9", "--no-metrics"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("metrics on"), "{stderr}");
    assert!(stderr.contains("0 readings, stream closed"), "{stderr}");
    let both = Command::new(env!("CARGO_BIN_EXE_wary-gateway"))
        .args(["--upstream", "http://127.0.0.1:9", "--no-metrics", "--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!both.status.success(), "--metrics and --no-metrics conflict");
}

/// A legacy write the probe cannot resolve is acked `unknown`, done and surfaced: on the wire,
/// the sensor is told never to resend it, and the gateway counts it for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_legacy_unknown_is_final_and_surfaced() {
    within(async {
        // Every write applies then answers 500; every probe read answers 500 too.
        let cloud = Cloud::start("127.0.0.1:0", "500=1.0,seed=2".parse::<Faults>().unwrap()).await.unwrap();
        let dir = Scratch::new("surfaced");
        let mut a = args(&cloud, &dir);
        a.extend(["--legacy", "--probe-grace-ms", "50"].map(str::to_owned));
        let mut gw = Gw::spawn(&a);
        let addr = gw.metrics_addr().await;
        let sent = readings(0..2, 1);
        for r in &sent {
            gw.send(&reading_frame(r));
        }
        let acks = gw.acks(sent.len()).await;
        for ack in &acks {
            assert_eq!(ack["verdict"], "unknown", "{ack}");
            assert_eq!(ack["done"], true, "an unknown must not be resent: {ack}");
            assert_eq!(ack["surfaced"], true, "{ack}");
        }
        let m = scrape(addr).await;
        assert_eq!(m["wary_gateway_surfaced_total"], 2.0);
        assert_eq!(m["wary_gateway_calls_total{verdict=\"unknown\"}"], 2.0);
        gw.close_stdin();
        let (status, stderr) = gw.wait().await;
        assert!(status.success(), "{status}: {stderr}");
        assert_clean_stderr(&stderr);
        for r in &sent {
            assert_eq!(cloud.reading_effects(&r.reading_id()), 1, "{r:?}");
        }
        cloud.shutdown().await;
    })
    .await;
}
