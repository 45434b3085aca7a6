//! A test cloud for wary: an HTTP/1.1 server with a keyed endpoint backed by an idempotency
//! store, a legacy unkeyed endpoint that applies every copy it gets, a read endpoint to probe
//! whether a legacy write landed, and seeded, scriptable faults.
//!
//! | route | what it does |
//! |---|---|
//! | `POST /readings` | needs `Idempotency-Key` (400 without); the first request applies the effect and stores `201 {"id": n}`; a replay returns the stored result and applies nothing; 409 while a request with the same key is in flight |
//! | `POST /readings/batch` | several keyed readings in one request (`wary_host::batch`, docs/batches.md): each item checked and applied exactly as a `POST /readings` of its own (same store, same per-key faults), answered `200` with one status per item, in order; a batch over [`MAX_BATCH_ITEMS`] items or [`MAX_BODY`] bytes is refused whole (413), one that is not a JSON array of `[key, body]` pairs too (400) |
//! | `POST /legacy/readings` | applies every request, `201 {"id": n}`; an optional `X-Reading-Id` labels the effect |
//! | `GET /legacy/readings/<reading-id>` | 200 if that reading landed at least once, else 404 |
//! | `GET /stats` | [`Stats`] as JSON |
//! | `GET /report` | [`Report`] as JSON: the stats, every key's counters, every reading id's effects |
//! | `GET`/`POST /admin/faults` | read or replace the [`Faults`] (JSON or compact form) |
//! | `POST /admin/refuse?ms=N` | closes the listener for `N` ms (1..=3600000): new connections are refused, then it is reopened on the same port; answered once the listener is closed |
//!
//! Faults on delivery (500, drops, resets, stalls, truncated or garbage replies, huge headers,
//! slow, bad body, endless body) also apply to replays: they model the path between the store and
//! the client, so the store always keeps the genuine first result. Request bodies are measured,
//! never logged or kept.
//!
//! A script's capacity (`capacity=N`: at most `N` requests a second, 503 at once above it) and
//! scheduled outages (`outage=A:ms=M`: 503 to everything) model a cloud under load; with either,
//! `GET /stats` carries each 1 s window's arrivals and accepted requests as `load`. An outage
//! with a status (`outage=A:ms=M:status=401`) models a client that the cloud refuses for a while
//! (an expired credential), a poison (`poison=N:status=422`) a reading it can never take.
//!
//! hyper writes every well-formed reply. Faults that break the connection instead (drops, resets,
//! truncated and garbage replies) work on the raw socket, which each connection shares between
//! hyper and the request's handler; a refusal window (a scripted [`Refusal`],
//! `POST /admin/refuse` or [`Cloud::refuse_for`]) closes and reopens the listener itself.

mod faults;
mod state;
mod wire;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, DATE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use wary_host::batch::ItemAnswer;

pub use faults::{
    BadBodyForm, Capacity, CapacityRetryAfter, Fault, Faults, GarbageForm, IdleClose, MAX_PADDING, Outage,
    Poison, Refusal, RetryAfter, Rule, Scope, StallEnd,
};
use state::{Claim, Gate, State, Stored};
pub use state::{Duplicates, KeyStats, LoadBin, Report, Stats};
use wire::{Broken, SharedIo};

/// Largest request body accepted (413 above), a batch's included.
pub const MAX_BODY: usize = 1 << 20;
/// Most items in one batch (413 above).
pub const MAX_BATCH_ITEMS: usize = 256;
/// Longest idempotency key or reading id accepted (400 above).
pub const MAX_KEY_LEN: usize = 255;
/// Longest refusal window, in milliseconds (an hour).
pub const MAX_REFUSAL_MS: u64 = 3_600_000;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A request to close the listener for a while; the sender hears back once it is closed.
type RefuseCmd = (Duration, oneshot::Sender<()>);

/// How long a handler waits for the accept loop to close the listener.
const REFUSE_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// How soon a listener that could not be reopened is tried again.
const REOPEN_RETRY: Duration = Duration::from_millis(20);

