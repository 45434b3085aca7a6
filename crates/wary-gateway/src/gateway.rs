//! The gateway: a bounded queue, workers running wary calls, an answer after each verdict.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration as StdDuration;

use http::StatusCode;
use rand::rngs::StdRng;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use wary::{
    Attempt, Backoff, Draw, Duration, FleetBudget, FleetBudgetError, GiveUp, Instant, Jitter, Key, Operation,
    Policy, Runner, Sink, Stopped, Table, Verdict, ledger::Record,
};
use wary_host::call::SharedEndpoint;
use wary_host::ledger::JsonLedger;
use wary_host::spec::PolicySpec;
use wary_host::time::{MonotonicClock, TokioDelay};

use crate::admission::{Admission, Limits, Refused};
use crate::credentials::{Credentials, Identity};
use crate::dead_letters::{self, DeadLetters};
use crate::hold::{EndpointFault, HoldingEndpoint, Holds};
use crate::metrics::Metrics;
use crate::retry_after::retry_after_secs;
use crate::upstream::{Delivered, Forward, HttpClient, LegacyProbe, Upstream, client};

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where readings go.
    pub upstream: Upstream,
    /// The policy, as data (the ledger's policy line carries it).
    pub policy: PolicySpec,
    /// Fleet budget: maximum tokens.
    pub fleet_max_tokens: u32,
    /// Fleet budget: thousandths of a token returned per success.
    pub fleet_ratio_milli: u32,
    /// Queue capacity (readings accepted but not yet being sent). A reading that finds it
    /// full is answered 503 at once: memory stays bounded whatever the load.
    pub queue: usize,
    /// Concurrent upstream calls.
    pub workers: usize,
    /// Largest request body accepted from a device, bytes (413 above); in a batch, each item's.
    pub max_body: usize,
    /// Most items and bytes of one `POST /readings/batch` (413 above; docs/batches.md).
    pub batch: wary_host::batch::Limits,
    /// Draw seed (tests and replays only; `None`: OS entropy, per process).
    pub seed: Option<u64>,
    /// Keep every attempt for a timeline.
    pub timeline: bool,
    /// Who may post: device credentials (the default, with no device admitted until some are
    /// given) or, explicitly, anyone.
    pub auth: Auth,
    /// Per-device admission (fairness): a token bucket per authenticated device.
    pub admission: Limits,
    /// How long a device may take to send its request head (and, over TLS, its handshake)
    /// before the connection is closed.
    pub header_timeout: StdDuration,
    /// How long a device may take to send its body once its head is in (408 after).
    pub body_timeout: StdDuration,
    /// Send the key upstream as `<device id, 16 hex>:<key>`, for upstreams whose devices do not
    /// use wary's key layout: keys of different devices stay apart whatever they look like, and
    /// the key need not start with the device id. Off by default; needs [`Auth::Bearer`] (an
    /// open gateway knows no device to prefix).
    pub device_prefix: bool,
    /// Pace the upstream calls and break the circuit when the upstream is down: one
    /// [`wary::Pace`] and one [`wary::Breaker`] shared by every worker, asked before every
    /// attempt ([`UPSTREAM_PACE`], [`UPSTREAM_BREAKER`], each field overridable in the policy's
    /// `[pace]` and `[breaker]`). On by default; `--no-upstream-pacing` turns both off (for an
    /// upstream known to take whatever the gateway sends). The ledger records what they said
    /// about each attempt, so `wary replay` checks the decisions they changed.
    pub upstream_pacing: bool,
}

/// The upstream's send rate by default: a gateway speaks for many devices, so it assumes 200
/// requests a second when first throttled (100 after the cut), halves on each cut down to 5 a
/// second, climbs back in 10 s, and lets 20 go at once. It hears many answers a second, and
/// cuts only when more than half of those since the last cut were throttles: an upstream that
/// refuses a share of requests at random, and serves the rest, is not slowed to the floor.
pub const UPSTREAM_PACE: wary::PaceSettings = wary::PaceSettings {
    start_milli: 200_000,
    floor_milli: 5_000,
    ceiling_milli: 10_000_000,
    keep_percent: 50,
    regrow: wary::Duration::from_millis(10_000),
    burst: 20,
    tolerate_percent: 50,
};

/// The upstream's circuit breaker by default: open after 5 failures in a row (refused
/// connections, timeouts, 5xx but 503) for 1–2 s, doubling to 15–30 s: short, because a
/// gateway's calls stand for devices that are waiting for an answer. A refused connection is
/// one of the five, not an open breaker at once: behind a load balancer, one replica that
/// restarts refuses a connection the next one serves.
pub const UPSTREAM_BREAKER: wary::BreakerSettings = wary::BreakerSettings {
    threshold: 5,
    open: wary::Duration::from_millis(2_000),
    max_open: wary::Duration::from_millis(30_000),
    refused_opens: false,
};

