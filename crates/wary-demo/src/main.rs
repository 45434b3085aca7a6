//! `wary-demo`: starts the test cloud and two gateways (keyed and legacy upstream) in-process,
//! each serving HTTP on 127.0.0.1, runs a simulated sensor fleet through a scripted fault storm
//! (every sensor posts `POST /readings` with its `Idempotency-Key`, as a device does), prints a
//! summary whose last two lines are `duplicates: <n>` and `lost: <n>`, and writes an SVG retry
//! timeline.
//!
//! Usage: `wary-demo [OUT.svg]` (default `target/demo/timeline.svg`). Everything runs on
//! 127.0.0.1.

mod svg;

use std::collections::{BTreeSet, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wary::{GiveUp, Key};
use wary_cloud::{Cloud, Faults};
use wary_gateway::{Config, Gateway};
use wary_host::spec::PolicySpec;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Keyed sensors, legacy sensors, readings per sensor, ms between readings.
const KEYED_SENSORS: u32 = 50;
const LEGACY_SENSORS: u32 = 10;
const PER_SENSOR: u64 = 20;
const PERIOD_MS: u64 = 1_500;
/// Recovery ends when every sensor is done, or after this long in all.
const MAX_RUN: Duration = Duration::from_secs(100);

/// (name, seconds, faults)
const PHASES: [(&str, u64, &str); 6] = [
    ("calm", 4, ""),
    ("503 storm", 6, "503=0.4,seed=11"),
    ("429 + Retry-After", 6, "429=0.15:ra=1,429=0.15:ra=date+2,seed=12"),
    ("drops after effect", 6, "drop_after_effect=0.25,500=0.1,seed=13"),
    ("total outage", 6, "503=1.0,seed=14"),
    ("recovery", 0, ""),
];

/// `key=value` pairs of the device leg's summary line (`uplink: readings=20 landed=20 …`).
struct Counts(Vec<(String, String)>);

impl Counts {
    fn parse(line: &str) -> Counts {
        Counts(
            line.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> &str {
        self.0.iter().find(|(k, _)| k == key).map_or("?", |(_, v)| v.as_str())
    }

    fn number(&self, key: &str) -> u64 {
        self.get(key).parse().unwrap_or(0)
    }
}

#[derive(Default)]
struct Tally {
    /// Acked `ok` or `failed`: done, delivered or not fixable by a resend.
    acked: AtomicU64,
    /// Acked `gave_up`: kept and sent again.
    gave_up: AtomicU64,
    /// Answered `unknown` (409, surfaced): may have landed; with a person; never resent, not acked.
    surfaced: Mutex<BTreeSet<(u32, u64)>>,
}

fn config(cloud: &Cloud, legacy: bool) -> Config {
    let mut c = Config::new(&cloud.url(""));
    c.auth = wary_gateway::Auth::Open;
    c.upstream.legacy = legacy;
    if legacy {
        c.upstream.path = "/legacy/readings".to_owned();
    }
    c.upstream.attempt_timeout = Duration::from_millis(1_000);
    c.policy = PolicySpec {
        base: Some(50),
        cap: Some(1_000),
        budget: Some(4_000),
        deadline: Some(8_000),
        min_attempt: Some(100),
        ..PolicySpec::default()
    };
    // 0.5 back per success: the demo's fleet recovers within seconds of the outage ending.
    c.fleet_ratio_milli = 500;
    c.workers = 32;
    c.queue = 128;
    c.timeline = true;
    c
}

/// A reading's key: sensor, boot 1, sequence (the cloud's report is looked up by it).
fn key(sensor: u32, seq: u64) -> String {
    Key::from_parts(
        u64::from(sensor),
        1,
        u32::try_from(seq).expect("a demo sensor makes fewer than 2^32 readings"),
    )
    .to_hex()
    .as_str()
    .to_owned()
}

/// What a sensor makes of the gateway's answer.
enum Heard {
    /// Landed (2xx) or failed (424): done.
    Done,
    /// Unknown (409): with a person; never resent.
    Surfaced,
    /// 503 (the gateway gave up, or its queue was full), no answer, or a broken connection:
    /// kept and sent again later with the same key.
    Later,
}

/// `POST /readings` as a device sends it, with the gateway's answer classified.
async fn post(client: &HttpClient, url: &str, key: &str, body: String) -> Heard {
    let Ok(req) = Request::post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body)))
    else {
        return Heard::Later;
    };
    let exchange = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status();
        resp.into_body().collect().await.ok()?;
        Some(status)
    };
    match tokio::time::timeout(Duration::from_secs(20), exchange).await {
        Ok(Some(s)) if s.is_success() || s == StatusCode::FAILED_DEPENDENCY => Heard::Done,
        Ok(Some(StatusCode::CONFLICT)) => Heard::Surfaced,
        _ => Heard::Later,
    }
}

