//! The uplink application on the nRF52840-DK: the same uplink as the QEMU app
//! (`boards/mps2-an386/app/src/bin/uplink.rs`), over a cellular modem's PPP instead of Ethernet.
//!
//! - **Link**: UARTE0 as a `BufferedUarte`, 115200 8N1, TX P1.01 and RX P1.02, to a 3GPP modem.
//!   `wary-dial` brings it into data mode (`ATD*99#` → `CONNECT`), then `embassy-net-ppp` runs
//!   PPP on the same UART as the `embassy-net` device, with the IPv4 address from IPCP; when
//!   PPP ends the modem is hung up and dialled again after a jittered wait ([`link`]).
//! - **Outbox and boot counter**: on the internal flash, in the top 32 KiB that `memory.x`
//!   keeps out of the program ([`layout`]), through embassy-nrf's `Nvmc`.
//! - **Jitter seed**: from the hardware RNG (bias correction on), per boot.
//! - **Device id**: the factory-programmed 64-bit id, FICR DEVICEID[1] (high word) and
//!   DEVICEID[0] (low word), the first 16 hex digits of every key.
//! - **Credential**: `WARY_DEVICE_TOKEN` at build time (64 lowercase hex digits), sent as
//!   `Authorization: Bearer <token>` on every attempt and never logged; unset, no header.
//! - **Readings**: the on-die temperature sensor (`TEMP`), one every [`PERIOD`], for ever.
//!
//! Logs over defmt-rtt (`cargo run --release` prints them through probe-rs); a panic is
//! reported by panic-probe.

#![no_std]
#![no_main]

mod config;
mod layout;
mod link;

use core::net::{Ipv4Addr, SocketAddrV4};

use defmt_rtt as _;
use embassy_embedded_hal::adapter::BlockingAsync;
use embassy_executor::Spawner;
use embassy_net::{Stack, StackResources};
use embassy_nrf::buffered_uarte::{self, BufferedUarte};
use embassy_nrf::config::{HfclkSource, LfclkSource};
use embassy_nrf::nvmc::Nvmc;
use embassy_nrf::temp::{self, Temp};
use embassy_nrf::{bind_interrupts, peripherals, rng, uarte};
use embassy_time::{Delay, Duration, Timer};
use panic_probe as _;
use static_cell::{ConstStaticCell, StaticCell};
use wary::Draw;
use wary::ledger::Ledger;
use wary_dial::{Apn, Chat};
use wary_outbox::Outbox;
#[cfg(not(feature = "tls"))]
use wary_uplink::HttpTransport;
use wary_uplink::health::BootWait;
use wary_uplink::http::Buffers;
use wary_uplink::{Config, Credential, FLEET, POLICY, Reading, SplitMix64, Store, offer, uplink};

use crate::link::LinkAware;

// ---------------------------------------------------------------------------------------------
// Configuration: each value can be set in the build's environment (`WARY_APN=... cargo build`);
// a malformed one stops the build. The APN and the PAP credentials are never logged.
// ---------------------------------------------------------------------------------------------

