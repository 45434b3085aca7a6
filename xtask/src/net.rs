//! `cargo xtask net`: the device's network stack under QEMU. The `nettest` firmware brings up
//! the LAN9118, takes a DHCP lease from QEMU's user-mode network and makes one HTTP exchange
//! per scripted fault against [`Fixture`], a plain `TcpListener` on 127.0.0.1 that the guest
//! reaches as 10.0.2.2. The firmware checks how each exchange was classified; the fixture
//! checks that every request it got was well-formed HTTP/1.1 and that each scripted fault was
//! served exactly once.
//!
//! The guest learns the fixture's port, a closed port and a seed from semihosting's command
//! line: QEMU passes `-append` there when no `-semihosting-config arg=` is given.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::qemu::{TARGET, build, describe_exit, elf_path, start_qemu, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// A wedged guest must never hold CI: a healthy run takes a few seconds.
const NET_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest request head the fixture reads; the device's is about 200 bytes.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a connection handler waits for request bytes, and the longest any handler lives.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const HANDLER_LIFETIME: Duration = Duration::from_secs(60);
/// Header block of `/huge-headers`: four times the device's 1 KiB buffer.
const HUGE_HEADERS: usize = 4 * 1024;

/// What the fixture does with a connection, picked by the request's path.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// Writes these bytes, then closes (FIN).
    Bytes(&'static [u8]),
    /// A status line and [`HUGE_HEADERS`] bytes of headers.
    HugeHeaders,
    /// Closes with a reset (SO_LINGER 0) right after reading the request.
    Reset,
    /// Closes with a reset after reading only the head: the device is still sending its body.
    ResetEarly,
    /// Closes cleanly without a byte of reply.
    Close,
    /// Holds the connection open and says nothing.
    Stall,
    /// Starts a reply, then sends one header byte every 100 ms, never ending the block.
    Trickle,
}