/// One sensor: a reading every period; what was not answered done is kept and sent again on
/// the next tick, with the same key. An `unknown` legacy write (409) is surfaced: the sensor
/// neither resends it (never a blind resend) nor counts it as acked.
async fn sensor(client: HttpClient, url: String, id: u32, tally: Arc<Tally>) {
    tokio::time::sleep(Duration::from_millis(u64::from(id % 50) * 29)).await;
    let mut tick = tokio::time::interval(Duration::from_millis(PERIOD_MS));
    let mut pending = VecDeque::new();
    let mut seq = 0;
    loop {
        tick.tick().await;
        if seq < PER_SENSOR {
            pending.push_back(seq);
            seq += 1;
        } else if pending.is_empty() {
            return;
        }
        for q in std::mem::take(&mut pending) {
            let body = format!("{{\"seq\":{q},\"mC\":{}}}", i64::from(id) * 1000 + q as i64);
            match post(&client, &url, &key(id, q), body).await {
                Heard::Surfaced => {
                    tally.surfaced.lock().unwrap_or_else(|e| e.into_inner()).insert((id, q));
                }
                Heard::Done => {
                    tally.acked.fetch_add(1, Ordering::Relaxed);
                }
                Heard::Later => {
                    tally.gave_up.fetch_add(1, Ordering::Relaxed);
                    pending.push_back(q);
                }
            }
        }
    }
}

