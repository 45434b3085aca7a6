//! End to end: sensors → gateway (in-process, HTTP on 127.0.0.1) → test cloud on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

mod gateway_http;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_http::{Ack, HttpClient, Reading, client, drive, post, readings, serve};
use tokio::io::AsyncWriteExt;
use wary_cloud::{Cloud, Faults};
use wary_gateway::{Config, Gateway};
use wary_host::spec::PolicySpec;

fn config(cloud: &Cloud) -> Config {
    let mut c = Config::new(&cloud.url(""));
    c.auth = wary_gateway::Auth::Open;
    c.policy = PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(2_000),
        deadline: Some(4_000),
        min_attempt: Some(50),
        ..PolicySpec::default()
    };
    c.upstream.attempt_timeout = Duration::from_millis(400);
    c.fleet_max_tokens = 1000;
    c.fleet_ratio_milli = 1000;
    c.workers = 16;
    c.queue = 256;
    c.seed = Some(99);
    // These tests check the retry path's guarantees under faults, attempt by attempt; the
    // upstream's pace and breaker (on by default) change when and whether attempts go, and
    // have their own test below.
    c.upstream_pacing = false;
    c
}

fn legacy(mut c: Config) -> Config {
    c.upstream.legacy = true;
    c.upstream.path = "/legacy/readings".into();
    c
}

/// A gateway serving HTTP; its base URL.
async fn start(c: Config) -> (Arc<Gateway>, String) {
    let gw = Arc::new(Gateway::start(c, Box::new(std::io::sink())).unwrap());
    let base = serve(&gw).await;
    (gw, base)
}

