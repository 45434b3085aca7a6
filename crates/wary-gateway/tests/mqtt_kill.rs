//! End to end over MQTT: devices publish readings to mosquitto, two `wary-gateway` processes
//! share the subscription and forward to the fault cloud, one is SIGKILLed with messages in
//! flight and restarted under its client id while readings keep arriving. Every reading the
//! broker accepted (PUBACK 0x00) is applied upstream exactly once, and nothing else is.
//!
//! The broker runs with the deployment's settings (docs/deployment.md): `max_queued_messages 0`
//! (no per-session limit, so a session whose replica is away loses nothing), persistent
//! sessions, and the replica restarted under the same id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::PubAckReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wary_cloud::{Cloud, Faults};
use wary_fixtures::mosquitto::Settings;

#[path = "common/mqtt.rs"]
mod mqtt;
use mqtt::{Device, key};

const BIN: &str = env!("CARGO_BIN_EXE_wary-gateway");
const DEVICES: [u64; 4] = [0xd1, 0xd2, 0xd3, 0xd4];
const PER_DEVICE: u32 = 100;

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

/// The replicas' policy: the default, with the upstream pace's floor at 100 requests a second.
/// The replicas run with the pace and breaker on (their default, asked for explicitly here), but
/// this cloud answers one request in ten with 503 at random, which the pace reads as overload and
/// cuts toward its 5 a second floor: draining the 400 readings that way takes far longer, and
/// this test is about the kill.
const POLICY: &str = r#"{"pace":{"floor_milli":100000}}"#;

