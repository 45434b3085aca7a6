//! The uplink application under QEMU: a sensor task pushes readings into the durable outbox on
//! (emulated) NOR flash, and the uplink sends each one as a keyed HTTP/1.1 `POST` through the
//! wary runner, over embassy-net on the LAN9118 (`-nic user,model=lan9118`), straight to the
//! test cloud on the host (10.0.2.2 from the guest). It prints a summary and exits 0 once
//! nothing is pending and the sensor is done. With feature `tls` it posts over HTTPS (TLS 1.3)
//! instead, to a server whose certificate chain leads to the CA pinned at build time and names
//! `WARY_SERVER_NAME` (build.rs): `cargo xtask qemu` runs it through the gateway that way.
//!
//! With feature `coap` it sends each reading as a confirmable CoAP `POST` to `/r/<key>` on the
//! host's UDP `port=` instead (`wary_uplink::coap`), under the CoAP policy: `cargo xtask device
//! coap` runs it against libcoap's `coap-server`. With feature `mqtt` it publishes each reading
//! as an MQTT 5 QoS 1 `PUBLISH` to the broker on the host's `port=` (`wary_uplink::mqtt`), and
//! with `mqtt` and `tls` over TLS 1.3 to a broker whose chain leads to the pinned CA: `cargo
//! xtask device mqtt` and `mqtt-tls` run them against mosquitto.
//!
//! The semihosting command line (QEMU `-append`) says who the device is, where the cloud
//! listens and how to run: `device=<id> port=<p> seed=<n> [token=<64 hex digits>]
//! [readings=<per boot>] [cut_write=<boot>:<n>] [reset_in_reply=<boot>]
//! [reset_in_backoff=<boot>] [reset_in_hold=<boot>] [crash_loop=<boots>] [boot_base=<ms>] [boot_cap=<ms>]
//! [hold_base=<ms>] [hold_cap=<ms>] [rounds=<n>] [when_full=shed] [pacing=off]` (and the transport's settings
//! below, on [`Args`]).
//!
//! - `device`: the 64-bit device id in every key, 16 hex digits or a decimal number
//!   ([`parse_device_id`]). Required: without a valid one the firmware logs why and exits
//!   non-zero, so a device never sends under a made-up identity.
//! - `token`: the device's credential, 64 lowercase hex digits, sent as `Authorization: Bearer
//!   <token>` on every attempt and never logged. Without it no `Authorization` header is sent;
//!   a malformed one stops the firmware.
//! - `pacing`: the device's pace and circuit breaker ([`Config::pacing`]) are on unless
//!   `pacing=off`.
//! - `hold_base`, `hold_cap`: the endpoint hold's probe backoff in milliseconds (about a minute
//!   doubling to an hour otherwise, [`wary::DrainSettings::DEVICE`]), so that a scenario sees a
//!   refusing endpoint probed several times in a short run; `rounds`: the most rounds over the
//!   outbox ([`Config::max_rounds`]), after which the firmware stops with its readings kept.
//! - `when_full=shed`: a full outbox moves its oldest readings to the dead letters to make room
//!   ([`wary_uplink::WhenFull::ShedOldest`]) instead of refusing the newest.
//!
//! The last four plan resets (`SYSRESETREQ`) in the given boot, to
//! show that a reset loses no reading and applies none twice; QEMU restarts the program and the
//! emulated flash survives:
//!
//! - `cut_write`: the `n`-th flash write after the outbox opened stops part-way (half its words
//!   written, then one word only partly programmed), as when power fails during a write;
//! - `reset_in_reply`: the first exchange still waiting for its reply after
//!   [`REPLY_RESET_AFTER`] (the cloud holds replies after applying the write) resets the device:
//!   the write landed, its reply never arrives;
//! - `reset_in_backoff`: the first retry wait of at least [`BACKOFF_RESET_MIN`] resets the
//!   device half-way through;
//! - `reset_in_hold`: once the endpoint's refusal holds the outbox (the hold on flash), the
//!   device resets [`HOLD_RESET_AFTER`] into the hold: the next boot must go on with it.
//!
//! - `crash_loop`: in each of the first `boots` boots, the device resets as soon as the boot's
//!   first exchange has its answer (before the reading is settled), as a device whose firmware
//!   crashes shortly after it connects. `boot_base` and `boot_cap` set the wait before a boot's
//!   first network attempt after unhealthy boots ([`wary_uplink::health`]), in milliseconds.
//!
//! Each planned reset logs a `RESET <kind>` line first. Without a plan, nothing resets.
//! The boot number comes from the boot counter on flash; the jitter seed is the host's `seed`
//! mixed with it, so each boot draws differently.