struct Shared {
    state: Mutex<State>,
    faults: Mutex<Faults>,
    refuse: mpsc::Sender<RefuseCmd>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking handler leaves counters consistent enough for a test server.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a new script in force. Per-stream ordinals keep counting; the request numbers of
    /// refusal windows start again from 1, so `refuse_at=N` means the `N`-th request under it.
    fn replace_faults(&self, faults: Faults) {
        // Same lock order as `choose`: faults, then state.
        let mut current = self.faults();
        self.state().restart_scoped();
        *current = faults;
    }

    /// Chooses this request's fault, if its endpoint is in scope, and starts the refusal window
    /// the script puts at this request, if any, before the request is answered.
    async fn pick(&self, endpoint: Endpoint, stream: &str) -> Option<Fault> {
        let (fault, refusal) = self.choose(endpoint, stream);
        if let Some(ms) = refusal {
            self.refuse(Duration::from_millis(ms)).await;
        }
        fault
    }

    /// The fault and the refusal window (ms) for this request.
    fn choose(&self, endpoint: Endpoint, stream: &str) -> (Option<Fault>, Option<u64>) {
        let faults = self.faults();
        let in_scope = match endpoint {
            Endpoint::Keyed => faults.scope.keyed,
            Endpoint::Legacy => faults.scope.legacy,
            Endpoint::Read => faults.scope.read,
        };
        let mut state = self.state();
        let ordinal = state.next_ordinal(stream);
        if !in_scope {
            return (None, None);
        }
        let number = state.next_scoped();
        let refusal = faults.refusals.iter().filter(|r| r.at == number).map(|r| r.ms).max();
        // Every arrival numbers its key, whatever the gate says about it.
        let poison = match (endpoint, stream.strip_prefix("k:")) {
            (Endpoint::Keyed, Some(key)) if !faults.poisons.is_empty() => {
                let nth = state.key_number(key);
                faults.poisons.iter().find(|p| p.nth == nth).map(|p| p.status)
            }
            _ => None,
        };
        let fault = match state.gate(&faults) {
            Gate::Pass if poison.is_some() => {
                state.count_fault("poison");
                return (poison.map(|code| Fault::Status { code }), refusal);
            }
            Gate::Pass => faults.pick(stream, ordinal).cloned(),
            Gate::Outage(status) => {
                state.count_fault("outage");
                let fault = match status {
                    Some(code) => Fault::Status { code },
                    None => Fault::Unavailable { retry_after: None },
                };
                return (Some(fault), refusal);
            }
            Gate::OverCapacity { window, refused } => {
                state.count_fault("capacity");
                let retry_after = faults.capacity.and_then(|c| c.retry_after(&faults, window, refused));
                return (Some(Fault::Unavailable { retry_after }), refusal);
            }
        };
        if let Some(f) = &fault {
            state.count_fault(f.name());
        }
        (fault, refusal)
    }

    /// Has the accept loop close the listener for `window`; returns once it is closed (or the
    /// loop is gone), so the caller's next connection is already refused.
    async fn refuse(&self, window: Duration) -> bool {
        let (ack_tx, ack_rx) = oneshot::channel();
        let sent = tokio::time::timeout(REFUSE_ACK_TIMEOUT, self.refuse.send((window, ack_tx))).await;
        if !matches!(sent, Ok(Ok(()))) {
            return false;
        }
        matches!(tokio::time::timeout(REFUSE_ACK_TIMEOUT, ack_rx).await, Ok(Ok(())))
    }
}

#[derive(Clone, Copy)]
enum Endpoint {
    Keyed,
    Legacy,
    Read,
}

