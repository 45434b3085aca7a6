//! A keyed POST through plain reqwest in one call: `policy.retry(op, |attempt| async { … })`.
//! Runs against the test cloud, started here on 127.0.0.1 with 503s and 429s.
//!
//! The client's own timeouts bound each attempt (2 s to connect, so a connect that hangs is
//! told apart and never counted as sent; 5 s in all); `within` adds the policy's deadline
//! around the attempt without replacing them.
//!
//! `cargo run -p wary-reqwest --example one_liner`

use std::time::Duration;

use wary::{Operation, Policy, Preset};
use wary_host::retry::{RetryExt, within};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cloud = wary_cloud::Cloud::start("127.0.0.1:0", "503=0.4,429=0.2:ra=1,seed=4".parse()?).await?;
    let url = cloud.url("/readings");

    let ms = wary::Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(50)).cap(ms(500)).deadline(ms(10_000)).build()?;
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .build()?;
    let resp = policy
        .retry(Operation::KeyedWrite, |a| {
            let req = client
                .post(&url)
                .header("idempotency-key", a.key.to_hex().as_str())
                .header("content-type", "application/json")
                .body(r#"{"t":21}"#);
            within(&a, async { wary_reqwest::check(&policy, req.send().await) })
        })
        .await?;
    println!("{}", resp.status());

    cloud.shutdown().await;
    Ok(())
}
