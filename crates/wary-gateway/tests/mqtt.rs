//! The MQTT ingress against mosquitto and the test cloud: what it forwards, what it refuses, and
//! when it acknowledges.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::PubAckReason;
use wary_cloud::{Cloud, Faults};
use wary_fixtures::mosquitto::Settings;
use wary_gateway::mqtt::{Ingress, MqttConfig, MqttCounts, Refusal};
use wary_gateway::{Config, Gateway};
use wary_host::spec::PolicySpec;

#[path = "common/mqtt.rs"]
mod mqtt;
use mqtt::{Device, key};

const LIMIT: Duration = Duration::from_secs(40);

fn gateway(base: &str) -> Arc<Gateway> {
    gateway_with(base, 500)
}

/// A gateway whose attempts may take `attempt_ms`, with a short wait budget.
fn gateway_with(base: &str, attempt_ms: u64) -> Arc<Gateway> {
    let mut c = Config::new(base);
    c.policy = PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(300),
        deadline: Some(attempt_ms * 2),
        min_attempt: Some(50),
        ..PolicySpec::default()
    };
    c.upstream.attempt_timeout = Duration::from_millis(attempt_ms);
    c.fleet_max_tokens = 1000;
    c.fleet_ratio_milli = 1000;
    c.seed = Some(7);
    c.auth = wary_gateway::Auth::Open;
    Arc::new(Gateway::start(c, Box::new(std::io::sink())).unwrap())
}