/// A running test cloud. Dropping it also stops the server, without waiting for that.
pub struct Cloud {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Cloud {
    /// Binds `addr` (port 0 picks a free port) and serves until [`Cloud::shutdown`].
    pub async fn start(addr: impl ToSocketAddrs, faults: Faults) -> anyhow::Result<Cloud> {
        faults.validate().map_err(anyhow::Error::msg)?;
        // Bound like `TcpListener::bind` (the first address that works), but always with
        // SO_REUSEADDR, which reopening on the same port after a refusal window needs.
        let mut bound = Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to bind"));
        for candidate in tokio::net::lookup_host(addr).await? {
            bound = wire::listen(candidate);
            if bound.is_ok() {
                break;
            }
        }
        let listener = bound?;
        let addr = listener.local_addr()?;
        let (refuse_tx, refuse_rx) = mpsc::channel(8);
        let mut state = State::default();
        // The capacity's windows and the outages count from here.
        state.restart_scoped();
        let shared =
            Arc::new(Shared { state: Mutex::new(state), faults: Mutex::new(faults), refuse: refuse_tx });
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, addr, shared.clone(), stop_rx, refuse_rx));
        Ok(Cloud { addr, shared, stop: Some(stop_tx), task: Some(task) })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.state().stats()
    }

    /// Counters of one idempotency key, if it was seen.
    pub fn key_stats(&self, key: &str) -> Option<KeyStats> {
        self.shared.state().key_stats(key)
    }

    /// How many times the legacy endpoint applied `reading_id`.
    pub fn reading_effects(&self, reading_id: &str) -> u64 {
        self.shared.state().readings.get(reading_id).copied().unwrap_or(0)
    }

    /// The fault script in force.
    pub fn faults(&self) -> Faults {
        self.shared.faults().clone()
    }

    /// Replaces the fault script; later requests use it. Per-stream ordinals keep counting;
    /// refusal windows count requests from 1 again.
    pub fn set_faults(&self, faults: Faults) -> anyhow::Result<()> {
        faults.validate().map_err(anyhow::Error::msg)?;
        self.shared.replace_faults(faults);
        Ok(())
    }

    /// The stats, every key's counters, every reading id's effects and the fault script.
    pub fn report(&self) -> Report {
        let faults = self.shared.faults().to_string();
        self.shared.state().report(faults)
    }

    /// Closes the listener for `window` (1 ms up to [`MAX_REFUSAL_MS`]): connections made
    /// meanwhile are refused; then it is reopened on the same port. Returns once the listener is
    /// closed. Connections already open are served as usual.
    pub async fn refuse_for(&self, window: Duration) -> anyhow::Result<()> {
        let ms = window.as_millis();
        if ms == 0 || ms > u128::from(MAX_REFUSAL_MS) {
            anyhow::bail!("refusal of {ms} ms is outside 1..={MAX_REFUSAL_MS}");
        }
        if !self.shared.refuse(window).await {
            anyhow::bail!("the cloud is not serving");
        }
        Ok(())
    }

    /// Stops accepting and closes every open connection, including endless bodies.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    /// Like [`Cloud::shutdown`], then the final [`Cloud::report`]: no request can change it
    /// any more.
    pub async fn shutdown_with_report(mut self) -> Report {
        self.stop().await;
        self.report()
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Accepts connections until stopped; closes the listener during refusal windows.
async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
    mut refusals: mpsc::Receiver<RefuseCmd>,
) {
    let mut conns = JoinSet::new();
    let mut listener = Some(listener);
    // When the listener is closed: when to reopen it.
    let mut reopen_at: Option<Instant> = None;
    let mut reopen_failed = false;
    let mut conn_number = 0u64;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some((window, ack)) = refusals.recv() => {
                // With no socket listening, the kernel answers a connect with RST.
                listener = None;
                let until = Instant::now() + window;
                reopen_at = Some(reopen_at.map_or(until, |at| at.max(until)));
                shared.state().count_fault("refuse");
                let _ = ack.send(());
            }
            () = sleep_until(reopen_at), if reopen_at.is_some() => {
                match wire::listen(addr) {
                    Ok(l) => {
                        listener = Some(l);
                        reopen_at = None;
                    }
                    Err(e) => {
                        // Someone else may hold the port for a moment; keep trying until stopped.
                        if !reopen_failed {
                            eprintln!("wary-cloud: cannot reopen {addr} yet ({:?}); retrying", e.kind());
                            reopen_failed = true;
                        }
                        reopen_at = Some(Instant::now() + REOPEN_RETRY);
                    }
                }
            }
            accepted = accept(listener.as_ref()) => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let number = conn_number;
                conn_number += 1;
                conns.spawn(serve(shared, stream, number));
            }
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// Serves one connection (HTTP/1.1, kept alive as long as the client keeps it), closing it
/// when it idles if the script's `idle_close` says so.
async fn serve(shared: Arc<Shared>, stream: TcpStream, number: u64) {
    let stream = Arc::new(stream);
    let conn = stream.clone();
    let watched = stream.clone();
    // Requests started and replies returned on this connection.
    let (activity_tx, mut activity) = tokio::sync::watch::channel((0u64, 0u64));
    let activity_tx = Arc::new(activity_tx);
    let handler_shared = shared.clone();
    let svc = service_fn(move |req| {
        let (shared, conn, activity) = (handler_shared.clone(), conn.clone(), activity_tx.clone());
        async move {
            activity.send_modify(|(started, _)| *started += 1);
            let reply = handle(shared, conn, req).await;
            activity.send_modify(|(_, replied)| *replied += 1);
            reply
        }
    });
    let serving = http1::Builder::new().serve_connection(TokioIo::new(SharedIo(stream)), svc);
    tokio::pin!(serving);
    // When to close the connection if no request starts before: set after a reply.
    let mut close_at: Option<(Instant, u64)> = None;
    let mut racing = false;
    let mut closing = false;
    loop {
        tokio::select! {
            // Before hyper reads it: the next request's bytes met a close that races them.
            biased;
            ready = watched.readable(), if close_at.is_some() && racing && !closing => {
                if ready.is_ok() && activity.borrow().0 == close_at.map_or(0, |(_, started)| started) {
                    shared.state().count_fault("idle_close_race");
                    // Dropping every handle with a zero linger sends RST; the request stays unread.
                    let _ = watched.set_zero_linger();
                    break;
                }
                // Served already (or a spurious wake-up): this close no longer races anything.
                racing = false;
            }
            // Errors here are clients going away or deliberately broken replies.
            _ = serving.as_mut() => break,
            changed = activity.changed(), if !closing => {
                if changed.is_err() {
                    close_at = None;
                    continue;
                }
                let (started, replied) = *activity.borrow_and_update();
                close_at = None;
                if started == replied && replied > 0 {
                    let faults = shared.faults().clone();
                    if let Some(idle) = faults.idle_close {
                        close_at = idle
                            .after(&faults, number, replied - 1)
                            .map(|ms| (Instant::now() + Duration::from_millis(ms), started));
                        racing = idle.races(&faults, number, replied - 1);
                    }
                }
            }
            () = sleep_until(close_at.map(|(at, _)| at)), if close_at.is_some() && !closing => {
                let started_then = close_at.map_or(0, |(_, started)| started);
                close_at = None;
                if activity.borrow().0 == started_then {
                    shared.state().count_fault("idle_close");
                    serving.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A response for hyper to write, or a connection broken on purpose.
type Reply = Result<Response<Body>, Broken>;

async fn handle(shared: Arc<Shared>, conn: Arc<TcpStream>, req: Request<Incoming>) -> Reply {
    shared.state().requests += 1;
    let reply = route(&shared, req).await;
    let label = match &reply {
        Ok(resp) => resp.status().as_str().to_owned(),
        Err(broken) => broken.label().to_owned(),
    };
    shared.state().count_reply(&label);
    if let Err(broken) = &reply {
        broken.apply(&conn).await;
    }
    reply
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (path.as_str(), method) {
        ("/readings", Method::POST) => keyed(shared, req).await,
        ("/readings/batch", Method::POST) => batch(shared, req).await,
        ("/legacy/readings", Method::POST) => legacy_write(shared, req).await,
        ("/stats", Method::GET) => {
            let stats = shared.state().stats();
            Ok(json(StatusCode::OK, &stats))
        }
        ("/report", Method::GET) => {
            let faults = shared.faults().to_string();
            let report = shared.state().report(faults);
            Ok(json(StatusCode::OK, &report))
        }
        ("/admin/refuse", Method::POST) => admin_refuse(shared, req.uri().query()).await,
        ("/admin/faults", Method::GET) => {
            let faults = shared.faults().clone();
            Ok(json(StatusCode::OK, &faults))
        }
        ("/admin/faults", Method::POST) => set_faults(shared, req).await,
        (p, Method::GET) if p.starts_with("/legacy/readings/") => {
            let rid = p.trim_start_matches("/legacy/readings/").to_owned();
            legacy_read(shared, &rid).await
        }
        (
            "/readings" | "/readings/batch" | "/legacy/readings" | "/stats" | "/report" | "/admin/faults"
            | "/admin/refuse",
            _,
        ) => Ok(error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")),
        _ => Ok(error(StatusCode::NOT_FOUND, "no such route")),
    }
}

/// `POST /readings/batch`: each item goes through what `POST /readings` does to a request of its
/// own (key check, the key's fault stream, the store), in order. Faults that answer with a
/// status answer the item; faults that break the connection break the whole reply at that item
/// (items before it are applied and their answers lost with the rest; items after it are not
/// read), as a server dying part-way through a batch would. Faults that shape a reply's body or
/// headers do not apply to an item: it is answered by its status.
async fn batch(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or broken")),
    };
    let limits = wary_host::batch::Limits { max_items: MAX_BATCH_ITEMS, max_bytes: MAX_BODY };
    let items = match wary_host::batch::parse(&body, &limits) {
        Ok(items) => items,
        Err(e) => {
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            return Ok(error(status, &e.to_string()));
        }
    };
    {
        let mut state = shared.state();
        state.batches += 1;
        state.batch_items += items.len() as u64;
    }
    let mut answers = Vec::with_capacity(items.len());
    for item in &items {
        answers.push(batch_item(shared, &item.key, item.body.len()).await?);
    }
    let body = wary_host::batch::answers(&answers);
    Ok(response(StatusCode::OK, "application/json", Bytes::from(body)))
}

/// One batch item, as [`keyed`] would treat it alone; `Err` breaks the whole reply.
async fn batch_item(shared: &Arc<Shared>, key: &str, len: usize) -> Result<ItemAnswer, Broken> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Ok(ItemAnswer::status(400));
    }
    let fault = shared.pick(Endpoint::Keyed, &format!("k:{key}")).await;
    match &fault {
        Some(Fault::Unavailable { retry_after }) => return Ok(item_status(503, *retry_after)),
        Some(Fault::TooManyRequests { retry_after }) => return Ok(item_status(429, *retry_after)),
        Some(Fault::BadRequest) => return Ok(ItemAnswer::status(400)),
        Some(Fault::Status { code }) => return Ok(ItemAnswer::status(*code)),
        Some(Fault::DropBeforeEffect) => return Err(Broken::Close),
        _ => {}
    }
    let claim = shared.state().claim(key);
    let stored = match claim {
        Claim::Busy => return Ok(ItemAnswer::status(409)),
        Claim::Replay(stored) => Some(stored),
        Claim::Fresh => {
            slow_before(fault.as_ref()).await;
            let stored = applies(fault.as_ref()).then(|| shared.state().apply_keyed(key, len));
            shared.state().release(key);
            stored
        }
    };
    let status = stored.as_ref().map_or(500, |s| s.status);
    match fault {
        Some(Fault::ErrorAfterEffect) => Ok(ItemAnswer::status(500)),
        Some(Fault::DropAfterEffect) => Err(Broken::Close),
        Some(Fault::ResetAfterEffect) => Err(Broken::Reset),
        Some(Fault::TruncatedReply) => {
            Err(Broken::Raw { bytes: truncated_head(stored.as_ref()), label: "truncated" })
        }
        Some(Fault::GarbageStatus { form, .. }) => {
            Err(Broken::Raw { bytes: Bytes::from(form.bytes()), label: "garbage" })
        }
        Some(Fault::Stall { ms, effect, then }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            match then {
                StallEnd::Close => Err(Broken::Close),
                StallEnd::Reply if effect => Ok(ItemAnswer::status(status)),
                StallEnd::Reply => Ok(ItemAnswer::status(504)),
            }
        }
        Some(Fault::Slow { ms, before_effect: false }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ItemAnswer::status(status))
        }
        _ => Ok(ItemAnswer::status(status)),
    }
}

/// An item's status with the fault's Retry-After in whole seconds (a date form as its offset;
/// unreadable forms as none: a batch answer carries seconds only).
fn item_status(status: u16, retry_after: Option<RetryAfter>) -> ItemAnswer {
    let secs = match retry_after {
        Some(RetryAfter::Seconds(n)) => Some(n),
        Some(RetryAfter::Date(offset)) => Some(offset.max(0).unsigned_abs()),
        _ => None,
    };
    ItemAnswer { status, retry_after_secs: secs }
}

/// A header value usable as a key or reading id: visible ASCII, 1..=MAX_KEY_LEN bytes.
fn id_header(req: &Request<Incoming>, name: &str) -> Result<Option<String>, &'static str> {
    let Some(value) = req.headers().get(name) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| "header is not visible ASCII")?;
    if text.is_empty() || text.len() > MAX_KEY_LEN || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("header must be 1..=255 visible ASCII characters");
    }
    Ok(Some(text.to_owned()))
}

