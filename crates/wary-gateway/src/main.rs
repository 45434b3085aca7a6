//! `wary-gateway`: readings from downstream sensors (length-prefixed frames on stdin, or on a
//! Unix socket) sent upstream with wary; an ack frame back for each after its verdict.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use wary_gateway::gateway::accept_loop;
use wary_gateway::{Config, Gateway};
use wary_host::spec::PolicySpec;

#[derive(Parser)]
#[command(about = "wary gateway: downstream frames to the cloud, acked after their verdict", version)]
struct Args {
    /// The cloud, `http://127.0.0.1:PORT`.
    #[arg(long)]
    upstream: String,
    /// Legacy mode: unkeyed `POST /legacy/readings`, probe on `unknown`.
    #[arg(long)]
    legacy: bool,
    /// Serve a Unix socket instead of stdin/stdout.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Serve Prometheus text on this loopback address (`GET /metrics`).
    #[arg(long, default_value = "127.0.0.1:9464", conflicts_with = "no_metrics")]
    metrics: SocketAddr,
    /// Serve no metrics endpoint.
    #[arg(long)]
    no_metrics: bool,
    /// Append the JSON-lines ledger here.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// A policy spec (JSON) instead of the default.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Queue capacity.
    #[arg(long, default_value_t = 256)]
    queue: usize,
    /// Concurrent upstream calls.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Time per attempt, milliseconds.
    #[arg(long, default_value_t = 5000)]
    attempt_timeout_ms: u64,
    /// Legacy mode: wait this long before probing a write that may still be in flight,
    /// milliseconds (default: the attempt timeout).
    #[arg(long)]
    probe_grace_ms: Option<u64>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !is_loopback(args.metrics.ip()) {
        bail!("the metrics endpoint is served on loopback only");
    }
    let mut config = Config::new(&args.upstream);
    config.upstream.legacy = args.legacy;
    config.upstream.attempt_timeout = Duration::from_millis(args.attempt_timeout_ms);
    config.upstream.probe_grace = args.probe_grace_ms.map(Duration::from_millis);
    config.queue = args.queue;
    config.workers = args.workers;
    if let Some(p) = &args.policy {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        config.policy = serde_json::from_str::<PolicySpec>(&text).context("policy spec")?;
    }
    let ledger: Box<dyn Write + Send> = match &args.ledger {
        Some(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
        None => Box::new(std::io::sink()),
    };
    let gw = Arc::new(Gateway::start(config, ledger)?);
    if !args.no_metrics {
        let listener = tokio::net::TcpListener::bind(args.metrics).await?;
        eprintln!("wary-gateway: metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(gw.clone().serve_metrics(listener));
    }
    match &args.unix {
        None => {
            let n = gw.serve(tokio::io::stdin(), tokio::io::stdout()).await?;
            eprintln!("wary-gateway: {n} readings, stream closed");
        }
        Some(path) => {
            // A socket left by an earlier run is replaced; any other file at the path is not.
            use std::os::unix::fs::FileTypeExt as _;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path)?;
            }
            let sock = tokio::net::UnixListener::bind(path)?;
            let handle = |(stream, _): (tokio::net::UnixStream, _)| {
                let gw = gw.clone();
                tokio::spawn(async move {
                    let (r, w) = stream.into_split();
                    if let Err(e) = gw.serve(r, w).await {
                        eprintln!("wary-gateway: stream closed: {e}");
                    }
                });
            };
            // An accept error (say, out of file descriptors) is waited out, not fatal and
            // not a busy loop; its kind is logged, never its text.
            let on_error = |e: &std::io::Error, d: Duration| {
                eprintln!("wary-gateway: accept failed ({:?}); next try in {} ms", e.kind(), d.as_millis());
            };
            tokio::select! {
                () = accept_loop(|| sock.accept(), handle, on_error) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
    }
    Ok(())
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}
