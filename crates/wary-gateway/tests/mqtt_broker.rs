//! What mosquitto 2.0 does with a shared subscription, observed: the facts the MQTT ingress's
//! deployment rests on (docs/deployment.md, "MQTT: what the broker does").
//!
//! Each test starts its own broker (`wary_fixtures::mosquitto`), publishes as a device and
//! watches bare members of the group (manual acknowledgements, persistent sessions). A member
//! that "vanishes" closes its socket without a DISCONNECT, which is what the broker sees when
//! a process is killed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::collections::BTreeSet;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::PubAckReason;
use wary_fixtures::mosquitto::Settings;

#[path = "common/mqtt.rs"]
mod mqtt;
use mqtt::{Device, Member, key, key_of};

const QUIET: Duration = Duration::from_millis(600);
const LIMIT: Duration = Duration::from_secs(40);

async fn publish_all(dev: &mut Device, keys: &[String]) {
    for k in keys {
        assert_eq!(dev.publish(k, b"{\"t\":1}").await, Some(PubAckReason::Success), "{k}");
    }
}

fn keys(device: u64, boot: u32, n: u32) -> Vec<String> {
    (0..n).map(|s| key(device, boot, s)).collect()
}

fn set(ps: &[rumqttc::v5::mqttbytes::v5::Publish]) -> BTreeSet<String> {
    ps.iter().map(key_of).collect()
}

/// Shared subscriptions are served round-robin over the group's sessions, whether their
/// client is connected or not: a member that is away still gets its turn, and its share waits
/// in its session until it comes back.
#[tokio::test]
async fn round_robin_counts_sessions_whose_client_is_away() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let (broker, dir) = mqtt::broker("rr", &[0xa1], &Settings::default());
        let port = broker.port();
        let (mut a, _) = Member::join(port, "rr-a", "g").await;
        let (b, _) = Member::join(port, "rr-b", "g").await;
        b.vanish();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut dev = Device::connect(port, 0xa1).await;
        let sent = keys(0xa1, 1, 10);
        publish_all(&mut dev, &sent).await;
        let to_a = a.drain(QUIET).await;
        for p in &to_a {
            a.ack(p).await;
        }
        let (mut b, mut to_b) = Member::join(port, "rr-b", "g").await;
        to_b.extend(b.drain(QUIET).await);
        println!(
            "round robin, one member away: {} to the connected member, {} kept for the away one",
            to_a.len(),
            to_b.len()
        );
        assert_eq!(to_a.len(), 5, "the connected member got every other message");
        assert_eq!(to_b.len(), 5);
        let (sa, sb) = (set(&to_a), set(&to_b));
        assert!(sa.is_disjoint(&sb));
        assert_eq!(sa.union(&sb).cloned().collect::<BTreeSet<_>>(), sent.iter().cloned().collect());
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// A member killed with messages unacknowledged: the broker gives them to nobody else in the
/// group, not even a member that is connected and idle; they come back (DUP set) only when a
/// client with the same id resumes the session.
#[tokio::test]
async fn unacknowledged_messages_return_only_to_the_same_client_id() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let (broker, dir) = mqtt::broker("unacked", &[0xa1], &Settings::default());
        let port = broker.port();
        let (mut a, _) = Member::join(port, "un-a", "g").await;
        let (mut b, _) = Member::join(port, "un-b", "g").await;
        let mut dev = Device::connect(port, 0xa1).await;
        publish_all(&mut dev, &keys(0xa1, 1, 10)).await;
        let held = a.drain(QUIET).await;
        let mut to_b = b.drain(QUIET).await;
        for p in &to_b {
            b.ack(p).await;
        }
        assert_eq!(held.len() + to_b.len(), 10);
        assert!(!held.is_empty() && held.iter().all(|p| !p.dup));
        // a is killed holding its messages; b is connected and has room for all of them.
        a.vanish();
        to_b.extend(b.drain(QUIET).await);
        publish_all(&mut dev, &keys(0xa1, 2, 4)).await;
        let later = b.drain(QUIET).await;
        for p in &later {
            b.ack(p).await;
        }
        let (mut a, mut back) = Member::join(port, "un-a", "g").await;
        back.extend(a.drain(QUIET).await);
        let redelivered: Vec<_> = back.iter().filter(|p| p.dup).collect();
        println!(
            "killed member held {}; the other member got {} of them; same id back: {} redelivered with DUP, {} queued meanwhile; {} new to the other member",
            held.len(),
            set(&to_b).intersection(&set(&held)).count(),
            redelivered.len(),
            back.len() - redelivered.len(),
            later.len()
        );
        assert!(set(&to_b).is_disjoint(&set(&held)), "the other member got a killed member's message");
        assert!(set(&later).is_disjoint(&set(&held)));
        assert_eq!(redelivered.iter().map(|p| key_of(p)).collect::<BTreeSet<_>>(), set(&held));
        // New messages kept their round-robin turn while a was away.
        assert_eq!(later.len() + back.len() - redelivered.len(), 4);
        assert!(back.len() > redelivered.len(), "nothing queued for the away member");
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}

