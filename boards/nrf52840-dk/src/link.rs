//! The cellular link: the dial-up chat (`wary-dial`) brings the modem into data mode, then
//! `embassy-net-ppp` runs PPP on the same UART as the `embassy-net` device, with the IPv4
//! address IPCP assigns. When PPP ends the modem is hung up and dialled again after a bounded,
//! jittered wait.
//!
//! PPP ends when:
//!
//! - the runner returns: the UART failed, or the peer terminated the link;
//! - IPCP has not assigned an address within [`NEGOTIATION_LIMIT`] of `CONNECT` (PPP here
//!   sends its configure requests once, so a lost one would otherwise stall for ever), or the
//!   link went down and did not come back within that time;
//! - the uplink saw [`STALE_AFTER`] connection attempts in a row time out ([`LinkAware`]): a
//!   modem that lost its carrier while PPP looks open (its `NO CARRIER` is text inside the PPP
//!   stream, which PPP skips) answers nothing, while a link that works brings back at least a
//!   refusal from the server.
//!
//! The wait between dials is the core's exponential backoff with equal jitter
//! ([`Jitter::Equal`]: half the ceiling plus a uniform draw up to the other half), its ceiling
//! doubling from [`REDIAL_BASE`] to [`REDIAL_CAP`] with each dial in a row that did not give a
//! lasting session. A configuration the network refuses (the APN, the SIM) waits the longest
//! ceiling every time: redialling cannot fix it, and a person has to.
//!
//! Across boots: the first dial of a boot after unhealthy ones waits first
//! (`wary_uplink::health::BootWait`), and every dial takes one from the modem's
//! [`DialCap`] (6 an hour by default), whose window is on flash in the outbox's boot record and
//! is saved before the dial: a reset loop cannot dial faster than the cap.

use core::cell::Cell;

use embassy_futures::select::{Either, select};
use embassy_net::{ConfigV4, Ipv4Cidr, Stack, StaticConfigV4};
use embassy_nrf::buffered_uarte::{self, BufferedUarte};
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::signal::Signal;
use embassy_time::{Duration, Instant, Timer, with_timeout};
use rand_core::RngCore;
use wary::{Backoff, Draw, Failure, Jitter};
use wary_dial::{Chat, Class, DialCap, DialWindow};
use wary_uplink::Store;
use wary_uplink::transport::{Answer, Message, Transport};

use crate::Flash;

/// How long PPP may take from `CONNECT` to an IPv4 address (LCP, PAP, IPCP), and to come back
/// after the link went down mid-session.
pub const NEGOTIATION_LIMIT: Duration = Duration::from_secs(30);
/// Connection attempts in a row that timed out after which the link counts as dead.
pub const STALE_AFTER: u32 = 3;
/// The first ceiling of the wait between dials.
pub const REDIAL_BASE: wary::Duration = wary::Duration::from_secs(5);
/// The longest ceiling of the wait between dials (and the wait, jittered, after the network
/// refused the configuration).
pub const REDIAL_CAP: wary::Duration = wary::Duration::from_secs(300);
/// How often an attempt made while the link is down looks whether it came up.
pub const LINK_POLL: Duration = Duration::from_millis(200);
/// A session open at least this long starts the redial backoff again from its base: the link
/// worked, so its end is news, not the same failure again.
pub const STABLE_SESSION: Duration = Duration::from_secs(120);

/// Raised by [`LinkAware`] when the link looks dead; the link task ends the PPP session.
static STALE: Signal<CriticalSectionRawMutex, ()> = Signal::new();

/// Why a PPP session ended.
#[derive(Debug, defmt::Format)]
pub enum End {
    /// The runner returned: the UART failed or the peer terminated PPP.
    Runner(embassy_net_ppp::RunError<buffered_uarte::Error>),
    /// No IPv4 address within [`NEGOTIATION_LIMIT`] of `CONNECT`.
    NoAddress,
    /// The link went down and did not come back within [`NEGOTIATION_LIMIT`].
    LinkDown,
    /// [`STALE_AFTER`] connection attempts in a row timed out.
    Stale,
}

/// The wait between dials: [`Backoff`] with [`Jitter::Equal`], draws from the device's
/// generator.
pub struct Redial {
    backoff: Backoff,
    /// Dials in a row without a lasting session.
    step: u32,
}

impl Redial {
    /// Ceilings doubling from [`REDIAL_BASE`] to [`REDIAL_CAP`].
    pub const fn new() -> Self {
        Redial { backoff: Backoff::new(REDIAL_BASE, REDIAL_CAP, Jitter::Equal), step: 0 }
    }

