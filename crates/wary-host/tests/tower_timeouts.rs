//! The tower adapter keeps the client's own timeouts: a connect timeout set on hyper-util's
//! connector ends each attempt as a connect timeout (never sent, so even an unkeyed write is
//! resent), and a timeout layer inside the retry as a response timeout (may have landed).
//! The server is a listener whose backlog of one is full and never accepted, so a connect
//! hangs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::timeout::TimeoutLayer;
use tower::{ServiceBuilder, ServiceExt};
use wary::ledger::Ledger;
use wary::{Duration, Failure, GiveUp, Policy, Preset, Verdict};
use wary_host::tower::{WaryPolicy, WaryRetry};

/// A listener with a full backlog of one, and the connections that fill it.
fn full_backlog() -> (SocketAddr, socket2::Socket, Vec<std::net::TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    sock.listen(1).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let mut held = Vec::new();
    while let Ok(s) = std::net::TcpStream::connect_timeout(&addr, StdDuration::from_millis(200)) {
        held.push(s);
        assert!(held.len() < 64, "the backlog never filled");
    }
    (addr, sock, held)
}

/// An unkeyed POST through `WaryRetry` over a hyper client with `connect_timeout` on its
/// connector and a timeout layer of `layer` inside the retry: the failures of its attempts
/// and its verdict.
async fn unkeyed_post(connect_timeout: Option<u64>, layer: u64) -> (Vec<Failure>, Option<Verdict>) {
    let (addr, _listener, _held) = full_backlog();
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(connect_timeout.map(StdDuration::from_millis));
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let ms = Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(10)).cap(ms(20)).max_attempts(3).build().unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::<8>::new()));
    let retry = WaryPolicy::with_rng(policy, wary_host::draw::seeded(7)).ledger(ledger.clone());
    let inner =
        ServiceBuilder::new().layer(TimeoutLayer::new(StdDuration::from_millis(layer))).service(client);
    let svc = WaryRetry::new(retry, inner);
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/readings"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    let failures = ledger.lock().unwrap().records().filter_map(|r| r.outcome.failure().copied()).collect();
    (failures, err.verdict())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_timeout_on_the_connector_is_never_sent() {
    let (failures, verdict) = unkeyed_post(Some(100), 2_000).await;
    assert_eq!(failures, [Failure::ConnectTimeout; 3]);
    assert_eq!(verdict, Some(Verdict::GaveUp(GiveUp::Attempts)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_cannot_see_the_phase_so_a_write_may_have_landed() {
    let (failures, verdict) = unkeyed_post(None, 100).await;
    assert_eq!(failures, [Failure::ResponseTimeout]);
    assert_eq!(verdict, Some(Verdict::Unknown));
}
