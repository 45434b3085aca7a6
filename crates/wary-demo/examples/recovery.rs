//! A fleet's recovery after an outage on real processes (`cargo xtask bench --only recovery` runs
//! it): the test cloud in this process on 127.0.0.1 with a capacity (`capacity=C`: at most `C`
//! requests a second, 503 at once above it) and a scheduled total outage at the start, the
//! `wary-gateway` binary in front of it as a separate process, and `M` sensors (tokio tasks) each
//! holding a backlog of `B` readings, posting `POST /readings` with an `Idempotency-Key` to the
//! gateway as the demo's sensors do, one reading at a time, and waiting out the gateway's
//! Retry-After on a 503 before sending the same reading again.
//!
//! Three runs: the gateway with its upstream pace and breaker (its default settings), the same
//! with the pace tuned for a known capacity, and the gateway with neither
//! (`--no-upstream-pacing`). For each: the cloud's arrivals and accepted requests in each second
//! (the cloud counts them), the peak arrival rate over the capacity after the outage, the time
//! from the outage's end to the last reading delivered over the ideal (backlog ÷ capacity), the
//! requests at the cloud per delivered reading, and every reading checked once at the cloud
//! (duplicates: keys applied twice; lost: keys never applied). Writes one JSON object to `--out`
//! and the arrivals per second against the capacity line, both modes, as SVG to `--svg`.
//!
//! Usage: `recovery --gateway-bin PATH --out FILE --svg FILE [--capacity C] [--sensors M]
//! [--backlog B] [--outage-ms O] [--limit-s S] [--capacity-retry-after spread|SECONDS]` (the
//! last gives the capacity's 503s a Retry-After: `spread` draws it to spread the excess over the
//! seconds it needs).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use wary::Key;
use wary_cloud::{Cloud, Faults, LoadBin};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Args {
    gateway_bin: PathBuf,
    out: PathBuf,
    svg: PathBuf,
    capacity: u64,
    sensors: u32,
    backlog: u32,
    outage_ms: u64,
    limit_s: u64,
    /// The Retry-After of the capacity's 503s (`spread`, or a fixed spec), none by default.
    capacity_ra: Option<String>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        gateway_bin: PathBuf::new(),
        out: PathBuf::from("target/bench/recovery.json"),
        svg: PathBuf::from("target/bench/recovery.svg"),
        capacity: 200,
        sensors: 600,
        backlog: 2,
        outage_ms: 5_000,
        limit_s: 17,
        capacity_ra: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--gateway-bin" => a.gateway_bin = v.into(),
            "--out" => a.out = v.into(),
            "--svg" => a.svg = v.into(),
            "--capacity" => a.capacity = v.parse()?,
            "--sensors" => a.sensors = v.parse()?,
            "--backlog" => a.backlog = v.parse()?,
            "--outage-ms" => a.outage_ms = v.parse()?,
            "--limit-s" => a.limit_s = v.parse()?,
            "--capacity-retry-after" => a.capacity_ra = Some(v),
            _ => bail!("unknown flag {flag}"),
        }
    }
    if a.gateway_bin.as_os_str().is_empty() {
        bail!("--gateway-bin is required");
    }
    // Bounded whatever the caller asks.
    a.capacity = a.capacity.clamp(1, 10_000);
    a.sensors = a.sensors.clamp(1, 5_000);
    a.backlog = a.backlog.clamp(1, 1_000);
    a.outage_ms = a.outage_ms.clamp(1, 60_000);
    a.limit_s = a.limit_s.clamp(1, 300);
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

/// The gateway process, stopped (SIGTERM, then SIGKILL after 3 s) when dropped.
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

/// What the sensors saw.
#[derive(Default)]
struct Tally {
    /// Requests to the gateway.
    sent: AtomicU64,
    /// Readings answered 2xx.
    delivered: AtomicU64,
    /// Readings answered with a status that must not be resent (424, 409, other 4xx).
    failed: AtomicU64,
    /// Answers that asked the sensor to wait (503, 429) or no answer at all.
    waits: AtomicU64,
    /// Milliseconds from the start to the last delivery.
    last_ms: AtomicU64,
    /// Deliveries per second since the start.
    per_second: Mutex<Vec<u64>>,
    /// Keys of the readings answered 2xx.
    landed: Mutex<Vec<String>>,
}

/// The gateway's answer as a device reads it.
enum Answer {
    Landed,
    /// Send the same reading again after this.
    Wait(Duration),
    /// Never resent.
    Failed,
}