#![no_std]
#![no_main]

use core::net::{Ipv4Addr, SocketAddrV4};
use core::sync::atomic::{AtomicU32, Ordering};

use embassy_executor::Spawner;
use embassy_futures::select::{Either, select};
use embassy_time::{Delay, Duration, Instant, Timer};
use embedded_hal_async::delay::DelayNs;
use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use mps2_an386::flash::{self, PsramFlash, WORD_SIZE};
use mps2_an386::{exit, exit_code, net};
use rand_core::RngCore;
use static_cell::{ConstStaticCell, StaticCell};
use wary::{Draw, Failure, ledger::Ledger};
use wary_outbox::{Config as OutboxConfig, Outbox};
#[cfg(any(all(feature = "tls", feature = "coap"), all(feature = "coap", feature = "mqtt")))]
compile_error!("the uplink is built with one transport: `coap` goes with neither `tls` nor `mqtt`");

#[cfg(not(any(feature = "tls", feature = "coap", feature = "mqtt")))]
use wary_uplink::HttpTransport;
#[cfg(not(feature = "coap"))]
use wary_uplink::POLICY;
use wary_uplink::health::BootWait;
#[cfg(not(any(feature = "coap", feature = "mqtt")))]
use wary_uplink::http::Buffers;
use wary_uplink::transport::{Answer, Counts, Message};
use wary_uplink::{
    Config, Credential, FLEET, SplitMix64, Store, Transport, WhenFull, parse_device_id, sense, uplink,
};

/// The host as seen from QEMU's user-mode network.
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// Readings the sensor makes in each boot, unless `readings=` says otherwise.
const READINGS_PER_BOOT: u32 = 6;
/// The boot counter in the first two pages of the emulated flash, the queue in the next eight,
/// the dead letters in the two after.
const OUTBOX: OutboxConfig =
    OutboxConfig { boot_range: 0..0x2000, queue_range: 0x2000..0xA000, dead_range: 0xA000..0xC000 };
/// Generous: guest time runs slow on a busy host.
const DHCP_LIMIT: Duration = Duration::from_secs(30);
/// How long an exchange waits for its reply before a planned `reset_in_reply` fires. Replies
/// from the host take milliseconds; only a reply the cloud holds takes this long.
const REPLY_RESET_AFTER: Duration = Duration::from_millis(800);
/// The shortest retry wait a planned `reset_in_backoff` cuts: below the policy's shortest
/// first wait (half its 100 ms base), so the boot's first retry is cut, whatever the draws.
const BACKOFF_RESET_MIN: Duration = Duration::from_millis(40);
/// How far into an endpoint hold a planned `reset_in_hold` fires: under the shortest first
/// probe wait a scenario sets (half its `hold_base`), so the reset falls inside the hold.
const HOLD_RESET_AFTER: Duration = Duration::from_millis(400);

type Flash = CutFlash<PsramFlash>;
/// A 2 KiB send buffer: a batch of 16 readings (about 1.4 KB with its head) leaves in one segment.
#[cfg(not(any(feature = "coap", feature = "mqtt")))]
type NetBuffers = Buffers<1024, 2048, 1024>;

#[cfg(not(any(feature = "coap", feature = "mqtt")))]
static BUFFERS: ConstStaticCell<NetBuffers> = ConstStaticCell::new(Buffers::new());
#[cfg(feature = "coap")]
static COAP_BUFFERS: ConstStaticCell<wary_uplink::coap::Buffers> =
    ConstStaticCell::new(wary_uplink::coap::Buffers::new());