/// `WARY_APN`: the access point name of the SIM's data plan. Default empty: the network's
/// default APN, which many networks assign.
const APN: Apn<'static> = match Apn::new(config::or(option_env!("WARY_APN"), "")) {
    Ok(apn) => apn,
    Err(_) => panic!("WARY_APN: printable ASCII without `\"` or `\\`, at most 100 bytes"),
};
/// `WARY_PPP_USER`, `WARY_PPP_PASSWORD`: PAP credentials, if the APN needs them (default
/// empty: most cellular networks take any).
const PPP_USER: &str = config::or(option_env!("WARY_PPP_USER"), "");
const PPP_PASSWORD: &str = config::or(option_env!("WARY_PPP_PASSWORD"), "");
/// `WARY_SERVER`: the cloud's IPv4 address. The default, 192.0.2.1, is a documentation
/// address that reaches nothing: set it to your server.
const SERVER_IP: Ipv4Addr = match config::ipv4(config::or(option_env!("WARY_SERVER"), "192.0.2.1")) {
    Some(ip) => ip,
    None => panic!("WARY_SERVER: an IPv4 address such as 203.0.113.7"),
};
/// `WARY_PORT`: the cloud's TCP port (HTTP/1.1, no TLS). Default 8080.
const SERVER_PORT: u16 = match config::port(config::or(option_env!("WARY_PORT"), "8080")) {
    Some(port) => port,
    None => panic!("WARY_PORT: a TCP port, 1 to 65535"),
};
/// `WARY_DEVICE_TOKEN`: the device's credential, a random 256-bit value as 64 lowercase hex
/// digits (one per device: the gateway keeps its SHA-256 beside the device id). Sent as
/// `Authorization: Bearer <token>` on every attempt and never logged. Unset: no
/// `Authorization` header.
static CREDENTIAL: Option<Credential> = match option_env!("WARY_DEVICE_TOKEN") {
    None => None,
    Some(token) => match Credential::from_token(token) {
        Some(credential) => Some(credential),
        None => panic!("WARY_DEVICE_TOKEN: 64 lowercase hex digits (a random 256-bit value)"),
    },
};
/// `WARY_PATH`: where readings are posted. Default `/readings`.
const PATH: &str = config::or(option_env!("WARY_PATH"), wary_uplink::PATH);
/// `WARY_SERVER_NAME` (feature `tls`): the cloud's name, sent as SNI and `Host`; its
/// certificate must carry it and lead to the CA compiled in from `WARY_CA_DER`.
#[cfg(feature = "tls")]
const SERVER_NAME: &str = config::or(option_env!("WARY_SERVER_NAME"), "cloud.example.com");
#[cfg(feature = "tls")]
static PINNED_CA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pinned-ca.der"));
/// TLS record buffers: a whole record of any server, and one record of request.
#[cfg(feature = "tls")]
static TLS_READ: ConstStaticCell<[u8; wary_uplink::tls::MAX_RECORD]> =
    ConstStaticCell::new([0; wary_uplink::tls::MAX_RECORD]);
#[cfg(feature = "tls")]
static TLS_WRITE: ConstStaticCell<[u8; 1024]> = ConstStaticCell::new([0; 1024]);
/// The TLS transport's socket, which it keeps (and connects again) for its whole life.
#[cfg(feature = "tls")]
static TLS_SOCKET: StaticCell<embassy_net::tcp::TcpSocket<'static>> = StaticCell::new();
const _: () = assert!(config::path(PATH), "WARY_PATH: an absolute path of visible ASCII, such as /readings");

/// Time between temperature readings. Flash wear sets the floor: the queue erases a page per
/// about 118 readings and has six pages, so one reading a minute erases each page about twice a
/// day, far inside the nRF52840's 10 000 erase cycles over a device's life.
const PERIOD: Duration = Duration::from_secs(60);
/// The longest one exchange may take (connect, send, reply): a cellular round trip takes
/// hundreds of milliseconds, more while the radio wakes; the call's 20 s deadline shortens it.
const ATTEMPT_LIMIT: wary::Duration = wary::Duration::from_secs(10);
/// How long the device waits before it tries again to open an outbox that did not open.
const OPEN_RETRY: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------

/// The outbox's flash: the NVMC's blocking `NorFlash` and `MultiwriteNorFlash`, made async.
/// Writes and erases halt the CPU while they run (a page erase takes up to 85 ms); the UART's
/// receive buffer is sized to take what the modem sends meanwhile.
type Flash = BlockingAsync<Nvmc<'static>>;
/// One exchange at a time: socket buffers and a header block of 1 KiB each.
type NetBuffers = Buffers<1024, 1024, 1024>;

/// The UART's receive buffer: half of it (2 KiB) holds 170 ms at 115200 baud, twice the longest
/// flash erase, during which the CPU cannot empty it.
static UART_RX: ConstStaticCell<[u8; 4096]> = ConstStaticCell::new([0; 4096]);
static UART_TX: ConstStaticCell<[u8; 2048]> = ConstStaticCell::new([0; 2048]);
static PPP_STATE: ConstStaticCell<embassy_net_ppp::State<2, 2>> =
    ConstStaticCell::new(embassy_net_ppp::State::new());