/// Who may post readings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Auth {
    /// Every request names its device with `Authorization: Bearer <token>`; its key must be
    /// that device's (403 otherwise).
    Bearer(Arc<Credentials>),
    /// Anyone who can reach the gateway may post any key: for tests and for a gateway whose
    /// network admits only its own devices. Chosen explicitly, never by default.
    Open,
}

impl Config {
    /// Defaults for `upstream`: the default policy with a 10 s wait budget and 20 s deadline,
    /// fleet budget 100 tokens / 0.1, queue 1024, 64 workers, 16 KiB bodies, batches of up to
    /// 32 items in 64 KiB, 5 s per attempt;
    /// bearer credentials with no device admitted yet, 5 requests a second per device in bursts
    /// of 20, 10 s for a body, keys forwarded as they are, the upstream paced and broken
    /// ([`UPSTREAM_PACE`], [`UPSTREAM_BREAKER`]).
    pub fn new(base: &str) -> Self {
        Config {
            upstream: Upstream::new(base),
            policy: PolicySpec {
                budget: Some(10_000),
                deadline: Some(20_000),
                min_attempt: Some(100),
                ..PolicySpec::default()
            },
            fleet_max_tokens: 100,
            fleet_ratio_milli: 100,
            queue: 1024,
            workers: 64,
            max_body: 16 * 1024,
            batch: wary_host::batch::Limits::default(),
            seed: None,
            timeline: false,
            auth: Auth::Bearer(Arc::new(Credentials::new())),
            admission: Limits::default(),
            header_timeout: crate::ingress::HEADER_TIMEOUT,
            body_timeout: StdDuration::from_secs(10),
            device_prefix: false,
            upstream_pacing: true,
        }
    }
}

/// Why the gateway could not start or take a reading.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The policy spec is invalid.
    #[error("policy: {0}")]
    Policy(#[from] wary_host::spec::SpecError),
    /// The fleet budget settings are invalid.
    #[error("fleet budget: {0}")]
    Fleet(#[from] FleetBudgetError),
    /// The gateway has stopped.
    #[error("gateway stopped")]
    Stopped,
    /// The queue is full (only from [`Gateway::try_submit`]).
    #[error("queue full")]
    Full,
}

/// The gateway's verdict on one reading, as the device will hear it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// It landed: the upstream's 2xx (whose body may have failed the body check: landed
    /// all the same, never resent).
    Landed(Delivered),
    /// The gateway's stop rules ended the call before it landed: the device keeps the reading
    /// and sends it again, with the same key, no sooner than `retry_after_secs`.
    GaveUp {
        /// Which stop rule.
        reason: GiveUp,
        /// When to come back, whole seconds (at least 1).
        retry_after_secs: u64,
    },
    /// The upstream's answer failed the call and was the endpoint's fault, not the reading's
    /// (by the policy's table: its credential, its path, its proxy, the server, TLS;
    /// [`crate::hold`]), or the breaker such an answer opened stopped the call: the device keeps
    /// the reading and sends it again, with the same key, no sooner than `retry_after_secs` (the
    /// upstream's breaker's remaining open time).
    Held {
        /// What the upstream answered.
        fault: EndpointFault,
        /// When to come back, whole seconds (1..=[`crate::MAX_RETRY_AFTER_SECS`]).
        retry_after_secs: u64,
    },
    /// The upstream refused it in a way a resend cannot fix.
    Failed {
        /// The upstream's status, if it answered with one.
        upstream_status: Option<u16>,
    },
    /// An unkeyed write that may have landed and that the probe could not resolve: surfaced
    /// to a person; the device must never send it again.
    Unknown,
    /// The call was cancelled.
    Cancelled,
}

impl Answer {
    /// The verdict's name (`ok`, `gave_up`, `held`, `failed`, `unknown`, `cancelled`).
    pub fn name(&self) -> &'static str {
        match self {
            Answer::Landed(_) => "ok",
            Answer::GaveUp { .. } => "gave_up",
            Answer::Held { .. } => "held",
            Answer::Failed { .. } => "failed",
            Answer::Unknown => "unknown",
            Answer::Cancelled => "cancelled",
        }
    }

    /// The status the device gets. See `docs/deployment.md` for the choice of each:
    /// the upstream's 2xx; 503 for a give-up and a hold (the device's resend is paced by
    /// Retry-After);
    /// 424 Failed Dependency for `failed` and 409 Conflict for `unknown`, both in every
    /// device table's "do not resend" class.
    pub fn status(&self) -> StatusCode {
        match self {
            Answer::Landed(d) => d.status,
            Answer::GaveUp { .. } | Answer::Held { .. } | Answer::Cancelled => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Answer::Failed { .. } => StatusCode::FAILED_DEPENDENCY,
            Answer::Unknown => StatusCode::CONFLICT,
        }
    }
}