/// Serves `gw` over HTTP on a free loopback port; returns its readings URL.
async fn serve(gw: &Arc<Gateway>) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/readings", listener.local_addr()?);
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<()> {
    let out =
        std::env::args().nth(1).map_or_else(|| PathBuf::from("target/demo/timeline.svg"), PathBuf::from);
    let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await?;
    // The keyed gateway's ledger, for `wary stats` and `wary replay` after the run.
    let ledger_path = out.with_file_name("ledger.jsonl");
    if let Some(dir) = ledger_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let ledger = std::io::BufWriter::new(
        std::fs::File::create(&ledger_path).with_context(|| format!("creating {}", ledger_path.display()))?,
    );
    let keyed = Arc::new(Gateway::start(config(&cloud, false), Box::new(ledger))?);
    let legacy = Arc::new(Gateway::start(config(&cloud, true), Box::new(std::io::sink()))?);
    let (keyed_url, legacy_url) = (serve(&keyed).await?, serve(&legacy).await?);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let tally = Arc::new(Tally::default());
    let t0 = Instant::now();
    let mut sensors = tokio::task::JoinSet::new();
    for id in 0..KEYED_SENSORS {
        sensors.spawn(sensor(client.clone(), keyed_url.clone(), id, tally.clone()));
    }
    for id in 0..LEGACY_SENSORS {
        sensors.spawn(sensor(client.clone(), legacy_url.clone(), 1000 + id, tally.clone()));
    }
    let total = u64::from(KEYED_SENSORS + LEGACY_SENSORS) * PER_SENSOR;
    let mut bands = Vec::new();
    for (name, secs, faults) in PHASES {
        cloud.set_faults(if faults.is_empty() {
            Faults::none()
        } else {
            faults.parse().map_err(anyhow::Error::msg)?
        })?;
        let start = keyed.now();
        let until = if secs == 0 { MAX_RUN } else { t0.elapsed() + Duration::from_secs(secs) };
        while t0.elapsed() < until && !(secs == 0 && sensors.is_empty()) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                Some(_) = sensors.join_next(), if !sensors.is_empty() => {}
            }
            let m = keyed.metrics();
            eprint!(
                "\r[{name:<19}] {:>5.1}s  acked {:>4}/{total}  attempts {:>5}  fleet tokens {:>6.1}   ",
                t0.elapsed().as_secs_f64(),
                tally.acked.load(Ordering::Relaxed),
                m.stats.attempts() + legacy.metrics().stats.attempts(),
                f64::from(keyed.fleet_tokens_milli()) / 1000.0,
            );
        }
        bands.push((name, start, keyed.now()));
    }
    eprintln!();
    sensors.abort_all();
    let elapsed = t0.elapsed();

    let stats = cloud.stats();
    let (mut effects, mut duplicates, mut lost) = (0u64, 0u64, 0u64);
    for id in 0..KEYED_SENSORS {
        for seq in 0..PER_SENSOR {
            let e = cloud.key_stats(&key(id, seq)).map_or(0, |k| k.effects);
            effects += e;
            duplicates += e.saturating_sub(1);
            lost += u64::from(e == 0);
        }
    }
    let surfaced_ids = tally.surfaced.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let surfaced = surfaced_ids.len() as u64;
    for id in 0..LEGACY_SENSORS {
        for seq in 0..PER_SENSOR {
            // The legacy upstream labels each effect with the key it got as `X-Reading-Id`.
            let e = cloud.reading_effects(&key(1000 + id, seq));
            effects += e;
            duplicates += e.saturating_sub(1);
            // A legacy reading surfaced as unknown that did not land is with a person, not lost.
            lost += u64::from(e == 0 && !surfaced_ids.contains(&(1000 + id, seq)));
        }
    }
    let (km, lm) = (keyed.metrics(), legacy.metrics());
    let mut all_stats = km.stats;
    for n in 1..=wary_gateway::metrics::BUCKETS as u32 {
        for _ in 0..lm.stats.count(n) {
            all_stats.add(n);
        }
    }

    let mut events = km.events.clone().unwrap_or_default();
    events.extend(lm.events.clone().unwrap_or_default());
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, svg::timeline(&events, &bands))
        .with_context(|| format!("writing {}", out.display()))?;

    // Every decision in the keyed gateway's ledger, recomputed by the core: a field incident
    // reproduces the same way on a laptop.
    let text = std::fs::read_to_string(&ledger_path)
        .with_context(|| format!("reading {}", ledger_path.display()))?;
    // Workers may still be finishing a call: replay only whole lines.
    let whole = text.get(..text.rfind('\n').map_or(0, |i| i + 1)).unwrap_or_default();
    let loaded = wary_cli::replay::load(whole);
    let replayed: usize = loaded.calls.iter().map(|c| c.records.len()).sum();
    let divergences = wary_cli::replay::replay(&loaded).len() + loaded.bad_lines.len();
    let device = std::env::var("WARY_DEMO_DEVICE").ok().map(|s| Counts::parse(&s));
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "\nwary demo: {KEYED_SENSORS} keyed + {LEGACY_SENSORS} legacy sensors × {PER_SENSOR} readings, {:.1} s",
        elapsed.as_secs_f64()
    )?;
    writeln!(
        o,
        "phases: {}",
        bands
            .iter()
            .map(|(n, a, b)| format!(
                "{n} {:.0}-{:.0}s",
                a.as_millis() as f64 / 1e3,
                b.as_millis() as f64 / 1e3
            ))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(o, "{:-<60}", "")?;
    writeln!(o, "{:<34}{:>10}", "readings", total)?;
    writeln!(o, "{:<34}{:>10}", "effects in the cloud", effects)?;
    writeln!(o, "{:<34}{:>10}", "acked done", tally.acked.load(Ordering::Relaxed))?;
    writeln!(o, "{:<34}{:>10}", "gave up (retried later)", tally.gave_up.load(Ordering::Relaxed))?;
    writeln!(
        o,
        "{:<34}{:>10}",
        "  of which fleet-throttled",
        [&km, &lm].map(|m| m.gave_up.get(GiveUp::Throttled.name()).copied().unwrap_or(0)).iter().sum::<u64>()
    )?;
    writeln!(o, "{:<34}{:>10}", "unknowns resolved: landed", lm.probe_landed)?;
    writeln!(o, "{:<34}{:>10}", "unknowns resolved: not landed", lm.probe_not_landed)?;
    writeln!(o, "{:<34}{:>10}", "unknowns surfaced to a person", surfaced)?;
    writeln!(o, "{:<34}{:>10}", "requests the cloud saw", stats.requests)?;
    writeln!(o, "{:<34}{:>10.2}", "attempts per call (mean)", all_stats.mean_milli() as f64 / 1000.0)?;
    writeln!(o, "{:<34}{:>10}", "attempts per call (p95)", all_stats.percentile(95))?;
    writeln!(o, "{:<34}{:>10}", "attempts per call (max)", all_stats.max())?;
    writeln!(o, "{:<34}{:>10}", "replays deduplicated by key", stats.replays)?;
    if let Some(d) = &device {
        writeln!(o, "{:-<60}", "")?;
        writeln!(o, "{:<34}{:>10}", "device (QEMU) readings", d.get("readings"))?;
        writeln!(o, "{:<34}{:>10}", "device readings landed once", d.get("landed"))?;
        writeln!(o, "{:<34}{:>10}", "device calls gave up (kept, resent)", d.get("gave_up"))?;
        writeln!(o, "{:<34}{:>10}", "device attempts per call (mean)", d.get("mean"))?;
        writeln!(o, "{:<34}{:>10}", "device attempts per call (p95)", d.get("p95"))?;
        writeln!(o, "{:<34}{:>10}", "device resets survived", d.get("resets"))?;
        // The device leg already failed the run unless the cloud applied each reading once.
        lost += d.number("readings").saturating_sub(d.number("landed") + d.number("failed"));
    }
    writeln!(o, "timeline: {}", out.display())?;
    writeln!(o, "ledger: {} (try `wary stats` and `wary replay` on it)", ledger_path.display())?;
    writeln!(o, "{:<34}{:>10}", "ledger decisions replayed", replayed)?;
    writeln!(o, "{:<34}{:>10}", "replay divergences", divergences)?;
    writeln!(o, "duplicates: {duplicates}")?;
    writeln!(o, "lost: {lost}")?;
    if divergences > 0 {
        anyhow::bail!("{divergences} decisions in the ledger diverge from the core's");
    }
    Ok(())
}