/// Feature `mqtt`: the socket's buffers and the client's arena, the socket the client and the
/// transport share (with `tls` too, the TLS session on it), and the login (the transport holds
/// them for the whole run).
#[cfg(feature = "mqtt")]
static MQTT_BUFFERS: ConstStaticCell<wary_uplink::mqtt::Buffers<1024, 1024, 256>> =
    ConstStaticCell::new(wary_uplink::mqtt::Buffers::new());
#[cfg(all(feature = "mqtt", not(feature = "tls")))]
static MQTT_SOCKET: StaticCell<wary_uplink::mqtt::SharedSocket<'static>> = StaticCell::new();
#[cfg(all(feature = "mqtt", feature = "tls"))]
static MQTT_TLS: StaticCell<wary_uplink::tls::TlsPipe<'static>> = StaticCell::new();
#[cfg(feature = "mqtt")]
static MQTT_ARENA: StaticCell<wary_uplink::mqtt::BumpBuffer<'static>> = StaticCell::new();
#[cfg(feature = "mqtt")]
static MQTT_LOGIN: StaticCell<Credential> = StaticCell::new();

/// Feature `tls`: the name the server's certificate must carry (sent as SNI and `Host`), and
/// the CA its chain must lead to, both fixed at build time (see build.rs).
#[cfg(feature = "tls")]
const SERVER_NAME: &str = env!("WARY_SERVER_NAME");
#[cfg(feature = "tls")]
static PINNED_CA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pinned-ca.der"));
/// TLS record buffers: a whole record of any server, and one record of request.
#[cfg(feature = "tls")]
static TLS_READ: ConstStaticCell<[u8; wary_uplink::tls::MAX_RECORD]> =
    ConstStaticCell::new([0; wary_uplink::tls::MAX_RECORD]);
#[cfg(feature = "tls")]
static TLS_WRITE: ConstStaticCell<[u8; 1024]> = ConstStaticCell::new([0; 1024]);
/// The TLS transport's socket (or MQTT's under TLS), which it keeps (and connects again) for
/// its whole life.
#[cfg(feature = "tls")]
static TLS_SOCKET: StaticCell<embassy_net::tcp::TcpSocket<'static>> = StaticCell::new();
static STORE: StaticCell<Store<Flash>> = StaticCell::new();

/// A planned `reset_in_hold`: waits until the outbox is held on flash for an endpoint's
/// refusal, then resets the device [`HOLD_RESET_AFTER`] later, inside the hold.
#[embassy_executor::task]
async fn reset_in_hold(store: &'static Store<Flash>) {
    loop {
        if let Some(hold) = store.hold().await {
            Timer::after(HOLD_RESET_AFTER).await;
            defmt::info!(
                "RESET hold: {=u64} ms into the hold after {=u8} refused probes (the last {=u16})",
                HOLD_RESET_AFTER.as_millis(),
                hold.step,
                hold.reason
            );
            flash::reset()
        }
        Timer::after(Duration::from_millis(20)).await;
    }
}

#[embassy_executor::task]
async fn sensor(store: &'static Store<Flash>, boot: u32, count: u32) {
    let mut n = 0u32;
    // A plausible room temperature that changes a little with every reading.
    let sample = move || {
        n = n.wrapping_add(1);
        let wobble = (boot.wrapping_mul(131).wrapping_add(n.wrapping_mul(37)) % 500) as i32;
        21_000 + wobble
    };
    sense(store, count, Duration::from_millis(60), sample).await;
}

