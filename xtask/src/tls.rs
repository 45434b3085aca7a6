//! `cargo xtask tls`: what TLS 1.3 costs the device, measured under QEMU.
//!
//! Makes a throwaway certificate chain for the run (a root CA, an intermediate, the cloud's
//! leaf for `cloud.wary.test`; a second, unrelated CA; a leaf for another name), builds the
//! `tls-probe` firmware with the root compiled in as its pinned CA, and serves each of the
//! probe's cases from its own TLS 1.3 server on 127.0.0.1 (rustls; the guest reaches them as
//! 10.0.2.2). It runs the plain-HTTP twin `plain-probe` against a plain server first, then the
//! TLS probe, checks on the host side what each server saw, and prints the timings and peak
//! stack the firmware measured and the flash and RAM of both binaries.
//!
//! The private keys live in this process's memory only and die with it; only the root CA's
//! certificate touches the disk, for the firmware build to embed.

use std::collections::BTreeMap;
use std::env;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::qemu::{
    TARGET, describe_exit, elf_path, llvm_size, parse_berkeley, start_qemu, wait_with_timeout,
};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// The cloud's name in the test chain: a reserved test domain. Must match `SERVER_NAME` in
/// firmware/tls-probe/src/bin/tls-probe.rs.
const SERVER_NAME: &str = "cloud.wary.test";
/// A name the pinned CA also vouches for, but not the one the device asks for.
const OTHER_NAME: &str = "other.wary.test";
/// Records of the small-record server, header and tag included: the probe's small read
/// buffer (`SMALL_READ`, 1280 bytes) holds one.
const SMALL_RECORDS: usize = 1024;
/// The big server's reply body, sent in one record: larger than the small read buffer.
const BIG_BODY: usize = 4000;
/// A wedged guest must never hold CI: a healthy run takes a few seconds.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a handler waits for request bytes, and the longest any handler lives.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const HANDLER_LIFETIME: Duration = Duration::from_secs(60);
/// The longest request head a server reads; the device's is about 200 bytes.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
const PACKAGE: &str = "wary-tls-probe";

/// What one server must have seen by the end of the run: connections, completed handshakes,
/// requests. Must agree with `CASES` in tls-probe.rs, and its two cases through the uplink's
/// own `TlsTransport` (one more on `good` and on `rogue`).
const EXPECTED: &[(&str, Seen)] = &[
    ("good", Seen { connections: 2, handshakes: 2, requests: 2 }),
    // Refused by the device after the server's certificate: no handshake completes, nothing is sent.
    ("rogue", Seen { connections: 2, handshakes: 0, requests: 0 }),
    ("wrongname", Seen { connections: 1, handshakes: 0, requests: 0 }),
    ("small", Seen { connections: 1, handshakes: 1, requests: 1 }),
    // The small-buffer case's request lands before its reply record overflows the buffer.
    ("big", Seen { connections: 2, handshakes: 2, requests: 2 }),
];

/// Counts one server keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    connections: usize,
    handshakes: usize,
    requests: usize,
}