    /// The next wait. A refused configuration draws under the longest ceiling at once.
    pub fn next(&mut self, class: Option<Class>, draw: Draw) -> Duration {
        self.step = self.step.saturating_add(1);
        let retry = match class {
            Some(Class::FixConfiguration) => u32::MAX,
            _ => self.step,
        };
        self.backoff.wait(retry, wary::Duration::ZERO, draw).into()
    }

    /// Back to the base: a session lasted.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}

/// Dials, runs PPP until it ends, hangs up, waits, and dials again, for ever. The first dial
/// waits `first_wait`; every dial is taken from the [`DialCap`] kept in `store`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    uart: &mut BufferedUarte<'static>,
    ppp: &mut embassy_net_ppp::Runner<'static>,
    ppp_config: embassy_net_ppp::Config<'_>,
    mut chat: Chat<'_>,
    stack: Stack<'static>,
    mut rng: impl RngCore,
    store: &'static Store<Flash>,
    first_wait: Duration,
) -> ! {
    let mut redial = Redial::new();
    let mut dials = 0u32;
    let cap = DialCap::DEFAULT;
    // Uptime before this point counts as none: the cap only gets stricter for it.
    let mut saved_at = Instant::now();
    Timer::after(first_wait).await;
    loop {
        let stored = store.dial_window().await;
        let now = Instant::now();
        let window = cap.age(
            DialWindow { elapsed_ms: stored.elapsed_ms, dials: stored.dials },
            now.saturating_duration_since(saved_at),
        );
        saved_at = now;
        let taken = cap.take(window);
        let save = taken.unwrap_or(window);
        let saved = wary_outbox::DialWindow { elapsed_ms: save.elapsed_ms, dials: save.dials };
        if let Err(e) = store.set_dial_window(saved).await {
            defmt::error!("LINK saving the dial window failed: {}", e);
        }
        if let Err(wait) = taken {
            defmt::warn!(
                "LINK dial cap: {=u16} dials in this window already; next dial in {=u64} ms",
                cap.max(),
                wait.as_millis()
            );
            Timer::after(wait).await;
            continue;
        }
        dials = dials.saturating_add(1);
        let class = match chat.dial(uart).await {
            Ok(connected) => {
                defmt::info!("LINK dial {=u32}: data mode, CONNECT rate {}", dials, connected.rate);
                let opened: Cell<Option<Instant>> = Cell::new(None);
                let end = session(uart, ppp, ppp_config.clone(), stack, &opened).await;
                stack.set_config_v4(ConfigV4::None);
                let lasted = opened.get().map(|at| at.elapsed());
                defmt::warn!("LINK PPP ended: {}, open for {} ms", end, lasted.map(|d| d.as_millis()));
                if lasted.is_some_and(|d| d >= STABLE_SESSION) {
                    redial.reset();
                }
                // PPP is stopped: the silence before the escape is what the modem needs.
                if let Err(e) = chat.hang_up(uart).await {
                    defmt::warn!("LINK hang-up failed: {} ({})", e, e.class());
                }
                None
            }
            Err(e) => {
                let class = e.class();
                if e.may_be_online() {
                    let _ = chat.hang_up(uart).await;
                }
                match class {
                    Class::FixConfiguration => defmt::error!(
                        "LINK dial {=u32}: {}: the modem or network refuses the configuration (APN, SIM): fix it; retrying on a long period",
                        dials,
                        e
                    ),
                    Class::ResetModem => defmt::error!(
                        "LINK dial {=u32}: {}: the modem does not answer; check its power and wiring (this board cannot reset it)",
                        dials,
                        e
                    ),
                    _ => defmt::warn!("LINK dial {=u32}: {}", dials, e),
                }
                Some(class)
            }
        };
        let wait = redial.next(class, Draw::from_rng(&mut rng));
        defmt::info!("LINK next dial in {=u64} ms; chat {}", wait.as_millis(), chat.stats());
        Timer::after(wait).await;
    }
}