/// What the host asked for.
struct Args {
    device: u64,
    credential: Option<Credential>,
    port: u16,
    seed: u64,
    readings: u32,
    cut_write: Option<(u32, u32)>,
    reset_in_reply: Option<u32>,
    reset_in_backoff: Option<u32>,
    reset_in_hold: Option<u32>,
    crash_loop: u32,
    boot_base: Option<u64>,
    boot_cap: Option<u64>,
    hold_base: Option<u64>,
    hold_cap: Option<u64>,
    rounds: Option<u32>,
    when_full: WhenFull,
    /// `keepalive=off`: one connection per request (`Connection: close`), for comparisons;
    /// over TLS also one handshake per request. Not read by the CoAP and MQTT transports.
    #[cfg_attr(any(feature = "tls", feature = "coap", feature = "mqtt"), allow(dead_code))]
    keepalive: bool,
    /// `idle_ms=`: how long a kept connection may idle (the transport's default otherwise).
    #[cfg_attr(any(feature = "tls", feature = "coap"), allow(dead_code))]
    idle_ms: Option<u64>,
    /// `batch=N`: up to N readings in one `POST /readings/batch` (off by default).
    #[cfg_attr(feature = "tls", allow(dead_code))]
    batch: usize,
    /// `pacing=off`: no pace and no breaker (on by default, as on a fielded device), for the
    /// scenarios whose cloud fails a share of every device's requests by design and whose time
    /// limit a herd's pace would not fit (docs/pacing.md).
    pacing: bool,
}

