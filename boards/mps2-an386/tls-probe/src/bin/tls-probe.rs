//! One keyed `POST /readings` over TLS 1.3 from the device under QEMU, with the server's chain
//! checked against a pinned CA, and the servers that must be refused.
//!
//! Run by `cargo xtask tls`, which makes a throwaway CA chain (crates/wary-fixtures/src/tls.rs),
//! builds this binary with that CA compiled in (`WARY_TLS_PROBE_CA`, see build.rs), starts one TLS server
//! per case on 127.0.0.1 (the guest reaches them as 10.0.2.2) and QEMU with
//! `-nic user,model=lan9118 -append "seed=<64 hex> good=<port> rogue=<port> …"`.
//!
//! Each case is one connection: the server with the right chain answers 201; a server whose
//! chain leads to another CA, and one with a chain from the pinned CA but for another name,
//! are refused in the handshake; a server that keeps its records to 1 KiB works with a record buffer of
//! 1 KiB plus TLS's overhead; a reply in one 4 KiB record needs a buffer that holds it. The binary logs
//! `MEASURE` lines (timings, peak stack, buffer sizes) for the host to collect.

#![no_std]
#![no_main]

use core::net::{Ipv4Addr, SocketAddrV4};

use embassy_executor::Spawner;
use embassy_net::tcp::TcpSocket;
use embassy_time::Duration;
use embedded_tls::{MaxFragmentLength, TlsError};
use mps2_an386::net;
use mps2_an386::{exit, exit_code};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use static_cell::ConstStaticCell;
use wary::{Failure, retry_after::Rules};
use wary_qemu::{Tally, body, key};
use wary_tls_probe::args::CommandLine;
use wary_tls_probe::{SocketBuffers, stack};
use wary_uplink::http::{HttpError, Phase, Post, Response, Timing};
use wary_uplink::tls::{self, MAX_RECORD, Pinned, Records, TlsTransport, Trace};
use wary_uplink::transport::{Answer, Message, Transport};

/// The CA every server chain must lead to, compiled in by build.rs.
static PINNED_CA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pinned-ca.der"));
/// The cloud's name in the test chain (a reserved test domain): SNI, `Host`, and the leaf's
/// common name.
const SERVER_NAME: &str = "cloud.wary.test";
/// The host as seen from QEMU's user-mode network.
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// Generous: guest time runs slow on a busy host.
const LIMIT: Duration = Duration::from_secs(10);
const DHCP_LIMIT: Duration = Duration::from_secs(20);
/// The write record buffer: one record of request (head and small body) fits.
const WRITE_RECORD: usize = 1024;
/// The read record buffer of the small-record cases: 2^10 bytes of plaintext plus TLS 1.3's
/// 256 bytes of expansion, so it takes any record of a server that honours the max fragment
/// length of 2^10 the device asks for (the test server's small records are shorter still).
const SMALL_READ: usize = 1024 + 256;

static BUFFERS: ConstStaticCell<SocketBuffers> = ConstStaticCell::new(SocketBuffers::new());
static READ_RECORD: ConstStaticCell<[u8; MAX_RECORD]> = ConstStaticCell::new([0; MAX_RECORD]);
static WRITE: ConstStaticCell<[u8; WRITE_RECORD]> = ConstStaticCell::new([0; WRITE_RECORD]);

/// What a case must produce.
#[derive(Clone, Copy)]
enum Expect {
    /// 201 with a complete body.
    Created,
    /// Refused in the handshake: the chain does not verify.
    BadCertificate,
    /// A reply record larger than the read buffer, after the request went out.
    RecordTooLarge,
}

struct Case {
    name: &'static str,
    /// The command-line key of the server's port.
    server: &'static str,
    /// Bytes of the read record buffer used.
    read: usize,
    max_fragment: Option<MaxFragmentLength>,
    expect: Expect,
}

/// Must agree with `EXPECTED` in crates/wary-fixtures/src/tls.rs.
const CASES: &[Case] = &[
    Case { name: "good", server: "good", read: MAX_RECORD, max_fragment: None, expect: Expect::Created },
    Case {
        name: "rogue-ca",
        server: "rogue",
        read: MAX_RECORD,
        max_fragment: None,
        expect: Expect::BadCertificate,
    },
    Case {
        name: "wrong-name",
        server: "wrongname",
        read: MAX_RECORD,
        max_fragment: None,
        expect: Expect::BadCertificate,
    },
    Case {
        name: "small-records",
        server: "small",
        read: SMALL_READ,
        max_fragment: Some(MaxFragmentLength::Bits10),
        expect: Expect::Created,
    },
    Case {
        name: "big-record-small-buffer",
        server: "big",
        read: SMALL_READ,
        max_fragment: Some(MaxFragmentLength::Bits10),
        expect: Expect::RecordTooLarge,
    },
    Case { name: "big-record", server: "big", read: MAX_RECORD, max_fragment: None, expect: Expect::Created },
];