/// Must agree with `CASES` in firmware/qemu/src/bin/nettest.rs (paths and header values).
const SCRIPT: &[(&str, Reply)] = &[
    (
        "/ok",
        Reply::Bytes(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\
              Connection: close\r\n\r\n{\"id\":1234}",
        ),
    ),
    ("/unavailable", Reply::Bytes(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")),
    (
        "/throttled-seconds",
        Reply::Bytes(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n"),
    ),
    (
        "/throttled-date",
        Reply::Bytes(
            b"HTTP/1.1 429 Too Many Requests\r\nDate: Wed, 21 Oct 2026 07:27:30 GMT\r\n\
              Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\nContent-Length: 0\r\n\r\n",
        ),
    ),
    (
        "/odd-case",
        Reply::Bytes(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 3\r\nRETRY-AFTER: 4\r\n\
              dATE: Wed, 21 Oct 2026 07:27:30 GMT\r\ncontent-length: 0\r\n\r\n",
        ),
    ),
    (
        "/many-retry-after",
        Reply::Bytes(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
              Retry-After: 99999999999999999999999999999999999999999999999999999999999999999999999999999999\r\n\
              Retry-After: 2\r\nRetry-After: 3\r\nRetry-After: 4\r\nRetry-After: 5\r\n\
              Date: Wednesday, 21-Oct-2026 07:27:30 GMT plus some more text\r\n\
              Content-Length: 0\r\n\r\n",
        ),
    ),
    (
        "/body-cut",
        Reply::Bytes(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":12"),
    ),
    ("/reset", Reply::Reset),
    ("/reset-early", Reply::ResetEarly),
    ("/closed", Reply::Close),
    ("/stall", Reply::Stall),
    ("/trickle", Reply::Trickle),
    ("/truncated", Reply::Bytes(b"HTTP/1.1 200 OK\r\nContent-Type: applic")),
    ("/garbage", Reply::Bytes(b"\x00\x01\x02 this is not HTTP\r\n\r\n")),
    ("/huge-headers", Reply::HugeHeaders),
];

/// Builds the firmware, starts the fixture and runs `nettest` under QEMU with a user-mode
/// LAN9118; fails unless the firmware exits 0 and the fixture saw each scripted request once,
/// well-formed.
pub fn nettest(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join("firmware");
    build(&firmware)?;

    let fixture = Fixture::start()?;
    let closed = closed_port()?;
    // TCP sequence numbers and local ports differ per run, as after a real reboot.
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let append = format!("port={} closed={closed} seed={seed}", fixture.port);
    step(&format!(
        "running nettest under QEMU mps2-an386, user-mode LAN9118 (timeout {} s)",
        NET_TIMEOUT.as_secs()
    ));
    let elf = elf_path(&firmware, "nettest");
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let started = Instant::now();
    let extra = ["-nic", "user,model=lan9118", "-serial", "none", "-append", append.as_str()];
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::piped(), Stdio::inherit())?;
    let mut qemu_stderr = qemu.stderr.take().context("qemu stderr")?;
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = qemu_stderr.read_to_string(&mut text);
        text
    });
    let qemu_status = wait_with_timeout(&mut qemu, NET_TIMEOUT)?;
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let elapsed = started.elapsed().as_secs_f64();
    let served = fixture.stop();
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if !qemu_stderr.trim().is_empty() {
        eprintln!("    qemu stderr:\n{}", qemu_stderr.trim_end());
    }
    match qemu_status {
        None => bail!("nettest: QEMU still running after {} s; killed", NET_TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("nettest failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => bail!("nettest: defmt-print could not decode the log"),
        Some(_) => {}
    }
    let summary = check_served(&served)?;
    eprintln!("    fixture: {summary}");
    eprintln!("    nettest passed in {elapsed:.1} s");
    Ok(())
}

/// A port on 127.0.0.1 with no listener: bound, then released (a small race with other
/// processes, acceptable for a test).
fn closed_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free TCP port")?;
    Ok(listener.local_addr()?.port())
}

/// What the fixture saw on one connection.
#[derive(Debug)]
struct Served {
    path: String,
    key: String,
    /// What was wrong with the request; empty if it was well-formed.
    problems: Vec<String>,
}

/// Every scripted path served exactly once, nothing else served, every request well-formed,
/// every key distinct.
fn check_served(served: &[Served]) -> Result<String> {
    let mut errors = vec![];
    for (path, _) in SCRIPT {
        let n = served.iter().filter(|s| s.path == *path).count();
        if n != 1 {
            errors.push(format!("{path} served {n} times, expected once"));
        }
    }
    for s in served {
        if !SCRIPT.iter().any(|(path, _)| *path == s.path) {
            errors.push(format!("unexpected request for {:?}", s.path));
        }
        for problem in &s.problems {
            errors.push(format!("{}: {problem}", s.path));
        }
    }
    let mut keys: Vec<&str> = served.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() != served.len() {
        errors.push("two requests carried the same Idempotency-Key".into());
    }
    if !errors.is_empty() {
        bail!("fixture: {}", errors.join("; "));
    }
    Ok(format!(
        "{} requests, each scripted fault served once, every request well-formed HTTP/1.1",
        served.len()
    ))
}

/// The scripted server: one thread accepting, one per connection.
struct Fixture {
    port: u16,
    done: Arc<AtomicBool>,
    acceptor: JoinHandle<Vec<Served>>,
}

impl Fixture {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the fixture's listener")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true).context("fixture listener")?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let acceptor = thread::spawn(move || accept_loop(&listener, port, &stop));
        Ok(Self { port, done, acceptor })
    }

    /// Stops accepting, lets every handler finish, and returns what was served.
    fn stop(self) -> Vec<Served> {
        self.done.store(true, Ordering::SeqCst);
        self.acceptor.join().unwrap_or_default()
    }
}

fn accept_loop(listener: &TcpListener, port: u16, done: &Arc<AtomicBool>) -> Vec<Served> {
    let served = Arc::new(Mutex::new(vec![]));
    let mut handlers = vec![];
    while !done.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let served = Arc::clone(&served);
                let done = Arc::clone(done);
                handlers.push(thread::spawn(move || {
                    let record = serve(stream, port, &done);
                    if let Ok(mut all) = served.lock() {
                        all.push(record);
                    }
                }));
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    for handler in handlers {
        let _ = handler.join();
    }
    Arc::try_unwrap(served).ok().and_then(|m| m.into_inner().ok()).unwrap_or_default()
}

/// Reads one request, checks it, and answers as the script says for its path.
fn serve(mut stream: TcpStream, port: u16, done: &AtomicBool) -> Served {
    let mut served = Served { path: String::new(), key: String::new(), problems: vec![] };
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut request = match read_head(&mut stream) {
        Ok(request) => request,
        Err(err) => {
            served.problems.push(format!("unreadable request head: {err:#}"));
            return served;
        }
    };
    served.path.clone_from(&request.path);
    served.key = request.header("idempotency-key").unwrap_or_default().to_owned();
    let reply = SCRIPT.iter().find(|(path, _)| *path == request.path).map(|(_, reply)| *reply);
    let whole = !matches!(reply, Some(Reply::ResetEarly));
    if whole && let Err(err) = read_body(&mut stream, &mut request) {
        served.problems.push(format!("unreadable request body: {err:#}"));
        return served;
    }
    served.problems = request.problems(port, whole);
    let Some(reply) = reply else {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return served;
    };
    // Errors writing are expected where the device gives up first (huge headers, trickle).
    match reply {
        Reply::Bytes(bytes) => {
            let _ = stream.write_all(bytes);
            let _ = stream.shutdown(Shutdown::Write);
            linger_until_closed(&mut stream, done);
        }
        Reply::HugeHeaders => {
            let mut block = b"HTTP/1.1 200 OK\r\n".to_vec();
            let mut n = 0;
            while block.len() < HUGE_HEADERS {
                block.extend_from_slice(format!("X-Filler-{n}: {}\r\n", "f".repeat(60)).as_bytes());
                n += 1;
            }
            block.extend_from_slice(b"Content-Length: 0\r\n\r\n");
            let _ = stream.write_all(&block);
            linger_until_closed(&mut stream, done);
        }
        Reply::Reset | Reply::ResetEarly => {
            if let Err(err) = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO)) {
                served.problems.push(format!("fixture could not set SO_LINGER 0: {err}"));
            }
        }
        Reply::Close => {
            let _ = stream.shutdown(Shutdown::Write);
            linger_until_closed(&mut stream, done);
        }
        Reply::Stall => linger_until_closed(&mut stream, done),
        Reply::Trickle => {
            let started = Instant::now();
            let mut ok = stream.write_all(b"HTTP/1.1 200 OK\r\nX-Slow: ").is_ok();
            while ok && !done.load(Ordering::SeqCst) && started.elapsed() < HANDLER_LIFETIME {
                thread::sleep(Duration::from_millis(100));
                ok = stream.write_all(b"a").is_ok();
            }
        }
    }
    served
}

