//! hyper through the tower adapter: a per-attempt timeout layer inside the retry, the verdict
//! on responses and on client errors. Runs against the test cloud, started here on 127.0.0.1.
//!
//! `cargo run -p wary-host --example tower`

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::timeout::TimeoutLayer;
use tower::{ServiceBuilder, ServiceExt};
use wary::{Policy, Preset, Verdict};
use wary_host::tower::{WaryPolicy, WaryRetry};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cloud =
        wary_cloud::Cloud::start("127.0.0.1:0", "503=0.4,reset_after_effect=0.2,seed=2".parse()?).await?;

    let ms = wary::Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(50)).cap(ms(500)).deadline(ms(10_000)).build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Each attempt is bounded inside the retry; the policy's deadline bounds the call.
    let attempt = ServiceBuilder::new().layer(TimeoutLayer::new(Duration::from_secs(2))).service(client);
    let svc = WaryRetry::new(WaryPolicy::new(policy), attempt);

    for i in 0..4 {
        let req = http::Request::post(cloud.url("/readings"))
            .header("idempotency-key", format!("tower-example-{i}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"t\":21}")))?;
        match svc.clone().oneshot(req).await {
            Ok(resp) => println!("{} {:?}", resp.status(), resp.extensions().get::<Verdict>()),
            Err(e) => return Err(format!("call failed: {e}").into()),
        }
    }
    let stats = cloud.stats();
    println!(
        "{} requests, {} effects, {} duplicated keys",
        stats.requests, stats.keyed_effects, stats.duplicates.keys
    );
    cloud.shutdown().await;
    Ok(())
}
