//! The device's network stack under QEMU: the LAN9118 driver, embassy-net with a DHCP lease
//! from QEMU's user-mode network, and `wary_uplink::http::post` against a scripted host
//! fixture, one exchange per fault, each failure checked for what it says about whether the
//! request may have landed.
//!
//! Run by `cargo xtask net`, which starts the fixture (crates/wary-fixtures/src/faults.rs) on
//! the host's 127.0.0.1 (the guest reaches it as 10.0.2.2) and QEMU with
//! `-nic user,model=lan9118 -append "port=<fixture> closed=<closed port> seed=<n>"`; the
//! arguments arrive through semihosting's command line. The fixture picks its behaviour from
//! the request's path, so one case's failure cannot shift the others.

#![no_std]
#![no_main]

use core::net::{Ipv4Addr, SocketAddrV4};

use embassy_executor::Spawner;
use embassy_net::{Ipv4Cidr, Stack};
use embassy_time::{Duration, Instant, with_timeout};
use mps2_an386::{eth, exit, exit_code, net};
use static_cell::ConstStaticCell;
use wary_qemu::{Tally, body, key};
use wary_uplink::http::{self, Buffers, HttpError, Post, Response};

/// The host as seen from QEMU's user-mode network.
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// An address in the user network nobody answers ARP for: a SYN to it never leaves.
const NOBODY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 99);
/// What QEMU's DHCP server hands the first guest.
const EXPECTED_LEASE: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// Generous: guest time runs slow on a busy host.
const LIMIT: Duration = Duration::from_secs(5);
/// The limit for the cases that must run into it; short so the run stays short.
const SHORT_LIMIT: Duration = Duration::from_millis(1_500);
/// How late past its limit an exchange may end: timers fire up to a tick late, and the
/// executor needs a moment to get back to the task.
const LATENESS: Duration = Duration::from_millis(100);
const DHCP_LIMIT: Duration = Duration::from_secs(20);
/// Matches the device's HEAD buffer below; the fixture's oversized header block is 4 KiB.
type NetBuffers = Buffers<1024, 1024, 1024>;
/// A body far larger than everything between the device and the fixture can buffer (QEMU's
/// user network and the host's sockets hold a few hundred KiB), so the fixture's reset lands
/// while the device is still sending it.
const BIG_BODY: usize = 1024 * 1024;

static BUFFERS: ConstStaticCell<NetBuffers> = ConstStaticCell::new(Buffers::new());
static BIG: ConstStaticCell<[u8; BIG_BODY]> = ConstStaticCell::new([0; BIG_BODY]);

/// Where a case connects.
#[derive(Clone, Copy)]
enum Target {
    /// The fixture's listening port.
    Fixture,
    /// A host port with no listener.
    Closed,
    /// An address that never answers.
    Nobody,
}

/// What a case must produce.
enum Expect {
    /// A response with exactly these fields.
    Answer {
        status: u16,
        retry_after: &'static [&'static [u8]],
        retry_after_dropped: u8,
        date: Option<&'static [u8]>,
        date_dropped: bool,
        body_complete: bool,
    },
    /// This error, and whether it may have landed (stated here, not derived, so a wrong
    /// classification fails).
    Fail { error: HttpError, may_have_landed: bool },
}

struct Case {
    /// The path, which also tells the fixture what to do.
    path: &'static str,
    target: Target,
    /// Send [`BIG_BODY`] bytes instead of a small reading.
    big: bool,
    limit: Duration,
    expect: Expect,
}

const fn answer(status: u16, retry_after: &'static [&'static [u8]], date: Option<&'static [u8]>) -> Expect {
    Expect::Answer {
        status,
        retry_after,
        retry_after_dropped: 0,
        date,
        date_dropped: false,
        body_complete: true,
    }
}

const fn fail(error: HttpError, may_have_landed: bool) -> Expect {
    Expect::Fail { error, may_have_landed }
}

const fn case(path: &'static str, expect: Expect) -> Case {
    Case { path, target: Target::Fixture, big: false, limit: LIMIT, expect }
}