fn check(tally: &mut Tally, case: &Case, result: &Result<Response, HttpError>, trace: &Trace) {
    match (case.expect, result) {
        (Expect::Created, Ok(reply)) => {
            tally.check("status 201", reply.status == 201);
            tally.check("body complete", reply.body_complete);
        }
        (Expect::BadCertificate, Err(err)) => {
            tally.check(
                "refused: bad certificate",
                *err == HttpError::Tls && matches!(trace.tls_error, Some(TlsError::InvalidCertificate)),
            );
            tally.check("refused in the handshake", err.phase() == Phase::Handshake);
            tally.check("refused: never landed", !err.may_have_landed());
        }
        (Expect::RecordTooLarge, Err(err)) => {
            tally.check(
                "record larger than the buffer",
                matches!(trace.tls_error, Some(TlsError::InsufficientSpace)),
            );
            tally.check("after the request: may have landed", err.may_have_landed());
        }
        (_, Ok(reply)) => {
            defmt::error!("{=str}: expected a failure, got {}", case.name, reply);
            tally.check("outcome kind", false);
        }
        (_, Err(err)) => {
            defmt::error!("{=str}: expected an answer, got {} in phase {}", case.name, err, err.phase());
            tally.check("outcome kind", false);
        }
    }
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    stack::paint();
    let board = mps2_an386::init();
    let mut tally = Tally::new();
    if PINNED_CA.is_empty() {
        defmt::error!("built without a pinned CA: `cargo xtask tls` builds this probe with one");
        exit(exit_code::FAIL)
    }
    let Some(line) = CommandLine::read() else {
        defmt::error!("no semihosting command line (QEMU -append)");
        exit(exit_code::FAIL)
    };
    let Some(seed) = line.seed() else {
        defmt::error!("no seed=<64 hex digits> on the command line");
        exit(exit_code::FAIL)
    };
    // TLS needs unpredictable key shares and randoms. QEMU has no entropy source, so the host
    // hands a seed over the command line: a test seed, known to whoever started the run, and
    // never one for a real device. On the nRF52840 the hardware RNG seeds this generator.
    let mut rng = ChaCha20Rng::from_seed(seed);
    let stack = match net::bring_up(spawner, board.eth, rng.next_u64(), DHCP_LIMIT).await {
        Ok(stack) => stack,
        Err(err) => {
            defmt::error!("network: {}", err);
            exit(exit_code::FAIL)
        }
    };
    defmt::info!("DHCP lease: {}", stack.config_v4());

    // What the network stack alone needed, for comparison with the peak after the handshakes.
    let before_tls = stack::high_water();
    let pinned = Pinned { ca: PINNED_CA, server_name: SERVER_NAME };
    let buffers = BUFFERS.take();
    let read_record = READ_RECORD.take();
    let write_record = WRITE.take();
    for (index, case) in CASES.iter().enumerate() {
        let Some(port) = line.port(case.server) else {
            defmt::error!("no {=str}=<port> on the command line", case.server);
            exit(exit_code::FAIL)
        };
        let key = key(index);
        let reading = body(index);
        let post = Post {
            path: "/readings",
            idempotency_key: &key,
            body: reading.as_bytes(),
            credential: None,
            dead_letters: None,
        };
        let Some(read) = read_record.get_mut(..case.read) else { exit(exit_code::FAIL) };
        let records = Records { read, write: &mut write_record[..], max_fragment: case.max_fragment };
        let server = SocketAddrV4::new(HOST, port);
        let (result, trace) =
            tls::post_tls(stack, server, &post, LIMIT, buffers, records, &pinned, &mut rng).await;
        match &result {
            Ok(reply) => defmt::info!("{=str}: {}", case.name, reply),
            Err(err) => {
                defmt::info!("{=str}: {} in phase {} ({})", case.name, err, err.phase(), trace.tls_error)
            }
        }
        measure(case.name, &trace.timing);
        check(&mut tally, case, &result, &trace);
    }

    // The uplink's own HTTPS transport, through the same buffers: a keyed write lands against
    // the good server, and a server the pinned CA does not vouch for is a TLS failure, which
    // the policy fails at once (never resent).
    for (name, server, landed) in [("uplink-good", "good", true), ("uplink-rogue-ca", "rogue", false)] {
        let Some(port) = line.port(server) else { exit(exit_code::FAIL) };
        let (rx, tx, head) = buffers.parts();
        let mut socket = TcpSocket::new(stack, rx, tx);
        let mut transport = TlsTransport::new(
            stack,
            SocketAddrV4::new(HOST, port),
            "/readings",
            pinned,
            &mut socket,
            head,
            &mut read_record[..],
            &mut write_record[..],
            ChaCha20Rng::from_seed(seed_from(&mut rng)),
        );
        let key = key(CASES.len());
        let reading = body(CASES.len());
        let mut answers: [Answer; 1] = [Err(Failure::Reset)];
        let message = Message { key: &key, body: reading.as_bytes() };
        transport.send(&[message], &mut answers, LIMIT.into()).await;
        transport.close().await;
        let [answer] = answers;
        let got = wary_uplink::transport::outcome(&answer, &Rules::LENIENT).0.into_result();
        defmt::info!("{=str}: {}", name, got);
        let expected = if landed { Ok(()) } else { Err(Failure::Tls) };
        tally.check(name, got == expected);
    }

    defmt::info!(
        "MEASURE memory stack_peak={=usize} stack_before_tls={=usize} read_record={=usize} small_read_record={=usize} write_record={=usize} cert_chain={=usize}",
        stack::high_water(),
        before_tls,
        MAX_RECORD,
        SMALL_READ,
        WRITE_RECORD,
        tls::CERT_CHAIN
    );
    tally.finish()
}

/// A fresh 256-bit seed from the run's generator, for a transport that owns its own.
fn seed_from(rng: &mut ChaCha20Rng) -> [u8; 32] {
    let mut seed = [0u8; 32];
    rng.fill_bytes(&mut seed);
    seed
}

fn measure(name: &str, timing: &Timing) {
    defmt::info!(
        "MEASURE case={=str} connect_us={=u64} handshake_us={=u64} request_us={=u64}",
        name,
        timing.connect_us,
        timing.handshake_us,
        timing.request_us
    );
}