/// Builds both probes, runs them under QEMU against their servers, checks what the servers
/// saw, and prints the measurements.
pub fn tls_probe(root: &Path) -> Result<()> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let llvm_size = llvm_size()?;
    let firmware = root.join("firmware");

    step("making a throwaway CA chain for this run (P-256, ECDSA)");
    let chain = TestChain::new()?;
    let dir = probe_dir(&firmware);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_path = dir.join("pinned-ca.der");
    std::fs::write(&ca_path, chain.root.der()).with_context(|| format!("writing {}", ca_path.display()))?;
    build_probes(&firmware, &ca_path)?;

    let seed = run_seed();
    let (plain_log, tls_log) = round(&firmware, &chain, &seed, Clock::Real)?;
    let (plain_count, tls_count) = round(&firmware, &chain, &seed, Clock::Instructions)?;

    step("measurements in guest time under QEMU (not a real board's: QEMU does not model cycles)");
    print_measurements(&plain_log, &tls_log, "ms");
    step("the same counted in instructions (QEMU -icount shift=0: one guest ns per instruction)");
    print_measurements(&plain_count, &tls_count, "M instr");
    step("flash and RAM (flash = text + data, RAM = data + bss; the stack is not counted)");
    let plain_elf = elf_path(&firmware, "plain-probe");
    let tls_elf = elf_path(&firmware, "tls-probe");
    let plain_size = size_of(&llvm_size, &plain_elf)?;
    let tls_size = size_of(&llvm_size, &tls_elf)?;
    println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}", "binary", "flash", "RAM", "text", "data", "bss");
    for (name, (text, data, bss)) in [("plain-probe", plain_size), ("tls-probe", tls_size)] {
        println!("{name:<16} {:>9} {:>9} {text:>9} {data:>9} {bss:>9}", text + data, data + bss);
    }
    let flash = |(t, d, _): (u64, u64, u64)| (t + d) as i64;
    let ram = |(_, d, b): (u64, u64, u64)| (d + b) as i64;
    println!(
        "{:<16} {:>+9} {:>+9}",
        "TLS adds",
        flash(tls_size) - flash(plain_size),
        ram(tls_size) - ram(plain_size)
    );
    step("the TLS probe's flash by crate (symbols; LTO inlines across crates, so approximate)");
    crate_shares(&llvm_size.with_file_name("llvm-nm"), &plain_elf, &tls_elf)?;
    Ok(())
}

/// How QEMU keeps the guest's time in a round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Clock {
    /// The host's time, as every other QEMU run here.
    Real,
    /// One guest nanosecond per instruction executed (`-icount shift=0,align=off`): the
    /// firmware's microseconds read as thousands of instructions, whatever the host's load.
    Instructions,
}

/// Runs the plain probe and then the TLS probe, each against fresh servers, and checks what
/// the servers saw; returns both logs.
fn round(firmware: &Path, chain: &TestChain, seed: &str, clock: Clock) -> Result<(Vec<String>, Vec<String>)> {
    let icount: &[&str] = match clock {
        Clock::Real => &[],
        Clock::Instructions => &["-icount", "shift=0,align=off"],
    };
    let plain = Server::start("plain", None, 0)?;
    let plain_log = run_probe(firmware, "plain-probe", &format!("seed={seed} port={}", plain.port), icount)?;
    check_plain(&plain.stop())?;

    let mut servers = vec![];
    for (name, config, body) in chain.server_configs()? {
        servers.push(Server::start(name, Some(Arc::new(config)), body)?);
    }
    let mut append = format!("seed={seed}");
    for server in &servers {
        append.push_str(&format!(" {}={}", server.name, server.port));
    }
    let tls_log = run_probe(firmware, "tls-probe", &append, icount)?;
    let seen: Vec<(&str, Vec<Conn>)> = servers.into_iter().map(|s| (s.name, s.stop())).collect();
    let summary = check_tls(&seen)?;
    eprintln!("    servers: {summary}");
    Ok((plain_log, tls_log))
}

/// Where the run's CA certificate goes: beside the firmware's build output.
fn probe_dir(firmware: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(|dir| firmware.join(dir))
        .unwrap_or_else(|| firmware.join("target"))
        .join("tls-probe")
}

/// The host hands the guest its randomness: QEMU's machine has no entropy source. A test
/// seed from the clock, different every run; a real device seeds from its hardware RNG.
fn run_seed() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos());
    let pid = u128::from(std::process::id());
    // Spread over 32 bytes; unpredictability does not matter for a test run.
    let a = nanos ^ (pid << 64);
    let b = a.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    format!("{a:032x}{b:032x}")
}