/// Must agree with `SCRIPT` in crates/wary-fixtures/src/faults.rs (paths and header values).
const CASES: &[Case] = &[
    case("/ok", answer(200, &[], None)),
    case("/unavailable", answer(503, &[], None)),
    case("/throttled-seconds", answer(429, &[b"2"], None)),
    case(
        "/throttled-date",
        answer(429, &[b"Wed, 21 Oct 2026 07:28:00 GMT"], Some(b"Wed, 21 Oct 2026 07:27:30 GMT")),
    ),
    case("/odd-case", answer(503, &[b"3", b"4"], Some(b"Wed, 21 Oct 2026 07:27:30 GMT"))),
    case(
        "/many-retry-after",
        Expect::Answer {
            status: 503,
            retry_after: &[b"1", b"2", b"3", b"4"],
            retry_after_dropped: 2,
            date: None,
            date_dropped: true,
            body_complete: true,
        },
    ),
    case(
        "/body-cut",
        Expect::Answer {
            status: 200,
            retry_after: &[],
            retry_after_dropped: 0,
            date: None,
            date_dropped: false,
            body_complete: false,
        },
    ),
    case("/reset", fail(HttpError::Reset, true)),
    case("/closed", fail(HttpError::Closed, true)),
    Case { limit: SHORT_LIMIT, ..case("/stall", fail(HttpError::ResponseTimeout, true)) },
    Case { limit: SHORT_LIMIT, ..case("/trickle", fail(HttpError::ResponseTimeout, true)) },
    Case { big: true, ..case("/reset-early", fail(HttpError::SendFailed, false)) },
    case("/truncated", fail(HttpError::Truncated, true)),
    case("/garbage", fail(HttpError::Malformed, true)),
    case("/huge-headers", fail(HttpError::HeadersTooLarge, true)),
    Case { target: Target::Closed, ..case("/refused", fail(HttpError::Refused, false)) },
    Case {
        target: Target::Nobody,
        limit: SHORT_LIMIT,
        ..case("/unreachable", fail(HttpError::ConnectTimeout, false))
    },
];

/// The host's settings from the semihosting command line (`key=value` words after the
/// program's path).
struct Args {
    port: u16,
    closed: u16,
    seed: u64,
}

fn args() -> Option<Args> {
    let all = semihosting::experimental::env::args::<512>().ok()?;
    let (mut port, mut closed, mut seed) = (None, None, None);
    for arg in &all {
        let Ok(arg) = arg else { continue };
        if let Some(v) = arg.strip_prefix("port=") {
            port = v.parse().ok();
        } else if let Some(v) = arg.strip_prefix("closed=") {
            closed = v.parse().ok();
        } else if let Some(v) = arg.strip_prefix("seed=") {
            seed = v.parse().ok();
        }
    }
    Some(Args { port: port?, closed: closed?, seed: seed? })
}

async fn run(
    stack: Stack<'_>,
    buffers: &mut NetBuffers,
    server: SocketAddrV4,
    path: &str,
    index: usize,
    big: Option<&[u8]>,
    limit: Duration,
) -> (Result<Response, HttpError>, Duration) {
    let key = key(index);
    let reading = body(index);
    let post = Post {
        path,
        idempotency_key: &key,
        body: big.unwrap_or(reading.as_bytes()),
        credential: None,
        dead_letters: None,
    };
    let started = Instant::now();
    let result = http::post(stack, server, &post, limit, buffers).await;
    (result, started.elapsed())
}