/// One TCP socket for the exchange, one spare.
static RESOURCES: ConstStaticCell<StackResources<2>> = ConstStaticCell::new(StackResources::new());
static BUFFERS: ConstStaticCell<NetBuffers> = ConstStaticCell::new(Buffers::new());
static STORE: StaticCell<Store<Flash>> = StaticCell::new();

bind_interrupts!(struct Irqs {
    UARTE0 => buffered_uarte::InterruptHandler<peripherals::UARTE0>;
    RNG => rng::InterruptHandler<peripherals::RNG>;
    TEMP => temp::InterruptHandler;
});

#[embassy_executor::task]
async fn net_task(mut runner: embassy_net::Runner<'static, embassy_net_ppp::Device<'static>>) -> ! {
    runner.run().await
}

/// The modem: dial, PPP, hang up, redial, for ever.
#[embassy_executor::task]
async fn modem_task(
    mut uart: BufferedUarte<'static>,
    mut ppp: embassy_net_ppp::Runner<'static>,
    stack: Stack<'static>,
    seed: u64,
    store: &'static Store<Flash>,
    first_wait: Duration,
) -> ! {
    let ppp_config =
        embassy_net_ppp::Config { username: PPP_USER.as_bytes(), password: PPP_PASSWORD.as_bytes() };
    let chat = Chat::new(wary_dial::Config::new(APN));
    link::run(&mut uart, &mut ppp, ppp_config, chat, stack, SplitMix64::new(seed), store, first_wait).await
}

/// Reads the on-die temperature sensor every [`PERIOD`], for ever, and [`offer`]s each reading
/// to the outbox until it takes it: nothing is dropped.
#[embassy_executor::task]
async fn sensor_task(mut temp: Temp<'static>, store: &'static Store<Flash>) -> ! {
    loop {
        // Quarter degrees Celsius.
        let quarters = temp.read().await.to_bits();
        offer(store, Reading { milli_celsius: quarters.saturating_mul(250) }, PERIOD).await;
        Timer::after(PERIOD).await;
    }
}

