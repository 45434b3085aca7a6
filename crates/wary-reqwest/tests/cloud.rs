//! The middleware against the test cloud on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Extensions;
use reqwest::{Request, Response, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use wary::{Duration as Ms, Failure, GiveUp, Policy, Preset, Verdict};
use wary_cloud::{Cloud, Faults};
use wary_host::ledger::{JsonLedger, Line, read_lines};
use wary_reqwest::{CallError, SentOnce, WaryMiddleware};

fn fast() -> Policy {
    Policy::builder(Preset::Default)
        .base(Ms::from_millis(10))
        .cap(Ms::from_millis(40))
        .budget(Ms::from_secs(10))
        .build()
        .unwrap()
}

/// Notes when each attempt leaves, from below the retry middleware.
#[derive(Clone, Default)]
struct Sends(Arc<Mutex<Vec<Instant>>>);

#[async_trait::async_trait]
impl Middleware for Sends {
    async fn handle(
        &self,
        req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.lock().unwrap().push(Instant::now());
        next.run(req, ext).await
    }
}

impl Sends {
    fn gaps_ms(&self) -> Vec<u128> {
        self.0.lock().unwrap().windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }
}

fn client(mw: impl Middleware, sends: &Sends) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new()).with(mw).with(sends.clone()).build()
}