struct Job {
    reading: Forward,
    reply: oneshot::Sender<Answer>,
}

struct Shared {
    config: Config,
    policy: Policy,
    fleet: FleetBudget,
    ledger: Mutex<JsonLedger<Box<dyn Write + Send>>>,
    metrics: Mutex<Metrics>,
    /// Retry-After values from the upstream that could not be read at all.
    unreadable: AtomicU64,
    clock: MonotonicClock,
    client: HttpClient,
    /// The credentials in force (`None`: open), swapped whole on reload.
    credentials: RwLock<Option<Arc<Credentials>>>,
    admission: Mutex<Admission>,
    /// The upstream's pace and breaker (neither when pacing is off).
    endpoint: SharedEndpoint,
    /// The MQTT ingress's counters, once it runs (shown on `/metrics`).
    mqtt: Mutex<Option<Arc<crate::mqtt::MqttCounts>>>,
    /// The CoAP ingress's counters, once it runs (shown on `/metrics`).
    coap: Mutex<Option<Arc<crate::coap::CoapCounts>>>,
    /// The upstream's endpoint faults: what holds its breaker open, their counts and log times.
    holds: Arc<Holds>,
    /// Each authenticated device's last dead-letter report, bounded ([`crate::dead_letters`]).
    dead_letters: Mutex<DeadLetters>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ledger sink every runner writes to: the JSON line, then the counters.
struct GatewaySink(Arc<Shared>);

impl Sink for GatewaySink {
    fn record(&mut self, record: &Record) {
        lock(&self.0.ledger).record(record);
        lock(&self.0.metrics).record(record, self.0.clock.now());
    }
}

/// A running gateway. Dropping it (or [`Gateway::shutdown`]) stops the workers; readings not
/// yet answered are simply not answered, and the devices send them again.
pub struct Gateway {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Starts the workers on the current tokio runtime; `ledger` gets the JSON lines.
    pub fn start(config: Config, ledger: Box<dyn Write + Send>) -> Result<Gateway, GatewayError> {
        let policy = config.policy.build()?;
        // A `[fleet]` in the policy spec wins over the config's own fields.
        let (tokens, ratio) = match config.policy.fleet {
            Some(f) => (f.tokens, f.ratio_milli),
            None => (config.fleet_max_tokens, config.fleet_ratio_milli),
        };
        let fleet = FleetBudget::new(tokens, ratio)?;
        let endpoint = if config.upstream_pacing {
            let pace = config.policy.pace.unwrap_or_default().build(UPSTREAM_PACE)?;
            let breaker = config.policy.breaker.unwrap_or_default().build(UPSTREAM_BREAKER)?;
            SharedEndpoint::new(Some(pace), Some(breaker))
        } else {
            SharedEndpoint::default()
        };
        let mut json = JsonLedger::new(ledger);
        // A ledger that cannot be written never stops the gateway; it counts the failures.
        let _ = json.policy(&policy);
        let metrics = Metrics { events: config.timeline.then(Vec::new), ..Metrics::default() };
        let client = client(config.upstream.attempt_timeout);
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let mut seeds = match config.seed {
            Some(s) => wary_host::draw::seeded(s),
            None => wary_host::draw::process_rng(),
        };
        let shared = Arc::new(Shared {
            policy,
            fleet,
            ledger: Mutex::new(json),
            metrics: Mutex::new(metrics),
            unreadable: AtomicU64::new(0),
            clock: MonotonicClock::new(),
            client,
            credentials: RwLock::new(match &config.auth {
                Auth::Bearer(c) => Some(c.clone()),
                Auth::Open => None,
            }),
            admission: Mutex::new(Admission::new(config.admission)),
            endpoint,
            mqtt: Mutex::new(None),
            coap: Mutex::new(None),
            holds: Arc::new(Holds::default()),
            dead_letters: Mutex::new(DeadLetters::default()),
            config,
        });
        let workers = (0..shared.config.workers.max(1))
            .map(|_| {
                let rng = wary_host::draw::split(&mut seeds);
                tokio::spawn(worker(shared.clone(), rx.clone(), rng))
            })
            .collect();
        Ok(Gateway { tx, shared, workers })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Sends one reading upstream and waits for its answer. Waits for queue space first.
    pub async fn submit(&self, reading: Forward) -> Result<Answer, GatewayError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job { reading, reply }).await.map_err(|_| GatewayError::Stopped)?;
        rx.await.map_err(|_| GatewayError::Stopped)
    }

