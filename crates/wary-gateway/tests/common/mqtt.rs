//! MQTT helpers for the gateway's tests: a device that publishes readings as the firmware does
//! (MQTT 5, QoS 1, the key as the `Idempotency-Key` user property), and a bare subscriber for
//! observing what the broker does.

// Each test file uses its own part of these helpers.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use wary_fixtures::mosquitto::{Broker, GATEWAY_USER, Login, MOSQUITTO, Settings};

pub const GATEWAY_PASSWORD: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A device's id as 16 hex digits.
pub fn hex(device: u64) -> String {
    format!("{device:016x}")
}

/// A device's token (64 hex digits, made from its id: tests only).
pub fn token(device: u64) -> String {
    format!("{device:016x}").repeat(4)
}

/// A reading's key.
pub fn key(device: u64, boot: u32, seq: u32) -> String {
    format!("{device:016x}{boot:08x}{seq:08x}")
}

/// True if mosquitto is installed (the tests say they skip otherwise).
pub fn have_mosquitto() -> bool {
    let ok = Path::new(MOSQUITTO).exists();
    if !ok {
        eprintln!("skipped: {MOSQUITTO} is not installed (cargo xtask ci installs it)");
    }
    ok
}

/// A broker in a fresh directory with logins for `devices` and the gateway.
pub fn broker(name: &str, devices: &[u64], settings: &Settings) -> (Broker, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("wary-gw-mqtt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut logins: Vec<Login> = devices.iter().map(|d| Login::new(hex(*d), token(*d))).collect();
    logins.push(Login::new(GATEWAY_USER, GATEWAY_PASSWORD));
    (Broker::start(&dir, &logins, settings).unwrap(), dir)
}

/// A device connected to the broker, publishing one reading at a time.
pub struct Device {
    pub id: u64,
    client: AsyncClient,
    events: EventLoop,
}

impl Device {
    /// Connects as `id` (clean start: a device's session is not the point here).
    pub async fn connect(port: u16, id: u64) -> Device {
        let mut o = MqttOptions::new(format!("dev-{}", hex(id)), "127.0.0.1", port);
        o.set_credentials(hex(id), token(id)).set_keep_alive(Duration::from_secs(30));
        let (client, events) = AsyncClient::new(o, 16);
        Device { id, client, events }
    }

    /// Publishes `body` with `key` on `topic` and waits for its PUBACK: its reason, or `None`
    /// if the connection broke first (not accepted: the device would send it again).
    pub async fn publish_on(&mut self, topic: &str, key: Option<&str>, body: &[u8]) -> Option<PubAckReason> {
        let props = PublishProperties {
            payload_format_indicator: Some(1),
            content_type: Some("application/json".to_owned()),
            user_properties: key
                .map(|k| vec![("Idempotency-Key".to_owned(), k.to_owned())])
                .unwrap_or_default(),
            ..PublishProperties::default()
        };
        self.client
            .publish_with_properties(topic, QoS::AtLeastOnce, false, Bytes::copy_from_slice(body), props)
            .await
            .ok()?;
        let wait = async {
            loop {
                match self.events.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(ack))) => return Some(ack.reason),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), wait).await.ok().flatten()
    }

    /// [`Device::publish_on`] on the device's own topic.
    pub async fn publish(&mut self, key: &str, body: &[u8]) -> Option<PubAckReason> {
        let topic = format!("wary/{}/readings", hex(self.id));
        self.publish_on(&topic, Some(key), body).await
    }
}

/// A bare member of a shared subscription, logged in as the gateway, with manual acks: what it
/// receives, and it acknowledges only when told.
pub struct Member {
    pub client: AsyncClient,
    events: EventLoop,
}

impl Member {
    /// Connects as `client_id` with a persistent session (clean start off, a session expiry) and
    /// subscribes to `$share/<group>/wary/+/readings`; returns once the broker has answered the
    /// subscription, with whatever it delivered meanwhile.
    pub async fn join(port: u16, client_id: &str, group: &str) -> (Member, Vec<Publish>) {
        let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
        o.set_credentials(GATEWAY_USER, GATEWAY_PASSWORD)
            .set_clean_start(false)
            .set_session_expiry_interval(Some(3600))
            .set_manual_acks(true)
            .set_keep_alive(Duration::from_secs(30));
        let (client, events) = AsyncClient::new(o, 256);
        let mut m = Member { client, events };
        m.client.subscribe(wary_gateway::mqtt::subscription(group), QoS::AtLeastOnce).await.unwrap();
        let mut got = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), m.events.poll()).await {
                Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => break,
                Ok(Ok(Event::Incoming(Packet::Publish(p)))) => got.push(p),
                Ok(Ok(_)) => {}
                other => panic!("no SUBACK: {other:?}"),
            }
        }
        (m, got)
    }

    /// What arrives within `quiet` of the last message (without acknowledging any).
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Publish> {
        let mut got = Vec::new();
        while let Ok(r) = tokio::time::timeout(quiet, self.events.poll()).await {
            match r {
                Ok(Event::Incoming(Packet::Publish(p))) => got.push(p),
                Ok(_) => {}
                Err(e) => panic!("member lost its connection: {e:?}"),
            }
        }
        got
    }

    /// What arrives within `quiet` of the last message, each acknowledged as it comes (so the
    /// broker's in-flight window never stops it).
    pub async fn drain_acking(&mut self, quiet: Duration) -> Vec<Publish> {
        let mut got = Vec::new();
        while let Ok(r) = tokio::time::timeout(quiet, self.events.poll()).await {
            match r {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    self.client.try_ack(&p).unwrap();
                    got.push(p);
                }
                Ok(_) => {}
                Err(e) => panic!("member lost its connection: {e:?}"),
            }
        }
        got
    }

    /// Acknowledges `p` and lets the event loop send it.
    pub async fn ack(&mut self, p: &Publish) {
        self.client.ack(p).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_millis(50), self.events.poll()).await;
    }

    /// Leaves without a DISCONNECT (the socket closed, as when the process is killed): the
    /// session stays on the broker.
    pub fn vanish(self) {
        drop(self);
    }
}

/// The key of a delivered reading.
pub fn key_of(p: &Publish) -> String {
    p.properties
        .as_ref()
        .and_then(|pr| pr.user_properties.iter().find(|(n, _)| n == "Idempotency-Key"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}
