//! The MQTT ingress's throughput bench (`cargo xtask bench --only mqtt-ingress`): the same
//! stream of readings consumed by mosquitto's own `mosquitto_sub` and by the `wary-gateway`
//! binary forwarding each reading to the test cloud, on one mosquitto 2.0 on 127.0.0.1.
//!
//! For each in-flight window (the broker's `max_inflight_messages` and the gateway's Receive
//! Maximum): both consumers' persistent sessions are made first (each in its own shared group,
//! so each gets every message), `--count` readings are published by eight devices (QoS 1, each
//! waiting for its PUBACK) and queue in both sessions; then each consumer is started and timed
//! until it has consumed all of them (`mosquitto_sub -C N` exits; the cloud has applied N
//! readings). Both times include starting the process and connecting. Three runs a window; the
//! one with the median gateway rate is kept. Writes one JSON object to `--out`.
//!
//! Usage: `mqtt_ingress_load --gateway-bin PATH --out FILE [--count N]`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use wary_cloud::{Cloud, Faults};
use wary_fixtures::mosquitto::{GATEWAY_USER, Settings};

#[path = "../tests/common/mqtt.rs"]
mod mqtt;

const DEVICES: u64 = 8;

fn sub_args(port: u16, group: &str) -> Vec<String> {
    let filter = wary_gateway::mqtt::subscription(group);
    ["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv5", "-q", "1", "-c", "-i", "bench-sub"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(
            ["-x", "600", "-u", GATEWAY_USER, "-P", mqtt::GATEWAY_PASSWORD, "-t", &filter].map(str::to_owned),
        )
        .collect()
}

async fn row(gateway_bin: &PathBuf, count: u32, window: u16) -> Result<Value> {
    let devices: Vec<u64> = (1..=DEVICES).collect();
    let settings = Settings { max_queued_messages: 0, max_inflight_messages: window, ..Settings::default() };
    let (broker, dir) = mqtt::broker(&format!("bench{window}"), &devices, &settings);
    let port = broker.port();
    let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await?;

    // The two sessions, made and left.
    // `-W 1` ends it (with a "Timed out" status) a second after it subscribed.
    let _ = Command::new("mosquitto_sub")
        .args(sub_args(port, "sub"))
        .args(["-W", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    let (m, _) = mqtt::Member::join(port, "bench-gw", "gw").await;
    m.vanish();

    // The stream.
    let per = count / DEVICES as u32;
    let mut tasks = Vec::new();
    for id in devices {
        tasks.push(tokio::spawn(async move {
            let mut dev = mqtt::Device::connect(port, id).await;
            for s in 0..per {
                let body = format!("{{\"seq\":{s},\"t\":21.5}}");
                let r = dev.publish(&mqtt::key(id, 1, s), body.as_bytes()).await;
                assert_eq!(r, Some(rumqttc::v5::mqttbytes::v5::PubAckReason::Success));
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let n = per * DEVICES as u32;

    let started = Instant::now();
    let out = Command::new("mosquitto_sub")
        .args(sub_args(port, "sub"))
        .args(["-C", &n.to_string(), "-W", "120"])
        .stdout(Stdio::piped())
        .output()?;
    let sub_secs = started.elapsed().as_secs_f64();
    let got = String::from_utf8_lossy(&out.stdout).lines().count();
    if got != n as usize {
        bail!("mosquitto_sub printed {got} of {n} messages");
    }

    let started = Instant::now();
    let mut gw = Command::new(gateway_bin)
        .args(["--mqtt", &format!("127.0.0.1:{port}"), "--mqtt-client-id", "bench-gw", "--mqtt-group", "gw"])
        .args([
            "--mqtt-password-env",
            "WARY_BENCH_MQTT_PASSWORD",
            "--mqtt-receive-maximum",
            &window.to_string(),
        ])
        .args(["--upstream", &cloud.url(""), "--no-metrics"])
        .env("WARY_BENCH_MQTT_PASSWORD", mqtt::GATEWAY_PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = started + Duration::from_secs(120);
    while cloud.stats().effects_total < u64::from(n) {
        if Instant::now() > deadline {
            let _ = gw.kill();
            bail!("the gateway forwarded {} of {n} in 120 s", cloud.stats().effects_total);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let gw_secs = started.elapsed().as_secs_f64();
    let _ = gw.kill();
    let _ = gw.wait();
    let stats = cloud.stats();
    drop(broker);
    let _ = std::fs::remove_dir_all(dir);
    let (sub_rate, gw_rate) = (f64::from(n) / sub_secs, f64::from(n) / gw_secs);
    eprintln!(
        "    window {window}: mosquitto_sub {sub_rate:.0} msg/s, wary-gateway {gw_rate:.0} readings/s forwarded ({:.2}×), {} upstream requests",
        gw_rate / sub_rate,
        stats.requests
    );
    Ok(json!({
        "window": window,
        "readings": n,
        "mosquitto_sub_per_sec": sub_rate.round(),
        "gateway_per_sec": gw_rate.round(),
        "gateway_to_mosquitto_sub": (gw_rate / sub_rate * 1000.0).round() / 1000.0,
        "upstream_requests": stats.requests,
        "upstream_effects": stats.effects_total,
    }))
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut gateway_bin = PathBuf::from("target/release/wary-gateway");
    let mut out = PathBuf::from("target/bench/mqtt_ingress.json");
    let mut count = 20_000u32;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--gateway-bin" => gateway_bin = v.into(),
            "--out" => out = v.into(),
            "--count" => count = v.parse().context("--count")?,
            _ => bail!("unknown flag {flag}"),
        }
    }
    if !mqtt::have_mosquitto() {
        bail!("mosquitto is not installed");
    }
    // Three runs a window, alternating; the row with the median gateway rate is kept (the
    // machine is shared, and single runs vary).
    let mut rows = Vec::new();
    for window in [20u16, 100] {
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(row(&gateway_bin, count, window).await?);
        }
        runs.sort_by(|a, b| {
            a["gateway_per_sec"].as_f64().partial_cmp(&b["gateway_per_sec"].as_f64()).unwrap()
        });
        let mut median = runs.swap_remove(1);
        median["runs"] = json!(3);
        rows.push(median);
    }
    let figures = json!({
        "method": "the same queued stream consumed by mosquitto_sub -C N (QoS 1) and by wary-gateway --mqtt forwarding each reading to the test cloud on loopback; each timed from process start until all consumed; the run with the median gateway rate of three",
        "rows": rows,
    });
    std::fs::write(&out, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