/// Keeps the connection until the device closes it or the run ends, so our close never
/// races the device's reading.
fn linger_until_closed(stream: &mut TcpStream, done: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let started = Instant::now();
    let mut buf = [0u8; 256];
    while !done.load(Ordering::SeqCst) && started.elapsed() < HANDLER_LIFETIME {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A request as the fixture read it.
struct Request {
    method: String,
    path: String,
    version: String,
    /// Names lowercased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// What a device request must carry: the product's wire format, checked here so that
    /// nothing made up goes out. The body only when it was read (`whole`).
    fn problems(&self, port: u16, whole: bool) -> Vec<String> {
        let mut problems = vec![];
        if self.method != "POST" {
            problems.push(format!("method {:?}, expected POST", self.method));
        }
        if self.version != "HTTP/1.1" {
            problems.push(format!("version {:?}, expected HTTP/1.1", self.version));
        }
        let host = format!("10.0.2.2:{port}");
        if self.header("host") != Some(host.as_str()) {
            problems.push(format!("Host {:?}, expected {host:?}", self.header("host")));
        }
        if self.header("content-type") != Some("application/json") {
            problems.push(format!("Content-Type {:?}", self.header("content-type")));
        }
        if self.header("connection") != Some("close") {
            problems.push(format!("Connection {:?}, expected close", self.header("connection")));
        }
        let key = self.header("idempotency-key").unwrap_or_default();
        if key.len() != 32 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            problems.push(format!("Idempotency-Key {key:?} is not 32 hex digits"));
        }
        let declared = self.header("content-length").and_then(|v| v.parse::<usize>().ok());
        if declared.is_none() {
            problems.push("no Content-Length".into());
        }
        if !whole {
            return problems;
        }
        if declared != Some(self.body.len()) {
            problems.push(format!("Content-Length {declared:?} but {} body bytes", self.body.len()));
        }
        let json: Result<serde_json::Value, _> = serde_json::from_slice(&self.body);
        if !json.is_ok_and(|v| v.is_object()) {
            problems.push("body is not a JSON object".into());
        }
        problems
    }
}

/// Reads the request head (up to [`MAX_REQUEST_HEAD`] bytes) and any body bytes that came
/// with it.
fn read_head(stream: &mut TcpStream) -> Result<Request> {
    let mut data = vec![];
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if data.len() > MAX_REQUEST_HEAD {
            bail!("request head longer than {MAX_REQUEST_HEAD} bytes");
        }
        let n = stream.read(&mut buf).context("reading the request head")?;
        if n == 0 {
            bail!("connection closed inside the request head");
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = std::str::from_utf8(&data[..head_end]).context("request head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, path, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(p), Some(v), None) => (m.to_owned(), p.to_owned(), v.to_owned()),
        _ => bail!("request line {request_line:?} is not `METHOD PATH VERSION`"),
    };
    let mut headers = vec![];
    for line in lines {
        let (name, value) =
            line.split_once(':').with_context(|| format!("header line {line:?} has no colon"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Request { method, path, version, headers, body: data[head_end + 4..].to_vec() })
}

/// Reads the rest of the `Content-Length` body.
fn read_body(stream: &mut TcpStream, request: &mut Request) -> Result<()> {
    let mut buf = [0u8; 1024];
    let want = request.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while request.body.len() < want {
        let n = stream.read(&mut buf).context("reading the request body")?;
        if n == 0 {
            bail!("connection closed inside the body ({} of {want} bytes)", request.body.len());
        }
        request.body.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(path: &str, key: &str) -> Served {
        Served { path: path.into(), key: key.into(), problems: vec![] }
    }

    fn all_scripted() -> Vec<Served> {
        SCRIPT.iter().enumerate().map(|(i, (path, _))| served(path, &format!("{i:032x}"))).collect()
    }

    #[test]
    fn a_full_clean_run_passes() {
        assert!(check_served(&all_scripted()).is_ok());
    }

    #[test]
    fn a_missing_a_repeated_or_an_unexpected_path_fails() {
        let mut missing = all_scripted();
        missing.pop();
        assert!(check_served(&missing).is_err());
        let mut repeated = all_scripted();
        repeated.push(served("/ok", "ffffffffffffffffffffffffffffffff"));
        assert!(check_served(&repeated).is_err());
        let mut unexpected = all_scripted();
        unexpected.push(served("/refused", "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"));
        assert!(check_served(&unexpected).is_err());
    }

    #[test]
    fn a_malformed_request_or_a_reused_key_fails() {
        let mut bad = all_scripted();
        bad[0].problems.push("Content-Type None".into());
        assert!(check_served(&bad).is_err());
        let mut reused = all_scripted();
        reused[1].key = reused[0].key.clone();
        assert!(check_served(&reused).is_err());
    }

    /// The fixture against a hand-written request over a real socket: a good one passes,
    /// each missing piece is named.
    #[test]
    fn the_fixture_checks_the_wire_format() {
        let fixture = Fixture::start().unwrap();
        let body = br#"{"seq":1,"mC":21000}"#;
        let good = format!(
            "POST /unavailable HTTP/1.1\r\nHost: 10.0.2.2:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nIdempotency-Key: 0a386001000000000000000000000001\r\n\
             Connection: close\r\n\r\n",
            fixture.port,
            body.len()
        );
        let mut stream = TcpStream::connect(("127.0.0.1", fixture.port)).unwrap();
        stream.write_all(good.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 503 "), "{reply}");
        drop(stream);

        let mut stream = TcpStream::connect(("127.0.0.1", fixture.port)).unwrap();
        stream.write_all(b"GET /ok HTTP/1.0\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        drop(stream);

        let served = fixture.stop();
        assert_eq!(served.len(), 2);
        let good = served.iter().find(|s| s.path == "/unavailable").unwrap();
        assert!(good.problems.is_empty(), "{:?}", good.problems);
        let bad = served.iter().find(|s| s.path == "/ok").unwrap();
        let text = bad.problems.join("; ");
        for what in ["method", "version", "Host", "Content-Type", "Connection", "Idempotency-Key", "JSON"] {
            assert!(text.contains(what), "{what} not named in {text}");
        }
    }
}
