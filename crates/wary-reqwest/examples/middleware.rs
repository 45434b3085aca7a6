//! reqwest through the wary middleware: keys made for each write, a JSON-lines ledger on
//! stdout (replayable: `… | grep -v "^#" > l.jsonl && cargo run -p wary-cli -- replay l.jsonl`), and the verdict of each call. Runs against the test cloud, started here on
//! 127.0.0.1 with 503s, dated 429s and replies dropped after the effect.
//!
//! `cargo run -p wary-reqwest --example middleware`

use std::sync::{Arc, Mutex};

use reqwest_middleware::ClientBuilder;
use wary::{Duration, Policy, Preset, Verdict};
use wary_host::ledger::JsonLedger;
use wary_reqwest::WaryMiddleware;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let faults = "503=0.3,429=0.2:ra=date+1,drop_after_effect=0.2,seed=4".parse()?;
    let cloud = wary_cloud::Cloud::start("127.0.0.1:0", faults).await?;

    let ms = Duration::from_millis;
    let policy = Policy::builder(Preset::Default).base(ms(50)).cap(ms(500)).deadline(ms(10_000)).build()?;
    // A policy line first, so `wary replay` can recompute every decision from stdout alone.
    let mut json = JsonLedger::new(std::io::stdout());
    json.policy(&policy)?;
    let ledger = Arc::new(Mutex::new(json));
    let wary = WaryMiddleware::new(policy).add_idempotency_key().ledger(ledger);
    // The client's own timeouts stand: each attempt has 1 s to connect and 5 s in all, and the
    // policy's deadline is a timer around it. A connect timeout shorter than the total lets a
    // connect that hangs be told apart (never sent, so even a write may be resent).
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(1))
        .timeout(std::time::Duration::from_secs(5))
        .build()?;
    let client = ClientBuilder::new(http).with(wary).build();

    for t in 20..24 {
        let resp = client.post(cloud.url("/readings")).body(format!("{{\"t\":{t}}}")).send().await?;
        let verdict = resp.extensions().get::<Verdict>().map_or_else(|| "-".to_owned(), Verdict::to_string);
        println!("# {} {verdict}", resp.status());
    }
    let stats = cloud.stats();
    println!(
        "# {} requests, {} effects, {} duplicated keys",
        stats.requests, stats.keyed_effects, stats.duplicates.keys
    );
    cloud.shutdown().await;
    if stats.keyed_effects != 4 || stats.duplicates.keys != 0 {
        return Err("a reading was lost or applied twice".into());
    }
    Ok(())
}