/// Checks every field of a response; a failure names the field only, so header values stay
/// out of the log.
fn check_answer(tally: &mut Tally, path: &str, got: &Response, expect: &Expect) {
    let Expect::Answer { status, retry_after, retry_after_dropped, date, date_dropped, body_complete } =
        expect
    else {
        return;
    };
    let same_retry_after = got.retry_after.len() == retry_after.len()
        && got.retry_after.iter().zip(retry_after.iter()).all(|(g, e)| g.as_slice() == *e);
    let same_date = got.date.as_deref() == *date;
    defmt::info!("{=str}: {}", path, got);
    tally.check("status", got.status == *status);
    tally.check("every Retry-After value, in order", same_retry_after);
    tally.check("Retry-After values dropped", got.retry_after_dropped == *retry_after_dropped);
    tally.check("Date value", same_date);
    tally.check("Date dropped flag", got.date_dropped == *date_dropped);
    tally.check("body completeness", got.body_complete == *body_complete);
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let board = mps2_an386::init();
    let mut tally = Tally::new();
    let Some(args) = args() else {
        defmt::error!("no port=, closed= and seed= on the semihosting command line (QEMU -append)");
        exit(exit_code::FAIL)
    };

    let (stack, net_runner) = match net::prepare(spawner, board.eth, args.seed) {
        Ok(parts) => parts,
        Err(err) => {
            defmt::error!("network: {}", err);
            exit(exit_code::FAIL)
        }
    };
    let server = SocketAddrV4::new(HOST, args.port);
    let buffers = BUFFERS.take();
    let big = BIG.take();
    big.fill(b'a');
    // Still JSON: `{"pad":"aaa…a"}`.
    for (at, byte) in br#"{"pad":""#.iter().enumerate() {
        big[at] = *byte;
    }
    big[BIG_BODY - 2] = b'"';
    big[BIG_BODY - 1] = b'}';

    // Before the stack runs there is no lease: nothing may be sent.
    let (early, _) = run(stack, buffers, server, "/never", 100, None, LIMIT).await;
    defmt::info!("before DHCP: {}", early.as_ref().err());
    tally.check("no lease: NoNetwork", early == Err(HttpError::NoNetwork));
    tally.check("no lease: never landed", early.is_err_and(|e| !e.may_have_landed()));

    if net::start(spawner, net_runner).is_err() {
        exit(exit_code::FAIL)
    }
    let started = Instant::now();
    if with_timeout(DHCP_LIMIT, stack.wait_config_up()).await.is_err() {
        defmt::error!("no DHCP lease within {=u64} s", DHCP_LIMIT.as_secs());
        exit(exit_code::FAIL)
    }
    let lease = stack.config_v4();
    defmt::info!("DHCP lease after {=u64} ms: {}", started.elapsed().as_millis(), lease);
    tally.check(
        "DHCP lease from QEMU's user network",
        lease.is_some_and(|c| c.address == Ipv4Cidr::new(EXPECTED_LEASE, 24)),
    );

    for (index, (path, key)) in
        [("/bad path", "k"), ("/ok", "bad\r\nkey"), ("no-slash", "k")].into_iter().enumerate()
    {
        let post = Post { path, idempotency_key: key, body: b"{}", credential: None, dead_letters: None };
        let result = http::post(stack, server, &post, LIMIT, buffers).await;
        defmt::info!("unencodable request {=usize}: {}", index, result.as_ref().err());
        tally.check("unencodable request: BadRequest", result == Err(HttpError::BadRequest));
        tally.check("unencodable request: never landed", result.is_err_and(|e| !e.may_have_landed()));
    }

    for (index, case) in CASES.iter().enumerate() {
        let target = match case.target {
            Target::Fixture => server,
            Target::Closed => SocketAddrV4::new(HOST, args.closed),
            Target::Nobody => SocketAddrV4::new(NOBODY, args.port),
        };
        let (result, took) =
            run(stack, buffers, target, case.path, index, case.big.then_some(&big[..]), case.limit).await;
        defmt::info!("{=str}: {=u64} ms", case.path, took.as_millis());
        tally.check("within its time limit", took <= case.limit + LATENESS);
        match (&result, &case.expect) {
            (Ok(got), Expect::Answer { .. }) => check_answer(&mut tally, case.path, got, &case.expect),
            (Err(got), Expect::Fail { error, may_have_landed }) => {
                defmt::info!("{=str}: {} (phase {})", case.path, got, got.phase());
                tally.check("error", got == error);
                tally.check("may have landed", got.may_have_landed() == *may_have_landed);
            }
            (Ok(got), Expect::Fail { error, .. }) => {
                defmt::error!("{=str}: expected {}, got {}", case.path, error, got);
                tally.check("outcome kind", false);
            }
            (Err(got), Expect::Answer { status, .. }) => {
                defmt::error!("{=str}: expected status {=u16}, got {}", case.path, status, got);
                tally.check("outcome kind", false);
            }
        }
    }

    defmt::info!("lan9118 {}", eth::counters());
    tally.finish()
}
