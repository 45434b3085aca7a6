//! The device scenario `mqtt-gateway`: the whole MQTT path end to end. The QEMU uplink built
//! with `mqtt` publishes its readings (through the fault proxy, which drops two connections
//! after a PUBLISH reached the broker and before its PUBACK) to a real mosquitto run with the
//! deployment's settings (`max_queued_messages 0`, persistent sessions); two `wary-gateway`
//! replicas (`gw-1`, `gw-2`) share the subscription `$share/wary/wary/+/readings` and forward
//! each reading to the test cloud, which answers some 503s and drops some connections after
//! applying the write. Power fails once during a flash write of the device's outbox, so the
//! readings span two boots.
//!
//! At the start the cloud holds every reply for a while, so the replicas hold messages they
//! have not acknowledged; `gw-1` is SIGKILLed once it holds some, the cloud speeds up again, and
//! `gw-1` is started again under the same client id while the device is still publishing.
//!
//! The run passes when every reading the device accepted into its outbox is applied by the
//! cloud exactly once, the cloud applied no other key, the restarted `gw-1` found its session
//! and had the messages it held redelivered, and the device published after the restart. It
//! prints `mqtt-gateway: duplicates 0, lost 0` and the broker's redelivery as observed.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wary_fixtures::mosquitto::{Broker, GATEWAY_USER, Login, Settings};
use wary_fixtures::mqtt_fault::{Fault, Proxy};

use crate::device::{
    Cloud, DEVICE, Extra, Log, Route, TOKEN, host_bins, key_hex, put_faults, scrape, shows_token,
};
use crate::harness::{TARGET, build, uplink_exited};
use crate::mqtt::{GATEWAY_PASSWORD, build_mqtt};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_mosquitto, ensure_targets, step};

/// Readings the sensor makes per boot (the device runs two boots).
const READINGS: u32 = 40;
/// Power fails during this flash write of boot 1; boot 2 delivers what is left and makes its
/// own readings.
/// Without the device's pace: the cloud's storm fails a share of requests at random, as for the
/// HTTP storm.
const PLAN: &str = "cut_write=1:30 pacing=off";
/// A wedged guest must never hold CI.
const TIMEOUT: Duration = Duration::from_secs(150);
/// The cloud while `gw-1` is to be killed: most replies (80 %) held 1.5 s (below the gateway's 5 s
/// attempt timeout), so the replicas hold what they received; plus the storm below.
const SLOW: &str = "slow=0.8:ms=1500,503=0.1,drop_after_effect=0.05,seed=11";
/// The cloud after the kill.
const STORM: &str = "503=0.1,drop_after_effect=0.05,slow=0.2:ms=300,seed=12";
/// The proxy's script, one entry per PUBLISH (then every PUBLISH passes): two connections lost
/// after the broker took the message, so the device resends it with the same key.
const SCRIPT: [Fault; 12] = [
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Drop,
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Pass,
    Fault::Drop,
];
/// The environment variable the replicas read their broker password from.
const PASSWORD_ENV: &str = "WARY_MQTT_GATEWAY_PASSWORD";

/// One `wary-gateway --mqtt` replica as a child process, its metrics on a port of its own.
struct Replica {
    child: Child,
    metrics: u16,
    stderr: Option<thread::JoinHandle<Vec<String>>>,
}

