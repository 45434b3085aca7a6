//! The gateway's load bench (`cargo xtask bench` runs it): the test cloud in this process on
//! 127.0.0.1, the `wary-gateway` binary and nginx (proxying the same requests, no retries)
//! as separate processes in front of it, and a bounded load generator posting what a device
//! posts. Every phase is bounded in count and in time, and everything stays on 127.0.0.1.
//!
//! Phases: the cloud directly (the latency baseline), nginx, then the gateway, each at 0% and at
//! 30% upstream 503s; then 10,000 readings held in flight in the gateway (a slow upstream) to
//! read its memory. Then, with TLS: the gateway (TLS and a credential per device) beside nginx
//! terminating TLS, five runs each, alternating, their medians under `tls`. Writes one JSON
//! object to `--out`.
//!
//! Usage: `gateway_load --gateway-bin PATH --nginx PATH --out FILE [--count N] [--concurrency C]
//! [--seconds S] [--in-flight N]`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use wary_cloud::{Cloud, Faults};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Args {
    gateway_bin: PathBuf,
    nginx: PathBuf,
    out: PathBuf,
    count: u64,
    concurrency: usize,
    seconds: u64,
    in_flight: u64,
}

fn args() -> Result<Args> {
    let mut a = Args {
        gateway_bin: PathBuf::new(),
        nginx: PathBuf::from("/usr/sbin/nginx"),
        out: PathBuf::from("target/bench/gateway.json"),
        count: 20_000,
        concurrency: 64,
        seconds: 15,
        in_flight: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--gateway-bin" => a.gateway_bin = v.into(),
            "--nginx" => a.nginx = v.into(),
            "--out" => a.out = v.into(),
            "--count" => a.count = v.parse()?,
            "--concurrency" => a.concurrency = v.parse()?,
            "--seconds" => a.seconds = v.parse()?,
            "--in-flight" => a.in_flight = v.parse()?,
            _ => bail!("unknown flag {flag}"),
        }
    }
    if a.gateway_bin.as_os_str().is_empty() {
        bail!("--gateway-bin is required");
    }
    // Bounded whatever the caller asks.
    a.count = a.count.clamp(1, 200_000);
    a.concurrency = a.concurrency.clamp(1, 1024);
    a.seconds = a.seconds.clamp(1, 60);
    a.in_flight = a.in_flight.clamp(1, 12_000);
    Ok(a)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn wait_listening(port: u16) -> Result<()> {
    let t0 = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("nothing listening on 127.0.0.1:{port}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The process and its children (nginx's workers), for summed memory.
fn family(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the comm may hold spaces, so split after its `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(pid) {
                out.push(child);
            }
        }
    }
    out
}

/// User plus system CPU of the processes, in clock ticks (`/proc/<pid>/stat` fields 14 and 15;
/// 100 per second on Linux).
fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            // After the comm: state is field 3, utime 14, stime 15.
            let f: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            n(11) + n(12)
        })
        .sum()
}

fn kib(pids: &[u32], field: &str) -> u64 {
    pids.iter().map(|p| status_kib(*p, field)).sum()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nginx_conf(dir: &Path, listen: u16, upstream_port: u16) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nworker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log error;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 upstream cloud {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}\n\
         \x20 server {{\n    listen 127.0.0.1:{listen} backlog=4096;\n    keepalive_requests 1000000;\n\
         \x20   location / {{\n      proxy_pass http://cloud;\n      proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n      proxy_next_upstream off;\n    }}\n  }}\n}}\n"
    )
}

/// nginx terminating TLS with the gateway's certificate and proxying to the cloud: the same
/// load, the same crypto (TLS 1.3), no authentication (nginx has no SHA-256 token table).
fn nginx_tls_conf(dir: &Path, listen: u16, upstream_port: u16, cert: &Path, key: &Path) -> String {
    let (d, c, k) = (dir.display(), cert.display(), key.display());
    format!(
        "daemon off;\nworker_processes 2;\npid {d}/nginx-tls.pid;\nerror_log {d}/error-tls.log error;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 upstream cloud {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}\n\
         \x20 server {{\n    listen 127.0.0.1:{listen} ssl backlog=4096;\n    keepalive_requests 1000000;\n\
         \x20   ssl_certificate {c};\n    ssl_certificate_key {k};\n    ssl_protocols TLSv1.3;\n\
         \x20   location / {{\n      proxy_pass http://cloud;\n      proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n      proxy_next_upstream off;\n    }}\n  }}\n}}\n"
    )
}

/// One HTTP/1.1 connection over TLS to 127.0.0.1:`port`, trusting only `ca`.
async fn tls_connect(
    port: u16,
    tls: &Arc<rustls::ClientConfig>,
) -> Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await.ok()?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    Some(sender)
}

/// A device's request: its token and a key by the device layout (device, boot, sequence).
fn device_request(device: u64, token: &str, boot: u32, seq: u32) -> Request<Full<Bytes>> {
    Request::post("/readings")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", format!("{device:016x}{boot:08x}{seq:08x}"))
        .body(Full::new(Bytes::from(format!("{{\"seq\":{seq},\"mC\":21500}}"))))
        .unwrap()
}

/// `count` posts over TLS to `port`, one connection per device (`devices[i]` drives task i),
/// until `limit` passes; `boot` keeps each run's keys apart.
async fn drive_tls(
    port: u16,
    tls: &Arc<rustls::ClientConfig>,
    devices: &[(u64, String)],
    boot: u32,
    count: u64,
    limit: Duration,
) -> Phase {
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (device, token) in devices.iter().cloned() {
        let (next, tls) = (next.clone(), tls.clone());
        tasks.spawn(async move {
            let mut p = Phase::default();
            let mut conn = None;
            let mut seq = 0u32;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || t0.elapsed() > limit {
                    break;
                }
                if conn.is_none() {
                    conn = tls_connect(port, &tls).await;
                }
                let Some(sender) = conn.as_mut() else {
                    p.broken += 1;
                    continue;
                };
                let sent = Instant::now();
                let req = device_request(device, &token, boot, seq);
                seq += 1;
                let exchange = async {
                    let resp = sender.send_request(req).await.ok()?;
                    let status = resp.status();
                    resp.into_body().collect().await.ok()?;
                    Some(status)
                };
                match tokio::time::timeout(Duration::from_secs(10), exchange).await {
                    Ok(Some(status)) => {
                        p.answered += 1;
                        p.landed += u64::from(status.is_success());
                        *p.by_status.entry(status.as_u16()).or_default() += 1;
                        p.micros.push(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
                    }
                    _ => {
                        p.broken += 1;
                        conn = None;
                    }
                }
            }
            p
        });
    }
    let mut all = Phase::default();
    for p in tasks.join_all().await {
        all.answered += p.answered;
        all.landed += p.landed;
        all.broken += p.broken;
        for (k, v) in p.by_status {
            *all.by_status.entry(k).or_default() += v;
        }
        all.micros.extend(p.micros);
    }
    all.secs = t0.elapsed().as_secs_f64().max(1e-3);
    all
}

/// Opens `n` TLS connections to `port`, each posting one reading the upstream will not answer
/// for a minute, then reads the resident set of `pids`: held readings, idle and held KiB,
/// and bytes per reading.
async fn hold_tls(
    port: u16,
    tls: &Arc<rustls::ClientConfig>,
    devices: &[(u64, String)],
    pids: &[u32],
    n: u64,
) -> Value {
    let idle = kib(pids, "VmRSS");
    let opened = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (tls, opened) = (tls.clone(), opened.clone());
        let (device, token) = devices[i as usize % devices.len()].clone();
        set.spawn(async move {
            let Some(mut sender) = tls_connect(port, &tls).await else { return };
            let req = device_request(device, &token, 7, i as u32);
            let sent = sender.send_request(req);
            opened.fetch_add(1, Ordering::Relaxed);
            let _ = tokio::time::timeout(Duration::from_secs(90), sent).await;
        });
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let t0 = Instant::now();
    while opened.load(Ordering::Relaxed) < n && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settle: the last requests are read and waiting upstream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held_kib = kib(pids, "VmRSS");
    let held = opened.load(Ordering::Relaxed);
    set.abort_all();
    let per = (held_kib.saturating_sub(idle) * 1024).checked_div(held).unwrap_or(0);
    eprintln!("  tls in flight on {port}: {held} held, RSS {held_kib} KiB (idle {idle} KiB), {per} B each");
    json!({"held": held, "rss_idle_kib": idle, "rss_held_kib": held_kib, "bytes_per_reading": per})
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The TLS section: the gateway with TLS and device credentials beside nginx terminating TLS,
/// five runs each, alternating; the medians of answers per second and CPU per answer.
async fn tls_section(a: &Args, cloud: &Cloud, dir: &Path, policy_file: &Path) -> Result<Value> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &ca)?;
    let (cert_file, key_file) = (dir.join("gw.crt"), dir.join("gw.key"));
    std::fs::write(&cert_file, leaf.pem())?;
    std::fs::write(&key_file, key.serialize_pem())?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    // One device per connection, each with its own credential.
    let devices: Vec<(u64, String, String)> = (0..a.concurrency as u64)
        .map(|n| {
            let id = 0x00be_0000_0000_0000 | n;
            let (token, line) = wary_gateway::Credentials::issue(id);
            (id, token, line)
        })
        .collect();
    let creds = dir.join("credentials");
    std::fs::write(&creds, devices.iter().map(|d| d.2.as_str()).collect::<Vec<_>>().join("\n"))?;
    let devices: Vec<(u64, String)> = devices.into_iter().map(|(i, t, _)| (i, t)).collect();

    let (gw_port, metrics_port, nginx_port) = (free_port(), free_port(), free_port());
    let gateway = Killed(
        Command::new(&a.gateway_bin)
            .args([
                "--listen",
                &format!("127.0.0.1:{gw_port}"),
                "--upstream",
                &format!("http://{}", cloud.addr()),
            ])
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .arg("--policy")
            .arg(policy_file)
            .args(["--queue", &(a.in_flight + 1024).to_string(), "--workers", "256", "--threads", "2"])
            .arg("--credentials")
            .arg(&creds)
            .arg("--tls-cert")
            .arg(&cert_file)
            .arg("--tls-key")
            .arg(&key_file)
            // The bench's devices send as fast as they are answered: no per-device rate here.
            .args(["--rate", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", a.gateway_bin.display()))?,
    );
    let conf = dir.join("nginx-tls.conf");
    std::fs::write(&conf, nginx_tls_conf(dir, nginx_port, cloud.addr().port(), &cert_file, &key_file))?;
    let nginx = Killed(
        Command::new(&a.nginx)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", a.nginx.display()))?,
    );
    wait_listening(gw_port).await?;
    wait_listening(nginx_port).await?;
    cloud.set_faults(Faults::none())?;
    let limit = Duration::from_secs(a.seconds);
    let mut runs = serde_json::Map::new();
    let (mut rate, mut cpu) = (
        std::collections::BTreeMap::<&str, Vec<f64>>::new(),
        std::collections::BTreeMap::<&str, Vec<f64>>::new(),
    );
    let nginx_pids = family(nginx.0.id());
    let gw_pids = [gateway.0.id()];
    for run in 0..5u32 {
        for (name, port, pids) in [("nginx", nginx_port, &nginx_pids[..]), ("gateway", gw_port, &gw_pids[..])]
        {
            // Boot numbers keep every run's keys new: 2 per run (warm-up, measured).
            let _ = drive_tls(port, &tls, &devices, 1000 + run * 2, 300, limit).await;
            let cpu_before = cpu_ticks(pids);
            let p = drive_tls(port, &tls, &devices, 1001 + run * 2, a.count, limit).await;
            let ticks = cpu_ticks(pids).saturating_sub(cpu_before);
            let mut j = p.json();
            let per = ticks as f64 * 10_000.0 / (p.answered.max(1) as f64);
            j["proxy_cpu_us_per_answer"] = json!(per.round());
            eprintln!("  tls run {run} {name:<8} {j}");
            rate.entry(name).or_default().push(j["answers_per_s"].as_f64().unwrap_or(0.0));
            cpu.entry(name).or_default().push(per);
            runs.insert(format!("{run}-{name}"), j);
        }
    }
    let gw_peak_kib = kib(&gw_pids, "VmHWM");
    let nginx_peak_kib = kib(&family(nginx.0.id()), "VmHWM");
    drop(gateway);
    drop(nginx);

    // Memory with readings held over TLS: the upstream answers nothing for a minute. The
    // gateway holds `in_flight`; nginx opens a connection to the cloud (in this process) for
    // each one it holds, so it is measured at fewer, within this process's descriptors.
    cloud.set_faults("slow=1.0:ms=60000".parse().map_err(anyhow::Error::msg)?)?;
    let hold_policy = json!({"base": 5, "cap": 50, "budget": 120000, "deadline": 120000, "min_attempt": 50});
    let hold_policy_file = dir.join("hold-tls-policy.json");
    std::fs::write(&hold_policy_file, hold_policy.to_string())?;
    let (hold_port, _) = (free_port(), free_port());
    let holder = Killed(
        Command::new(&a.gateway_bin)
            .args([
                "--listen",
                &format!("127.0.0.1:{hold_port}"),
                "--upstream",
                &format!("http://{}", cloud.addr()),
            ])
            .arg("--no-metrics")
            .arg("--policy")
            .arg(&hold_policy_file)
            .args(["--queue", &(a.in_flight + 1024).to_string(), "--workers", "256", "--threads", "2"])
            .arg("--credentials")
            .arg(&creds)
            .arg("--tls-cert")
            .arg(&cert_file)
            .arg("--tls-key")
            .arg(&key_file)
            .args(["--rate", "0", "--attempt-timeout-ms", "120000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", a.gateway_bin.display()))?,
    );
    wait_listening(hold_port).await?;
    let gw_hold = hold_tls(hold_port, &tls, &devices, &[holder.0.id()], a.in_flight).await;
    drop(holder);
    let nginx_port = free_port();
    std::fs::write(&conf, nginx_tls_conf(dir, nginx_port, cloud.addr().port(), &cert_file, &key_file))?;
    let nginx = Killed(
        Command::new(&a.nginx)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", a.nginx.display()))?,
    );
    wait_listening(nginx_port).await?;
    let nginx_hold =
        hold_tls(nginx_port, &tls, &devices, &family(nginx.0.id()), a.in_flight.min(4_000)).await;
    drop(nginx);
    let m = |t: &std::collections::BTreeMap<&str, Vec<f64>>, n: &str| {
        median(t.get(n).cloned().unwrap_or_default())
    };
    let ratio = |x: f64, y: f64| if y > 0.0 { (x / y * 1000.0).round() / 1000.0 } else { 0.0 };
    Ok(json!({
        "setup": "TLS 1.3 both; the gateway with a credential per device (one device per connection), --rate 0; nginx without authentication; 5 runs each, alternating, medians",
        "answers_per_s_median": {"gateway": m(&rate, "gateway").round(), "nginx": m(&rate, "nginx").round()},
        "cpu_us_per_answer_median": {"gateway": m(&cpu, "gateway").round(), "nginx": m(&cpu, "nginx").round()},
        "throughput_ratio_to_nginx": ratio(m(&rate, "gateway"), m(&rate, "nginx")),
        "cpu_ratio_to_nginx": ratio(m(&cpu, "gateway"), m(&cpu, "nginx")),
        "gateway_peak_rss_kib": gw_peak_kib,
        "nginx_peak_rss_kib": nginx_peak_kib,
        "memory_per_reading_ratio_to_nginx_per_connection": ratio(
            gw_hold["bytes_per_reading"].as_f64().unwrap_or(0.0),
            nginx_hold["bytes_per_reading"].as_f64().unwrap_or(0.0)
        ),
        "in_flight": {"gateway": gw_hold, "nginx": nginx_hold},
        "runs": runs,
    }))
}

#[derive(Default)]
struct Phase {
    answered: u64,
    landed: u64,
    broken: u64,
    by_status: std::collections::BTreeMap<u16, u64>,
    micros: Vec<u64>,
    secs: f64,
}

fn pct(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1).min(sorted.len() - 1);
    sorted[i]
}

impl Phase {
    fn json(&self) -> Value {
        let mut s = self.micros.clone();
        s.sort_unstable();
        json!({
            "requests": self.answered + self.broken,
            "answered": self.answered,
            "landed": self.landed,
            "broken": self.broken,
            "seconds": (self.secs * 1000.0).round() / 1000.0,
            "answers_per_s": (self.answered as f64 / self.secs).round(),
            "landed_per_s": (self.landed as f64 / self.secs).round(),
            "p50_us": pct(&s, 50),
            "p99_us": pct(&s, 99),
            "by_status": self.by_status.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

/// `count` posts to `base` from `concurrency` tasks, or until `limit` passes.
async fn drive(
    client: &HttpClient,
    base: &str,
    tag: &str,
    count: u64,
    concurrency: usize,
    limit: Duration,
) -> Phase {
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next, url, tag) =
            (client.clone(), next.clone(), format!("{base}/readings"), tag.to_owned());
        tasks.spawn(async move {
            let mut p = Phase::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || t0.elapsed() > limit {
                    break;
                }
                let req = Request::post(&url)
                    .header("content-type", "application/json")
                    .header("idempotency-key", format!("{tag}-{i}"))
                    .body(Full::new(Bytes::from(format!("{{\"seq\":{i},\"mC\":21500}}"))))
                    .unwrap();
                let sent = Instant::now();
                let exchange = async {
                    let resp = client.request(req).await.ok()?;
                    let status = resp.status();
                    resp.into_body().collect().await.ok()?;
                    Some(status)
                };
                match tokio::time::timeout(Duration::from_secs(10), exchange).await {
                    Ok(Some(status)) => {
                        p.answered += 1;
                        p.landed += u64::from(status.is_success());
                        *p.by_status.entry(status.as_u16()).or_default() += 1;
                        p.micros.push(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
                    }
                    _ => p.broken += 1,
                }
            }
            p
        });
    }
    let mut all = Phase::default();
    for p in tasks.join_all().await {
        all.answered += p.answered;
        all.landed += p.landed;
        all.broken += p.broken;
        for (k, v) in p.by_status {
            *all.by_status.entry(k).or_default() += v;
        }
        all.micros.extend(p.micros);
    }
    all.secs = t0.elapsed().as_secs_f64().max(1e-3);
    all
}

/// `wary_gateway_queue_depth` from the gateway's metrics endpoint.
async fn queue_depth(client: &HttpClient, metrics_port: u16) -> Option<u64> {
    let req = Request::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .body(Full::new(Bytes::new()))
        .ok()?;
    let resp = client.request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    text.lines().find_map(|l| l.strip_prefix("wary_gateway_queue_depth ")?.trim().parse().ok())
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let limit = Duration::from_secs(a.seconds);
    let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await?;
    let cloud_port = cloud.addr().port();
    let cloud_base = format!("http://127.0.0.1:{cloud_port}");
    let dir = std::env::temp_dir().join(format!("wary-gateway-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    // The gateway as deployed, with a policy for loopback latencies: 5 ms first backoff, 50 ms
    // ceiling; its fleet budget returns half a token per success, so retries can absorb a 30%
    // storm (the default tenth would throttle most of them: fewer landings, fewer requests).
    let policy = json!({"base": 5, "cap": 50, "budget": 2000, "deadline": 5000, "min_attempt": 50,
        "fleet": {"tokens": 100, "ratio_milli": 500}});
    let policy_file = dir.join("policy.json");
    std::fs::write(&policy_file, policy.to_string())?;
    let (gw_port, metrics_port) = (free_port(), free_port());
    let gw_queue = a.in_flight + 1024;
    let gateway = Killed(
        Command::new(&a.gateway_bin)
            .args(["--listen", &format!("127.0.0.1:{gw_port}"), "--upstream", &cloud_base])
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .arg("--policy")
            .arg(&policy_file)
            .args(["--queue", &gw_queue.to_string(), "--workers", "256", "--threads", "2"])
            .args(["--insecure-no-auth", "--insecure-plain-http", "--rate", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", a.gateway_bin.display()))?,
    );
    let nginx_port = free_port();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&dir, nginx_port, cloud_port))?;
    let nginx = Killed(
        Command::new(&a.nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", a.nginx.display()))?,
    );
    wait_listening(gw_port).await?;
    wait_listening(nginx_port).await?;
    let gw_base = format!("http://127.0.0.1:{gw_port}");
    let nginx_base = format!("http://127.0.0.1:{nginx_port}");
    let client: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build_http();

    let mut results = serde_json::Map::new();
    for (storm, faults) in [("0pct", None), ("30pct", Some("503=0.3,seed=5"))] {
        cloud.set_faults(match faults {
            Some(f) => f.parse().map_err(anyhow::Error::msg)?,
            None => Faults::none(),
        })?;
        let mut row = serde_json::Map::new();
        let nginx_pids = family(nginx.0.id());
        let gw_pids = [gateway.0.id()];
        for (name, base, pids) in [
            ("direct", &cloud_base, &[][..]),
            ("nginx", &nginx_base, &nginx_pids[..]),
            ("gateway", &gw_base, &gw_pids[..]),
        ] {
            // A short warm-up (connections, allocator), then the measured run.
            let _ = drive(&client, base, &format!("w-{storm}-{name}"), 500, a.concurrency, limit).await;
            let before = cloud.stats().requests;
            let cpu_before = cpu_ticks(pids);
            let p = drive(&client, base, &format!("{storm}-{name}"), a.count, a.concurrency, limit).await;
            let cpu = cpu_ticks(pids).saturating_sub(cpu_before);
            let mut j = p.json();
            j["upstream_requests"] = json!(cloud.stats().requests - before);
            if !pids.is_empty() {
                // The proxy's own CPU per answer: steadier than wall-clock rates on a shared
                // machine (ticks of 10 ms, so about 1% over a phase of a few seconds).
                let per = cpu as f64 * 10_000.0 / (p.answered.max(1) as f64);
                j["proxy_cpu_us_per_answer"] = json!(per.round());
            }
            eprintln!("  {storm:>5} {name:<8} {j}");
            row.insert(name.to_owned(), j);
        }
        results.insert(storm.to_owned(), Value::Object(row));
    }
    let gw_family = vec![gateway.0.id()];
    let nginx_family = family(nginx.0.id());
    let gw_peak_kib = kib(&gw_family, "VmHWM");
    let nginx_peak_kib = kib(&nginx_family, "VmHWM");

    drop(gateway);
    drop(nginx);

    let tls = tls_section(&a, &cloud, &dir, &policy_file).await?;

    // Memory with `in_flight` readings held: a fresh gateway whose upstream answers nothing for
    // a minute (and whose policy waits that long), so 256 readings wait on the upstream and the
    // rest in the queue, none answered while the memory is read.
    cloud.set_faults("slow=1.0:ms=60000".parse().map_err(anyhow::Error::msg)?)?;
    let hold_policy = json!({"base": 5, "cap": 50, "budget": 120000, "deadline": 120000, "min_attempt": 50});
    let hold_policy_file = dir.join("hold-policy.json");
    std::fs::write(&hold_policy_file, hold_policy.to_string())?;
    let (hold_port, metrics_port) = (free_port(), free_port());
    let holder = Killed(
        Command::new(&a.gateway_bin)
            .args(["--listen", &format!("127.0.0.1:{hold_port}"), "--upstream", &cloud_base])
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .arg("--policy")
            .arg(&hold_policy_file)
            .args(["--queue", &gw_queue.to_string(), "--workers", "256", "--threads", "2"])
            .args(["--insecure-no-auth", "--insecure-plain-http", "--rate", "0"])
            .args(["--attempt-timeout-ms", "120000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", a.gateway_bin.display()))?,
    );
    wait_listening(hold_port).await?;
    let hold_family = vec![holder.0.id()];
    let rss_idle_kib = kib(&hold_family, "VmRSS");
    let hold_base = format!("http://127.0.0.1:{hold_port}");
    // Opened in steps of 250 connections, so the listen backlog never overflows.
    let mut hold = tokio::task::JoinSet::new();
    for i in 0..a.in_flight {
        let (client, url) = (client.clone(), format!("{hold_base}/readings"));
        hold.spawn(async move {
            let req = Request::post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("inflight-{i}"))
                .body(Full::new(Bytes::from(format!("{{\"seq\":{i},\"mC\":21500}}"))))
                .unwrap();
            let _ = tokio::time::timeout(Duration::from_secs(90), client.request(req)).await;
        });
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let t0 = Instant::now();
    let mut held = 0;
    while t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held = queue_depth(&client, metrics_port).await.unwrap_or(0) + 256;
        if held >= a.in_flight {
            break;
        }
    }
    // Settle: the last connections' buffers are in place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_inflight_kib = kib(&hold_family, "VmRSS");
    let hwm_inflight_kib = kib(&hold_family, "VmHWM");
    eprintln!("  in flight: {held} held, RSS {rss_inflight_kib} KiB (idle {rss_idle_kib} KiB)");
    hold.abort_all();
    drop(holder);

    let g = |s: &str, n: &str, f: &str| results[s][n][f].as_f64().unwrap_or(0.0);
    let ratio = |x: f64, y: f64| if y > 0.0 { (x / y * 1000.0).round() / 1000.0 } else { 0.0 };
    let summary = json!({
        "throughput_ratio_to_nginx_0pct": ratio(g("0pct", "gateway", "answers_per_s"), g("0pct", "nginx", "answers_per_s")),
        "throughput_ratio_to_nginx_30pct": ratio(g("30pct", "gateway", "answers_per_s"), g("30pct", "nginx", "answers_per_s")),
        "landed_ratio_to_nginx_30pct": ratio(g("30pct", "gateway", "landed_per_s"), g("30pct", "nginx", "landed_per_s")),
        "added_p50_us_gateway_0pct": g("0pct", "gateway", "p50_us") - g("0pct", "direct", "p50_us"),
        "added_p99_us_gateway_0pct": g("0pct", "gateway", "p99_us") - g("0pct", "direct", "p99_us"),
        "added_p50_us_nginx_0pct": g("0pct", "nginx", "p50_us") - g("0pct", "direct", "p50_us"),
        "added_p99_us_nginx_0pct": g("0pct", "nginx", "p99_us") - g("0pct", "direct", "p99_us"),
        "added_p50_us_gateway_30pct": g("30pct", "gateway", "p50_us") - g("30pct", "direct", "p50_us"),
        "added_p99_us_gateway_30pct": g("30pct", "gateway", "p99_us") - g("30pct", "direct", "p99_us"),
        "added_p50_us_nginx_30pct": g("30pct", "nginx", "p50_us") - g("30pct", "direct", "p50_us"),
        "added_p99_us_nginx_30pct": g("30pct", "nginx", "p99_us") - g("30pct", "direct", "p99_us"),
        "cpu_ratio_to_nginx_0pct": ratio(g("0pct", "gateway", "proxy_cpu_us_per_answer"), g("0pct", "nginx", "proxy_cpu_us_per_answer")),
        "cpu_ratio_to_nginx_30pct": ratio(g("30pct", "gateway", "proxy_cpu_us_per_answer"), g("30pct", "nginx", "proxy_cpu_us_per_answer")),
        "gateway_peak_rss_kib": gw_peak_kib,
        "nginx_peak_rss_kib": nginx_peak_kib,
        "gateway_rss_ratio_to_nginx": ratio(gw_peak_kib as f64, nginx_peak_kib as f64),
        "in_flight": held,
        "gateway_rss_in_flight_kib": rss_inflight_kib,
        "gateway_peak_rss_in_flight_kib": hwm_inflight_kib,
        "gateway_rss_idle_kib": rss_idle_kib,
        "gateway_rss_per_reading_in_flight_bytes": (rss_inflight_kib.saturating_sub(rss_idle_kib) * 1024).checked_div(held).unwrap_or(0),
    });
    let out = json!({
        "setup": {
            "concurrency": a.concurrency, "count_per_phase": a.count, "seconds_limit_per_phase": a.seconds,
            "cloud": "wary-cloud in the load generator's process, 127.0.0.1",
            "gateway": {"workers": 256, "threads": 2, "queue": gw_queue, "policy": policy},
            "nginx": "2 workers, keepalive 256 to the cloud, proxy_next_upstream off (no retries)",
            "latency": "added = proxy's percentile minus the direct-to-cloud percentile under the same faults",
        },
        "phases": results,
        "summary": summary,
        "tls": tls,
    });
    if let Some(d) = a.out.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&out)?)?;
    println!("{}", serde_json::to_string_pretty(&out["summary"])?);
    let _ = std::fs::remove_dir_all(&dir);
    // The cloud's slow handlers are still asleep: do not wait for them.
    drop(cloud);
    Ok(())
}
