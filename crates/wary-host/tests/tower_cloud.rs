//! The tower adapter against the test cloud on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceExt;
use tower::retry::Retry;
use wary::{Class, Duration, Policy, Preset, Verdict, ledger::Ledger};
use wary_cloud::{Cloud, Faults};
use wary_host::draw::seeded;
use wary_host::tower::WaryPolicy;

fn fast() -> Policy {
    let ms = Duration::from_millis;
    Policy::builder(Preset::Default).base(ms(10)).cap(ms(40)).budget(ms(5_000)).build().unwrap()
}

fn post(url: &str, key: Option<&str>, rid: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(Method::POST).uri(url).header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    if let Some(r) = rid {
        b = b.header("x-reading-id", r);
    }
    b.body(Full::new(Bytes::from_static(b"{\"t\":21}"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_post_retries_503s_to_success_with_one_effect_each() {
    let cloud = Cloud::start("127.0.0.1:0", "503=0.6,seed=11".parse().unwrap()).await.unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let ledger = Arc::new(Mutex::new(Ledger::<256>::new()));
    let svc = Retry::new(WaryPolicy::with_rng(fast(), seeded(1)).ledger(ledger.clone()), client);
    for i in 0..8 {
        let key = format!("tower-key-{i}");
        let resp = svc.clone().oneshot(post(&cloud.url("/readings"), Some(&key), None)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED, "{key}");
        assert_eq!(resp.extensions().get::<Verdict>(), Some(&Verdict::Ok));
        assert_eq!(cloud.key_stats(&key).unwrap().effects, 1, "{key}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.keyed_effects, 8);
    // The storm did hit: more requests than calls, every extra one a 503 that was retried.
    let n503 = stats.requests_by_status.get("503").copied().unwrap_or(0);
    assert!(n503 >= 3, "{stats:?}");
    assert_eq!(stats.requests, 8 + n503);
    let retries = ledger.lock().unwrap().records().filter(|r| r.class == Class::Retry).count() as u64;
    assert_eq!(retries, n503);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_post_is_not_resent_after_a_500() {
    let cloud = Cloud::start("127.0.0.1:0", "500=1.0,seed=1".parse().unwrap()).await.unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = Retry::new(WaryPolicy::with_rng(fast(), seeded(2)), client);
    let resp = svc.oneshot(post(&cloud.url("/legacy/readings"), None, Some("r-500"))).await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.extensions().get::<Verdict>(), Some(&Verdict::Unknown));
    assert_eq!(cloud.reading_effects("r-500"), 1);
    assert_eq!(cloud.stats().requests, 1);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_in_both_forms() {
    for ra in ["1", "date+1"] {
        let faults: Faults = format!("429=0.5:ra={ra},seed=5").parse().unwrap();
        let cloud = Cloud::start("127.0.0.1:0", faults).await.unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let ledger = Arc::new(Mutex::new(Ledger::<256>::new()));
        let svc = Retry::new(WaryPolicy::with_rng(fast(), seeded(3)).ledger(ledger.clone()), client);
        let mut slept_on_429 = 0u64;
        for i in 0..4 {
            let key = format!("ra-{i}");
            let t0 = Instant::now();
            let resp = svc.clone().oneshot(post(&cloud.url("/readings"), Some(&key), None)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::CREATED);
            let waited = ledger
                .lock()
                .unwrap()
                .records()
                .filter(|r| r.key == wary::Key::from_payload(key.as_bytes()))
                .fold(Duration::ZERO, |sum, r| sum + r.wait);
            assert!(t0.elapsed() >= waited.into(), "slept less than the ledger says");
        }
        for r in ledger.lock().unwrap().records().filter(|r| r.outcome.code() == Some(429)) {
            // The backoff alone would wait at most 40 ms; the server asked for a second (a date
            // form may round down to 0 s when the second ticks between Date and now: the
            // cloud sets both from one instant, so it is exactly 1 here).
            assert_eq!(r.outcome.retry_after(), Some(Duration::from_secs(1)), "{ra}");
            assert!(r.wait >= Duration::from_millis(1_000), "{ra}: waited {} after a 429", r.wait);
            slept_on_429 += 1;
        }
        assert!(slept_on_429 >= 1, "{ra}: the seed produced no 429");
        cloud.shutdown().await;
    }
}

/// A port nothing listens on: every connect is refused.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}/readings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_carries_the_verdict_and_a_static_fleet_is_accepted() {
    use wary::GiveUp;
    use wary_host::tower::WaryRetry;
    static FLEET: wary::FleetBudget = match wary::FleetBudget::new(100, 100) {
        Ok(f) => f,
        Err(_) => panic!("a valid fleet budget"),
    };
    let ms = Duration::from_millis;
    let policy = Policy::builder(Preset::Default)
        .base(ms(10))
        .cap(ms(40))
        .budget(ms(60_000))
        .deadline(ms(300))
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let ledger = Arc::new(Mutex::new(Ledger::<256>::new()));
    let p = WaryPolicy::with_rng(policy, seeded(9)).fleet(&FLEET).ledger(ledger.clone());
    let err = WaryRetry::new(p, client)
        .oneshot(post(&closed_port_url(), Some("k-refused"), None))
        .await
        .unwrap_err();
    // Refused connections are retried for any operation until the deadline ends the call.
    let stopped = err.stopped.unwrap();
    assert_eq!(err.verdict(), Some(Verdict::GaveUp(GiveUp::Deadline)), "{err}");
    assert_eq!(stopped.last, Some(wary::Failure::Refused));
    // The core's text: names and numbers, never the client error's own text.
    assert_eq!(
        err.to_string(),
        format!("gave_up (deadline) after {} attempts, the last a refused", stopped.attempts)
    );
    assert!(err.error.is_connect());
    let records = ledger.lock().unwrap().records().count() as u32;
    assert!(records >= 2, "{records} attempts");
    assert_eq!(stopped.attempts, records);
    // The static fleet was charged one token per failure (100 000 thousandths to start).
    assert_eq!(FLEET.tokens_milli(), 100_000 - 1_000 * records);
}