/// The factory-programmed, per-chip 64-bit id: FICR DEVICEID[1] as the high word, DEVICEID[0]
/// as the low one. Both words: two chips that share one word still make different keys.
fn device_id() -> u64 {
    let low = nrf_pac::FICR.deviceid(0).read();
    let high = nrf_pac::FICR.deviceid(1).read();
    (u64::from(high) << 32) | u64::from(low)
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let mut config = embassy_nrf::config::Config::default();
    // The DK has both crystals; the UART's baud rate is more accurate on the HFXO.
    config.hfclk_source = HfclkSource::ExternalXtal;
    config.lfclk_source = LfclkSource::ExternalXtal;
    let p = embassy_nrf::init(config);

    let device = device_id();
    // Three seeds from the hardware RNG with bias correction, fresh at every boot: the uplink's
    // jitter, the redial backoff's jitter, and the TCP stack's (initial sequence numbers, ports).
    // With TLS, 256 more bits seed the handshakes' generator.
    let (jitter_seed, redial_seed, net_seed, _tls_seed) = {
        let mut rng = rng::Rng::new(p.RNG, Irqs);
        rng.set_bias_correction(true);
        let mut bytes = [0u8; 56];
        rng.fill_bytes(&mut bytes).await;
        let (words, tls) = bytes.split_at(24);
        let mut seeds = words.chunks_exact(8).map(|c| c.try_into().map_or(0, u64::from_le_bytes));
        let tls: [u8; 32] = tls.try_into().unwrap_or([0; 32]);
        (seeds.next().unwrap_or(0), seeds.next().unwrap_or(0), seeds.next().unwrap_or(0), tls)
    };

    // The outbox first: its boot counter goes up before anything is sent.
    let outbox_config = wary_outbox::Config {
        boot_range: layout::BOOT_RANGE,
        queue_range: layout::QUEUE_RANGE,
        dead_range: layout::DEAD_RANGE,
    };
    let mut flash: Flash = BlockingAsync::new(Nvmc::new(p.NVMC));
    let (outbox, report) = loop {
        match Outbox::open(flash, outbox_config.clone()).await {
            Ok(opened) => break opened,
            Err(e) => {
                defmt::error!(
                    "the outbox does not open ({}): trying again in {=u64} s",
                    e.error,
                    OPEN_RETRY.as_secs()
                );
                flash = e.flash;
                Timer::after(OPEN_RETRY).await;
            }
        }
    };
    defmt::info!(
        "wary uplink on nRF52840-DK: device {=u64:016x}, BOOT {=u32}: {=u32} pending, boot range reset {}, queue range reset {}, {=u32} foreign discarded",
        device,
        report.boot,
        report.pending,
        report.boot_range_reset,
        report.queue_range_reset,
        report.foreign_discarded
    );
    defmt::info!("server {}:{=u16}, path {=str}", SERVER_IP, SERVER_PORT, PATH);
    let store: &'static Store<Flash> = STORE.init(Store::new(outbox));
    // A device runs for ever: no round limit.
    let config = Config { attempt_limit: ATTEMPT_LIMIT, max_rounds: u32::MAX, ..Config::new(device) };
    // Before the boot's first dial: after unhealthy boots (counted on flash), a wait.
    let first_wait = BootWait::after(
        &config,
        report.unhealthy_boots,
        Draw::from_rng(&mut SplitMix64::new(redial_seed.rotate_left(17))),
    );
    first_wait.log(report.unhealthy_boots);

    // The modem's pins: TX P1.01, RX P1.02, on the DK's P1 header and used by nothing else on
    // the board. firmware/README.md lists the other free pins.
    let (modem_tx, modem_rx) = (p.P1_01, p.P1_02);
    let mut uart_config = uarte::Config::default();
    uart_config.baudrate = uarte::Baudrate::Baud115200;
    let uart = BufferedUarte::new(
        p.UARTE0,
        p.TIMER1,
        p.PPI_CH0,
        p.PPI_CH1,
        p.PPI_GROUP0,
        modem_rx,
        modem_tx,
        Irqs,
        uart_config,
        UART_RX.take(),
        UART_TX.take(),
    );

    let (device_ppp, ppp_runner) = embassy_net_ppp::new(PPP_STATE.take());
    // No address until IPCP assigns one (`link`).
    let (stack, net_runner) =
        embassy_net::new(device_ppp, embassy_net::Config::default(), RESOURCES.take(), net_seed);

    for spawned in [
        net_task(net_runner).map(|t| spawner.spawn(t)),
        modem_task(uart, ppp_runner, stack, redial_seed, store, first_wait.wait.into())
            .map(|t| spawner.spawn(t)),
        sensor_task(Temp::new(p.TEMP, Irqs), store).map(|t| spawner.spawn(t)),
    ] {
        if spawned.is_err() {
            // Each task is spawned once, into its own pool: this cannot happen.
            defmt::panic!("could not spawn a task");
        }
    }

    let server = SocketAddrV4::new(SERVER_IP, SERVER_PORT);
    #[cfg(not(feature = "tls"))]
    let http = HttpTransport::new(stack, server, PATH, BUFFERS.take()).with_credential(CREDENTIAL.as_ref());
    #[cfg(feature = "tls")]
    let http = {
        use rand_chacha::rand_core::SeedableRng;
        let pinned = wary_uplink::tls::Pinned { ca: PINNED_CA, server_name: SERVER_NAME };
        let (rx, tx, head) = BUFFERS.take().parts();
        let socket = TLS_SOCKET.init(embassy_net::tcp::TcpSocket::new(stack, rx, tx));
        wary_uplink::tls::TlsTransport::new(
            stack,
            server,
            PATH,
            pinned,
            socket,
            head,
            TLS_READ.take(),
            TLS_WRITE.take(),
            rand_chacha::ChaCha20Rng::from_seed(_tls_seed),
        )
        .with_credential(CREDENTIAL.as_ref())
    };
    let mut transport = LinkAware::new(http, stack);
    let mut ledger = Ledger::<32>::new();
    let mut rng = SplitMix64::new(jitter_seed);
    loop {
        let s = uplink(&config, &POLICY, &FLEET, Delay, &mut rng, &mut transport, store, &mut ledger).await;
        s.log(&store.counters().await, &transport.inner.counts());
        defmt::info!("{=u32} attempts found no link", transport.no_link());
    }
}