    /// Queues one reading without waiting; `Full` when the queue is full.
    pub fn try_submit(&self, reading: Forward) -> Result<oneshot::Receiver<Answer>, GatewayError> {
        let (reply, rx) = oneshot::channel();
        self.tx.try_send(Job { reading, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => GatewayError::Full,
            mpsc::error::TrySendError::Closed(_) => GatewayError::Stopped,
        })?;
        Ok(rx)
    }

    /// Who a request's `Authorization` names ([`Credentials::identify`]); `None` if the
    /// gateway is open to anyone.
    pub fn identify(&self, authorization: Option<&[u8]>, claimed: Option<u64>) -> Option<Identity> {
        let creds = self.shared.credentials.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        creds.map(|c| c.identify(authorization, claimed))
    }

    /// Puts new credentials in force for the requests that follow; open connections stay open.
    /// An open gateway stays open.
    pub fn set_credentials(&self, credentials: Credentials) {
        let mut slot = self.shared.credentials.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_some() {
            // A device no longer listed no longer shows its dead letters: the map stays within
            // the file.
            lock(&self.shared.dead_letters).retain(|d| credentials.contains(d));
            *slot = Some(Arc::new(credentials));
        }
    }

    /// Notes the `Wary-Dead-Letters` report in `headers`, if any, as `device`'s: the device the
    /// request authenticated as, never one it names. A malformed field is counted, never logged,
    /// and changes nothing else.
    pub(crate) fn note_dead_letters(&self, device: u64, headers: &http::HeaderMap) {
        if let Some(report) = dead_letters::Report::from_headers(headers) {
            lock(&self.shared.dead_letters).note(device, report);
        }
    }

    /// `device`'s last dead-letter report, if one was kept.
    pub fn dead_letters(&self, device: u64) -> Option<dead_letters::Report> {
        lock(&self.shared.dead_letters).get(device)
    }

    /// A snapshot of the dead-letter reports and their counters.
    pub fn dead_letter_reports(&self) -> DeadLetters {
        lock(&self.shared.dead_letters).clone()
    }

    /// True if the credentials in force list `device` (false if open).
    pub fn admits(&self, device: u64) -> bool {
        let slot = self.shared.credentials.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.as_ref().is_some_and(|c| c.contains(device))
    }

    /// Devices admitted by the credentials in force (0 if open).
    pub fn credential_count(&self) -> usize {
        let slot = self.shared.credentials.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.as_ref().map_or(0, |c| c.len())
    }

    /// Takes one of `device`'s admission tokens now.
    pub(crate) fn admit(&self, device: u64) -> Result<(), Refused> {
        lock(&self.shared.admission).admit(device, std::time::Instant::now())
    }

    /// Devices holding an admission bucket.
    pub fn admission_buckets(&self) -> usize {
        lock(&self.shared.admission).len()
    }

    /// Counts a request refused before it reached the queue (see [`Metrics::refused`]).
    pub(crate) fn count_refusal(&self, what: &'static str) {
        *lock(&self.shared.metrics).refused.entry(what).or_default() += 1;
    }

    /// True if this key was answered `unknown` lately (legacy upstreams): a resend of it is
    /// answered `unknown` again and never forwarded.
    pub(crate) fn was_surfaced(&self, key: Key) -> bool {
        self.shared.config.upstream.legacy && lock(&self.shared.metrics).surfaced.contains(&key)
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        let mut m = lock(&self.shared.metrics).clone();
        m.retry_after_unreadable = self.shared.unreadable.load(Ordering::Relaxed);
        m
    }

    /// The fleet budget's tokens now, thousandths.
    pub fn fleet_tokens_milli(&self) -> u32 {
        self.shared.fleet.tokens_milli()
    }

    /// Readings queued, not yet taken by a worker.
    pub fn queue_depth(&self) -> usize {
        self.tx.max_capacity().saturating_sub(self.tx.capacity())
    }

    /// The gateway's time since start (the timeline's clock).
    pub fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// The Prometheus text exposition.
    pub fn prometheus(&self) -> String {
        let mut m = lock(&self.shared.metrics);
        m.retry_after_unreadable = self.shared.unreadable.load(Ordering::Relaxed);
        let mut text = m.prometheus(
            self.shared.fleet.tokens_milli(),
            self.shared.fleet.max_milli(),
            self.queue_depth(),
            self.tx.max_capacity(),
        );
        if let Some(c) = lock(&self.shared.mqtt).as_ref() {
            text.push_str(&c.prometheus());
        }
        if let Some(c) = lock(&self.shared.coap).as_ref() {
            text.push_str(&c.prometheus());
        }
        text.push_str(&self.shared.holds.prometheus());
        text.push_str(&lock(&self.shared.dead_letters).prometheus());
        text
    }