impl Replica {
    /// Starts the replica and returns once it is connected to the broker.
    fn start(bin: &Path, id: &'static str, broker: u16, upstream: u16) -> Result<Replica> {
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new(bin)
            .args(["--mqtt", &format!("127.0.0.1:{broker}"), "--mqtt-client-id", id])
            .args(["--mqtt-password-env", PASSWORD_ENV])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            .args(["--metrics", &format!("127.0.0.1:{metrics}"), "--workers", "8", "--threads", "1"])
            .env(PASSWORD_ENV, GATEWAY_PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let err = child.stderr.take().context("gateway stderr")?;
        let stderr = Some(thread::spawn(move || BufReader::new(err).lines().map_while(Result::ok).collect()));
        let mut replica = Replica { child, metrics, stderr };
        let end = Instant::now() + Duration::from_secs(20);
        while replica.counter("connects_total") < 1 {
            if Instant::now() > end {
                bail!("replica {id} did not connect to the broker within 20 s");
            }
            if let Some(status) = replica.child.try_wait()? {
                bail!("replica {id} exited with {status}: {:?}", replica.stop().1);
            }
            thread::sleep(Duration::from_millis(25));
        }
        Ok(replica)
    }

    /// `wary_gateway_mqtt_<name>` (0 while its metrics do not answer).
    fn counter(&self, name: &str) -> u64 {
        let prefix = format!("wary_gateway_mqtt_{name} ");
        scrape(self.metrics)
            .ok()
            .and_then(|lines| lines.iter().find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// Received and not yet acknowledged.
    fn held(&self) -> u64 {
        self.counter("received_total").saturating_sub(self.counter("acked_total"))
    }

    /// SIGKILL (or the end of the run): its exit and what it logged.
    fn stop(mut self) -> (Option<std::process::ExitStatus>, Vec<String>) {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let lines = self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        (status, lines)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the kill thread saw.
struct Kill {
    /// Messages `gw-1` had received and not acknowledged just before its SIGKILL.
    held: u64,
    /// Publishes through the proxy at the kill and at the restart.
    publishes_at_kill: u32,
    publishes_at_restart: u32,
    /// The restarted `gw-1`.
    restarted: Replica,
    /// The killed process's log lines.
    killed_log: Vec<String>,
}

/// `cargo xtask device mqtt-gateway`: see the module docs. Returns the report.
pub fn run(root: &Path) -> Result<String> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    ensure_mosquitto()?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    let bins = host_bins(root, Route::GatewayTls)?;
    let dir = std::env::temp_dir().join(format!("wary-mqtt-gateway-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = build_mqtt(&firmware, &dir).and_then(|(elf, _)| scenario(&dir, &elf, &bins));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn scenario(dir: &Path, elf: &Path, bins: &crate::device::HostBins) -> Result<String> {
    let logins = [Login::new(format!("{DEVICE:016x}"), TOKEN), Login::new(GATEWAY_USER, GATEWAY_PASSWORD)];
    let settings = Settings { max_queued_messages: 0, ..Settings::default() };
    let broker = Broker::start(&dir.join("broker"), &logins, &settings)?;
    let proxy = Arc::new(Proxy::start(broker.port())?);
    proxy.script(SCRIPT);
    let mut cloud = Cloud::start(&bins.cloud, SLOW)?;
    let cloud_port = cloud.port;
    step(&format!(
        "device scenario `mqtt-gateway`: the uplink over MQTT through the fault proxy to mosquitto on :{}, replicas gw-1 and gw-2 sharing the subscription, the cloud on :{cloud_port} (`{SLOW}`)",
        broker.port()
    ));
    let gw1 = Replica::start(&bins.gateway, "gw-1", broker.port(), cloud_port)?;
    let gw2 = Replica::start(&bins.gateway, "gw-2", broker.port(), cloud_port)?;
    // Both sessions are in the group before the first reading.
    thread::sleep(Duration::from_millis(300));

    // The kill: once gw-1 holds messages it has not acknowledged, SIGKILL; the cloud speeds up;
    // a moment later gw-1 comes back under its id, while the device is still publishing.
    let killer = {
        let (proxy, gateway) = (Arc::clone(&proxy), bins.gateway.clone());
        let broker_port = broker.port();
        thread::spawn(move || -> Result<Kill> {
            let end = Instant::now() + TIMEOUT;
            let mut held = 0;
            while Instant::now() < end {
                held = gw1.held();
                // Five held, or any once the device is well under way.
                if held >= 5 || (held > 0 && proxy.counts().publishes >= 16) {
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
            let publishes_at_kill = proxy.counts().publishes;
            let (status, killed_log) = gw1.stop();
            if held == 0 {
                bail!("gw-1 never held an unacknowledged message");
            }
            if status.is_some_and(|s| s.success()) {
                bail!("gw-1 exited cleanly instead of being killed");
            }
            put_faults(cloud_port, STORM)?;
            thread::sleep(Duration::from_millis(700));
            let publishes_at_restart = proxy.counts().publishes;
            let restarted = Replica::start(&gateway, "gw-1", broker_port, cloud_port)?;
            Ok(Kill { held, publishes_at_kill, publishes_at_restart, restarted, killed_log })
        })
    };

    let started = Instant::now();
    let extra = Extra::default();
    let (status, lines) =
        crate::device::run_uplink(elf, proxy.port(), TOKEN, READINGS, PLAN, TIMEOUT, &extra)?;
    let device_secs = started.elapsed().as_secs_f64();
    let kill = killer.join().map_err(|_| anyhow::anyhow!("the kill thread panicked"))??;
    uplink_exited("mqtt-gateway", status, TIMEOUT)?;
    let log = Log::read(&lines);
    let accepted: BTreeSet<String> = log.accepted.iter().map(|&(b, s)| key_hex(b, s)).collect();

    // The replicas forward what is left; wait until the cloud has every accepted key and both
    // replicas have acknowledged everything they received.
    let gw1b = kill.restarted;
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let landed = cloud_report(cloud_port)
            .map(|r| accepted.iter().filter(|k| effects(&r, k) > 0).count())
            .unwrap_or(0);
        if landed == accepted.len() && gw1b.held() == 0 && gw2.held() == 0 {
            break;
        }
        if Instant::now() > end {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let c = |r: &Replica, name: &str| r.counter(name);
    let (received1b, redelivered1b, resumed1b) =
        (c(&gw1b, "received_total"), c(&gw1b, "redelivered_total"), c(&gw1b, "sessions_resumed_total"));
    let (received2, redelivered2) = (c(&gw2, "received_total"), c(&gw2, "redelivered_total"));
    let called_again = c(&gw1b, "called_again_total") + c(&gw2, "called_again_total");
    let refused: u64 = [&gw1b, &gw2]
        .iter()
        .filter_map(|r| scrape(r.metrics).ok())
        .flatten()
        .filter(|l| l.starts_with("wary_gateway_mqtt_refused_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    let held_at_end = gw1b.held() + gw2.held();
    let (_, log1b) = gw1b.stop();
    let (_, log2) = gw2.stop();
    let report = cloud.stop()?;
    drop(broker);
    let counts = proxy.counts();

    let Effects { lost, twice, strangers, cloud_duplicates } = Effects::of(&accepted, &report)?;
    let duplicates = twice.len() + strangers.len() + usize::try_from(cloud_duplicates).unwrap_or(usize::MAX);
    let replays = report["cloud"]["replays"].as_u64().unwrap_or(0);

    let mut problems = vec![];
    if log.boots.len() != 2 || log.resets.len() != 1 {
        problems.push(format!(
            "expected two boots and one reset: boots {:?}, resets {:?}",
            log.boots, log.resets
        ));
    }
    let last = log.boots.last().copied().unwrap_or(0);
    if log.accepted.iter().filter(|(b, _)| *b == last).count() != READINGS as usize {
        problems.push(format!("the last boot did not accept its {READINGS} readings"));
    }
    if !lost.is_empty() {
        problems.push(format!("lost (never applied): {lost:?}"));
    }
    if !twice.is_empty() || cloud_duplicates != 0 {
        problems.push(format!("applied more than once: {twice:?} (cloud duplicates {cloud_duplicates})"));
    }
    if !strangers.is_empty() {
        problems.push(format!("the cloud applied keys the device never accepted: {strangers:?}"));
    }
    if resumed1b != 1 {
        problems.push(format!("the restarted gw-1 resumed {resumed1b} sessions, expected 1"));
    }
    if redelivered1b == 0 {
        problems.push("the restarted gw-1 got no redelivered (DUP) message".into());
    }
    if kill.publishes_at_restart >= counts.publishes {
        problems.push(format!(
            "the device published nothing after gw-1 came back ({} publishes at the restart, {} in all)",
            kill.publishes_at_restart, counts.publishes
        ));
    }
    if refused != 0 {
        problems.push(format!("the replicas refused {refused} messages"));
    }
    if held_at_end != 0 {
        problems.push(format!("the replicas still held {held_at_end} unacknowledged messages at the end"));
    }
    if proxy.pending() > 0 {
        problems.push(format!("{} scripted proxy faults never used", proxy.pending()));
    }
    if let Some(line) = lines
        .iter()
        .chain(&kill.killed_log)
        .chain(&log1b)
        .chain(&log2)
        .find(|l| shows_token(l) || l.contains(GATEWAY_PASSWORD) || l.contains("\"mC\""))
    {
        problems.push(format!("a log line shows a secret or a payload: {:?}", line.replace(TOKEN, "…")));
    }

    let text = [
        format!(
            "mqtt-gateway: duplicates {duplicates}, lost {} ({} readings accepted over {} boots, each applied once by the cloud)",
            lost.len(),
            accepted.len(),
            log.boots.len()
        ),
        format!(
            "redelivery: gw-1 SIGKILLed holding {} unacknowledged messages (after {} device publishes); restarted under its id after {} publishes, it resumed its session ({resumed1b}) and received {received1b}, {redelivered1b} of them redelivered with DUP; gw-2 received {received2} ({redelivered2} with DUP)",
            kill.held, kill.publishes_at_kill, kill.publishes_at_restart
        ),
        format!(
            "cloud: {} requests, {replays} replays answered from its store (raw redeliveries deduplicated by key), faults {}; gateway calls made again after a give-up {called_again}",
            report["cloud"]["requests"], report["cloud"]["faults_injected"]
        ),
        format!(
            "device: {} PUBLISHes through the proxy ({} with DUP), {} connections dropped after the broker took a PUBLISH; {}",
            counts.publishes,
            counts.dup_publishes,
            counts.drops,
            log.summary.as_deref().unwrap_or("(no SUMMARY line)")
        ),
        format!("wall time: device {device_secs:.1} s"),
    ]
    .join("\n");
    if !problems.is_empty() {
        bail!("{text}\nmqtt-gateway failed:\n  {}", problems.join("\n  "));
    }
    Ok(text)
}

/// The cloud's effects against the readings the device accepted.
#[derive(Debug)]
struct Effects {
    /// Accepted, never applied.
    lost: Vec<String>,
    /// Accepted, applied more than once.
    twice: Vec<String>,
    /// Applied, never accepted.
    strangers: Vec<String>,
    /// The cloud's own count of keys applied more than once.
    cloud_duplicates: u64,
}

impl Effects {
    fn of(accepted: &BTreeSet<String>, report: &serde_json::Value) -> Result<Effects> {
        let keys = report["keys"].as_object().context("no keys in the cloud's report")?;
        let pick = |f: &dyn Fn(u64) -> bool| -> Vec<String> {
            accepted.iter().filter(|k| f(effects(report, k))).cloned().collect()
        };
        Ok(Effects {
            lost: pick(&|n| n == 0),
            twice: pick(&|n| n > 1),
            strangers: keys
                .iter()
                .filter(|(k, v)| !accepted.contains(*k) && v["effects"].as_u64().unwrap_or(0) > 0)
                .map(|(k, _)| k.clone())
                .collect(),
            cloud_duplicates: report["cloud"]["duplicates"]["keys"].as_u64().unwrap_or(u64::MAX),
        })
    }
}

/// The cloud's `/report` while it runs.
fn cloud_report(port: u16) -> Result<serde_json::Value> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).context("connecting to the cloud")?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(b"GET /report HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).context("the cloud's /report is not JSON")
}

/// The cloud's count of effects for `key`.
fn effects(report: &serde_json::Value, key: &str) -> u64 {
    report["keys"][key]["effects"].as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(keys: &[(&str, u64)], duplicates: u64) -> serde_json::Value {
        let keys: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .map(|(k, e)| ((*k).to_owned(), serde_json::json!({"effects": e, "replays": 0})))
            .collect();
        serde_json::json!({"keys": keys, "cloud": {"duplicates": {"keys": duplicates}}})
    }

    #[test]
    fn exactly_once_is_the_only_clean_result() {
        let accepted: BTreeSet<String> = ["a", "b"].map(String::from).into();
        let clean = Effects::of(&accepted, &report(&[("a", 1), ("b", 1)], 0)).unwrap();
        assert!(clean.lost.is_empty() && clean.twice.is_empty() && clean.strangers.is_empty());
        assert_eq!(clean.cloud_duplicates, 0);

        let bad = Effects::of(&accepted, &report(&[("a", 2), ("b", 0), ("c", 1), ("d", 0)], 1)).unwrap();
        assert_eq!(bad.twice, vec!["a"]);
        assert_eq!(bad.lost, vec!["b"]);
        assert_eq!(bad.strangers, vec!["c"], "a key seen but never applied is no stranger");
        assert_eq!(bad.cloud_duplicates, 1);
        // A report without the cloud's own count never passes for a clean one.
        let no_count = serde_json::json!({"keys": {"a": {"effects": 1}, "b": {"effects": 1}}});
        assert_eq!(Effects::of(&accepted, &no_count).unwrap().cloud_duplicates, u64::MAX);
        assert!(Effects::of(&accepted, &serde_json::json!({})).is_err());
    }
}
