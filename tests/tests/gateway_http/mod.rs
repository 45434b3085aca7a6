//! Shared by the gateway's end-to-end tests: a sensor's side of HTTP, as a device speaks it
//! (`POST /readings` with `Idempotency-Key`), and the gateway's answers read back.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wary::Key;
use wary_gateway::Gateway;

/// The client sensors post with (a pool of keep-alive connections).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with no retries of its own (the sensor decides what to resend).
pub fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).retry_canceled_requests(false).build(c)
}

/// One reading: its sensor and sequence number (boot 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reading {
    pub sensor: u32,
    pub seq: u64,
}

impl Reading {
    /// Its idempotency key, 32 hex digits, as a device makes it.
    pub fn key(&self) -> String {
        Key::from_parts(
            u64::from(self.sensor),
            1,
            u32::try_from(self.seq).expect("a test reading's sequence fits 32 bits"),
        )
        .to_hex()
        .as_str()
        .to_owned()
    }

    /// Its JSON body, as a device sends it.
    pub fn body(&self) -> String {
        format!("{{\"seq\":{},\"mC\":{}}}", self.seq, i64::from(self.sensor) * 100 + self.seq as i64)
    }
}

/// `sensors` × `per` readings.
pub fn readings(sensors: u32, per: u64) -> Vec<Reading> {
    (0..sensors).flat_map(|sensor| (0..per).map(move |seq| Reading { sensor, seq })).collect()
}

/// What the gateway answered (or that nothing came back).
#[derive(Debug, Clone)]
pub struct Ack {
    pub reading: Reading,
    /// The status; `None` if the connection broke or timed out before an answer.
    pub status: Option<StatusCode>,
    /// `Wary-Verdict`.
    pub verdict: String,
    /// `Wary-Reason` (give-ups).
    pub reason: Option<String>,
    /// `Retry-After`, seconds.
    pub retry_after: Option<u64>,
}

impl Ack {
    /// The sensor must not send it again: landed, failed, or unknown (surfaced).
    pub fn done(&self) -> bool {
        matches!(self.verdict.as_str(), "ok" | "failed" | "unknown")
    }
}

/// Posts one reading to `base` (`http://host:port`) and reads the answer within `limit`.
pub async fn post(client: &HttpClient, base: &str, r: Reading, limit: Duration) -> Ack {
    let req = Request::post(format!("{base}/readings"))
        .header("content-type", "application/json")
        .header("idempotency-key", r.key())
        .body(Full::new(Bytes::from(r.body())))
        .unwrap();
    let exchange = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status();
        let h = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (verdict, reason, ra) = (h("wary-verdict"), h("wary-reason"), h("retry-after"));
        resp.into_body().collect().await.ok()?;
        Some((status, verdict, reason, ra))
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(Some((status, verdict, reason, ra))) => Ack {
            reading: r,
            status: Some(status),
            verdict: verdict.unwrap_or_else(|| format!("status {status}")),
            reason,
            retry_after: ra.and_then(|s| s.parse().ok()),
        },
        _ => Ack { reading: r, status: None, verdict: "no answer".into(), reason: None, retry_after: None },
    }
}

/// Posts every reading at once (each sensor's readings concurrently) and collects the answers.
pub async fn drive(client: &HttpClient, base: &str, batch: &[Reading]) -> Vec<Ack> {
    let mut set = tokio::task::JoinSet::new();
    for &r in batch {
        let (client, base) = (client.clone(), base.to_owned());
        set.spawn(async move { post(&client, &base, r, Duration::from_secs(15)).await });
    }
    set.join_all().await
}

/// Serves `gw` over HTTP on a free loopback port; returns its base URL.
pub async fn serve(gw: &Arc<Gateway>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
    base
}