    /// The upstream's endpoint faults: what holds its breaker open, and their counts.
    pub fn holds(&self) -> &Holds {
        &self.shared.holds
    }

    /// Shows an MQTT ingress's counters on `/metrics` ([`crate::mqtt::Ingress::start`] does it).
    pub(crate) fn attach_mqtt(&self, counts: Arc<crate::mqtt::MqttCounts>) {
        *lock(&self.shared.mqtt) = Some(counts);
    }

    /// Shows a CoAP ingress's counters on `/metrics` ([`crate::coap::Ingress::start`] does it).
    pub(crate) fn attach_coap(&self, counts: Arc<crate::coap::CoapCounts>) {
        *lock(&self.shared.coap) = Some(counts);
    }

    /// Stops the workers now. In-flight calls are dropped without an answer.
    pub async fn shutdown(mut self) {
        let workers = std::mem::take(&mut self.workers);
        for w in &workers {
            w.abort();
        }
        for w in workers {
            let _ = w.await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for w in &self.workers {
            w.abort();
        }
    }
}

/// The sleep after a failed `accept`: the core's [`Backoff`] from 5 ms, doubling up to 1 s,
/// back to the start after a success. Accept errors (out of file descriptors, out of buffers)
/// tend to last a while; accepting again at once would spin a core and starve the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptBackoff {
    backoff: Backoff,
    /// Failures since the last success.
    failures: u32,
    previous: Duration,
}

impl AcceptBackoff {
    /// The schedule: exactly the ceilings, 5 ms to 1 s. One process's accept loop has no herd
    /// to spread, so no jitter; [`AcceptBackoff::with`] takes another.
    pub const BACKOFF: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1), Jitter::None);
    /// The first sleep.
    pub const FIRST: Duration = Self::BACKOFF.base;
    /// The longest sleep.
    pub const CAP: Duration = Self::BACKOFF.cap;

    /// A backoff that has seen no error, on [`Self::BACKOFF`].
    pub const fn new() -> Self {
        Self::with(Self::BACKOFF)
    }

    /// A backoff that has seen no error, on `backoff`.
    pub const fn with(backoff: Backoff) -> Self {
        AcceptBackoff { backoff, failures: 0, previous: Duration::ZERO }
    }

    /// An accept failed: the sleep before the next one, drawn with `draw` under the jitter.
    pub fn failed(&mut self, draw: Draw) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let d = self.backoff.wait(self.failures, self.previous, draw);
        self.previous = d;
        d
    }

    /// An accept succeeded: the next error starts from the first sleep again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.previous = Duration::ZERO;
    }
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Accepts forever: each success goes to `handle`; after an error `on_error` is told it and
/// the sleep, then the loop sleeps ([`AcceptBackoff`], draws from wary-host's generator)
/// before accepting again.
pub async fn accept_loop<T, E, A, Fut, H, O>(mut accept: A, mut handle: H, mut on_error: O)
where
    A: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    H: FnMut(T),
    O: FnMut(&E, Duration),
{
    let mut backoff = AcceptBackoff::new();
    let mut rng = wary_host::draw::for_call();
    loop {
        match accept().await {
            Ok(conn) => {
                backoff.succeeded();
                handle(conn);
            }
            Err(e) => {
                let d = backoff.failed(Draw::from_rng(&mut rng));
                on_error(&e, d);
                wary_host::time::sleep(d).await;
            }
        }
    }
}

/// The answer for a call's result. A give-up's Retry-After is the wait the upstream asked for,
/// passed on as it was asked (a cloud that spreads its asks spreads the devices behind the
/// gateway, rather than all of them coming back after one fixed wait), else the policy's
/// largest backoff ceiling; whole seconds, at least 1.
fn answer(policy: &Policy, result: Result<Delivered, Stopped>) -> Answer {
    let s = match result {
        Ok(d) => return Answer::Landed(d),
        Err(s) => s,
    };
    let upstream_status = s.last.and_then(|o| o.code());
    match s.verdict {
        Verdict::Ok | Verdict::Failed => Answer::Failed { upstream_status },
        Verdict::Unknown => Answer::Unknown,
        Verdict::Cancelled => Answer::Cancelled,
        Verdict::GaveUp(reason) => {
            let asked = match reason {
                GiveUp::RetryAfterTooLong { asked } => Some(asked),
                _ => s.last.and_then(|f| f.retry_after()),
            };
            let ms = asked.unwrap_or(policy.backoff().cap).as_millis();
            Answer::GaveUp { reason, retry_after_secs: retry_after_secs(u64::from(ms)) }
        }
    }
}

