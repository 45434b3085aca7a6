//! Rate-limit headers beside Retry-After, switched on in a policy spec, end to end: a small
//! HTTP/1.1 server on 127.0.0.1 answers the first request with a 429 carrying one header, the
//! second with 200, and the client's wait between them is measured.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest_middleware::ClientBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wary_host::ratelimit::Signals;
use wary_host::spec::PolicySpec;
use wary_reqwest::WaryMiddleware;

/// Serves a 429 with `header`, then a 200, one connection each; returns the base URL and a
/// receiver of the two arrival instants.
async fn serve(header: String) -> (String, tokio::sync::mpsc::UnboundedReceiver<Instant>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/quota", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for reply in
            [format!("HTTP/1.1 429 Too Many Requests\r\n{header}\r\n"), "HTTP/1.1 200 OK\r\n".to_owned()]
        {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                buf.extend_from_slice(&chunk[..n]);
            }
            tx.send(Instant::now()).unwrap();
            let reply = format!("{reply}content-length: 0\r\nconnection: close\r\n\r\n");
            s.write_all(reply.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
        }
    });
    (url, rx)
}

/// The wait between the two requests of a GET under a fast policy with `signals` on.
async fn wait_for(header: String, signals: Signals) -> Duration {
    let spec = PolicySpec {
        base: Some(10),
        cap: Some(40),
        budget: Some(10_000),
        rate_limit: Some(signals),
        ..PolicySpec::default()
    };
    let client =
        ClientBuilder::new(reqwest::Client::new()).with(WaryMiddleware::from_spec(&spec).unwrap()).build();
    let (url, mut arrivals) = serve(header).await;
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let first = arrivals.recv().await.unwrap();
    arrivals.recv().await.unwrap() - first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_signal_raises_the_wait_only_when_switched_on() {
    let ms = "retry-after-ms: 1000".to_owned();
    let draft = "ratelimit: \"default\";r=0;t=1\r\nratelimit-policy: \"default\";q=10;w=60".to_owned();
    // Two seconds ahead of the wall clock (no Date header): at least one second is left.
    let reset = || {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        format!("x-ratelimit-reset: {}\r\nx-ratelimit-remaining: 0", now + 2)
    };
    let cases: [(Box<dyn Fn() -> String>, Signals); 3] = [
        (Box::new(|| ms.clone()), Signals { retry_after_ms: true, ..Signals::NONE }),
        (Box::new(|| draft.clone()), Signals { ratelimit: true, ..Signals::NONE }),
        (Box::new(reset), Signals { x_ratelimit_reset: true, ..Signals::NONE }),
    ];
    for (header, on) in cases {
        // Made just before its request, so the reset is still ahead.
        let header = header();
        let waited = wait_for(header.clone(), on).await;
        assert!(waited >= Duration::from_millis(1_000), "{header}: waited {waited:?}");
    }
    // Off (the default): the header is not read, and the backoff alone (under 40 ms) applies.
    for header in [ms.clone(), draft.clone()] {
        let waited = wait_for(header.clone(), Signals::NONE).await;
        assert!(waited < Duration::from_millis(900), "{header}: waited {waited:?}");
    }
}
