//! A keyed POST through plain reqwest in one call: `policy.retry(op, |attempt| async { … })`.
//! Runs against the test cloud, started here on 127.0.0.1 with 503s and 429s.
//!
//! `cargo run -p wary-reqwest --example one_liner`

use std::time::Duration;

use wary::{Operation, Policy, Preset};
use wary_host::retry::{RetryExt, attempt_timeout};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cloud = wary_cloud::Cloud::start("127.0.0.1:0", "503=0.4,429=0.2:ra=1,seed=4".parse()?).await?;
    let url = cloud.url("/readings");

    let ms = wary::Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(50)).cap(ms(500)).deadline(ms(10_000)).build()?;
    let client = reqwest::Client::new();
    let resp = policy
        .retry(Operation::KeyedWrite, |a| {
            let req = client
                .post(&url)
                .header("idempotency-key", a.key.to_hex().as_str())
                .header("content-type", "application/json")
                .timeout(attempt_timeout(&a, Duration::from_secs(5)))
                .body(r#"{"t":21}"#);
            async { wary_reqwest::check(&policy, req.send().await) }
        })
        .await?;
    println!("{}", resp.status());

    cloud.shutdown().await;
    Ok(())
}