/// The endpoint fault a stopped call is held by, if any: it ended `failed` on an answer the
/// policy's `table` blames on the endpoint (a 401, say, or a 431), or the breaker was open when
/// it asked and an endpoint fault is what holds it open (`cause`). Any other verdict is not
/// held: a `failed` that is the reading's fault is answered 424, another give-up is a give-up,
/// an `unknown` may have landed and must never be resent, a cancel is no verdict on the
/// upstream.
fn held_by(s: &Stopped, table: &Table, cause: Option<EndpointFault>) -> Option<EndpointFault> {
    match s.verdict {
        Verdict::Failed => s.last.as_ref().and_then(|f| EndpointFault::blamed(table, f)),
        Verdict::GaveUp(GiveUp::CircuitOpen) => cause,
        _ => None,
    }
}

/// The hold for `fault`: the Retry-After is the upstream breaker's remaining open time `open`
/// (`None` without a breaker: the policy's largest backoff ceiling, as for a give-up), whole
/// seconds, 1..=[`crate::MAX_RETRY_AFTER_SECS`].
fn hold(policy: &Policy, fault: EndpointFault, open: Option<Duration>) -> Answer {
    let wait = open.unwrap_or(policy.backoff().cap);
    Answer::Held { fault, retry_after_secs: retry_after_secs(u64::from(wait.as_millis())) }
}

/// Logs an endpoint fault a call met, at most once every [`crate::hold::LOG_EVERY`] for each
/// fault: what the upstream said and what the gateway does about it, never a header's value
/// (the upstream's credential is one).
fn log_fault(holds: &Holds, fault: EndpointFault, answer: &Answer) {
    let Some(calls) = holds.met(fault, std::time::Instant::now()) else { return };
    let what = match fault {
        EndpointFault::Status(code) => {
            format!("answered {code} to the gateway's own request (its credential, path, proxy or server)")
        }
        EndpointFault::Tls => "failed the TLS handshake".to_owned(),
        other => format!("failed the gateway's request ({other})"),
    };
    let secs = match answer {
        Answer::Held { retry_after_secs, .. } => *retry_after_secs,
        _ => 0,
    };
    eprintln!(
        "wary-gateway: the upstream {what}: the gateway's configuration, not the readings; its breaker \
         is open and devices are held (503, Retry-After {secs} s); {calls} call(s) met it since the \
         last such line"
    );
}

