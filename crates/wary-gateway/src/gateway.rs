//! The gateway: a bounded queue, workers running wary calls, acks after verdicts.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use wary::ledger::{Record, Sink};
use wary::run::{Attempt, Runner, Stopped};
use wary::{FleetBudget, Operation, Policy, Verdict};
use wary_host::ledger::JsonLedger;
use wary_host::spec::PolicySpec;
use wary_host::time::{MonotonicClock, TokioDelay};

use crate::frame::{Ack, FrameError, Reading, read_frame, write_frame};
use crate::metrics::{Metrics, Surfaced};
use crate::upstream::{HttpClient, LegacyProbe, Upstream, client};

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
    /// Queue capacity (readings accepted but not yet being sent).
    pub queue: usize,
    /// Concurrent upstream calls.
    pub workers: usize,
    /// Draw seed (tests and replays only; `None`: OS entropy, per process).
    pub seed: Option<u64>,
    /// Keep every attempt for a timeline.
    pub timeline: bool,
}

impl Config {
    /// Defaults for `upstream`: the default policy with a 10 s wait budget and 20 s deadline,
    /// fleet budget 100 tokens / 0.1, queue 256, 8 workers, 5 s per attempt.
    pub fn new(base: &str) -> Self {
        Config {
            upstream: Upstream {
                base: base.trim_end_matches('/').to_owned(),
                legacy: false,
                attempt_timeout: Duration::from_secs(5),
                probe_grace: None,
            },
            policy: PolicySpec {
                budget: Some(10_000),
                deadline: Some(20_000),
                min_attempt: Some(100),
                ..PolicySpec::default()
            },
            fleet_max_tokens: 100,
            fleet_ratio_milli: 100,
            queue: 256,
            workers: 8,
            seed: None,
            timeline: false,
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
    #[error("fleet budget: {0:?}")]
    Fleet(wary::PolicyError),
    /// The policy counts in other ticks than the gateway's millisecond clock.
    #[error("the gateway's policy must count milliseconds (tick_hz 1000), not {0} ticks per second")]
    TickRate(u32),
    /// The gateway has stopped.
    #[error("gateway stopped")]
    Stopped,
    /// The queue is full (only from [`Gateway::try_submit`]).
    #[error("queue full")]
    Full,
}

struct Job {
    reading: Reading,
    reply: oneshot::Sender<Ack>,
}

struct Shared {
    config: Config,
    policy: Policy,
    fleet: FleetBudget,
    ledger: Mutex<JsonLedger<Box<dyn Write + Send>>>,
    metrics: Mutex<Metrics>,
    clock: MonotonicClock,
    client: HttpClient,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ledger sink every runner writes to: the JSON line, then the counters.
struct GatewaySink(Arc<Shared>);

impl Sink for GatewaySink {
    fn record(&mut self, record: &Record) {
        lock(&self.0.ledger).record(record);
        lock(&self.0.metrics).record(record, self.0.clock.millis());
    }
}

/// A running gateway. Dropping it (or [`Gateway::shutdown`]) stops the workers; readings not
/// yet acked are simply not acked, and the sensors send them again.
pub struct Gateway {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Starts the workers on the current tokio runtime; `ledger` gets the JSON lines.
    pub fn start(config: Config, ledger: Box<dyn Write + Send>) -> Result<Gateway, GatewayError> {
        let policy = config.policy.build()?;
        // The runner's clock and the sleeps are in milliseconds.
        if policy.tick_hz() != 1000 {
            return Err(GatewayError::TickRate(policy.tick_hz()));
        }
        // A `[fleet]` in the policy spec wins over the config's own fields.
        let (tokens, ratio) = match config.policy.fleet {
            Some(f) => (f.tokens, f.ratio_milli),
            None => (config.fleet_max_tokens, config.fleet_ratio_milli),
        };
        let fleet = FleetBudget::new(tokens, ratio).map_err(GatewayError::Fleet)?;
        let mut json = JsonLedger::new(ledger);
        // A ledger that cannot be written never stops the gateway; it counts the failures.
        let _ = json.policy(&policy, &config.policy);
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
            clock: MonotonicClock::new(),
            client,
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

    /// Sends one reading upstream and waits for its ack. Waits for queue space first.
    pub async fn submit(&self, reading: Reading) -> Result<Ack, GatewayError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job { reading, reply }).await.map_err(|_| GatewayError::Stopped)?;
        rx.await.map_err(|_| GatewayError::Stopped)
    }

    /// Queues one reading without waiting; `Full` when the queue is full (backpressure).
    pub fn try_submit(&self, reading: Reading) -> Result<oneshot::Receiver<Ack>, GatewayError> {
        let (reply, rx) = oneshot::channel();
        self.tx.try_send(Job { reading, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => GatewayError::Full,
            mpsc::error::TrySendError::Closed(_) => GatewayError::Stopped,
        })?;
        Ok(rx)
    }

    /// Serves one downstream stream: reads reading frames, writes an ack frame for each after
    /// its verdict. A full queue stops the reading (backpressure). Returns how many readings
    /// were read, after every ack was written; a bad frame ends the stream with its error.
    pub async fn serve<R, W>(&self, mut reader: R, writer: W) -> Result<u64, FrameError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (ack_tx, mut ack_rx) = mpsc::channel::<Ack>(self.shared.config.queue.max(1));
        let write_task = tokio::spawn(async move {
            let mut w = writer;
            while let Some(ack) = ack_rx.recv().await {
                if write_frame(&mut w, &ack).await.is_err() {
                    break;
                }
            }
            let _ = w.shutdown().await;
        });
        let mut n = 0u64;
        let result = loop {
            match read_frame::<_, Reading>(&mut reader).await {
                Ok(Some(reading)) => {
                    let Ok(permit) = self.tx.clone().reserve_owned().await else {
                        break Ok(n);
                    };
                    let (reply, rx) = oneshot::channel();
                    permit.send(Job { reading, reply });
                    let ack_tx = ack_tx.clone();
                    tokio::spawn(async move {
                        if let Ok(ack) = rx.await {
                            let _ = ack_tx.send(ack).await;
                        }
                    });
                    n += 1;
                }
                Ok(None) => break Ok(n),
                Err(e) => break Err(e),
            }
        };
        drop(ack_tx);
        let _ = write_task.await;
        result
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        lock(&self.shared.metrics).clone()
    }

    /// The fleet budget's tokens now, thousandths.
    pub fn fleet_tokens_milli(&self) -> u32 {
        self.shared.fleet.tokens_milli()
    }

    /// Readings queued, not yet taken by a worker.
    pub fn queue_depth(&self) -> usize {
        self.tx.max_capacity().saturating_sub(self.tx.capacity())
    }

    /// Gateway milliseconds since start (the timeline's clock).
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.millis()
    }