/// One PPP session on `uart`, from `CONNECT` until it ends; `opened` is set when IPCP gave the
/// stack an address.
async fn session(
    uart: &mut BufferedUarte<'static>,
    ppp: &mut embassy_net_ppp::Runner<'static>,
    ppp_config: embassy_net_ppp::Config<'_>,
    stack: Stack<'static>,
    opened: &Cell<Option<Instant>>,
) -> End {
    let on_ipv4_up = |status: embassy_net_ppp::Ipv4Status| {
        let Some(address) = status.address else {
            defmt::warn!("LINK IPCP opened without an address for us");
            return;
        };
        let mut dns_servers = heapless::Vec::new();
        for server in status.dns_servers.iter().flatten() {
            let _ = dns_servers.push(*server);
        }
        // A point-to-point link: every destination is on the other end, no gateway needed.
        stack.set_config_v4(ConfigV4::Static(StaticConfigV4 {
            address: Ipv4Cidr::new(address, 0),
            gateway: None,
            dns_servers,
        }));
        opened.set(Some(Instant::now()));
        defmt::info!("LINK up: {}, peer {}", address, status.peer_address);
    };
    STALE.reset();
    let watch = async {
        if with_timeout(NEGOTIATION_LIMIT, stack.wait_config_up()).await.is_err() {
            return End::NoAddress;
        }
        loop {
            // The stack learns of the link's state from the driver a moment after IPCP, and
            // again after a renegotiation.
            if with_timeout(NEGOTIATION_LIMIT, stack.wait_link_up()).await.is_err() {
                return End::LinkDown;
            }
            match select(STALE.wait(), stack.wait_link_down()).await {
                Either::First(()) => return End::Stale,
                Either::Second(()) => defmt::warn!("LINK down mid-session: waiting for PPP to renegotiate"),
            }
        }
    };
    match select(ppp.run(&mut *uart, ppp_config, on_ipv4_up), watch).await {
        Either::First(Err(e)) => End::Runner(e),
        Either::First(Ok(never)) => match never {},
        Either::Second(end) => end,
    }
}

/// The uplink's transport, aware of the link under it.
///
/// - An attempt made while the link is down (dialling, negotiating) waits for it, within the
///   attempt's own time limit; if none comes up, the attempt is answered as never sent
///   ([`Failure::Refused`]): nothing left the device, so any operation may be sent again.
/// - [`STALE_AFTER`] connection timeouts in a row tell the link task to end the session and
///   redial. Any other outcome (a reply, a refusal, a reset) shows the path works.
pub struct LinkAware<T> {
    /// The transport that makes the exchange.
    pub inner: T,
    stack: Stack<'static>,
    timeouts_in_row: u32,
    no_link: u32,
}

impl<T> LinkAware<T> {
    /// `inner` over `stack`.
    pub const fn new(inner: T, stack: Stack<'static>) -> Self {
        LinkAware { inner, stack, timeouts_in_row: 0, no_link: 0 }
    }

    /// Attempts answered as never sent because no link came up in time.
    pub fn no_link(&self) -> u32 {
        self.no_link
    }
}

impl<T: Transport> Transport for LinkAware<T> {
    const BATCH: usize = T::BATCH;

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn open(&mut self, limit: wary::Duration) -> Result<(), Failure> {
        self.inner.open(limit).await
    }

    async fn send(&mut self, messages: &[Message<'_>], answers: &mut [Answer], limit: wary::Duration) {
        let started = Instant::now();
        let deadline = started.saturating_add(limit.into());
        // Polled, not awaited: embassy-net keeps one waker for link and configuration changes,
        // and the link task holds it; a second waiter would evict it, and the two tasks would
        // wake each other in turn for as long as the link is down.
        let mut up = true;
        while !(self.stack.is_link_up() && self.stack.is_config_up()) {
            let now = Instant::now();
            if now >= deadline {
                up = false;
                break;
            }
            Timer::at(now.saturating_add(LINK_POLL).min(deadline)).await;
        }
        let left = limit.checked_sub(started.elapsed().into()).filter(|left| *left > wary::Duration::ZERO);
        let Some(left) = left.filter(|_| up) else {
            // Nothing left the device: every message is answered as never sent.
            self.no_link = self.no_link.saturating_add(1);
            for slot in answers.iter_mut().take(messages.len()) {
                *slot = Err(Failure::Refused);
            }
            return;
        };
        self.inner.send(messages, answers, left).await;
        let answered = answers.get(..messages.len()).unwrap_or_default();
        if answered.iter().any(|a| *a == Err(Failure::ConnectTimeout)) {
            self.timeouts_in_row = self.timeouts_in_row.saturating_add(1);
            if self.timeouts_in_row >= STALE_AFTER {
                defmt::warn!(
                    "LINK {=u32} connection attempts in a row timed out: redialling",
                    self.timeouts_in_row
                );
                self.timeouts_in_row = 0;
                STALE.signal(());
            }
        } else {
            self.timeouts_in_row = 0;
        }
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }

    fn report_dead_letters(&mut self, held: u32, dropped: u32) {
        self.inner.report_dead_letters(held, dropped);
    }
}