/// Sends until every reading is answered done, as a sensor re-sends what was not.
async fn until_done(
    client: &HttpClient,
    base: &str,
    all: &[Reading],
    rounds: usize,
) -> BTreeMap<Reading, Ack> {
    let mut done = BTreeMap::new();
    for _ in 0..rounds {
        let left: Vec<Reading> = all.iter().filter(|r| !done.contains_key(*r)).copied().collect();
        if left.is_empty() {
            break;
        }
        for a in drive(client, base, &left).await {
            if a.done() {
                done.insert(a.reading, a);
            }
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_writes_under_a_fault_storm_have_exactly_one_effect() {
    let faults =
        "503=0.2,429=0.1,500=0.1,drop_after_effect=0.1,drop_before_effect=0.05,slow=0.05:ms=600,seed=7";
    let cloud = Cloud::start("127.0.0.1:0", faults.parse().unwrap()).await.unwrap();
    let (gw, base) = start(config(&cloud)).await;
    let all = readings(20, 10);
    let done = until_done(&client(), &base, &all, 5).await;
    assert_eq!(done.len(), all.len(), "every reading acked");
    assert!(done.values().all(|a| a.verdict == "ok" && a.status == Some(http::StatusCode::CREATED)));
    for r in &all {
        let ks = cloud.key_stats(&r.key()).expect("key reached the cloud");
        assert_eq!(ks.effects, 1, "reading {r:?}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.keyed_effects, 200);
    assert_eq!(stats.duplicates.keys, 0);
    // The storm hit: replays of effects whose answers were lost, and retries.
    assert!(stats.replays > 0, "{stats:?}");
    let m = gw.metrics();
    assert!(m.stats.attempts() > 200 && m.mean() > 1.0);
    let prom = gw.prometheus();
    assert!(prom.contains("wary_gateway_calls_total{verdict=\"ok\"}"));
    assert!(prom.contains("wary_gateway_attempts_per_call_p95"));
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_writes_are_never_resent_blind_and_the_probe_resolves_unknowns() {
    let faults = "scope=legacy,500=0.25,drop_after_effect=0.15,drop_before_effect=0.15,503=0.1,seed=3";
    let cloud = Cloud::start("127.0.0.1:0", faults.parse().unwrap()).await.unwrap();
    let (gw, base) = start(legacy(config(&cloud))).await;
    let all = readings(10, 10);
    let acks = drive(&client(), &base, &all).await;
    assert_eq!(acks.len(), all.len());
    let mut unknown = 0;
    for a in &acks {
        let r = a.reading;
        let effects = cloud.reading_effects(&r.key());
        assert!(effects <= 1, "reading {r:?} applied {effects} times");
        match a.verdict.as_str() {
            "ok" => {
                assert_eq!(effects, 1, "answered ok but not applied: {r:?}");
                assert!(a.status.unwrap().is_success(), "{a:?}");
            }
            // Final for the sensor (never resent), and surfaced to a person: 409.
            "unknown" => {
                assert_eq!(a.status, Some(http::StatusCode::CONFLICT), "{a:?}");
                unknown += 1;
            }
            other => panic!("unexpected verdict {other}"),
        }
    }
    let stats = cloud.stats();
    assert_eq!(stats.duplicates.reading_ids, 0);
    let m = gw.metrics();
    // Both probe answers happened: landed (500 / drop after effect) and not landed (one resend).
    assert!(m.probe_landed > 0 && m.probe_not_landed > 0, "{m:?}");
    assert_eq!(m.unresolved, unknown);
    assert_eq!(m.surfaced_total, unknown);
    let listed: BTreeSet<String> = m.surfaced.iter().map(|k| k.to_hex().as_str().to_owned()).collect();
    let unknowns: BTreeSet<String> =
        acks.iter().filter(|a| a.verdict == "unknown").map(|a| a.reading.key()).collect();
    assert_eq!(listed, unknowns);
    assert!(gw.prometheus().contains(&format!("wary_gateway_surfaced_total {unknown}\n")));
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_budget_bounds_amplification_in_a_total_outage() {
    let cloud = Cloud::start("127.0.0.1:0", "503=1.0,seed=1".parse().unwrap()).await.unwrap();
    let mut c = config(&cloud);
    c.fleet_max_tokens = 10;
    c.fleet_ratio_milli = 100;
    let (gw, base) = start(c).await;
    let acks = drive(&client(), &base, &readings(10, 10)).await;
    // Every one a 503 with a Retry-After: the sensor keeps it and comes back later.
    assert!(
        acks.iter().all(|a| a.verdict == "gave_up"
            && a.status == Some(http::StatusCode::SERVICE_UNAVAILABLE)
            && a.retry_after.is_some_and(|s| s >= 1)),
        "{acks:?}"
    );
    let requests = cloud.stats().requests;
    // Without the fleet budget each call would retry until its 2 s wait budget (≈10 attempts
    // each, about 1,000 requests). With 10 tokens, retries stop once 5 are spent.
    assert!(requests <= 100 + 5, "{requests} requests for 100 calls");
    let m = gw.metrics();
    assert!(m.gave_up.get("throttled").copied().unwrap_or(0) >= 95, "{m:?}");
    assert!(gw.fleet_tokens_milli() <= 5_000);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_cloud_cannot_hold_the_gateway_past_its_budgets() {
    for (faults, reasons) in [
        ("429=1.0:ra=year", &["retry_after_too_long"][..]),
        ("503=1.0:ra=date+year", &["retry_after_too_long"][..]),
        ("503=1.0:ra=garbage", &["budget", "deadline"][..]),
        // An unparseable Date header: the date is measured against the wall clock (5 s).
        ("429=1.0:ra=garbage_date", &["retry_after_too_long"][..]),
        ("endless_body=1.0:ms=50", &["budget", "deadline"][..]),
    ] {
        let cloud = Cloud::start("127.0.0.1:0", faults.parse::<Faults>().unwrap()).await.unwrap();
        let (gw, base) = start(config(&cloud)).await;
        let t0 = Instant::now();
        let r = Reading { sensor: 1, seq: 1 };
        let ack = post(&client(), &base, r, Duration::from_secs(8)).await;
        assert_eq!(ack.verdict, "gave_up", "{faults}");
        assert_eq!(ack.status, Some(http::StatusCode::SERVICE_UNAVAILABLE), "{faults}");
        assert!(reasons.contains(&ack.reason.as_deref().unwrap()), "{faults}: {ack:?}");
        // The 4 s deadline plus one attempt's timeout bounds it.
        assert!(t0.elapsed() < Duration::from_millis(4_600), "{faults}: {:?}", t0.elapsed());
        drop(gw);
        cloud.shutdown().await;
    }
}

/// How long the relay keeps a server connection open after its client went away.
const LINGER: Duration = Duration::from_millis(1_500);

/// A TCP relay in front of the cloud that, like a load balancer, lets the server finish a
/// request whose client gave up: when the client closes, the server side stays open for
/// [`LINGER`] (the cloud alone would see the close and drop the request unapplied). Returns
/// the relay's base URL.
async fn relay(cloud: &Cloud) -> String {
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};
    let target = cloud.url("").trim_start_matches("http://").trim_end_matches('/').to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(target.as_str()).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    tokio::time::sleep(LINGER).await;
                    drop(sw);
                });
                let mut buf = [0u8; 4096];
                let mut client_open = true;
                while let Ok(n @ 1..) = sr.read(&mut buf).await {
                    if client_open && cw.write_all(&buf[..n]).await.is_err() {
                        client_open = false;
                    }
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A legacy write the server applies only after the client's attempt timed out: the probe must
/// not read before it can have landed, or its 404 allows a resend that applies it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_waits_out_a_write_still_in_flight() {
    // Every legacy write sleeps 300 ms, then applies; the gateway gives up on it after 250 ms,
    // and the relay lets the server finish it. Read at once, the probe would find nothing.
    let faults = "scope=legacy,slow=1.0:ms=300:before=true,seed=1";
    let cloud = Cloud::start("127.0.0.1:0", faults.parse().unwrap()).await.unwrap();
    let mut c = legacy(config(&cloud));
    c.upstream.base = relay(&cloud).await;
    c.upstream.attempt_timeout = Duration::from_millis(250);
    let (gw, base) = start(c).await;
    let all = readings(4, 3);
    let acks = drive(&client(), &base, &all).await;
    assert_eq!(acks.len(), all.len());
    // Any resend still on its way lands within its 300 ms.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for a in &acks {
        assert_eq!(cloud.reading_effects(&a.reading.key()), 1, "applied twice or never: {a:?}");
        // The probe, 250 ms after the timeout, finds it landed: ok, with no resend.
        assert_eq!(a.verdict, "ok", "{a:?}");
    }
    let stats = cloud.stats();
    assert_eq!(stats.duplicates.reading_ids, 0, "{stats:?}");
    let m = gw.metrics();
    assert_eq!((m.probe_landed, m.probe_not_landed), (all.len() as u64, 0), "{m:?}");
    cloud.shutdown().await;
}

/// The probe stays inside the call's deadline: when the grace and one read do not fit, the
/// reading is surfaced at once, with no read and no resend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_never_runs_past_the_call_deadline() {
    let faults = "scope=legacy,slow=1.0:ms=600:before=true,seed=1";
    let cloud = Cloud::start("127.0.0.1:0", faults.parse().unwrap()).await.unwrap();
    let mut c = legacy(config(&cloud));
    c.upstream.base = relay(&cloud).await;
    c.upstream.attempt_timeout = Duration::from_millis(300);
    c.policy.deadline = Some(400);
    let (gw, base) = start(c).await;
    let t0 = Instant::now();
    let r = Reading { sensor: 7, seq: 1 };
    let a = post(&client(), &base, r, Duration::from_secs(5)).await;
    let took = t0.elapsed();
    assert_eq!(a.verdict, "unknown", "{a:?}");
    assert_eq!(a.status, Some(http::StatusCode::CONFLICT), "{a:?}");
    // The 300 ms attempt, then no 300 ms grace past the 400 ms deadline.
    assert!(took < Duration::from_millis(550), "{took:?}");
    // Let the slow write land: it was sent once, and read never.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(cloud.reading_effects(&r.key()), 1);
    assert_eq!(cloud.stats().requests, 1, "{:?}", cloud.stats());
    assert_eq!(gw.metrics().surfaced_total, 1);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_pace_sends_fewer_requests_into_an_overloaded_cloud() {
    let mut requests = Vec::new();
    for pacing in [false, true] {
        let cloud = Cloud::start("127.0.0.1:0", "503=1.0,seed=1".parse().unwrap()).await.unwrap();
        let mut c = config(&cloud);
        c.upstream_pacing = pacing;
        let (gw, base) = start(c).await;
        let acks = drive(&client(), &base, &readings(10, 10)).await;
        assert!(acks.iter().all(|a| a.verdict == "gave_up"), "{acks:?}");
        requests.push(cloud.stats().requests);
        if pacing {
            // The waits the pace asked for that the calls' 2 s budget could not pay ended them.
            let m = gw.metrics();
            assert!(m.gave_up.get("budget").copied().unwrap_or(0) > 0, "{m:?}");
        }
        cloud.shutdown().await;
    }
    // The same 100 calls into a cloud answering 503 to everything: without the pace they retry
    // as the policy and the fleet budget allow; with it, every worker's attempt waits for the
    // one shared pace, which each 503 holds back (for its Retry-After) or cuts.
    assert!(requests[1] * 2 < requests[0], "{requests:?}");
}