    /// The Prometheus text exposition.
    pub fn prometheus(&self) -> String {
        let m = lock(&self.shared.metrics);
        m.prometheus(
            self.shared.fleet.tokens_milli(),
            self.shared.fleet.max_milli(),
            self.queue_depth(),
            self.tx.max_capacity(),
        )
    }

    /// Serves `GET /metrics` on `listener` (bind it to 127.0.0.1) until the task is dropped.
    /// An accept error (out of file descriptors, say) backs off ([`AcceptBackoff`]).
    pub async fn serve_metrics(self: Arc<Self>, listener: TcpListener) {
        let handle = |(mut sock, _): (tokio::net::TcpStream, std::net::SocketAddr)| {
            let gw = self.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let mut got = 0;
                let read = async {
                    while got < buf.len() {
                        let n = sock.read(buf.get_mut(got..).unwrap_or_default()).await.ok()?;
                        if n == 0 {
                            break;
                        }
                        got += n;
                        if buf.get(..got).is_some_and(|b| b.windows(4).any(|w| w == b"\r\n\r\n")) {
                            break;
                        }
                    }
                    Some(())
                };
                if tokio::time::timeout(Duration::from_secs(5), read).await.ok().flatten().is_none() {
                    return;
                }
                let head = buf.get(..got).unwrap_or_default();
                let (status, body) =
                    if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET /metrics?") {
                        ("200 OK", gw.prometheus())
                    } else {
                        ("404 Not Found", "not found\n".to_owned())
                    };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        };
        accept_loop(|| listener.accept(), handle, |_, _| {}).await;
    }

    /// Stops the workers now. In-flight calls are dropped without an ack.
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

/// The sleep after a failed `accept`: 5 ms, doubling up to 1 s, back to 5 ms after a success.
/// Accept errors (out of file descriptors, out of buffers) tend to last a while; accepting
/// again at once would spin a core and starve the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptBackoff {
    next: Duration,
}

impl AcceptBackoff {
    /// The first sleep.
    pub const FIRST: Duration = Duration::from_millis(5);
    /// The longest sleep.
    pub const CAP: Duration = Duration::from_secs(1);

    /// A backoff that has seen no error.
    pub const fn new() -> Self {
        AcceptBackoff { next: Self::FIRST }
    }