/// Builds both probe binaries (release, `--locked`) with `ca` as the pinned CA.
fn build_probes(firmware: &Path, ca: &Path) -> Result<()> {
    step("building the TLS probe and its plain twin (release, thumbv7em-none-eabihf)");
    let args = ["build", "--release", "--locked", "-p", PACKAGE, "--bins"];
    eprintln!("    $ (cd firmware && WARY_TLS_PROBE_CA={} cargo {})", ca.display(), args.join(" "));
    let started = Instant::now();
    // RUSTFLAGS would replace the rustflags of firmware/.cargo/config.toml, and with them the
    // linker scripts.
    let status = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(firmware)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("WARY_TLS_PROBE_CA", ca)
        .status()
        .context("starting cargo")?;
    if !status.success() {
        bail!("building {PACKAGE} failed with {status}");
    }
    eprintln!("    built in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs one probe under QEMU with a user-mode LAN9118 and `append` as its command line;
/// returns its decoded log, failing unless it exits 0.
fn run_probe(firmware: &Path, bin: &str, append: &str, qemu_args: &[&str]) -> Result<Vec<String>> {
    step(&format!(
        "running {bin} under QEMU mps2-an386, user-mode LAN9118 (timeout {} s)",
        RUN_TIMEOUT.as_secs()
    ));
    let elf = elf_path(firmware, bin);
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let mut extra = vec!["-nic", "user,model=lan9118", "-serial", "none", "-append", append];
    extra.extend_from_slice(qemu_args);
    let started = Instant::now();
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::inherit(), Stdio::piped())?;
    let out = printer.stdout.take().context("defmt-print stdout")?;
    let reader = thread::spawn(move || {
        let mut lines = vec![];
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("    {line}");
            lines.push(line);
        }
        lines
    });
    let status = wait_with_timeout(&mut qemu, RUN_TIMEOUT)?;
    let printer_status = printer.wait().context("waiting for defmt-print")?;
    let lines = reader.join().unwrap_or_default();
    match status {
        None => bail!("{bin}: QEMU still running after {} s; killed", RUN_TIMEOUT.as_secs()),
        Some(status) if !status.success() => bail!("{bin} failed under QEMU: {}", describe_exit(status)),
        Some(_) if !printer_status.success() => bail!("{bin}: defmt-print could not decode the log"),
        Some(_) => {}
    }
    eprintln!("    {bin} passed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(lines)
}

/// The run's certificates and keys.
struct TestChain {
    root: CertifiedIssuer<'static, KeyPair>,
    intermediate: CertifiedIssuer<'static, KeyPair>,
    rogue: CertifiedIssuer<'static, KeyPair>,
}

impl TestChain {
    fn new() -> Result<Self> {
        let root = CertifiedIssuer::self_signed(ca_params("wary test root CA")?, KeyPair::generate()?)?;
        let intermediate =
            CertifiedIssuer::signed_by(ca_params("wary test intermediate CA")?, KeyPair::generate()?, &root)?;
        // Same shape, same names, but no path to the pinned root.
        let rogue = CertifiedIssuer::self_signed(ca_params("wary test root CA")?, KeyPair::generate()?)?;
        Ok(Self { root, intermediate, rogue })
    }

    /// A leaf for `name` issued by `issuer`, with the chain a server sends (leaf first) and
    /// its key.
    fn leaf(
        name: &str,
        issuer: &CertifiedIssuer<'static, KeyPair>,
        above: Option<&CertifiedIssuer<'static, KeyPair>>,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, issuer)?;
        let mut chain = vec![cert.der().clone()];
        chain.extend(above.map(|ca| ca.der().clone()));
        Ok((chain, PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))))
    }

    /// One server configuration per case: name (the probe's command-line key), TLS config,
    /// reply body size.
    fn server_configs(&self) -> Result<Vec<(&'static str, ServerConfig, usize)>> {
        let good = Self::leaf(SERVER_NAME, &self.intermediate, Some(&self.intermediate))?;
        let rogue = Self::leaf(SERVER_NAME, &self.rogue, None)?;
        let wrong_name = Self::leaf(OTHER_NAME, &self.intermediate, Some(&self.intermediate))?;
        let mut small = tls13(&good)?;
        small.max_fragment_size = Some(SMALL_RECORDS);
        Ok(vec![
            ("good", tls13(&good)?, 0),
            ("rogue", tls13(&rogue)?, 0),
            ("wrongname", tls13(&wrong_name)?, 0),
            ("small", small, 0),
            ("big", tls13(&good)?, BIG_BODY),
        ])
    }
}

/// A throwaway CA certificate (DER), for a build that pins a CA but never connects: its key is
/// dropped at once.
pub(crate) fn throwaway_ca_der() -> Result<Vec<u8>> {
    let ca = CertifiedIssuer::self_signed(ca_params("wary build-check CA")?, KeyPair::generate()?)?;
    Ok(ca.der().to_vec())
}

