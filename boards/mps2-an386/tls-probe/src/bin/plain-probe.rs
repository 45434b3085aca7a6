//! The TLS probe's plain-HTTP twin: the same stack, buffers and `POST /readings`, without TLS,
//! so that the difference between the two binaries is what TLS costs.
//!
//! Run by `cargo xtask tls` with `-append "seed=<64 hex> port=<plain HTTP server>"`.

#![no_std]
#![no_main]

use core::net::{Ipv4Addr, SocketAddrV4};

use embassy_executor::Spawner;
use embassy_time::Duration;
use mps2_an386::net;
use mps2_an386::{exit, exit_code};
use static_cell::ConstStaticCell;
use wary_qemu::Tally;
use wary_tls_probe::args::CommandLine;
use wary_tls_probe::{SocketBuffers, stack};
use wary_uplink::http::{self, Post};

/// Must match the TLS probe: the request differs only in its transport.
const SERVER_NAME: &str = "cloud.wary.test";
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
const LIMIT: Duration = Duration::from_secs(10);
const DHCP_LIMIT: Duration = Duration::from_secs(20);

static BUFFERS: ConstStaticCell<SocketBuffers> = ConstStaticCell::new(SocketBuffers::new());

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    stack::paint();
    let board = mps2_an386::init();
    let mut tally = Tally::new();
    let Some(line) = CommandLine::read() else {
        defmt::error!("no semihosting command line (QEMU -append)");
        exit(exit_code::FAIL)
    };
    let (Some(seed), Some(port)) = (line.seed(), line.port("port")) else {
        defmt::error!("need seed=<64 hex digits> and port=<port> on the command line");
        exit(exit_code::FAIL)
    };
    // Only TCP's sequence numbers and ports need it here.
    let stack_seed = seed.first_chunk::<8>().map_or(0, |bytes| u64::from_le_bytes(*bytes));
    let stack = match net::bring_up(spawner, board.eth, stack_seed, DHCP_LIMIT).await {
        Ok(stack) => stack,
        Err(err) => {
            defmt::error!("network: {}", err);
            exit(exit_code::FAIL)
        }
    };
    defmt::info!("DHCP lease: {}", stack.config_v4());

    let key = "0a386001000000000000000000000100";
    let post = Post {
        path: "/readings",
        idempotency_key: key,
        body: br#"{"seq":0,"mC":21000}"#,
        credential: None,
        dead_letters: None,
    };
    let server = SocketAddrV4::new(HOST, port);
    let (result, timing) = http::post_timed(stack, server, SERVER_NAME, &post, LIMIT, BUFFERS.take()).await;
    match &result {
        Ok(reply) => defmt::info!("plain: {}", reply),
        Err(err) => defmt::info!("plain: {} in phase {}", err, err.phase()),
    }
    defmt::info!(
        "MEASURE case=plain connect_us={=u64} handshake_us={=u64} request_us={=u64}",
        timing.connect_us,
        timing.handshake_us,
        timing.request_us
    );
    tally.check("status 201", result.is_ok_and(|r| r.status == 201 && r.body_complete));
    defmt::info!("MEASURE memory stack_peak={=usize}", stack::high_water());
    tally.finish()
}