    /// An accept failed: the sleep before the next one.
    pub fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = d.saturating_mul(2).min(Self::CAP);
        d
    }

    /// An accept succeeded: the next error starts from [`Self::FIRST`] again.
    pub fn succeeded(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Accepts forever: each success goes to `handle`; after an error `on_error` is told it and
/// the sleep, then the loop sleeps ([`AcceptBackoff`]) before accepting again.
pub async fn accept_loop<T, E, A, Fut, H, O>(mut accept: A, mut handle: H, mut on_error: O)
where
    A: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    H: FnMut(T),
    O: FnMut(&E, Duration),
{
    let mut backoff = AcceptBackoff::new();
    loop {
        match accept().await {
            Ok(conn) => {
                backoff.succeeded();
                handle(conn);
            }
            Err(e) => {
                let d = backoff.failed();
                on_error(&e, d);
                tokio::time::sleep(d).await;
            }
        }
    }
}

fn ack(reading: &Reading, verdict: Verdict) -> Ack {
    let reason = match verdict {
        Verdict::GaveUp(g) => Some(g.name().to_owned()),
        _ => None,
    };
    // An `unknown` may have landed: it is final for the sensor (a resend is the blind resend
    // the design forbids) and surfaced to a person instead.
    let surfaced = matches!(verdict, Verdict::Unknown);
    Ack {
        sensor: reading.sensor,
        boot: reading.boot,
        seq: reading.seq,
        verdict: verdict.name().to_owned(),
        reason,
        done: surfaced || matches!(verdict, Verdict::Ok | Verdict::Failed),
        surfaced,
    }
}

async fn worker(
    shared: Arc<Shared>,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    rng: rand::rngs::StdRng,
) {
    let policy = shared.policy;
    let upstream = shared.config.upstream.clone();
    let mut runner = Runner::new(&policy, TokioDelay, shared.clock, rng)
        .fleet(&shared.fleet)
        .ledger(GatewaySink(shared.clone()));
    loop {
        let job = rx.lock().await.recv().await;
        let Some(job) = job else { break };
        let r = job.reading;
        let client = &shared.client;
        // Ticks are milliseconds here (checked in `Gateway::start`).
        let send = |a: Attempt| upstream.send(client, &policy, &r, a.remaining);
        // The call's deadline, for the probe (the runner tells attempts, not probes).
        let deadline = policy.deadline().map(|d| tokio::time::Instant::now() + Duration::from_millis(d));
        let result: Result<u64, Stopped> = if upstream.legacy {
            let probe = LegacyProbe { client, upstream: &upstream, reading: r, deadline };
            runner.call_with_probe(Operation::Write, r.key(), send, probe).await
        } else {
            runner.call(Operation::KeyedWrite, r.key(), send).await
        };
        let verdict = match result {
            Ok(_) => Verdict::Ok,
            Err(s) => s.verdict,
        };
        if verdict == Verdict::Unknown {
            lock(&shared.metrics).surface(Surfaced { sensor: r.sensor, boot: r.boot, seq: r.seq });
        }
        let _ = job.reply.send(ack(&r, verdict));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn accept_backoff_grows_caps_and_resets() {
        let mut b = AcceptBackoff::new();
        let ms: Vec<u128> = (0..10).map(|_| b.failed().as_millis()).collect();
        assert_eq!(ms, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), AcceptBackoff::FIRST);
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
        assert!(tokio::time::timeout(Duration::from_millis(300), run).await.is_err());
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
        let _ = tokio::time::timeout(Duration::from_millis(400), run).await;
        let s = lock(&sleeps).clone();
        assert_eq!(s.get(..7), Some(&[5, 10, 20, 40, 80, 5, 10][..]), "{s:?}");
    }

    #[test]
    fn an_unknown_is_final_for_the_sensor_and_surfaced() {
        let r = Reading { sensor: 1, boot: 2, seq: 3, value: 4 };
        let a = ack(&r, Verdict::Unknown);
        assert!(a.done && a.surfaced && a.verdict == "unknown", "{a:?}");
        let a = ack(&r, Verdict::GaveUp(wary::GiveUp::Budget));
        assert!(!a.done && !a.surfaced, "{a:?}");
        for v in [Verdict::Ok, Verdict::Failed] {
            let a = ack(&r, v);
            assert!(a.done && !a.surfaced, "{a:?}");
        }
        // On the wire: `surfaced` is there when true, and old acks without it still parse.
        let json = serde_json::to_string(&ack(&r, Verdict::Unknown)).unwrap();
        assert!(json.contains("\"surfaced\":true") && json.contains("\"done\":true"), "{json}");
        let old: Ack =
            serde_json::from_str(r#"{"sensor":1,"boot":2,"seq":3,"verdict":"ok","done":true}"#).unwrap();
        assert!(!old.surfaced);
    }
}