fn replica(broker: u16, upstream: &str, id: &str, metrics: u16, policy: &std::path::Path) -> Child {
    Command::new(BIN)
        .args(["--mqtt", &format!("127.0.0.1:{broker}"), "--mqtt-client-id", id])
        .arg("--upstream-pacing")
        .arg("--policy")
        .arg(policy)
        .args(["--mqtt-password-env", "WARY_TEST_MQTT_PASSWORD", "--upstream", upstream])
        .args(["--metrics", &format!("127.0.0.1:{metrics}"), "--workers", "8", "--threads", "1"])
        .env("WARY_TEST_MQTT_PASSWORD", mqtt::GATEWAY_PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `wary_gateway_mqtt_<name>` from a replica's `/metrics`, if it answers.
async fn metric(port: u16, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: m\r\n\r\n").await.ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let prefix = format!("wary_gateway_mqtt_{name} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}

async fn until_metric(port: u16, name: &str, at_least: u64) {
    for _ in 0..200 {
        if metric(port, name).await.is_some_and(|v| v >= at_least) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name} never reached {at_least} on :{port}");
}

fn stderr_of(mut child: Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    err
}

#[tokio::test]
async fn a_replica_killed_mid_stream_loses_and_duplicates_nothing() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        let faults = "503=0.1,drop_after_effect=0.05,slow=0.3:ms=400,seed=11".parse::<Faults>().unwrap();
        let cloud = Cloud::start("127.0.0.1:0", faults).await.unwrap();
        let settings = Settings { max_queued_messages: 0, ..Settings::default() };
        let (broker, dir) = mqtt::broker("kill", &DEVICES, &settings);
        let port = broker.port();
        let upstream = cloud.url("");
        let (m1, m2, m1b) = (free_port().await, free_port().await, free_port().await);
        let policy = dir.join("policy.json");
        std::fs::write(&policy, POLICY).unwrap();
        let mut gw1 = replica(port, &upstream, "gw-1", m1, &policy);
        let gw2 = replica(port, &upstream, "gw-2", m2, &policy);
        until_metric(m1, "connects_total", 1).await;
        until_metric(m2, "connects_total", 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;

        // Devices publish as the firmware does: a reading is accepted when the broker says 0x00;
        // without a PUBACK it is sent again with the same key.
        let accepted = Arc::new(Mutex::new(BTreeSet::new()));
        let published = Arc::new(Mutex::new(BTreeSet::new()));
        let mut publishers = Vec::new();
        for id in DEVICES {
            let (accepted, published) = (accepted.clone(), published.clone());
            publishers.push(tokio::spawn(async move {
                let mut dev = Device::connect(port, id).await;
                for s in 0..PER_DEVICE {
                    let k = key(id, 1, s);
                    let body = format!("{{\"device\":\"{id:x}\",\"seq\":{s},\"t\":21.5}}");
                    loop {
                        published.lock().unwrap().insert(k.clone());
                        match dev.publish(&k, body.as_bytes()).await {
                            Some(PubAckReason::Success) => break,
                            other => {
                                eprintln!("resend {k}: {other:?}");
                                dev = Device::connect(port, id).await;
                            }
                        }
                    }
                    accepted.lock().unwrap().insert(k);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }));
        }

        // Kill gw-1 once it holds messages it has not acknowledged.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let mut in_flight = 0;
        for _ in 0..200 {
            let (r, a) = (metric(m1, "received_total").await, metric(m1, "acked_total").await);
            if let (Some(r), Some(a)) = (r, a)
                && r > a
            {
                in_flight = r - a;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        gw1.kill().unwrap(); // SIGKILL
        gw1.wait().unwrap();
        let killed_err = stderr_of(gw1);
        assert!(in_flight > 0, "gw-1 never held an unacknowledged message");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let gw1b = replica(port, &upstream, "gw-1", m1b, &policy);
        until_metric(m1b, "connects_total", 1).await;

        for p in publishers {
            p.await.unwrap();
        }
        let accepted = accepted.lock().unwrap().clone();
        let published = published.lock().unwrap().clone();
        assert_eq!(accepted.len(), DEVICES.len() * PER_DEVICE as usize);
        // Everything accepted reaches the cloud (calls that gave up are made again).
        let mut missing = accepted.len();
        for _ in 0..400 {
            let report = cloud.report();
            missing = accepted.iter().filter(|k| report.keys.get(*k).is_none_or(|s| s.effects == 0)).count();
            if missing == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the last acknowledgements go out before reading the figures.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let report = cloud.report();
        let duplicates = report.keys.values().filter(|s| s.effects > 1).count();
        let lost = accepted.iter().filter(|k| report.keys.get(*k).is_none_or(|s| s.effects == 0)).count();
        let strangers = report.keys.keys().filter(|k| !published.contains(*k)).count();
        let redelivered = metric(m1b, "redelivered_total").await.unwrap();
        let resumed = metric(m1b, "sessions_resumed_total").await.unwrap();
        let (r1b, r2) = (metric(m1b, "received_total").await.unwrap(), metric(m2, "received_total").await.unwrap());
        let called_again = metric(m1b, "called_again_total").await.unwrap() + metric(m2, "called_again_total").await.unwrap();
        println!(
            "mqtt kill: {} readings accepted; gw-1 killed holding {in_flight} unacknowledged; restarted gw-1 resumed its session ({resumed}) and got {redelivered} redelivered (DUP) of {r1b} received; gw-2 received {r2}; {called_again} calls made again after a give-up; cloud: {} requests, {} replays answered from its store, faults {:?}",
            accepted.len(),
            report.cloud.requests,
            report.cloud.replays,
            report.cloud.faults_injected,
        );
        println!("duplicates {duplicates}, lost {lost}");
        let err1b = stderr_of(gw1b);
        let err2 = stderr_of(gw2);
        for err in [&killed_err, &err1b, &err2] {
            assert!(!err.contains("\"seq\""), "a payload reached the log");
            assert!(!err.contains(mqtt::GATEWAY_PASSWORD), "the password reached the log");
        }
        assert_eq!(duplicates, 0);
        assert_eq!((lost, missing), (0, 0));
        assert_eq!(strangers, 0, "the cloud applied a key nobody published");
        assert_eq!(resumed, 1, "the restarted replica did not find its session");
        assert!(redelivered > 0, "the killed replica's messages were not redelivered to its id");
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// The MQTT flags are checked before anything starts: a client id is required (a replica must
/// come back under the one it had), the password comes from a file or a variable, the HTTP
/// device side's flags do not mix with `--mqtt`, and `--mqtt-ca` must hold a CA certificate.
#[test]
fn the_mqtt_flags_are_checked_at_start() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let up = ["--upstream", "http://127.0.0.1:9", "--no-metrics"];
    let (ok, err) = run(&[&up[..], &["--mqtt", "127.0.0.1:1"]].concat());
    assert!(!ok && err.contains("--mqtt-client-id"), "{err}");
    let (ok, err) = run(&[&up[..], &["--mqtt", "127.0.0.1:1", "--mqtt-client-id", "gw-1"]].concat());
    assert!(!ok && err.contains("--mqtt-password-file or --mqtt-password-env"), "{err}");
    let (ok, err) = run(&[
        &up[..],
        &["--mqtt", "127.0.0.1:1", "--mqtt-client-id", "gw-1", "--insecure-no-auth"],
    ]
    .concat());
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, err) = run(&[&up[..], &["--mqtt", "no-port", "--mqtt-client-id", "gw-1"]].concat());
    assert!(!ok && err.contains("HOST:PORT"), "{err}");
    // A CA file that holds no certificate stops the start; its content is not quoted.
    let not_pem = std::env::temp_dir().join(format!("wary-gw-not-a-ca-{}", std::process::id()));
    std::fs::write(&not_pem, "secret-looking bytes, not a certificate").unwrap();
    let password = std::env::temp_dir().join(format!("wary-gw-pw-{}", std::process::id()));
    std::fs::write(&password, "pw").unwrap();
    let (ok, err) = run(&[
        &up[..],
        &["--mqtt", "127.0.0.1:1", "--mqtt-client-id", "gw-1", "--mqtt-password-file"],
        &[password.to_str().unwrap(), "--mqtt-ca", not_pem.to_str().unwrap()],
    ]
    .concat());
    assert!(!ok && err.contains("no readable PEM CA certificate") && !err.contains("secret"), "{err}");
    let _ = std::fs::remove_file(not_pem);
    let _ = std::fs::remove_file(password);
}