fn ingress(gw: &Arc<Gateway>, port: u16, id: &str) -> Ingress {
    Ingress::start(gw.clone(), &MqttConfig::new("127.0.0.1", port, id, mqtt::GATEWAY_PASSWORD))
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

fn get(c: &MqttCounts, f: impl Fn(&MqttCounts) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(c).load(Ordering::Relaxed)
}

/// Good readings land once each; a message without a key, with another device's key or with a
/// payload that is not JSON is acknowledged, counted by reason and never forwarded; and what was
/// acknowledged is not delivered again to the same client id.
#[tokio::test]
async fn good_readings_land_and_bad_messages_are_refused_and_acknowledged() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (broker, dir) = mqtt::broker("refuse", &[0xa1], &Settings::default());
        let port = broker.port();
        let gw = gateway(&cloud.url(""));
        let ing = ingress(&gw, port, "gw-1");
        let c = ing.counts().clone();
        until("connected", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        let topic = format!("wary/{}/readings", mqtt::hex(0xa1));
        for s in 0..5 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{\"t\":1}").await, Some(PubAckReason::Success));
        }
        assert_eq!(dev.publish_on(&topic, None, b"{}").await, Some(PubAckReason::Success));
        assert_eq!(dev.publish(&key(0xb2, 1, 0), b"{}").await, Some(PubAckReason::Success));
        assert_eq!(dev.publish(&key(0xa1, 1, 9), b"not json").await, Some(PubAckReason::Success));
        until("every message acknowledged", || get(&c, |c| &c.acked) == 8).await;
        assert_eq!(get(&c, |c| &c.landed), 5);
        assert_eq!(c.refused(Refusal::NoKey), 1);
        assert_eq!(c.refused(Refusal::Forbidden), 1);
        assert_eq!(c.refused(Refusal::NotJson), 1);
        let stats = cloud.stats();
        assert_eq!(stats.keys, 5);
        assert_eq!(stats.effects_total, 5);
        assert!(cloud.key_stats(&key(0xb2, 1, 0)).is_none());
        assert!(gw.prometheus().contains("wary_gateway_mqtt_refused_total{reason=\"forbidden\"} 1\n"));
        // The same replica again: its session is kept, and nothing acknowledged comes back.
        // `acked` counts acknowledgements handed to the client; give its event loop a moment to
        // write them before the replica goes (dropping it is a crash: a PUBACK still queued then
        // is never sent, and the broker rightly delivers that message again).
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(ing);
        let again = ingress(&gw, port, "gw-1");
        let c2 = again.counts().clone();
        until("reconnected", || get(&c2, |c| &c.sessions_resumed) == 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(get(&c2, |c| &c.received), 0);
        assert_eq!(cloud.stats().requests, 5);
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// A message is acknowledged only after its verdict: while the upstream answers 503 the calls
/// give up and are made again (same key), nothing is acknowledged, and once it recovers each
/// reading lands once and every acknowledgement goes out.
#[tokio::test]
async fn a_call_that_gave_up_is_made_again_and_acknowledged_only_after_it_lands() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", "503=1.0".parse::<Faults>().unwrap()).await.unwrap();
        let (broker, dir) = mqtt::broker("giveup", &[0xa1], &Settings::default());
        let port = broker.port();
        let gw = gateway(&cloud.url(""));
        let ing = ingress(&gw, port, "gw-1");
        let c = ing.counts().clone();
        until("connected", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        for s in 0..3 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{\"t\":1}").await, Some(PubAckReason::Success));
        }
        until("each call gave up and was made again", || get(&c, |c| &c.called_again) >= 3).await;
        assert_eq!(get(&c, |c| &c.acked), 0, "acknowledged before a verdict");
        assert_eq!(get(&c, |c| &c.landed), 0);
        cloud.set_faults(Faults::none()).unwrap();
        until("all acknowledged", || get(&c, |c| &c.acked) == 3).await;
        assert_eq!(get(&c, |c| &c.landed), 3);
        let stats = cloud.stats();
        assert_eq!((stats.keys, stats.effects_total), (3, 3));
        assert!(stats.requests > 6, "the 503s were attempts: {}", stats.requests);
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// A message held because the upstream refuses the gateway's credential (401) is never
/// acknowledged while it is held, as a give-up is not: the broker keeps it. Once the credential
/// is good again each reading lands once and is acknowledged.
#[tokio::test]
async fn a_message_held_by_an_upstream_refusing_the_gateway_is_not_acknowledged() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", "outage=0:ms=3000:status=401".parse::<Faults>().unwrap())
            .await
            .unwrap();
        let (broker, dir) = mqtt::broker("held", &[0xa1], &Settings::default());
        let port = broker.port();
        let gw = gateway(&cloud.url(""));
        let ing = ingress(&gw, port, "gw-1");
        let c = ing.counts().clone();
        until("connected", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        for s in 0..3 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{\"t\":1}").await, Some(PubAckReason::Success));
        }
        until("each call held", || get(&c, |c| &c.held) >= 3).await;
        assert_eq!(get(&c, |c| &c.acked), 0, "acknowledged while held");
        assert_eq!((get(&c, |c| &c.failed), get(&c, |c| &c.landed)), (0, 0));
        assert!(gw.prometheus().contains("wary_gateway_held_total{status=\"401\"}"));
        assert!(gw.prometheus().contains("\nwary_gateway_mqtt_held_total "));
        until("all acknowledged", || get(&c, |c| &c.acked) == 3).await;
        assert_eq!((get(&c, |c| &c.landed), get(&c, |c| &c.failed)), (3, 0));
        let stats = cloud.stats();
        assert_eq!((stats.keys, stats.effects_total), (3, 3));
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// Acknowledgements go out in arrival order: a slow call holds back the acknowledgements of
/// the messages behind it, whose calls already landed.
#[tokio::test]
async fn acknowledgements_wait_for_the_oldest_message() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (broker, dir) = mqtt::broker("order", &[0xa1], &Settings::default());
        let port = broker.port();
        let gw = gateway_with(&cloud.url(""), 4_000);
        let ing = ingress(&gw, port, "gw-1");
        let c = ing.counts().clone();
        until("connected", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The first reading meets an upstream that stalls every request for 1.5 s, then the
        // others meet a quick one.
        cloud.set_faults("slow=1.0:ms=1500".parse::<Faults>().unwrap()).unwrap();
        let mut dev = Device::connect(port, 0xa1).await;
        assert_eq!(dev.publish(&key(0xa1, 1, 0), b"{}").await, Some(PubAckReason::Success));
        until("the first call is upstream", || cloud.stats().requests == 1).await;
        cloud.set_faults(Faults::none()).unwrap();
        for s in 1..4 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{}").await, Some(PubAckReason::Success));
        }
        until("the later three landed", || get(&c, |c| &c.landed) == 3).await;
        assert_eq!(get(&c, |c| &c.acked), 0, "a later message was acknowledged before the first");
        until("all four acknowledged", || get(&c, |c| &c.acked) == 4).await;
        assert_eq!(get(&c, |c| &c.landed), 4);
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// The broker restarted between two bursts: the ingress reconnects (paced by its backoff), finds
/// its session kept, and every reading of both bursts lands once.
#[tokio::test]
async fn a_broker_restart_is_ridden_out_with_the_session_kept() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (mut broker, dir) = mqtt::broker("restart", &[0xa1], &Settings::default());
        let port = broker.port();
        let gw = gateway(&cloud.url(""));
        let ing = ingress(&gw, port, "gw-1");
        let c = ing.counts().clone();
        until("connected", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        for s in 0..5 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{}").await, Some(PubAckReason::Success));
        }
        until("the first burst acknowledged", || get(&c, |c| &c.acked) == 5).await;
        broker.restart().unwrap();
        until("reconnected to the kept session", || get(&c, |c| &c.sessions_resumed) == 1).await;
        let mut dev = Device::connect(port, 0xa1).await;
        for s in 5..10 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{}").await, Some(PubAckReason::Success));
        }
        until("the second burst landed", || cloud.stats().keys == 10).await;
        until("everything received acknowledged", || get(&c, |c| &c.acked) == get(&c, |c| &c.received)).await;
        println!("broker restart: {:?}", wary_gateway::mqtt::snapshot(&c));
        assert_eq!(get(&c, |c| &c.connects), 2);
        let stats = cloud.stats();
        assert_eq!((stats.keys, stats.effects_total), (10, 10));
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// Retiring a replica id: while gw-2 is away its turns queue in its session; `leave` takes
/// them, forwards them, and unsubscribes, after which every reading goes to gw-1. Nothing is
/// lost, and the retired id gets no more turns.
#[tokio::test]
async fn a_replica_that_leaves_takes_its_queue_and_gets_no_more_turns() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let settings = Settings { max_queued_messages: 0, ..Settings::default() };
        let (broker, dir) = mqtt::broker("leave", &[0xa1], &settings);
        let port = broker.port();
        let gw = gateway(&cloud.url(""));
        let one = ingress(&gw, port, "gw-1");
        let two = ingress(&gw, port, "gw-2");
        let (c1, c2) = (one.counts().clone(), two.counts().clone());
        until("both connected", || get(&c1, |c| &c.connects) == 1 && get(&c2, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(two); // gw-2 away, its session kept
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        for s in 0..10 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{}").await, Some(PubAckReason::Success));
        }
        until("gw-1 took its turns", || get(&c1, |c| &c.acked) == 5).await;
        assert_eq!(cloud.stats().keys, 5, "gw-2's turns wait in its session");
        let leaving = ingress(&gw, port, "gw-2");
        let left = leaving.leave(Duration::from_millis(500), Duration::from_secs(10)).await;
        assert_eq!(left, Ok(()));
        assert_eq!(get(leaving.counts(), |c| &c.received), 5);
        assert_eq!(cloud.stats().keys, 10);
        drop(leaving);
        for s in 10..20 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{}").await, Some(PubAckReason::Success));
        }
        until("gw-1 took every new reading", || get(&c1, |c| &c.acked) == 15).await;
        let stats = cloud.stats();
        assert_eq!((stats.keys, stats.effects_total), (20, 20));
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// TLS to the broker (`MqttConfig::tls`, the binary's `--mqtt-ca`): with the CA that issued the
/// broker's certificate the ingress connects over TLS and the readings land; with another CA it
/// never gets past the handshake, so the broker sees no login from it and it receives nothing.
#[tokio::test]
async fn the_ingress_speaks_tls_to_the_broker_and_refuses_one_it_cannot_verify() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let chain = wary_fixtures::tls::TestChain::new().unwrap();
        let other = wary_fixtures::tls::TestChain::new().unwrap();
        let files = std::env::temp_dir().join(format!("wary-gw-mqtt-tls-files-{}", std::process::id()));
        std::fs::create_dir_all(&files).unwrap();
        // The name the ingress dials is an address: the certificate names it.
        let (cert, key_pem) = chain.leaf_pem("127.0.0.1").unwrap();
        std::fs::write(files.join("broker.pem"), cert).unwrap();
        std::fs::write(files.join("broker.key"), key_pem).unwrap();
        std::fs::write(files.join("ca.pem"), chain.root.pem()).unwrap();
        std::fs::write(files.join("other-ca.pem"), other.root.pem()).unwrap();
        let settings = Settings {
            tls: Some((files.join("broker.pem"), files.join("broker.key"))),
            ..Settings::default()
        };
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (broker, dir) = mqtt::broker("tls", &[0xa1], &settings);
        let tls_port = broker.tls_port().unwrap();
        let over_tls = |id: &str, ca: &str| {
            let mut c = MqttConfig::new("127.0.0.1", tls_port, id, mqtt::GATEWAY_PASSWORD);
            c.tls = Some(Arc::new(wary_gateway::tls::client_config(&files.join(ca)).unwrap()));
            c
        };
        let wrong_gw = gateway(&cloud.url(""));
        let wrong = Ingress::start(wrong_gw.clone(), &over_tls("gw-wrong-ca", "other-ca.pem"));
        let gw = gateway(&cloud.url(""));
        let ing = Ingress::start(gw.clone(), &over_tls("gw-1", "ca.pem"));
        let c = ing.counts().clone();
        until("connected over TLS", || get(&c, |c| &c.connects) == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(broker.port(), 0xa1).await;
        for s in 0..3 {
            assert_eq!(dev.publish(&key(0xa1, 1, s), b"{\"t\":1}").await, Some(PubAckReason::Success));
        }
        until("every reading landed", || get(&c, |c| &c.landed) == 3).await;
        assert_eq!(cloud.stats().effects_total, 3);
        let w = wrong.counts().clone();
        assert_eq!(get(&w, |c| &c.connects), 0, "no CONNACK for a broker the CA does not vouch for");
        assert_eq!(get(&w, |c| &c.received), 0);
        let log = std::fs::read_to_string(broker.dir().join("mosquitto.log")).unwrap();
        assert!(log.contains("as gw-1"), "the good replica logged in: {log}");
        assert!(!log.contains("as gw-wrong-ca"), "the wrong-CA replica never sent its login: {log}");
        drop((ing, wrong, broker));
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(files);
    })
    .await
    .expect("test took too long");
}