fn call_error(e: reqwest_middleware::Error) -> CallError {
    match e {
        reqwest_middleware::Error::Middleware(a) => a.downcast::<CallError>().unwrap(),
        other => panic!("not a wary error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_ends_in_one_effect_per_call_with_keys_made_once() {
    let cloud = Cloud::start("127.0.0.1:0", "503=0.6,seed=11".parse().unwrap()).await.unwrap();
    let ledger = Arc::new(Mutex::new(JsonLedger::new(Vec::new())));
    static FLEET: wary::FleetBudget = match wary::FleetBudget::new(1000, 100) {
        Ok(f) => f,
        Err(_) => panic!("a valid fleet budget"),
    };
    let mw = WaryMiddleware::new(fast()).add_idempotency_key().fleet(&FLEET).ledger(ledger.clone());
    let sends = Sends::default();
    let c = client(mw, &sends);
    // The middleware draws each call's key at random, and the cloud's 503s are drawn from the
    // key: post until the storm has hit three times (eight posts at least), so the count of
    // posts, not luck, decides that it did (eight posts alone saw fewer in about one run in 80).
    let mut posts = 0u64;
    while posts < 8 || cloud.stats().requests_by_status.get("503").copied().unwrap_or(0) < 3 {
        assert!(posts < 64, "64 posts and the storm still had not hit three times");
        posts += 1;
        let r = c
            .post(cloud.url("/readings"))
            .header("content-type", "application/json")
            .body("{\"t\":21}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.extensions().get::<Verdict>(), Some(&Verdict::Ok));
    }
    let stats = cloud.stats();
    let n503 = stats.requests_by_status.get("503").copied().unwrap_or(0);
    assert!(n503 >= 3, "the storm did not hit: {stats:?}");
    assert_eq!(stats.requests, posts + n503);
    // One key per call, one effect each: every retry carried its call's key.
    assert_eq!(stats.effects_per_key.get("1").copied(), Some(posts), "{stats:?}");
    assert_eq!(stats.keys, posts);
    assert_eq!(stats.duplicates.keys, 0);
    // One JSON line per attempt; each call's lines share one key and the last says ok.
    let text = String::from_utf8(ledger.lock().unwrap().get_ref().clone()).unwrap();
    let lines: Vec<_> = read_lines(&text)
        .map(|(_, l)| match l.unwrap() {
            Line::Attempt(a) => a,
            Line::Policy(_) => panic!("no policy line was asked for"),
        })
        .collect();
    assert_eq!(lines.len() as u64, stats.requests);
    let oks: Vec<_> = lines.iter().filter(|l| l.verdict == Some(Verdict::Ok)).collect();
    assert_eq!(oks.len() as u64, posts);
    let mut keys: Vec<_> = lines.iter().map(|l| l.key).collect();
    keys.dedup();
    assert_eq!(keys.len() as u64, posts, "a key changed inside a call");
    assert!(FLEET.tokens_milli() < FLEET.max_milli(), "the fleet was not charged");
    cloud.shutdown().await;
}

/// A key whose first request on `faults` is a 429 and second is served.
fn key_429_then_ok(faults: &Faults, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let s = format!("k:{k}");
            faults.pick(&s, 0).is_some_and(|f| f.name() == "429") && faults.pick(&s, 1).is_none()
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_an_http_date_is_waited_out_where_reqwest_retry_does_not() {
    // The 429 carries `Retry-After: <Date + 2 s>` in IMF-fixdate form.
    let faults: Faults = "429=0.5:ra=date+2,seed=7".parse().unwrap();
    let cloud = Cloud::start("127.0.0.1:0", faults.clone()).await.unwrap();
    let post = |c: &ClientWithMiddleware, key: &str| {
        c.post(cloud.url("/readings"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body("{}")
            .send()
    };

    let sends = Sends::default();
    let wary_client = client(WaryMiddleware::new(fast()), &sends);
    let r = post(&wary_client, &key_429_then_ok(&faults, "wary")).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let wary_gaps = sends.gaps_ms();
    eprintln!("wary: waits between attempts {wary_gaps:?} ms");
    assert_eq!(wary_gaps.len(), 1);
    // Never sooner than asked: the backoff alone would be at most 40 ms.
    assert!(wary_gaps[0] >= 2_000, "{wary_gaps:?}");

    // reqwest-retry, with the same backoff bounds, resends at once: it never reads the date.
    use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};
    let backoff = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(10), Duration::from_millis(40))
        .build_with_max_retries(3);
    let sends = Sends::default();
    let retry_client = client(RetryTransientMiddleware::new_with_policy(backoff), &sends);
    let key = key_429_then_ok(&faults, "reqwest-retry");
    let r = post(&retry_client, &key).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let other_gaps = sends.gaps_ms();
    eprintln!("reqwest-retry: waits between attempts {other_gaps:?} ms");
    assert_eq!(other_gaps.len(), 1);
    assert!(other_gaps[0] < 2_000, "{other_gaps:?}");
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_replies_after_the_effect_do_not_duplicate_a_keyed_post() {
    let cloud = Cloud::start("127.0.0.1:0", "drop_after_effect=0.5,seed=3".parse().unwrap()).await.unwrap();
    let sends = Sends::default();
    let c = client(WaryMiddleware::new(fast()).add_idempotency_key(), &sends);
    // Post until at least two replies were dropped after their effect (the cloud drops half of
    // them; which ones depends on how its draws meet the requests, so the count is not fixed).
    let mut posted = 0u64;
    while posted < 6 || cloud.stats().requests_by_status.get("dropped").copied().unwrap_or(0) < 2 {
        assert!(posted < 60, "fewer than two dropped replies in 60 posts: {:?}", cloud.stats());
        let r = c
            .post(cloud.url("/readings"))
            .header("content-type", "application/json")
            .body("{\"t\":1}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        posted += 1;
    }
    let stats = cloud.stats();
    let dropped = stats.requests_by_status.get("dropped").copied().unwrap_or(0);
    assert!(dropped >= 2, "{stats:?}");
    // The effect landed before each drop; the resend was answered from the store.
    assert_eq!(stats.keyed_effects, posted);
    assert_eq!(stats.duplicates.keys, 0);
    assert!(stats.replays >= dropped, "{stats:?}");
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_post_whose_reply_was_dropped_ends_unknown_not_resent() {
    let cloud = Cloud::start("127.0.0.1:0", "drop_after_effect=1.0,seed=1".parse().unwrap()).await.unwrap();
    let sends = Sends::default();
    let c = client(WaryMiddleware::new(fast()), &sends);
    let err = c
        .post(cloud.url("/legacy/readings"))
        .header("x-reading-id", "r-drop")
        .body("{}")
        .send()
        .await
        .unwrap_err();
    let err = call_error(err);
    assert_eq!(err.stopped.verdict, Verdict::Unknown, "{err}");
    assert_eq!(err.stopped.last, Some(Failure::Reset));
    assert_eq!(err.to_string(), "unknown after 1 attempt, the last a reset");
    assert_eq!(cloud.reading_effects("r-drop"), 1);
    assert_eq!(cloud.stats().requests, 1);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_is_sent_once_and_says_why() {
    let cloud = Cloud::start("127.0.0.1:0", "503=1.0,seed=1".parse().unwrap()).await.unwrap();
    let sends = Sends::default();
    let c = client(WaryMiddleware::new(fast()), &sends);
    let chunks =
        futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"t\":2}"))]);
    let r = c
        .post(cloud.url("/readings"))
        .header("idempotency-key", "stream-1")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.extensions().get::<SentOnce>(), Some(&SentOnce::BodyNotCloneable));
    // The policy would have retried the 503; the body allowed one attempt.
    assert_eq!(r.extensions().get::<Verdict>(), Some(&Verdict::GaveUp(GiveUp::Attempts)));
    assert_eq!(cloud.stats().requests, 1);
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempts_timeout_is_capped_to_the_deadline() {
    let cloud = Cloud::start("127.0.0.1:0", "stall=1.0:ms=5000,seed=1".parse().unwrap()).await.unwrap();
    let ms = Ms::from_millis;
    let policy = Policy::builder(Preset::Default)
        .base(ms(10))
        .cap(ms(40))
        .deadline(ms(400))
        .min_attempt(ms(50))
        .build()
        .unwrap();
    let sends = Sends::default();
    let c = client(WaryMiddleware::new(policy), &sends);
    let t0 = Instant::now();
    let err = c
        .post(cloud.url("/readings"))
        .header("idempotency-key", "stall-1")
        .timeout(Duration::from_secs(30))
        .body("{}")
        .send()
        .await
        .unwrap_err();
    let took = t0.elapsed();
    let err = call_error(err);
    assert_eq!(err.stopped.verdict, Verdict::GaveUp(GiveUp::Deadline), "{err}");
    assert_eq!(err.stopped.last, Some(Failure::ResponseTimeout));
    // The server stalls 5 s and the request's own timeout is 30 s; the deadline is 400 ms.
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    cloud.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_whose_breaker_opened_ends_the_next_call_unsent() {
    // Port 9 on loopback: nothing listens, every connection is refused.
    let breaker = wary::Breaker::new(wary::BreakerSettings::DEVICE).unwrap();
    let endpoint = wary_host::call::SharedEndpoint::new(None, Some(breaker));
    let mw = WaryMiddleware::new(fast()).endpoint(endpoint.clone());
    let sends = Sends::default();
    let c = client(mw, &sends);
    // Two refused connections open it; the retry after them meets it open.
    let e = call_error(c.get("http://127.0.0.1:9/x").send().await.unwrap_err());
    assert_eq!((e.stopped.verdict, e.stopped.attempts), (Verdict::GaveUp(GiveUp::CircuitOpen), 2));
    assert_eq!(sends.0.lock().unwrap().len(), 2);
    // The next call ends before its first attempt, with nothing sent.
    let e = call_error(c.get("http://127.0.0.1:9/x").send().await.unwrap_err());
    assert_eq!((e.stopped.verdict, e.stopped.attempts), (Verdict::GaveUp(GiveUp::CircuitOpen), 0));
    assert!(e.error.to_string().contains("nothing was sent"), "{}", e.error);
    assert_eq!(sends.0.lock().unwrap().len(), 2);
    assert_eq!(endpoint.breaker().unwrap().state().name(), "open");
}