/// The command line, or why it cannot be used.
fn args() -> Result<Args, &'static str> {
    let all = semihosting::experimental::env::args::<512>()
        .map_err(|_| "the semihosting command line (QEMU -append) cannot be read")?;
    let mut a = Args {
        device: 0,
        credential: None,
        port: 0,
        seed: 0,
        readings: READINGS_PER_BOOT,
        cut_write: None,
        reset_in_reply: None,
        reset_in_backoff: None,
        reset_in_hold: None,
        crash_loop: 0,
        boot_base: None,
        boot_cap: None,
        hold_base: None,
        hold_cap: None,
        rounds: None,
        when_full: WhenFull::RefuseNewest,
        keepalive: true,
        idle_ms: None,
        batch: 1,
        pacing: true,
    };
    let (mut device, mut port, mut seed) = (None, None, None);
    for arg in &all {
        let Ok(arg) = arg else { continue };
        let Some((name, value)) = arg.split_once('=') else { continue };
        match name {
            "device" => {
                device = Some(
                    parse_device_id(value)
                        .ok_or("device= is not 16 hex digits or a decimal 64-bit number")?,
                );
            }
            // The value itself is never echoed: it is a secret.
            "token" => {
                a.credential =
                    Some(Credential::from_token(value).ok_or("token= is not 64 lowercase hex digits")?);
            }
            "port" => port = value.parse().ok(),
            "seed" => seed = value.parse().ok(),
            "readings" => a.readings = value.parse().map_err(|_| "readings= is not a number")?,
            "cut_write" => {
                let bad = "cut_write= is not <boot>:<n>";
                let (boot, n) = value.split_once(':').ok_or(bad)?;
                a.cut_write = Some((boot.parse().map_err(|_| bad)?, n.parse().map_err(|_| bad)?));
            }
            "reset_in_reply" => {
                a.reset_in_reply = Some(value.parse().map_err(|_| "reset_in_reply= is not a boot number")?);
            }
            "reset_in_backoff" => {
                a.reset_in_backoff =
                    Some(value.parse().map_err(|_| "reset_in_backoff= is not a boot number")?);
            }
            "reset_in_hold" => {
                a.reset_in_hold = Some(value.parse().map_err(|_| "reset_in_hold= is not a boot number")?);
            }
            "crash_loop" => {
                a.crash_loop = value.parse().map_err(|_| "crash_loop= is not a number of boots")?
            }
            "boot_base" => a.boot_base = Some(value.parse().map_err(|_| "boot_base= is not milliseconds")?),
            "boot_cap" => a.boot_cap = Some(value.parse().map_err(|_| "boot_cap= is not milliseconds")?),
            "hold_base" => a.hold_base = Some(value.parse().map_err(|_| "hold_base= is not milliseconds")?),
            "hold_cap" => a.hold_cap = Some(value.parse().map_err(|_| "hold_cap= is not milliseconds")?),
            "when_full" => {
                a.when_full = match value {
                    "refuse" => WhenFull::RefuseNewest,
                    "shed" => WhenFull::ShedOldest,
                    _ => return Err("when_full= is not refuse or shed"),
                }
            }
            "rounds" => a.rounds = Some(value.parse().map_err(|_| "rounds= is not a number")?),
            "keepalive" => a.keepalive = value != "off",
            "idle_ms" => a.idle_ms = Some(value.parse().map_err(|_| "idle_ms= is not a number")?),
            "batch" => a.batch = value.parse().map_err(|_| "batch= is not a number")?,
            "pacing" => {
                a.pacing = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err("pacing= is not on or off"),
                }
            }
            _ => {}
        }
    }
    a.device = device.ok_or("no device= (the 64-bit device id) on the command line")?;
    a.port = port.ok_or("no valid port= on the command line")?;
    a.seed = seed.ok_or("no valid seed= on the command line")?;
    Ok(a)
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let board = mps2_an386::init();
    let args = match args() {
        Ok(args) => args,
        Err(why) => {
            defmt::error!("cannot run: {=str} (QEMU -append)", why);
            exit(exit_code::FAIL)
        }
    };
    let Some(psram) = flash::take() else { exit(exit_code::FAIL) };

    // The outbox first: its boot counter goes up before anything is sent.
    let (outbox, report) = match Outbox::open(CutFlash { inner: psram }, OUTBOX).await {
        Ok(opened) => opened,
        Err(e) => {
            defmt::error!("the outbox does not open: {}", e.error);
            exit(exit_code::FAIL)
        }
    };
    let boot = report.boot;
    defmt::info!(
        "BOOT {=u32}: {=u32} pending, boot range reset {}, queue range reset {}, dead-letter range reset {}, {=u32} foreign discarded",
        boot,
        report.pending,
        report.boot_range_reset,
        report.queue_range_reset,
        report.dead_range_reset,
        report.foreign_discarded
    );
    if report.dead_letters > 0 || report.dead_dropped > 0 {
        defmt::warn!(
            "DEAD_LETTERS {=u32} on flash, {=u32} dropped to make room",
            report.dead_letters,
            report.dead_dropped
        );
    }
    // Whether a credential is set, never what it is.
    defmt::info!(
        "device {=u64:016x}, credential {=str}, pace and breaker {=str}",
        args.device,
        if args.credential.is_some() { "set" } else { "none" },
        if args.pacing { "on" } else { "off" }
    );
    if let Some((b, n)) = args.cut_write
        && b == boot
    {
        CUT_AT.store(n, Ordering::Relaxed);
    }
    let store = STORE.init(Store::new(outbox).when_full(args.when_full));

    let seed = SplitMix64::new(args.seed ^ u64::from(boot).wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64();
    if sensor(store, boot, args.readings).map(|t| spawner.spawn(t)).is_err() {
        defmt::error!("could not spawn a task");
        exit(exit_code::FAIL)
    }
    if args.reset_in_hold == Some(boot) && reset_in_hold(store).map(|t| spawner.spawn(t)).is_err() {
        defmt::error!("could not spawn a task");
        exit(exit_code::FAIL)
    }
    let mut config = Config::new(args.device);
    config.pacing = args.pacing;
    if let Some(ms) = args.boot_base {
        config.boot_base = wary::Duration::from_millis(ms);
    }
    if let Some(ms) = args.boot_cap {
        config.boot_cap = wary::Duration::from_millis(ms);
    }
    if let Some(ms) = args.hold_base {
        config.drain.hold_base = wary::Duration::from_millis(ms);
    }
    if let Some(ms) = args.hold_cap {
        config.drain.hold_cap = wary::Duration::from_millis(ms);
    }
    if let Some(n) = args.rounds {
        config.max_rounds = n;
    }
    if let Err(e) = config.drain.check() {
        defmt::error!("cannot run: the drain's settings are refused ({}) (QEMU -append)", e);
        exit(exit_code::FAIL)
    }
    // Before the first network attempt (the link's bring-up included): a boot after unhealthy
    // ones waits.
    let first = BootWait::after(&config, report.unhealthy_boots, Draw::from_rng(&mut SplitMix64::new(seed)));
    first.log(report.unhealthy_boots);
    Timer::after(first.wait.into()).await;
    defmt::info!("FIRST_WAIT over at {=u64} ms", Instant::now().as_millis());
    let started = Instant::now();
    let stack = match net::bring_up(spawner, board.eth, seed, DHCP_LIMIT).await {
        Ok(stack) => stack,
        Err(err) => {
            defmt::error!("network: {}", err);
            exit(exit_code::FAIL)
        }
    };
    defmt::info!("DHCP lease after {=u64} ms: {}", started.elapsed().as_millis(), stack.config_v4());

    let server = SocketAddrV4::new(HOST, args.port);
    #[cfg(not(any(feature = "tls", feature = "coap", feature = "mqtt")))]
    let http = {
        let mut http = HttpTransport::new(stack, server, wary_uplink::PATH, BUFFERS.take())
            .with_credential(args.credential.as_ref());
        if let Some(ms) = args.idle_ms {
            http = http.idle_limit(Duration::from_millis(ms));
        }
        if !args.keepalive {
            http = http.connection_per_request();
        }
        if args.batch > 1 {
            http = http.batches(wary_uplink::BATCH_PATH, args.batch);
        }
        http
    };
    #[cfg(all(feature = "tls", not(feature = "mqtt")))]
    let http = {
        defmt::info!("TLS to {=str} (CA pinned at build time, {=usize} bytes)", SERVER_NAME, PINNED_CA.len());
        let pinned = wary_uplink::tls::Pinned { ca: PINNED_CA, server_name: SERVER_NAME };
        let (rx, tx, head) = BUFFERS.take().parts();
        let socket = TLS_SOCKET.init(embassy_net::tcp::TcpSocket::new(stack, rx, tx));
        let mut https = wary_uplink::tls::TlsTransport::new(
            stack,
            server,
            wary_uplink::PATH,
            pinned,
            socket,
            head,
            TLS_READ.take(),
            TLS_WRITE.take(),
            tls_rng(seed),
        )
        .with_credential(args.credential.as_ref());
        if let Some(ms) = args.idle_ms {
            https = https.idle_limit(Duration::from_millis(ms));
        }
        if !args.keepalive {
            https = https.connection_per_request();
        }
        if args.batch > 1 {
            https = https.batches(wary_uplink::BATCH_PATH, args.batch);
        }
        https
    };
    #[cfg(feature = "coap")]
    let http = {
        // An attempt listens 1 s for its answer; a later one is taken by the next attempt.
        config.attempt_limit = wary::Duration::from_secs(1);
        wary_uplink::coap::CoapTransport::new(
            stack,
            server,
            wary_uplink::coap::PREFIX,
            boot,
            COAP_BUFFERS.take(),
        )
    };
    #[cfg(feature = "coap")]
    let policy = &wary_uplink::coap::POLICY;
    #[cfg(not(feature = "coap"))]
    let policy = &POLICY;
    // The broker at `port=` (the device logs in with its id and `token=`, required).
    // Over TLS 1.3 with `tls` too: the broker's chain must lead to the pinned CA and name
    // `WARY_SERVER_NAME`; one handshake per MQTT connection.
    #[cfg(feature = "mqtt")]
    let http = {
        let Some(credential) = args.credential.clone() else {
            defmt::error!("feature mqtt: no token= to log in to the broker with");
            exit(exit_code::FAIL)
        };
        let (rx, tx, arena) = MQTT_BUFFERS.take().parts();
        #[cfg(not(feature = "tls"))]
        let pipe = MQTT_SOCKET.init(wary_uplink::mqtt::shared_socket(stack, rx, tx));
        #[cfg(feature = "tls")]
        let pipe = {
            defmt::info!(
                "MQTT over TLS to {=str} (CA pinned at build time, {=usize} bytes)",
                SERVER_NAME,
                PINNED_CA.len()
            );
            let pinned = wary_uplink::tls::Pinned { ca: PINNED_CA, server_name: SERVER_NAME };
            let socket = TLS_SOCKET.init(embassy_net::tcp::TcpSocket::new(stack, rx, tx));
            MQTT_TLS.init(wary_uplink::tls::TlsPipe::new(
                pinned,
                socket,
                TLS_READ.take(),
                TLS_WRITE.take(),
                tls_rng(seed),
            ))
        };
        let arena = MQTT_ARENA.init(wary_uplink::mqtt::BumpBuffer::new(arena));
        wary_uplink::mqtt::MqttTransport::new(
            stack,
            server,
            args.device,
            MQTT_LOGIN.init(credential),
            pipe,
            arena,
        )
    };
    let reply = ResetInReply { inner: http, armed: args.reset_in_reply == Some(boot) };
    let mut transport = CrashAfterExchange { inner: reply, armed: boot <= args.crash_loop, sent: 0 };
    let delay = ResetInBackoff { inner: Delay, armed: args.reset_in_backoff == Some(boot) };
    let mut ledger = Ledger::<32>::new();
    let s = uplink(&config, policy, &FLEET, delay, SplitMix64::new(seed), &mut transport, store, &mut ledger)
        .await;
    let counts: Counts = transport.inner.inner.counts();
    s.log(&store.counters().await, &counts);
    // The HTTP connection counts; over CoAP its own line instead.
    #[cfg(not(feature = "coap"))]
    counts.log();
    #[cfg(feature = "coap")]
    transport.inner.inner.coap_counts().log();
    #[cfg(feature = "mqtt")]
    transport.inner.inner.mqtt_counts().log();
    // A dead letter is kept and reported, not lost: the run passes once nothing is pending.
    if s.all_settled() {
        exit(exit_code::PASS)
    } else {
        defmt::error!("{=u32} readings left, {=u32} dead-lettered", s.left, s.dead_lettered);
        exit(exit_code::FAIL)
    }
}