/// Reads the body and returns its length only.
async fn body_len(req: Request<Incoming>) -> Result<usize, Response<Body>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes().len()),
        Err(_) => Err(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or broken")),
    }
}

async fn keyed(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let key = match id_header(&req, "idempotency-key") {
        Ok(Some(key)) => key,
        Ok(None) => return Ok(error(StatusCode::BAD_REQUEST, "missing Idempotency-Key")),
        Err(why) => return Ok(error(StatusCode::BAD_REQUEST, why)),
    };
    let len = match body_len(req).await {
        Ok(len) => len,
        Err(resp) => return Ok(resp),
    };
    let fault = shared.pick(Endpoint::Keyed, &format!("k:{key}")).await;
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    let claim = shared.state().claim(&key);
    match claim {
        Claim::Busy => Ok(error(StatusCode::CONFLICT, "a request with this key is in flight")),
        Claim::Replay(stored) => {
            let mut resp = deliver(fault.as_ref(), Some(stored)).await?;
            resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(resp)
        }
        Claim::Fresh => {
            // Clears the busy mark even if the client hangs up and this future is dropped.
            let busy = BusyGuard { shared: shared.clone(), key: key.clone() };
            slow_before(fault.as_ref()).await;
            let stored = applies(fault.as_ref()).then(|| shared.state().apply_keyed(&key, len));
            if matches!(fault, Some(Fault::Stall { .. })) {
                // A stall is a reply lost on the way: the store is settled, so a resend during
                // the stall gets the stored result (or, with no effect, applies it) instead of 409.
                drop(busy);
                return deliver(fault.as_ref(), stored).await;
            }
            let reply = deliver(fault.as_ref(), stored).await;
            drop(busy);
            reply
        }
    }
}