fn ca_params(name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

/// A TLS 1.3-only server configuration (ring's primitives) for `chain` and its key.
fn tls13((chain, key): &(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)) -> Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key.clone_key())?)
}

/// What a server saw on one connection.
#[derive(Debug, Default)]
struct Conn {
    /// The negotiated version and cipher suite, or why the handshake failed.
    handshake: Option<Result<String, String>>,
    request: Option<Served>,
}

/// One request as a server read it.
#[derive(Debug)]
struct Served {
    key: String,
    /// What was wrong with it; empty if it is what the device must send.
    problems: Vec<String>,
}

/// A server on 127.0.0.1: TLS with `config`, or plain HTTP without; one thread accepting, one
/// per connection.
struct Server {
    name: &'static str,
    port: u16,
    done: Arc<AtomicBool>,
    acceptor: JoinHandle<Vec<Conn>>,
}

impl Server {
    fn start(name: &'static str, config: Option<Arc<ServerConfig>>, body: usize) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding a test server")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true).context("test server listener")?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let acceptor = thread::spawn(move || accept_loop(&listener, config.as_ref(), body, &stop));
        Ok(Self { name, port, done, acceptor })
    }

    /// Stops accepting, lets every handler finish, and returns what each connection saw.
    fn stop(self) -> Vec<Conn> {
        self.done.store(true, Ordering::SeqCst);
        self.acceptor.join().unwrap_or_default()
    }
}

