//! `POST /readings/batch` (docs/batches.md): each item checked as a single reading is, forwarded
//! upstream as a keyed POST of its own, answered by its place in the batch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use wary_cloud::{Cloud, Faults};
use wary_gateway::admission::Limits;
use wary_gateway::{Auth, Config, Credentials, Gateway};
use wary_host::batch::{Item, ItemAnswer, encode, parse_answers};
use wary_host::spec::PolicySpec;

const TEST_LIMIT: Duration = Duration::from_secs(30);

struct Device {
    id: u64,
    token: String,
    line: String,
}

fn device(id: u64) -> Device {
    let (token, line) = Credentials::issue(id);
    Device { id, token, line }
}

fn key(device: u64, boot: u32, seq: u32) -> String {
    format!("{device:016x}{boot:08x}{seq:08x}")
}

fn config(base: &str, devices: &[&Device]) -> Config {
    let mut c = Config::new(base);
    c.policy = PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(1_000),
        deadline: Some(3_000),
        min_attempt: Some(50),
        ..PolicySpec::default()
    };
    c.upstream.attempt_timeout = Duration::from_millis(500);
    c.fleet_max_tokens = 1000;
    c.fleet_ratio_milli = 1000;
    c.workers = 8;
    c.queue = 64;
    c.seed = Some(7);
    let lines = devices.iter().map(|d| d.line.as_str()).collect::<Vec<_>>().join("\n");
    c.auth = Auth::Bearer(Arc::new(lines.parse().unwrap()));
    c
}

async fn gateway(config: Config) -> (Arc<Gateway>, SocketAddr) {
    let gw = Arc::new(Gateway::start(config, Box::new(std::io::sink())).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    (gw, addr)
}

/// Posts a batch of `keys` (bodies `{"n":i}`); the status and the answers when it is 200.
async fn post_batch(addr: SocketAddr, token: Option<&str>, keys: &[String]) -> (StatusCode, Vec<ItemAnswer>) {
    let items: Vec<Item> = keys
        .iter()
        .enumerate()
        .map(|(n, k)| Item { key: k.clone(), body: format!("{{\"n\":{n}}}").into_bytes() })
        .collect();
    post_raw(addr, token, encode(&items)).await
}

async fn post_raw(addr: SocketAddr, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Vec<ItemAnswer>) {
    let mut b =
        Request::post(format!("http://{addr}/readings/batch")).header("content-type", "application/json");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = client.request(b.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let answers = if status == StatusCode::OK { parse_answers(&body).unwrap() } else { vec![] };
    (status, answers)
}

fn statuses(a: &[ItemAnswer]) -> Vec<u16> {
    a.iter().map(|a| a.status).collect()
}

#[tokio::test]
async fn items_go_upstream_one_by_one_and_are_answered_in_order() {
    tokio::time::timeout(TEST_LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::default()).await.unwrap();
        let (a, b) = (device(0xa1), device(0xb2));
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a, &b])).await;
        // Item 2 is another device's key, item 3 is not a key at all: refused in place, never sent.
        let keys = [key(a.id, 1, 1), key(a.id, 1, 2), key(b.id, 1, 1), "no key".to_owned(), key(a.id, 1, 3)];
        let (status, answers) = post_batch(addr, Some(&a.token), &keys).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(statuses(&answers), [201, 201, 403, 400, 201]);
        // Upstream: three single keyed POSTs, no batch, each key applied once.
        let s = cloud.stats();
        assert_eq!((s.requests, s.keyed_effects, s.batches), (3, 3, 0));
        for k in [&keys[0], &keys[1], &keys[4]] {
            assert_eq!(cloud.key_stats(k).unwrap().effects, 1);
        }
        assert_eq!(cloud.key_stats(&keys[2]), None);
        // The same batch again (a device's resend): replays upstream, nothing applied twice.
        let (_, again) = post_batch(addr, Some(&a.token), &keys).await;
        assert_eq!(statuses(&again), [201, 201, 403, 400, 201]);
        assert_eq!(cloud.stats().keyed_effects, 3);
        assert_eq!(cloud.stats().duplicates.keys, 0);
    })
    .await
    .expect("test took too long");
}

#[tokio::test]
async fn a_batch_without_the_credential_is_refused_whole_and_nothing_is_sent() {
    tokio::time::timeout(TEST_LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::default()).await.unwrap();
        let a = device(0xa1);
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let keys = [key(a.id, 1, 1)];
        assert_eq!(post_batch(addr, None, &keys).await.0, StatusCode::UNAUTHORIZED);
        let wrong = device(0xa1);
        assert_eq!(post_batch(addr, Some(&wrong.token), &keys).await.0, StatusCode::UNAUTHORIZED);
        // Malformed and over the limits: refused whole.
        assert_eq!(post_raw(addr, Some(&a.token), b"[[1,2]]".to_vec()).await.0, StatusCode::BAD_REQUEST);
        let many: Vec<String> = (0..=wary_host::batch::MAX_ITEMS as u32).map(|n| key(a.id, 1, n)).collect();
        assert_eq!(post_batch(addr, Some(&a.token), &many).await.0, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(cloud.stats().requests, 0);
        assert_eq!(gw.metrics().refused.get("unauthenticated"), Some(&2));
    })
    .await
    .expect("test took too long");
}