/// Messages for a session whose client is away queue up to `max_queued_messages` beyond what
/// the session may have in flight; past that mosquitto drops them, and their publisher still got
/// PUBACK 0x00. With `max_queued_messages 0` (no limit) the same run loses nothing.
#[tokio::test]
async fn a_dead_sessions_queue_drops_past_its_limit_after_puback_success() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let mut seen = Vec::new();
        for limit in [5u32, 0] {
            let settings = Settings { max_queued_messages: limit, ..Settings::default() };
            let (broker, dir) = mqtt::broker(&format!("queue{limit}"), &[0xa1], &settings);
            let port = broker.port();
            let (a, _) = Member::join(port, "q-a", "g").await;
            a.vanish();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut dev = Device::connect(port, 0xa1).await;
            let sent = keys(0xa1, 1, 60);
            // Every publish is acknowledged 0x00 (asserted inside).
            publish_all(&mut dev, &sent).await;
            let (mut a, mut got) = Member::join(port, "q-a", "g").await;
            for p in &got {
                a.client.try_ack(p).unwrap();
            }
            got.extend(a.drain_acking(QUIET).await);
            println!(
                "max_queued_messages {limit}: 60 published, all PUBACK 0x00; {} delivered on return",
                got.len()
            );
            seen.push(got.len());
            drop(broker);
            let _ = std::fs::remove_dir_all(dir);
        }
        // Away, the whole session holds `max_queued_messages`: nothing extra for the in-flight
        // window the member would have had connected.
        assert_eq!(seen, [5, 60]);
    })
    .await
    .expect("test took too long");
}

/// The same limit holds for a member that is connected but has its whole in-flight window
/// unacknowledged (a gateway waiting on a slow or failing upstream): beyond the window, its
/// turns queue up to `max_queued_messages` and the rest are dropped after PUBACK 0x00.
#[tokio::test]
async fn a_full_window_queues_up_to_the_same_limit() {
    if !mqtt::have_mosquitto() {
        return;
    }
    tokio::time::timeout(LIMIT, async {
        let settings = Settings { max_queued_messages: 5, ..Settings::default() };
        let (broker, dir) = mqtt::broker("window", &[0xa1], &settings);
        let port = broker.port();
        let (mut a, _) = Member::join(port, "w-a", "g").await;
        let mut dev = Device::connect(port, 0xa1).await;
        publish_all(&mut dev, &keys(0xa1, 1, 60)).await;
        let window = a.drain(QUIET).await;
        for p in &window {
            a.client.try_ack(p).unwrap();
        }
        let rest = a.drain_acking(QUIET).await;
        println!(
            "max_queued_messages 5, member connected, acknowledging nothing: {} in flight, {} more after it acknowledged, {} of 60 dropped",
            window.len(),
            rest.len(),
            60 - window.len() - rest.len()
        );
        assert_eq!(window.len(), 20, "mosquitto's in-flight default");
        assert_eq!(rest.len(), 5);
        drop(broker);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test took too long");
}