fn accept_loop(
    listener: &TcpListener,
    config: Option<&Arc<ServerConfig>>,
    body: usize,
    done: &Arc<AtomicBool>,
) -> Vec<Conn> {
    let seen = Arc::new(Mutex::new(vec![]));
    let mut handlers = vec![];
    while !done.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let seen = Arc::clone(&seen);
                let done = Arc::clone(done);
                let config = config.cloned();
                handlers.push(thread::spawn(move || {
                    let conn = serve(stream, config, body, &done);
                    if let Ok(mut all) = seen.lock() {
                        all.push(conn);
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
    Arc::try_unwrap(seen).ok().and_then(|m| m.into_inner().ok()).unwrap_or_default()
}

fn serve(stream: TcpStream, config: Option<Arc<ServerConfig>>, body: usize, done: &AtomicBool) -> Conn {
    let mut conn = Conn::default();
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let Some(config) = config else {
        let mut stream = stream;
        conn.request = answer(&mut stream, body, done);
        return conn;
    };
    let server = match ServerConnection::new(config) {
        Ok(server) => server,
        Err(err) => {
            conn.handshake = Some(Err(format!("server setup: {err}")));
            return conn;
        }
    };
    let mut tls = StreamOwned::new(server, stream);
    while tls.conn.is_handshaking() {
        if let Err(err) = tls.conn.complete_io(&mut tls.sock) {
            conn.handshake = Some(Err(err.to_string()));
            return conn;
        }
    }
    let version = tls.conn.protocol_version().map_or("?".into(), |v| format!("{v:?}"));
    let suite = tls.conn.negotiated_cipher_suite().map_or("?".into(), |s| format!("{:?}", s.suite()));
    conn.handshake = Some(Ok(format!("{version} {suite}")));
    conn.request = answer(&mut tls, body, done);
    tls.conn.send_close_notify();
    let _ = tls.flush();
    conn
}

/// Reads one request, checks it, answers 201 (with `body` bytes of JSON when non-zero), and
/// waits for the device to close.
fn answer<S: Read + Write>(stream: &mut S, body: usize, done: &AtomicBool) -> Option<Served> {
    let request = match read_request(stream) {
        Ok(request) => request,
        Err(_) => return None,
    };
    let served = Served {
        key: request.header("idempotency-key").unwrap_or_default().to_owned(),
        problems: request.problems(),
    };
    let json = if body == 0 {
        r#"{"id":1}"#.to_owned()
    } else {
        let pad = body.saturating_sub(r#"{"id":1,"pad":""}"#.len());
        format!(r#"{{"id":1,"pad":"{}"}}"#, "a".repeat(pad))
    };
    let reply = format!(
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    );
    // One write: over TLS the whole reply goes out in one record (up to 16 KiB).
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.flush();
    linger_until_closed(stream, done);
    Some(served)
}

/// Keeps the connection until the device closes it or the run ends.
fn linger_until_closed<S: Read>(stream: &mut S, done: &AtomicBool) {
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

/// A request as a server read it.
struct Request {
    line: String,
    /// Names lowercased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// What the device's request must carry.
    fn problems(&self) -> Vec<String> {
        let mut problems = vec![];
        if self.line != "POST /readings HTTP/1.1" {
            problems.push(format!("request line {:?}", self.line));
        }
        let expected = [("host", SERVER_NAME), ("content-type", "application/json"), ("connection", "close")];
        for (name, value) in expected {
            if self.header(name) != Some(value) {
                problems.push(format!("{name}: {:?}, expected {value:?}", self.header(name)));
            }
        }
        let key = self.header("idempotency-key").unwrap_or_default();
        if key.len() != 32 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            problems.push(format!("Idempotency-Key {key:?} is not 32 hex digits"));
        }
        let declared = self.header("content-length").and_then(|v| v.parse::<usize>().ok());
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

/// Reads a request head (up to [`MAX_REQUEST_HEAD`] bytes) and its `Content-Length` body.
fn read_request<S: Read>(stream: &mut S) -> Result<Request> {
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
    let line = lines.next().unwrap_or_default().to_owned();
    let mut headers = vec![];
    for header in lines {
        let (name, value) =
            header.split_once(':').with_context(|| format!("header line {header:?} has no colon"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut request = Request { line, headers, body: data[head_end + 4..].to_vec() };
    let want = request.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while request.body.len() < want {
        let n = stream.read(&mut buf).context("reading the request body")?;
        if n == 0 {
            bail!("connection closed inside the body");
        }
        request.body.extend_from_slice(&buf[..n]);
    }
    Ok(request)
}

/// The plain server saw one well-formed request.
fn check_plain(conns: &[Conn]) -> Result<()> {
    let requests: Vec<&Served> = conns.iter().filter_map(|c| c.request.as_ref()).collect();
    if requests.len() != 1 {
        bail!("plain server: {} requests, expected 1", requests.len());
    }
    if let Some(served) = requests.first()
        && !served.problems.is_empty()
    {
        bail!("plain server: {}", served.problems.join("; "));
    }
    Ok(())
}

/// Every TLS server saw what its case implies, every handshake that completed was TLS 1.3
/// with AES-128-GCM, every request well-formed, every key distinct.
fn check_tls(seen: &[(&str, Vec<Conn>)]) -> Result<String> {
    let mut errors = vec![];
    let mut keys = vec![];
    for (name, expected) in EXPECTED {
        let Some((_, conns)) = seen.iter().find(|(n, _)| n == name) else {
            errors.push(format!("{name}: no such server"));
            continue;
        };
        let got = Seen {
            connections: conns.len(),
            handshakes: conns.iter().filter(|c| matches!(c.handshake, Some(Ok(_)))).count(),
            requests: conns.iter().filter(|c| c.request.is_some()).count(),
        };
        if got != *expected {
            errors.push(format!("{name}: saw {got:?}, expected {expected:?}"));
        }
        for conn in conns {
            if let Some(Ok(negotiated)) = &conn.handshake
                && negotiated != "TLSv1_3 TLS13_AES_128_GCM_SHA256"
            {
                errors.push(format!("{name}: negotiated {negotiated}"));
            }
            if let Some(served) = &conn.request {
                errors.extend(served.problems.iter().map(|p| format!("{name}: {p}")));
                keys.push(served.key.clone());
            }
        }
    }
    let total = keys.len();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() != total {
        errors.push("two requests carried the same Idempotency-Key".into());
    }
    if !errors.is_empty() {
        bail!("TLS servers: {}", errors.join("; "));
    }
    let refused: Vec<String> = seen
        .iter()
        .flat_map(|(name, conns)| {
            conns.iter().filter_map(move |c| match &c.handshake {
                Some(Err(err)) => Some(format!("{name}: {err}")),
                _ => None,
            })
        })
        .collect();
    Ok(format!(
        "{total} requests over TLS 1.3 (TLS13_AES_128_GCM_SHA256), each well-formed, keys distinct; \
         handshakes the device broke off: [{}]",
        refused.join("; ")
    ))
}

/// The `MEASURE` lines of both logs, as a table of microseconds / 1000 in `unit`.
fn print_measurements(plain: &[String], tls: &[String], unit: &str) {
    println!(
        "{:<26} {:>16} {:>16} {:>16}",
        "case",
        format!("connect {unit}"),
        format!("handshake {unit}"),
        format!("request {unit}")
    );
    let mut memory = vec![];
    for (bin, line) in plain.iter().map(|l| ("plain-probe", l)).chain(tls.iter().map(|l| ("tls-probe", l))) {
        let Some(fields) = line.split_once("MEASURE ").map(|(_, rest)| measure_fields(rest)) else {
            continue;
        };
        if let Some(case) = fields.get("case") {
            let ms = |key: &str| {
                fields
                    .get(key)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map_or("?".into(), |us| format!("{:.1}", us / 1000.0))
            };
            println!(
                "{case:<26} {:>16} {:>16} {:>16}",
                ms("connect_us"),
                ms("handshake_us"),
                ms("request_us")
            );
        } else {
            let text: Vec<String> =
                fields.iter().filter(|(k, _)| **k != "memory").map(|(k, v)| format!("{k}={v}")).collect();
            memory.push(format!("{bin}: {}", text.join(" ")));
        }
    }
    for line in memory {
        println!("{line}");
    }
}

/// `key=value` words of a `MEASURE` line; a word without `=` maps to itself.
fn measure_fields(rest: &str) -> BTreeMap<&str, &str> {
    rest.split_whitespace().map(|word| word.split_once('=').unwrap_or((word, word))).collect()
}

fn size_of(llvm_size: &Path, elf: &Path) -> Result<(u64, u64, u64)> {
    let out = Command::new(llvm_size)
        .arg(elf)
        .output()
        .with_context(|| format!("running {}", llvm_size.display()))?;
    if !out.status.success() {
        bail!("llvm-size {} failed: {}", elf.display(), String::from_utf8_lossy(&out.stderr));
    }
    parse_berkeley(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("reading llvm-size output for {}", elf.display()))
}

/// Flash of code and read-only symbols per crate, for both binaries, largest TLS-side first.
fn crate_shares(llvm_nm: &Path, plain: &Path, tls: &Path) -> Result<()> {
    let plain = crate_flash(llvm_nm, plain)?;
    let tls = crate_flash(llvm_nm, tls)?;
    let mut rows: Vec<(&String, &u64)> = tls.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    println!("{:<24} {:>10} {:>10}", "crate", "tls-probe", "plain");
    for (name, size) in rows.into_iter().take(14) {
        println!("{name:<24} {size:>10} {:>10}", plain.get(name).copied().unwrap_or(0));
    }
    Ok(())
}

fn crate_flash(llvm_nm: &Path, elf: &Path) -> Result<BTreeMap<String, u64>> {
    let out = Command::new(llvm_nm)
        .args(["--print-size", "--size-sort", "--demangle"])
        .arg(elf)
        .output()
        .with_context(|| format!("running {}", llvm_nm.display()))?;
    if !out.status.success() {
        bail!("llvm-nm {} failed: {}", elf.display(), String::from_utf8_lossy(&out.stderr));
    }
    let mut sizes = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut fields = line.splitn(4, ' ');
        let (Some(_), Some(size), Some(kind), Some(name)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(kind, "t" | "T" | "r" | "R") {
            continue;
        }
        let Ok(size) = u64::from_str_radix(size, 16) else { continue };
        *sizes.entry(crate_of(name)).or_insert(0) += size;
    }
    Ok(sizes)
}

/// The crate a demangled symbol belongs to: the first path segment, past any `<` of a trait
/// impl (llvm-nm leaves some impl symbols half-mangled: `_$LT$crate..Type…`); symbols
/// without a path count as `(other)`.
fn crate_of(symbol: &str) -> String {
    let (name, separator) = match symbol.strip_prefix("_$LT$") {
        Some(rest) => (rest, ".."),
        None => (symbol.trim_start_matches('<').trim_start_matches('&').trim_start_matches("mut "), "::"),
    };
    match name.split_once(separator) {
        Some((first, _)) if !first.is_empty() && first.chars().all(|c| c.is_alphanumeric() || c == '_') => {
            first.to_owned()
        }
        _ => "(other)".into(),
    }
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier;

    use super::*;

    fn conn(handshake: Option<Result<&str, &str>>, key: Option<&str>) -> Conn {
        Conn {
            handshake: handshake.map(|h| h.map(str::to_owned).map_err(str::to_owned)),
            request: key.map(|k| Served { key: k.into(), problems: vec![] }),
        }
    }

    const OK: Option<Result<&str, &str>> = Some(Ok("TLSv1_3 TLS13_AES_128_GCM_SHA256"));
    const BROKEN: Option<Result<&str, &str>> = Some(Err("unexpected end of file"));

    fn a_clean_run() -> Vec<(&'static str, Vec<Conn>)> {
        vec![
            ("good", vec![conn(OK, Some("0a386001000000000000000000000000"))]),
            ("rogue", vec![conn(BROKEN, None)]),
            ("wrongname", vec![conn(BROKEN, None)]),
            ("small", vec![conn(OK, Some("0a386001000000000000000000000003"))]),
            (
                "big",
                vec![
                    conn(OK, Some("0a386001000000000000000000000004")),
                    conn(OK, Some("0a386001000000000000000000000005")),
                ],
            ),
        ]
    }

    #[test]
    fn a_clean_run_passes() {
        assert!(check_tls(&a_clean_run()).is_ok());
    }

    #[test]
    fn a_rogue_server_that_got_a_request_fails() {
        let mut run = a_clean_run();
        run[1].1 = vec![conn(OK, Some("0a3860010000000000000000000000ff"))];
        let err = check_tls(&run).unwrap_err().to_string();
        assert!(err.contains("rogue"), "{err}");
    }

    #[test]
    fn another_version_a_repeated_key_or_a_bad_request_fails() {
        let mut run = a_clean_run();
        run[0].1[0].handshake = Some(Ok("TLSv1_2 TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()));
        assert!(check_tls(&run).is_err());
        let mut run = a_clean_run();
        run[3].1[0].request =
            Some(Served { key: "0a386001000000000000000000000000".into(), problems: vec![] });
        assert!(check_tls(&run).is_err());
        let mut run = a_clean_run();
        run[4].1[0].request.as_mut().unwrap().problems.push("host: None".into());
        assert!(check_tls(&run).is_err());
    }

    #[test]
    fn reads_measure_lines() {
        let fields = measure_fields("case=good connect_us=1200 handshake_us=95000 request_us=3000");
        assert_eq!(fields.get("case"), Some(&"good"));
        assert_eq!(fields.get("handshake_us"), Some(&"95000"));
        assert_eq!(measure_fields("memory stack_peak=9000").get("stack_peak"), Some(&"9000"));
    }

    #[test]
    fn names_the_crate_of_a_symbol() {
        assert_eq!(crate_of("p256::arithmetic::field::FieldElement::mul"), "p256");
        assert_eq!(crate_of("<embedded_tls::asynch::TlsConnection<S,C> as Read>::read"), "embedded_tls");
        assert_eq!(
            crate_of("_$LT$ecdsa..verifying..VerifyingKey$LT$C$GT$$u20$as$u20$X$GT$::verify::h63b8"),
            "ecdsa"
        );
        assert_eq!(crate_of("main"), "(other)");
    }

    /// A leaf of the run's chain verifies up to its root with a real verifier, and the rogue
    /// and wrong-name leaves do not: what the firmware must also conclude.
    #[test]
    fn the_test_chain_has_the_shape_the_cases_need() {
        let chain = TestChain::new().unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(chain.root.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let verify = |(certs, _): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)| {
            verifier.verify_server_cert(&certs[0], &certs[1..], &name, &[], now).is_ok()
        };
        assert!(verify(
            TestChain::leaf(SERVER_NAME, &chain.intermediate, Some(&chain.intermediate)).unwrap()
        ));
        assert!(!verify(TestChain::leaf(SERVER_NAME, &chain.rogue, None).unwrap()));
        assert!(!verify(
            TestChain::leaf(OTHER_NAME, &chain.intermediate, Some(&chain.intermediate)).unwrap()
        ));
    }
}
