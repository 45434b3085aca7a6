//! `wary-cloud`: runs the test cloud until interrupted. Prints the bound address on its first
//! stdout line so a script can start it on port 0 and read where it landed.

use std::io::Write;
use std::net::SocketAddr;

use clap::Parser;
use wary_cloud::{Cloud, Faults};

/// Test cloud for wary: keyed and legacy endpoints with seeded faults.
#[derive(Parser)]
#[command(name = "wary-cloud", version)]
struct Args {
    /// Address to bind, e.g. 127.0.0.1:0 for any free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Fault script, compact (`503=0.2,429=0.1:ra=2,drop_after_effect=0.05,seed=7`) or JSON.
    #[arg(long, default_value = "")]
    faults: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let faults = Faults::parse_any(&args.faults).map_err(anyhow::Error::msg)?;
    let cloud = Cloud::start(args.listen, faults).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", cloud.addr())?;
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c().await?;
    cloud.shutdown().await;
    Ok(())
}