#[tokio::test]
async fn each_item_takes_its_own_rate_token_and_an_oversized_item_is_413() {
    tokio::time::timeout(TEST_LIMIT, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::default()).await.unwrap();
        let a = device(0xa1);
        let mut c = config(&cloud.url(""), &[&a]);
        c.admission = Limits { rate_per_sec: 1, burst: 3, max_devices: 10 };
        c.max_body = 16;
        let (_gw, addr) = gateway(c).await;
        let big =
            Item { key: key(a.id, 1, 9), body: format!("{{\"pad\":\"{}\"}}", "x".repeat(32)).into_bytes() };
        let mut items: Vec<Item> =
            (0..4).map(|n| Item { key: key(a.id, 1, n), body: b"{\"n\":1}".to_vec() }).collect();
        items.insert(1, big);
        let (status, answers) = post_raw(addr, Some(&a.token), encode(&items)).await;
        assert_eq!(status, StatusCode::OK);
        // Burst 3: items 0, 1 (the big one takes its token, then fails its size), 2 pass the
        // bucket; 3 and 4 are over the device's rate, with a Retry-After.
        assert_eq!(statuses(&answers), [201, 413, 201, 429, 429]);
        assert!(answers[3].retry_after_secs.is_some_and(|s| s >= 1));
        assert_eq!(cloud.stats().keyed_effects, 2);
    })
    .await
    .expect("test took too long");
}

#[tokio::test]
async fn a_partial_success_settles_exactly_the_items_that_landed() {
    tokio::time::timeout(TEST_LIMIT, async {
        let a = device(0xa1);
        let keys: Vec<String> = (0..8).map(|n| key(a.id, 1, n)).collect();
        // Half the keys are refused for good upstream (400, never retried: 424 to the device).
        let cloud = Cloud::start("127.0.0.1:0", "400=0.5,seed=3".parse::<Faults>().unwrap()).await.unwrap();
        let (_gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let (_, answers) = post_batch(addr, Some(&a.token), &keys).await;
        let landed: Vec<bool> = answers.iter().map(|a| a.status == 201).collect();
        assert!(landed.contains(&true) && landed.contains(&false), "{:?}", statuses(&answers));
        for (k, (answer, landed)) in keys.iter().zip(answers.iter().zip(&landed)) {
            let effects = cloud.key_stats(k).map_or(0, |s| s.effects);
            assert_eq!(effects, u64::from(*landed), "{k}");
            if !landed {
                assert_eq!(answer.status, 424, "{k}");
            }
        }
        // A 503 with Retry-After from the upstream: every item gives up at the gateway, each
        // answered 503 with the seconds to wait, none applied.
        cloud.set_faults("503=1:ra=1".parse().unwrap()).unwrap();
        let fresh: Vec<String> = (100..102).map(|n| key(a.id, 1, n)).collect();
        let (_, answers) = post_batch(addr, Some(&a.token), &fresh).await;
        assert_eq!(statuses(&answers), [503, 503]);
        assert!(answers.iter().all(|a| a.retry_after_secs.is_some_and(|s| s >= 1)));
        assert!(fresh.iter().all(|k| cloud.key_stats(k).is_none_or(|s| s.effects == 0)));
    })
    .await
    .expect("test took too long");
}

/// An upstream refusing the gateway's credential (401): every item of a batch is held, 503 with
/// its Retry-After as a give-up is, never 424; a poisoned item is still 424 beside items that
/// land.
#[tokio::test]
async fn items_are_held_by_an_endpoint_fault_and_failed_by_their_own() {
    tokio::time::timeout(TEST_LIMIT, async {
        let a = device(0xa1);
        let cloud = Cloud::start("127.0.0.1:0", "outage=0:ms=60000:status=401".parse::<Faults>().unwrap())
            .await
            .unwrap();
        let (gw, addr) = gateway(config(&cloud.url(""), &[&a])).await;
        let keys: Vec<String> = (0..4).map(|n| key(a.id, 1, n)).collect();
        let (status, answers) = post_batch(addr, Some(&a.token), &keys).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(statuses(&answers), [503, 503, 503, 503]);
        assert!(
            answers.iter().all(|a| a.retry_after_secs.is_some_and(|s| (1..=2).contains(&s))),
            "{answers:?}"
        );
        assert_eq!(cloud.stats().effects_total, 0);
        assert!(gw.prometheus().contains("wary_gateway_held_total{status=\"401\"} 4\n"));
        // The reading's own fault: the second distinct key the upstream sees is poisoned.
        cloud.set_faults("poison=2".parse().unwrap()).unwrap();
        // The breaker opened for 1-2 s at the 401s: wait it out, so the items go upstream.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        let fresh: Vec<String> = (10..11).map(|n| key(a.id, 1, n)).collect();
        let (_, answers) = post_batch(addr, Some(&a.token), &fresh).await;
        assert_eq!(statuses(&answers), [201], "the probe lands and closes the breaker");
        let fresh: Vec<String> = (11..13).map(|n| key(a.id, 1, n)).collect();
        let (_, answers) = post_batch(addr, Some(&a.token), &fresh[..1]).await;
        assert_eq!(statuses(&answers), [424]);
        let (_, answers) = post_batch(addr, Some(&a.token), &fresh[1..]).await;
        assert_eq!(statuses(&answers), [201]);
    })
    .await
    .expect("test took too long");
}