/// The TLS handshakes' generator. QEMU has no hardware RNG: the randomness comes from the host's
/// seed and the boot, so no two boots share it (a real board seeds it from its RNG).
#[cfg(feature = "tls")]
fn tls_rng(seed: u64) -> rand_chacha::ChaCha20Rng {
    use rand_chacha::rand_core::SeedableRng;
    let mut bytes = [0u8; 32];
    let mut draw = SplitMix64::new(seed ^ 0x746c_735f_7365_6564);
    draw.fill_bytes(&mut bytes);
    rand_chacha::ChaCha20Rng::from_seed(bytes)
}

/// A planned reset while a reply is outstanding; otherwise the inner transport as it is.
struct ResetInReply<T> {
    inner: T,
    armed: bool,
}

impl<T: Transport> Transport for ResetInReply<T> {
    const BATCH: usize = T::BATCH;

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn open(&mut self, limit: wary::Duration) -> Result<(), Failure> {
        self.inner.open(limit).await
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: wary::Duration) {
        if !self.armed {
            return self.inner.send(messages, answers, limit).await;
        }
        let key = messages.first().map_or("", |m| m.key);
        match select(self.inner.send(messages, answers, limit), Timer::after(REPLY_RESET_AFTER)).await {
            Either::First(()) => {}
            Either::Second(()) => {
                defmt::info!(
                    "RESET reply: no reply after {=u64} ms, key={=str}",
                    REPLY_RESET_AFTER.as_millis(),
                    key
                );
                flash::reset()
            }
        }
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        self.inner.report_dead_letters(held, dropped);
    }
}