struct BusyGuard {
    shared: Arc<Shared>,
    key: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.shared.state().release(&self.key);
    }
}

async fn legacy_write(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let rid = match id_header(&req, "x-reading-id") {
        Ok(rid) => rid,
        Err(why) => return Ok(error(StatusCode::BAD_REQUEST, why)),
    };
    if let Err(resp) = body_len(req).await {
        return Ok(resp);
    }
    let stream = rid.as_ref().map_or_else(|| "legacy".to_owned(), |r| format!("r:{r}"));
    let fault = shared.pick(Endpoint::Legacy, &stream).await;
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    slow_before(fault.as_ref()).await;
    let stored = applies(fault.as_ref()).then(|| shared.state().apply_legacy(rid.as_deref()));
    deliver(fault.as_ref(), stored).await
}

async fn legacy_read(shared: &Arc<Shared>, rid: &str) -> Reply {
    let fault = shared.pick(Endpoint::Read, &format!("g:{rid}")).await;
    if let Some(reply) = before_effect(fault.as_ref()) {
        return reply;
    }
    slow_before(fault.as_ref()).await;
    let applied = shared.state().readings.get(rid).copied().unwrap_or(0);
    let stored = if applied > 0 {
        Stored {
            status: 200,
            body: Bytes::from(serde_json::json!({"reading_id": rid, "applied": applied}).to_string()),
        }
    } else {
        Stored { status: 404, body: Bytes::from_static(b"{\"error\":\"reading not found\"}") }
    };
    deliver(fault.as_ref(), Some(stored)).await
}