async fn worker(shared: Arc<Shared>, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>, rng: StdRng) {
    let policy = shared.policy;
    let upstream = shared.config.upstream.clone();
    // A keyed write, or with a legacy upstream an unkeyed one whose `unknown` goes to the probe.
    let op = if upstream.legacy { Operation::Write } else { Operation::KeyedWrite };
    let table = *policy.table();
    let mut runner = Runner::new(&policy, TokioDelay, shared.clock, rng)
        .fleet(&shared.fleet)
        .ledger(GatewaySink(shared.clone()))
        .endpoint(HoldingEndpoint::new(shared.endpoint.clone(), shared.holds.clone(), table, op));
    loop {
        let job = rx.lock().await.recv().await;
        let Some(job) = job else { break };
        let r = &job.reading;
        let client = &shared.client;
        let unreadable = &shared.unreadable;
        let send = |a: Attempt| upstream.send(client, &policy, r, a.remaining, unreadable);
        // The call's deadline, for the probe (the runner tells attempts, not probes).
        let deadline = policy.deadline().map(|d| tokio::time::Instant::now() + StdDuration::from(d));
        let result = if upstream.legacy {
            let reading_id = r.key.to_str().unwrap_or_default();
            let probe = LegacyProbe { client, upstream: &upstream, reading_id, deadline, unreadable };
            runner.call_with_probe(op, r.wary_key, send, probe).await
        } else {
            runner.call(op, r.wary_key, send).await
        };
        let answer = match result {
            Err(s) => match held_by(&s, &table, shared.holds.cause()) {
                Some(fault) => {
                    let open = shared.endpoint.breaker().map(|b| b.wait(shared.clock.now()));
                    let held = hold(&policy, fault, open);
                    shared.holds.held(fault);
                    // Logged for the calls that met the fault themselves, not those the open
                    // breaker stopped.
                    if matches!(s.verdict, Verdict::Failed) {
                        log_fault(&shared.holds, fault, &held);
                    }
                    held
                }
                None => answer(&policy, Err(s)),
            },
            ok => answer(&policy, ok),
        };
        {
            let mut m = lock(&shared.metrics);
            match &answer {
                Answer::Unknown => m.surface(r.wary_key),
                Answer::Landed(d) if !d.body_ok => m.landed_bad_body += 1,
                _ => {}
            }
        }
        let _ = job.reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::MAX_RETRY_AFTER_SECS;

    #[test]
    fn accept_backoff_grows_caps_and_resets() {
        let mut b = AcceptBackoff::new();
        let ms: Vec<u32> = (0..10).map(|_| b.failed(Draw::TOP).as_millis()).collect();
        assert_eq!(ms, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(Draw::TOP), AcceptBackoff::FIRST);
        // Another schedule of the core's: equal jitter draws between half the ceiling and all of it.
        let mut j = AcceptBackoff::with(Backoff::new(
            Duration::from_millis(5),
            Duration::from_secs(1),
            Jitter::Equal,
        ));
        assert_eq!(j.failed(Draw::ZERO), Duration::from_millis(2));
        assert_eq!(j.failed(Draw::TOP), Duration::from_millis(9));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_accept_loop_that_keeps_failing_does_not_spin() {
        let calls = AtomicU32::new(0);
        let errors = AtomicU32::new(0);
        let accept = || {
            calls.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Err::<(), _>(std::io::Error::from(std::io::ErrorKind::OutOfMemory)))
        };
        let run = accept_loop(
            accept,
            |()| {},
            |_, _| {
                errors.fetch_add(1, Ordering::Relaxed);
            },
        );
        assert!(tokio::time::timeout(StdDuration::from_millis(300), run).await.is_err());
        // 5 + 10 + 20 + 40 + 80 + 160 ms: about six tries in 300 ms, not millions.
        let n = calls.load(Ordering::Relaxed);
        assert!((3..=8).contains(&n), "{n} accepts in 300 ms");
        assert_eq!(errors.load(Ordering::Relaxed), n);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_success_resets_the_backoff() {
        // Five errors, one success, then errors: the sleep after the success starts at 5 ms.
        let calls = AtomicU32::new(0);
        let sleeps = Mutex::new(Vec::new());
        let accept = || {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            std::future::ready(if n == 5 { Ok(()) } else { Err(()) })
        };
        let run = accept_loop(accept, |()| {}, |_, d: Duration| lock(&sleeps).push(d.as_millis()));
        let _ = tokio::time::timeout(StdDuration::from_millis(400), run).await;
        let s = lock(&sleeps).clone();
        assert_eq!(s.get(..7), Some(&[5, 10, 20, 40, 80, 5, 10][..]), "{s:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_upstream_is_paced_and_broken_by_default() {
        use wary::Endpoint as _;
        let config = Config::new("http://127.0.0.1:9");
        assert!(config.upstream_pacing);
        let gw = Gateway::start(config, Box::new(std::io::sink())).unwrap();
        assert!(gw.shared.endpoint.is_active());
        let mut off = Config::new("http://127.0.0.1:9");
        off.upstream_pacing = false;
        let gw = Gateway::start(off, Box::new(std::io::sink())).unwrap();
        assert!(!gw.shared.endpoint.is_active());
    }

    #[test]
    fn an_endpoint_fault_holds_the_call_and_a_readings_fault_does_not() {
        let stopped = |verdict, last| Stopped { verdict, attempts: 1, last };
        let t = &Table::DEFAULT;
        let f401 = EndpointFault::Status(401);
        // A failed call whose last answer the table blames on the endpoint: the core's rule.
        for code in [401, 403, 404, 406, 411, 414, 421, 426, 428, 431, 501, 505, 506, 510, 511] {
            assert_eq!(
                held_by(&stopped(Verdict::Failed, Some(wary::Failure::status(code))), t, None),
                Some(EndpointFault::Status(code)),
                "{code}"
            );
        }
        assert_eq!(
            held_by(&stopped(Verdict::Failed, Some(wary::Failure::Tls)), t, None),
            Some(EndpointFault::Tls)
        );
        // Stopped by the open breaker before any attempt: held only if a fault holds it open.
        let open = stopped(Verdict::GaveUp(GiveUp::CircuitOpen), None);
        assert_eq!(held_by(&open, t, Some(f401)), Some(f401));
        assert_eq!(held_by(&open, t, None), None);
        // Another give-up is a give-up: not held by a fault some other call met, nor by an
        // answer of its own that the table retried, the endpoint's (a 503) or not.
        for last in [wary::Failure::status(503), wary::Failure::Tls, wary::Failure::status(401)] {
            assert_eq!(held_by(&stopped(Verdict::GaveUp(GiveUp::Budget), Some(last)), t, Some(f401)), None);
        }
        // The reading's own faults, and an unknown (it may have landed), are never held.
        for code in [400, 402, 409, 413, 415, 422, 424, 451] {
            assert_eq!(
                held_by(&stopped(Verdict::Failed, Some(wary::Failure::status(code))), t, Some(f401)),
                None,
                "{code}"
            );
        }
        assert_eq!(held_by(&stopped(Verdict::Unknown, Some(wary::Failure::Tls)), t, Some(f401)), None);
        // The policy's table decides whose fault it is.
        let reading_401 = Table::DEFAULT.with_blame(401, wary::Blame::Reading).unwrap();
        assert_eq!(
            held_by(&stopped(Verdict::Failed, Some(wary::Failure::status(401))), &reading_401, None),
            None
        );
        // The Retry-After: the breaker's remaining open time, rounded up, 1 s at least, an hour
        // at most; without a breaker the policy's largest ceiling.
        let p = Policy::builder(wary::Preset::Default).cap(Duration::from_millis(2_500)).build().unwrap();
        let secs = |open| match hold(&p, f401, open) {
            Answer::Held { retry_after_secs, fault } if fault == f401 => retry_after_secs,
            other => panic!("{other:?}"),
        };
        assert_eq!(secs(Some(Duration::from_millis(1_200))), 2);
        assert_eq!(secs(Some(Duration::ZERO)), 1);
        assert_eq!(secs(Some(Duration::from_secs(86_400))), MAX_RETRY_AFTER_SECS);
        assert_eq!(secs(None), 3);
        let held = hold(&p, f401, None);
        assert_eq!((held.name(), held.status()), ("held", StatusCode::SERVICE_UNAVAILABLE));
    }

    #[test]
    fn answers_map_verdicts_to_statuses_a_device_understands() {
        let ms = Duration::from_millis;
        let p = Policy::builder(wary::Preset::Default)
            .base(ms(100))
            .cap(ms(2_500))
            .budget(ms(5_000))
            .build()
            .unwrap();
        let stopped = |verdict, last| Err(Stopped { verdict, attempts: 3, last });
        let a = answer(&p, stopped(Verdict::GaveUp(GiveUp::Budget), Some(wary::Failure::status(503))));
        // No Retry-After from upstream: the policy's cap, 2.5 s, rounded up.
        assert_eq!(a, Answer::GaveUp { reason: GiveUp::Budget, retry_after_secs: 3 });
        assert_eq!(a.status(), StatusCode::SERVICE_UNAVAILABLE);
        let a = answer(
            &p,
            stopped(
                Verdict::GaveUp(GiveUp::Throttled),
                Some(wary::Failure::status_after(503, Duration::from_secs(7))),
            ),
        );
        assert_eq!(a, Answer::GaveUp { reason: GiveUp::Throttled, retry_after_secs: 7 });
        // An ask shorter than the cap is passed on as asked (1.2 s, rounded up), not raised to it.
        let a = answer(
            &p,
            stopped(Verdict::GaveUp(GiveUp::Budget), Some(wary::Failure::status_after(503, ms(1_200)))),
        );
        assert_eq!(a, Answer::GaveUp { reason: GiveUp::Budget, retry_after_secs: 2 });
        let asked = ms(60_001);
        let a = answer(&p, stopped(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }), None));
        assert_eq!(a, Answer::GaveUp { reason: GiveUp::RetryAfterTooLong { asked }, retry_after_secs: 61 });
        // However long the upstream asks for, a device is told at most an hour.
        let asked = Duration::MAX;
        let a = answer(&p, stopped(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked }), None));
        assert_eq!(
            a,
            Answer::GaveUp { reason: GiveUp::RetryAfterTooLong { asked }, retry_after_secs: 3_600 }
        );
        let a = answer(&p, stopped(Verdict::Failed, Some(wary::Failure::status(422))));
        assert_eq!(a, Answer::Failed { upstream_status: Some(422) });
        assert_eq!(a.status(), StatusCode::FAILED_DEPENDENCY);
        let a = answer(&p, stopped(Verdict::Unknown, Some(wary::Failure::Reset)));
        assert_eq!((a.name(), a.status()), ("unknown", StatusCode::CONFLICT));
        // The device's own default table must not resend either of them.
        let t = wary::Policy::builder(wary::Preset::Default).build().unwrap();
        for code in [424, 409] {
            for op in [Operation::KeyedWrite, Operation::Write] {
                assert_eq!(
                    t.table().classify(op, &wary::Outcome::status(code)),
                    wary::Class::Failed,
                    "{code}"
                );
            }
        }
    }
}