async fn post(client: &HttpClient, url: &str, key: &str, body: String) -> Answer {
    let Ok(req) = Request::post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body)))
    else {
        return Answer::Failed;
    };
    let exchange = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        resp.into_body().collect().await.ok()?;
        Some((status, retry_after))
    };
    match tokio::time::timeout(Duration::from_secs(30), exchange).await {
        Ok(Some((s, _))) if s.is_success() => Answer::Landed,
        Ok(Some((StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS, ra))) => {
            Answer::Wait(Duration::from_secs(ra.unwrap_or(1).clamp(1, 60)))
        }
        Ok(Some(_)) => Answer::Failed,
        // No answer: the gateway is not there (yet); try again in a second.
        _ => Answer::Wait(Duration::from_secs(1)),
    }
}

fn key(sensor: u32, seq: u32) -> String {
    Key::from_parts(u64::from(sensor) + 1, 1, seq).to_hex().as_str().to_owned()
}

/// One sensor: its backlog in order, each reading sent until it is answered for good.
async fn sensor(client: HttpClient, url: String, id: u32, backlog: u32, start: Instant, tally: Arc<Tally>) {
    for seq in 0..backlog {
        let body = format!("{{\"seq\":{seq},\"mC\":{}}}", i64::from(id) * 1000 + i64::from(seq));
        loop {
            tally.sent.fetch_add(1, Ordering::Relaxed);
            let key = key(id, seq);
            match post(&client, &url, &key, body.clone()).await {
                Answer::Landed => {
                    tally.landed.lock().unwrap_or_else(|e| e.into_inner()).push(key);
                    let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tally.delivered.fetch_add(1, Ordering::Relaxed);
                    tally.last_ms.fetch_max(ms, Ordering::Relaxed);
                    let mut bins = tally.per_second.lock().unwrap_or_else(|e| e.into_inner());
                    let i = usize::try_from(ms / 1000).unwrap_or(usize::MAX).min(3600);
                    if bins.len() <= i {
                        bins.resize(i + 1, 0);
                    }
                    bins[i] += 1;
                    break;
                }
                Answer::Wait(d) => {
                    tally.waits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(d).await;
                }
                Answer::Failed => {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// One run: a fresh cloud and gateway, the sensors from the outage's start until every reading
/// is answered or the limit.
/// How the gateway sends upstream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The gateway's default: the upstream paced and broken with `UPSTREAM_PACE`,
    /// `UPSTREAM_BREAKER`.
    Paced,
    /// The pace with a floor and a regrow for a cloud whose capacity the operator knows
    /// ([`TUNED_POLICY`]).
    Tuned,
    /// `--no-upstream-pacing`: no upstream pace or breaker.
    Unpaced,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Paced => "paced",
            Mode::Tuned => "paced_tuned",
            Mode::Unpaced => "unpaced",
        }
    }
}

/// The gateway's default policy spec (`Config::new`) with a `[pace]` for a cloud known to serve
/// about 200 requests a second: never below a quarter of that, back at the rate it was cut from
/// in 2 s instead of 10.
const TUNED_POLICY: &str = r#"{"budget": 10000, "deadline": 20000, "min_attempt": 100,
  "pace": {"floor_milli": 50000, "regrow_ms": 2000}}"#;

async fn run(a: &Args, mode: Mode) -> Result<Value> {
    let paced = mode != Mode::Unpaced;
    let mode_name = mode.name();
    let mode = mode_name;
    eprintln!("  recovery, gateway {mode}: starting");
    let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await?;
    let port = free_port();
    let mut cmd = Command::new(&a.gateway_bin);
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--upstream", &cloud.url("")])
        .args(["--insecure-no-auth", "--insecure-plain-http", "--no-metrics", "--rate", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !paced {
        cmd.arg("--no-upstream-pacing");
    }
    let policy_file = std::env::temp_dir().join(format!("wary-recovery-policy-{}.json", std::process::id()));
    if mode_name == Mode::Tuned.name() {
        std::fs::write(&policy_file, TUNED_POLICY)
            .with_context(|| format!("writing {}", policy_file.display()))?;
        cmd.arg("--policy").arg(&policy_file);
    }
    let gateway = Killed(cmd.spawn().with_context(|| format!("starting {}", a.gateway_bin.display()))?);
    wait_listening(port).await?;

    // The outage and the capacity's windows count from here, as do the sensors.
    let ra = a.capacity_ra.as_ref().map_or(String::new(), |ra| format!(":ra={ra}"));
    let script = format!("capacity={}{ra},outage=0:ms={},scope=keyed", a.capacity, a.outage_ms);
    cloud.set_faults(script.parse().map_err(anyhow::Error::msg)?)?;
    let start = Instant::now();
    let tally = Arc::new(Tally::default());
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://127.0.0.1:{port}/readings");
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..a.sensors {
        tasks.spawn(sensor(client.clone(), url.clone(), id, a.backlog, start, tally.clone()));
    }
    let limit = Duration::from_secs(a.limit_s);
    let finished =
        tokio::time::timeout(limit, async { while tasks.join_next().await.is_some() {} }).await.is_ok();
    tasks.shutdown().await;
    let elapsed = start.elapsed();
    drop(gateway);
    let _ = std::fs::remove_file(&policy_file);
    let report = cloud.shutdown_with_report().await;
    let stats = &report.cloud;

    let readings = u64::from(a.sensors) * u64::from(a.backlog);
    let keys_applied = report.keys.values().filter(|k| k.effects >= 1).count() as u64;
    // Lost: answered 2xx to the sensor, yet never applied at the cloud.
    let lost = tally
        .landed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|k| report.keys.get(*k).is_none_or(|s| s.effects == 0))
        .count();
    let delivered = tally.delivered.load(Ordering::Relaxed);
    let load: &[LoadBin] = &stats.load;
    let arrivals: Vec<u64> = load.iter().map(|b| b.arrivals).collect();
    let accepted: Vec<u64> = load.iter().map(|b| b.accepted).collect();
    let cloud_requests: u64 = arrivals.iter().sum();
    let outage_bins = usize::try_from(a.outage_ms.div_ceil(1000)).unwrap_or(usize::MAX);
    let cap = a.capacity as f64;
    let peak_recovery = arrivals.iter().skip(outage_bins).copied().max().unwrap_or(0);
    let peak_outage = arrivals.iter().take(outage_bins).copied().max().unwrap_or(0);
    let ideal_s = readings as f64 / cap;
    let last_ms = tally.last_ms.load(Ordering::Relaxed);
    let drain_s = last_ms.saturating_sub(a.outage_ms) as f64 / 1000.0;
    let row = json!({
        "gateway": mode,
        "finished": finished,
        "seconds": elapsed.as_secs_f64(),
        "readings": readings,
        "delivered": delivered,
        "failed": tally.failed.load(Ordering::Relaxed),
        "sensor_requests": tally.sent.load(Ordering::Relaxed),
        "sensor_waits": tally.waits.load(Ordering::Relaxed),
        "cloud_requests": cloud_requests,
        "peak_x_capacity": peak_recovery as f64 / cap,
        "peak_in_outage_x_capacity": peak_outage as f64 / cap,
        // Only when every reading was delivered within the limit.
        "drain_s": if finished { json!(drain_s) } else { Value::Null },
        "drain_x_ideal": if finished { json!(drain_s / ideal_s) } else { Value::Null },
        // Otherwise the drain took longer than the run's recovery: this many times the ideal.
        "drain_x_ideal_more_than": if finished {
            Value::Null
        } else {
            json!((elapsed.as_secs_f64() - a.outage_ms as f64 / 1000.0).max(0.0) / ideal_s)
        },
        "delivered_share": delivered as f64 / readings as f64,
        // Readings delivered a second between the outage's end and the run's, over the capacity.
        "goodput_x_capacity": delivered as f64
            / (elapsed.as_secs_f64() - a.outage_ms as f64 / 1000.0).max(0.001)
            / cap,
        "applied_at_cloud": keys_applied,
        "requests_per_reading": if delivered == 0 { Value::Null } else { json!(cloud_requests as f64 / delivered as f64) },
        "duplicates": stats.duplicates.keys,
        "lost": lost,
        "arrivals": arrivals,
        "accepted": accepted,
        "delivered_per_second": tally.per_second.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    });
    eprintln!(
        "  recovery, gateway {mode}: peak {:.2}× capacity, drain {}× ideal, goodput {:.2}× capacity, \
         {:.2} requests/reading, delivered {delivered}/{readings}, duplicates {}, lost {}{}",
        row["peak_x_capacity"].as_f64().unwrap_or(0.0),
        if finished {
            format!("{:.2}", row["drain_x_ideal"].as_f64().unwrap_or(0.0))
        } else {
            format!("> {:.2}", row["drain_x_ideal_more_than"].as_f64().unwrap_or(0.0))
        },
        row["goodput_x_capacity"].as_f64().unwrap_or(0.0),
        row["requests_per_reading"].as_f64().unwrap_or(f64::NAN),
        row["duplicates"],
        row["lost"],
        if finished { "" } else { " (stopped at the limit)" },
    );
    Ok(row)
}

/// Arrivals per second at the cloud, both modes, against the capacity line; the outage shaded.
fn svg(a: &Args, rows: &[Value]) -> String {
    const W: f64 = 900.0;
    const H: f64 = 360.0;
    const L: f64 = 60.0;
    const R: f64 = 20.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    let series: Vec<(String, Vec<u64>)> = rows
        .iter()
        .map(|r| {
            let name = r["gateway"].as_str().unwrap_or("?").to_owned();
            let bins =
                r["arrivals"].as_array().map_or(Vec::new(), |v| v.iter().filter_map(Value::as_u64).collect());
            (name, bins)
        })
        .collect();
    let seconds = series.iter().map(|(_, b)| b.len()).max().unwrap_or(1).max(1) as f64;
    let top =
        series.iter().flat_map(|(_, b)| b.iter().copied()).max().unwrap_or(0).max(a.capacity) as f64 * 1.1;
    let x = |s: f64| L + (W - L - R) * s / seconds;
    let y = |n: f64| H - B - (H - T - B) * n / top;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>"
    );
    let outage_end = a.outage_ms as f64 / 1000.0;
    let _ = write!(
        s,
        "<rect x=\"{L}\" y=\"{T}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#ffe3e3\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">outage (503 to all)</text>",
        x(outage_end) - L,
        H - T - B,
        L + 4.0,
        T + 14.0,
    );
    // Axes and ticks.
    let _ = write!(
        s,
        "<line x1=\"{L}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\
         <line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{:.1}\" stroke=\"black\"/>",
        H - B,
        W - R,
        H - B,
        H - B,
    );
    let step = if seconds > 40.0 { 10 } else { 5 };
    for t in (0..=seconds as u64).step_by(step) {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t}</text>",
            x(t as f64),
            H - B + 14.0
        );
    }
    let ystep = ((top / 5.0 / 50.0).ceil() * 50.0).max(50.0) as u64;
    for n in (0..=top as u64).step_by(ystep as usize) {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{n}</text>",
            L - 4.0,
            y(n as f64) + 4.0
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{L}\" y1=\"{cy:.1}\" x2=\"{:.1}\" y2=\"{cy:.1}\" stroke=\"#2b8a3e\" stroke-dasharray=\"6 4\" stroke-width=\"1.5\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#2b8a3e\" text-anchor=\"end\">capacity {} requests/s</text>",
        W - R,
        W - R - 4.0,
        y(a.capacity as f64) - 4.0,
        a.capacity,
        cy = y(a.capacity as f64),
    );
    let colours = [("paced", "#1c7ed6"), ("paced_tuned", "#7048e8"), ("unpaced", "#e8590c")];
    for (i, (name, bins)) in series.iter().enumerate() {
        let colour = colours.iter().find(|(n, _)| n == name).map_or("#495057", |(_, c)| *c);
        let points: Vec<String> = bins
            .iter()
            .enumerate()
            .map(|(t, n)| format!("{:.1},{:.1}", x(t as f64 + 0.5), y(*n as f64)))
            .collect();
        let label = match name.as_str() {
            "paced" => "gateway, upstream paced (its default settings)",
            "paced_tuned" => "gateway, pace floor 50/s, regrow 2 s",
            _ => "gateway --no-upstream-pacing",
        };
        let _ = write!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.8\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{label}</text>",
            points.join(" "),
            W - R - 260.0,
            T + 14.0 + 14.0 * i as f64,
        );
    }
    let _ = write!(
        s,
        "<text x=\"{L}\" y=\"22\" font-size=\"13\">Requests arriving at the cloud per second: {} sensors × {} readings, \
         capacity {}/s, {} s outage</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds since the sensors started</text>",
        a.sensors,
        a.backlog,
        a.capacity,
        outage_end,
        (L + W - R) / 2.0,
        H - 14.0,
    );
    s.push_str("</svg>\n");
    s
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let mut rows = Vec::new();
    for mode in [Mode::Paced, Mode::Tuned, Mode::Unpaced] {
        rows.push(run(&a, mode).await?);
    }
    let readings = u64::from(a.sensors) * u64::from(a.backlog);
    let out = json!({
        "capacity_per_s": a.capacity,
        "sensors": a.sensors,
        "backlog_per_sensor": a.backlog,
        "readings": readings,
        "outage_s": a.outage_ms as f64 / 1000.0,
        "ideal_drain_s": readings as f64 / a.capacity as f64,
        "capacity_retry_after": a.capacity_ra,
        "svg": a.svg.display().to_string(),
        "rows": rows,
    });
    for file in [&a.out, &a.svg] {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&out)?)
        .with_context(|| format!("writing {}", a.out.display()))?;
    std::fs::write(&a.svg, svg(&a, &rows)).with_context(|| format!("writing {}", a.svg.display()))?;
    eprintln!("  recovery: {} and {}", a.out.display(), a.svg.display());
    Ok(())
}
