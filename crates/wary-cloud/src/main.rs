//! `wary-cloud`: runs the test cloud for a script.
//!
//! It prints the bound address on its first stdout line, so a script can start it on port 0 and
//! read where it landed. On SIGTERM or SIGINT (and, with `--exit-on-stdin-close`, when its
//! standard input reaches its end) it stops serving and prints the final report as one JSON line
//! on stdout: `{"cloud": <GET /stats>, "keys": {<key>: {"effects": n, …}}, "readings":
//! {<reading id>: n}, "faults": "<compact script>"}`, the shape the modem emulator's report had
//! for `cloud` and `keys`. Nothing else goes to stdout; notes go to stderr.

use std::io::{Read, Write};
use std::net::SocketAddr;

use clap::Parser;
use tokio::sync::oneshot;
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
    /// Also stop when standard input reaches its end, e.g. when the script holding the pipe
    /// exits.
    #[arg(long)]
    exit_on_stdin_close: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let faults = Faults::parse_any(&args.faults).map_err(anyhow::Error::msg)?;
    // Before the address goes out: a script may signal as soon as it has read it.
    let mut signals = Signals::install()?;
    let stdin_closed = args.exit_on_stdin_close.then(stdin_end);
    let cloud = Cloud::start(args.listen, faults).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", cloud.addr())?;
    out.flush()?;
    drop(out);

    let why = tokio::select! {
        why = signals.recv() => why,
        _ = async { stdin_closed?.await.ok() }, if args.exit_on_stdin_close => "stdin closed",
    };
    eprintln!("wary-cloud: {why}; stopping");
    let report = cloud.shutdown_with_report().await;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    Ok(())
}

/// Resolves when stdin reaches its end or fails. The read runs on a detached thread because a
/// blocking read cannot be cancelled: on tokio's blocking pool it would hold up the runtime's
/// shutdown after a signal until the next input line.
fn stdin_end() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 512];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    rx
}

/// SIGINT and SIGTERM, caught from the moment they are installed.
#[cfg(unix)]
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for either; says which came.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            Some(()) = self.interrupt.recv() => "SIGINT",
            Some(()) = self.terminate.recv() => "SIGTERM",
            // Both streams ended: only stdin can stop the cloud now.
            else => std::future::pending().await,
        }
    }
}

/// Ctrl-C where there are no Unix signals.
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> anyhow::Result<Signals> {
        Ok(Signals)
    }

    async fn recv(&mut self) -> &'static str {
        match tokio::signal::ctrl_c().await {
            Ok(()) => "Ctrl-C",
            Err(_) => std::future::pending().await,
        }
    }
}