/// A planned crash as soon as the boot's first exchange has its answer; otherwise the inner
/// transport as it is. Either way the start of the boot's first exchange is logged
/// (`EXCHANGE first`), so the order of a boot's events can be checked.
struct CrashAfterExchange<T> {
    inner: T,
    armed: bool,
    /// Requests handed to the transport in this boot.
    sent: u32,
}

impl<T: Transport> Transport for CrashAfterExchange<T> {
    const BATCH: usize = T::BATCH;

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn open(&mut self, limit: wary::Duration) -> Result<(), Failure> {
        self.inner.open(limit).await
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: wary::Duration) {
        if self.sent == 0 {
            defmt::info!("EXCHANGE first at {=u64} ms", Instant::now().as_millis());
        }
        self.sent = self.sent.saturating_add(messages.len() as u32);
        self.inner.send(messages, answers, limit).await;
        if self.armed {
            let answered = answers.first().is_some_and(|a| a.is_ok());
            defmt::info!(
                "RESET crash-loop: first exchange over at {=u64} ms (answered {=bool}) requests={=u32}",
                Instant::now().as_millis(),
                answered,
                self.sent
            );
            flash::reset()
        }
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        self.inner.report_dead_letters(held, dropped);
    }
}

/// A planned reset half-way through a retry wait; otherwise the inner delay as it is.
struct ResetInBackoff<D> {
    inner: D,
    armed: bool,
}