async fn set_faults(shared: &Arc<Shared>, req: Request<Incoming>) -> Reply {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or broken"));
        }
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "faults must be UTF-8"));
    };
    match Faults::parse_any(text) {
        Ok(faults) => {
            shared.replace_faults(faults.clone());
            Ok(json(StatusCode::OK, &faults))
        }
        Err(why) => Ok(error(StatusCode::BAD_REQUEST, &why)),
    }
}

/// `POST /admin/refuse?ms=N`: answered once the listener is closed.
async fn admin_refuse(shared: &Arc<Shared>, query: Option<&str>) -> Reply {
    let ms = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("ms="))
        .and_then(|v| v.parse::<u64>().ok());
    let Some(ms) = ms.filter(|ms| (1..=MAX_REFUSAL_MS).contains(ms)) else {
        return Ok(error(StatusCode::BAD_REQUEST, "need ms=N with N in 1..=3600000"));
    };
    if !shared.refuse(Duration::from_millis(ms)).await {
        return Ok(error(StatusCode::SERVICE_UNAVAILABLE, "the listener could not be closed"));
    }
    Ok(json(StatusCode::OK, &serde_json::json!({ "refusing_ms": ms })))
}

/// Faults that answer before any effect.
fn before_effect(fault: Option<&Fault>) -> Option<Reply> {
    match fault? {
        Fault::Unavailable { retry_after } => {
            Some(Ok(with_retry_after(error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"), *retry_after)))
        }
        Fault::TooManyRequests { retry_after } => {
            Some(Ok(with_retry_after(error(StatusCode::TOO_MANY_REQUESTS, "slow down"), *retry_after)))
        }
        Fault::BadRequest => Some(Ok(error(StatusCode::BAD_REQUEST, "rejected"))),
        Fault::Status { code } => {
            let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
            Some(Ok(error(status, "scripted status; nothing applied")))
        }
        Fault::DropBeforeEffect => Some(Err(Broken::Close)),
        _ => None,
    }
}

async fn slow_before(fault: Option<&Fault>) {
    if let Some(Fault::Slow { ms, before_effect: true }) = fault {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
}

/// Whether the effect is applied under this fault.
fn applies(fault: Option<&Fault>) -> bool {
    !matches!(
        fault,
        Some(
            Fault::BadBody { effect: false, .. }
                | Fault::EndlessBody { effect: false, .. }
                | Fault::Stall { effect: false, .. }
                | Fault::GarbageStatus { effect: false, .. }
        )
    )
}

/// Turns the result (or its absence, for faults that skip the effect) into what the client gets.
async fn deliver(fault: Option<&Fault>, stored: Option<Stored>) -> Reply {
    match fault {
        Some(Fault::ErrorAfterEffect) => Ok(error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")),
        Some(Fault::DropAfterEffect) => Err(Broken::Close),
        Some(Fault::ResetAfterEffect) => Err(Broken::Reset),
        Some(Fault::Stall { ms, effect, then }) => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            match then {
                StallEnd::Close => Err(Broken::Close),
                StallEnd::Reply if *effect => Ok(from_stored(stored)),
                // What a proxy answers when the server behind it never did.
                StallEnd::Reply => Ok(error(StatusCode::GATEWAY_TIMEOUT, "upstream timed out")),
            }
        }
        Some(Fault::TruncatedReply) => {
            Err(Broken::Raw { bytes: truncated_head(stored.as_ref()), label: "truncated" })
        }
        Some(Fault::GarbageStatus { form, .. }) => {
            Err(Broken::Raw { bytes: Bytes::from(form.bytes()), label: "garbage" })
        }
        Some(Fault::HugeHeader { bytes }) => {
            let mut resp = from_stored(stored);
            // Visible ASCII of any length is a valid header value.
            if let Ok(padding) = HeaderValue::from_str(&"x".repeat(*bytes)) {
                resp.headers_mut().insert("x-padding", padding);
            }
            Ok(resp)
        }
        Some(Fault::Slow { ms, before_effect: false }) => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            Ok(from_stored(stored))
        }
        Some(Fault::BadBody { form, .. }) => {
            let (content_type, body): (&str, &[u8]) = match form {
                BadBodyForm::NotJson => {
                    ("application/json", b"<html><body>502 upstream hiccup</body></html>")
                }
                BadBodyForm::WrongType => ("text/html", b"{\"id\":0}"),
            };
            Ok(response(StatusCode::OK, content_type, Bytes::from_static(body)))
        }
        Some(Fault::EndlessBody { ms, .. }) => {
            let body = Trickle {
                period: Duration::from_millis(*ms),
                sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            };
            let mut resp = Response::new(body.boxed_unsync());
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Ok(resp)
        }
        _ => Ok(from_stored(stored)),
    }
}

/// The status line and the start of the header block of the reply, cut inside a header name.
fn truncated_head(stored: Option<&Stored>) -> Bytes {
    let status =
        stored.and_then(|s| StatusCode::from_u16(s.status).ok()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-le",
        status.as_str(),
        status.canonical_reason().unwrap_or("Unknown")
    );
    Bytes::from(head)
}

fn from_stored(stored: Option<Stored>) -> Response<Body> {
    match stored {
        Some(s) => response(
            StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "application/json",
            s.body,
        ),
        None => error(StatusCode::INTERNAL_SERVER_ERROR, "no result"),
    }
}

fn with_retry_after(mut resp: Response<Body>, retry_after: Option<RetryAfter>) -> Response<Body> {
    let Some(ra) = retry_after else { return resp };
    let now = SystemTime::now();
    let headers = resp.headers_mut();
    let date_value = |t: SystemTime| {
        HeaderValue::from_str(&httpdate::fmt_http_date(t)).expect("IMF-fixdate is a valid header")
    };
    match ra {
        RetryAfter::Seconds(n) => {
            headers.insert(RETRY_AFTER, HeaderValue::from(n));
        }
        RetryAfter::Date(offset) => {
            let delta = Duration::from_secs(offset.unsigned_abs());
            let at = if offset >= 0 { now + delta } else { now - delta };
            // Both from the same instant, so `Retry-After - Date` is exactly the offset.
            headers.insert(DATE, date_value(now));
            headers.insert(RETRY_AFTER, date_value(at));
        }
        RetryAfter::Garbage => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("soon-ish, maybe -1"));
        }
        RetryAfter::GarbageDate => {
            headers.insert(DATE, HeaderValue::from_static("the day after yesterday"));
            headers.insert(RETRY_AFTER, date_value(now + Duration::from_secs(5)));
        }
        RetryAfter::Duplicate => {
            headers.append(RETRY_AFTER, HeaderValue::from_static("1"));
            headers.append(RETRY_AFTER, HeaderValue::from_static("3600"));
        }
    }
    resp
}

fn response(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body).boxed_unsync());
    *resp.status_mut() = status;
    if let Ok(ct) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, ct);
    }
    resp
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    response(status, "application/json", Bytes::from(body))
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

/// A body that never ends: one space every `period`.
struct Trickle {
    period: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl HttpBody for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let next = tokio::time::Instant::now() + self.period;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b" ")))))
    }
}