impl<D: DelayNs> DelayNs for ResetInBackoff<D> {
    async fn delay_ns(&mut self, ns: u32) {
        let ms = u64::from(ns) / 1_000_000;
        if self.armed && ms >= BACKOFF_RESET_MIN.as_millis() {
            self.inner.delay_ns(ns / 2).await;
            defmt::info!("RESET backoff: {=u64} ms into a {=u64} ms wait", ms / 2, ms);
            flash::reset()
        }
        self.inner.delay_ns(ns).await;
    }

    async fn delay_us(&mut self, us: u32) {
        let ms = u64::from(us) / 1_000;
        if self.armed && ms >= BACKOFF_RESET_MIN.as_millis() {
            self.inner.delay_us(us / 2).await;
            defmt::info!("RESET backoff: {=u64} ms into a {=u64} ms wait", ms / 2, ms);
            flash::reset()
        }
        self.inner.delay_us(us).await;
    }

    async fn delay_ms(&mut self, ms: u32) {
        if self.armed && u64::from(ms) >= BACKOFF_RESET_MIN.as_millis() {
            self.inner.delay_ms(ms / 2).await;
            defmt::info!("RESET backoff: {=u32} ms into a {=u32} ms wait", ms / 2, ms);
            flash::reset()
        }
        self.inner.delay_ms(ms).await;
    }
}

/// The emulated flash, with a planned power cut part-way through one write: the
/// [`CUT_AT`]-th write after it was armed (0: none).
struct CutFlash<F> {
    inner: F,
}

/// Which write after arming is cut; armed after the outbox opened, in the planned boot only.
static CUT_AT: AtomicU32 = AtomicU32::new(0);
/// Writes since [`CUT_AT`] was armed.
static WRITES: AtomicU32 = AtomicU32::new(0);

impl<F: ErrorType> ErrorType for CutFlash<F> {
    type Error = F::Error;
}

impl<F: ReadNorFlash> ReadNorFlash for CutFlash<F> {
    const READ_SIZE: usize = F::READ_SIZE;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.inner.read(offset, bytes).await
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

impl<F: NorFlash> NorFlash for CutFlash<F> {
    const WRITE_SIZE: usize = F::WRITE_SIZE;
    const ERASE_SIZE: usize = F::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        self.inner.erase(from, to).await
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        let cut_at = CUT_AT.load(Ordering::Relaxed);
        if cut_at == 0 {
            return self.inner.write(offset, bytes).await;
        }
        let writes = WRITES.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if writes != cut_at {
            return self.inner.write(offset, bytes).await;
        }
        // Half the words written whole, the next one only partly programmed (its first half
        // of bytes cleared as asked, the rest still erased), then the power goes.
        let words = bytes.len() / WORD_SIZE;
        let whole = (words / 2) * WORD_SIZE;
        if whole > 0 {
            let _ = self.inner.write(offset, &bytes[..whole]).await;
        }
        if let Some(word) = bytes.get(whole..whole + WORD_SIZE) {
            let mut partial = [0xFFu8; WORD_SIZE];
            partial[..WORD_SIZE / 2].copy_from_slice(&word[..WORD_SIZE / 2]);
            let _ = self.inner.write(offset + whole as u32, &partial).await;
        }
        defmt::info!(
            "RESET flash-write: write {=u32} cut after {=usize} of {=usize} bytes",
            writes,
            whole + WORD_SIZE / 2,
            bytes.len()
        );
        flash::reset()
    }
}

impl<F: MultiwriteNorFlash> MultiwriteNorFlash for CutFlash<F> {}
