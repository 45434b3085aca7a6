//! The user's timeouts stand: the client's timeout, its connect timeout and a request's own
//! timeout are never replaced by the middleware, and the policy's deadline is a timer around
//! each attempt. One test per row of settings, against three servers on 127.0.0.1:
//!
//! - **never accepts**: a listener with a backlog of one, filled, never accepted. Linux drops
//!   further SYNs, so a connect hangs: a timeout then fires before the connection was made.
//! - **silent**: accepts, never reads, never answers.
//! - **stalls**: accepts, reads the request, sends part of the status line and stops.
//!
//! Each test asserts the attempts, the last attempt's failure and the verdict, the order of
//! events (the attempt leaving, the server seeing it, the decision), and the timeout each
//! attempt carried below the middleware. Durations are hundreds of milliseconds; no test
//! asserts wall time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use reqwest::{Method, Request, Response};
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wary::ledger::Record;
use wary::{Duration as Ms, Failure, GiveUp, Policy, Preset, Sink, Verdict};
use wary_reqwest::{CallError, DeadlineElapsed, WaryMiddleware};

/// What happened, in order, across the client, the server and the decision.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// An attempt left the middleware, carrying this request timeout.
    Sent(Option<Duration>),
    /// The server accepted a connection.
    Accepted,
    /// The server read a whole request head.
    RequestRead,
    /// The middleware decided after an attempt.
    Decided { attempt: u32, failure: Option<Failure>, verdict: Option<Verdict>, waited: bool },
}

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Event>>>);

impl Events {
    fn push(&self, e: Event) {
        self.0.lock().unwrap().push(e);
    }
    fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
}

/// The ledger: one `Decided` per attempt, in the same stream as the rest.
struct EventSink(Events);

impl Sink for EventSink {
    fn record(&mut self, r: &Record) {
        self.0.push(Event::Decided {
            attempt: r.attempt,
            failure: r.outcome.failure().copied(),
            verdict: r.verdict,
            waited: r.wait > Ms::ZERO,
        });
    }
}

/// Below the retry middleware: notes each attempt and the timeout it carries.
#[derive(Clone)]
struct SeeAttempts(Events);

#[async_trait::async_trait]
impl Middleware for SeeAttempts {
    async fn handle(
        &self,
        req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.push(Event::Sent(req.timeout().copied()));
        next.run(req, ext).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    NeverAccepts,
    Silent,
    Stalls,
}

/// A running server; dropping it closes everything.
struct Fixture {
    addr: SocketAddr,
    _held: Vec<std::net::TcpStream>,
    _listener: Option<socket2::Socket>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// A listener whose backlog of one is full: it never accepts, and a further connect hangs.
fn full_backlog() -> Fixture {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    sock.listen(1).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let mut held = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(e) => {
                // The backlog is full when a connect hangs, not when it is refused.
                assert!(
                    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock),
                    "{e:?}"
                );
                break;
            }
        }
        assert!(held.len() < 64, "the backlog never filled");
    }
    assert!(!held.is_empty());
    Fixture { addr, _held: held, _listener: Some(sock), task: None }
}

async fn serve(kind: Server, events: &Events) -> Fixture {
    if kind == Server::NeverAccepts {
        return full_backlog();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let events = events.clone();
    let task = tokio::spawn(async move {
        // A silent server keeps every connection open, unread, for as long as it runs; a
        // stalling one serves each on its own task, which ends when the client hangs up.
        let mut silent = Vec::new();
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            events.push(Event::Accepted);
            if kind == Server::Silent {
                silent.push(conn);
                continue;
            }
            let events = events.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                events.push(Event::RequestRead);
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Le").await;
                // Stalled: the connection stays open until the client gives up on it.
                let _ = conn.read(&mut buf).await;
            });
        }
    });
    Fixture { addr, _held: Vec::new(), _listener: None, task: Some(task) }
}

/// One row of settings.
#[derive(Debug, Clone, Copy)]
struct Row {
    client_timeout: Option<u64>,
    connect_timeout: Option<u64>,
    request_timeout: Option<u64>,
    deadline: Option<u64>,
    max_attempts: u32,
    method: &'static str,
    keyed: bool,
}

const ROW: Row = Row {
    client_timeout: None,
    connect_timeout: None,
    request_timeout: None,
    deadline: None,
    max_attempts: 3,
    method: "GET",
    keyed: false,
};

/// What one call did.
struct Run {
    events: Vec<Event>,
    error: Option<CallError>,
}

impl Run {
    fn decided(&self) -> Vec<(u32, Option<Failure>, Option<Verdict>, bool)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Decided { attempt, failure, verdict, waited } => {
                    Some((*attempt, *failure, *verdict, *waited))
                }
                _ => None,
            })
            .collect()
    }

    fn attempts(&self) -> u32 {
        u32::try_from(self.decided().len()).unwrap()
    }

    fn last(&self) -> (Option<Failure>, Option<Verdict>) {
        let d = self.decided();
        let (_, f, v, _) = d.last().copied().unwrap();
        (f, v)
    }

    fn ended_by_deadline_timer(&self) -> bool {
        let e = self.error.as_ref().unwrap();
        match &e.error {
            reqwest_middleware::Error::Middleware(m) => m.is::<DeadlineElapsed>(),
            reqwest_middleware::Error::Reqwest(_) => false,
        }
    }
}

async fn run(server: Server, row: Row) -> Run {
    let events = Events::default();
    let fixture = serve(server, &events).await;
    let ms = Ms::from_millis;
    let mut b = Policy::builder(Preset::Default).base(ms(10)).cap(ms(20)).budget(ms(10_000));
    b = b.max_attempts(row.max_attempts);
    b = match row.deadline {
        Some(d) => b.deadline(ms(d)),
        None => b.no_deadline(),
    };
    let policy = b.build().unwrap();
    let mut http = reqwest::Client::builder().no_proxy();
    if let Some(t) = row.client_timeout {
        http = http.timeout(Duration::from_millis(t));
    }
    if let Some(t) = row.connect_timeout {
        http = http.connect_timeout(Duration::from_millis(t));
    }
    let ledger: wary_host::call::SharedSink = Arc::new(Mutex::new(EventSink(events.clone())));
    let client = ClientBuilder::new(http.build().unwrap())
        .with(WaryMiddleware::new(policy).ledger(ledger))
        .with(SeeAttempts(events.clone()))
        .build();
    let url = format!("http://{}/readings", fixture.addr);
    let mut req = client.request(Method::from_bytes(row.method.as_bytes()).unwrap(), url);
    if row.keyed {
        req = req.header("idempotency-key", "k-1");
    }
    if row.method != "GET" {
        req = req.body("{}");
    }
    if let Some(t) = row.request_timeout {
        req = req.timeout(Duration::from_millis(t));
    }
    let error = match req.send().await {
        Ok(r) => panic!("{server:?} {row:?}: a response from a server that never answers: {}", r.status()),
        Err(reqwest_middleware::Error::Middleware(a)) => Some(a.downcast::<CallError>().unwrap()),
        Err(other) => panic!("not a wary error: {other:?}"),
    };
    drop(fixture);
    let run = Run { events: events.all(), error };
    check_order(server, row, &run);
    run
}

/// Every attempt: it leaves with the user's own request timeout, the server sees it (as far
/// as this server lets it), then the decision; a wait follows every decision but the last.
fn check_order(server: Server, row: Row, run: &Run) {
    let n = run.attempts();
    let mut expected = Vec::new();
    for i in 1..=n {
        expected.push("sent");
        match server {
            Server::NeverAccepts => {}
            Server::Silent => expected.push("accepted"),
            Server::Stalls => expected.extend(["accepted", "read"]),
        }
        expected.push(if i < n { "decided, wait" } else { "decided, done" });
    }
    let got: Vec<&str> = run
        .events
        .iter()
        .map(|e| match e {
            Event::Sent(t) => {
                let own = row.request_timeout.map(Duration::from_millis);
                assert_eq!(*t, own, "{server:?} {row:?}: the request's timeout was changed");
                "sent"
            }
            Event::Accepted => "accepted",
            Event::RequestRead => "read",
            Event::Decided { waited: true, verdict: None, .. } => "decided, wait",
            Event::Decided { waited: false, verdict: Some(_), .. } => "decided, done",
            Event::Decided { .. } => "decided, inconsistent",
        })
        .collect();
    assert_eq!(got, expected, "{server:?} {row:?}");
    let numbers: Vec<u32> = run.decided().iter().map(|d| d.0).collect();
    assert_eq!(numbers, (1..=n).collect::<Vec<_>>(), "{server:?} {row:?}");
}

const RT: Option<Failure> = Some(Failure::ResponseTimeout);

/// Three attempts, each ended by the user's timeout, the call by the attempt cap.
async fn three_attempts_each_ended_by_the_users_timeout(server: Server, row: Row) {
    let r = run(server, row).await;
    assert_eq!(r.attempts(), 3, "{server:?} {row:?}");
    assert_eq!(r.last(), (RT, Some(Verdict::GaveUp(GiveUp::Attempts))));
    assert!(!r.ended_by_deadline_timer());
    assert!(r.decided().iter().all(|d| d.1 == RT));
}

/// One attempt, ended by the deadline's timer: a response timeout, the call over at the
/// deadline.
async fn one_attempt_ended_by_the_deadline(server: Server, row: Row) {
    let r = run(server, row).await;
    assert_eq!(r.attempts(), 1, "{server:?} {row:?}");
    assert_eq!(r.last(), (RT, Some(Verdict::GaveUp(GiveUp::Deadline))));
    assert!(r.ended_by_deadline_timer());
}

/// Attempts of the user's timeout (100 ms) with backoff between, until the deadline (800 ms).
/// At most 8 fit, whatever the machine's load; fewer than 3 would mean an attempt ran far
/// past its own timeout.
async fn attempts_of_the_users_timeout_until_the_deadline(server: Server, row: Row) {
    let r = run(server, row).await;
    let n = r.attempts();
    assert!((3..=8).contains(&n), "{server:?} {row:?}: {n} attempts");
    assert_eq!(r.last(), (RT, Some(Verdict::GaveUp(GiveUp::Deadline))));
    // Every attempt but possibly the last ended by the user's own timeout.
    let d = r.decided();
    assert!(d.iter().all(|d| d.1 == RT));
    assert!(!d[..d.len() - 1].iter().any(|d| d.2.is_some()));
}

const CLIENT_TIMEOUT_ALONE: Row = Row { client_timeout: Some(100), ..ROW };
const REQUEST_TIMEOUT_ALONE: Row = Row { request_timeout: Some(100), ..ROW };
/// The request's 100 ms applies, not the client's 2 s (reqwest's own rule): three attempts
/// fit in the 1.5 s deadline only at 100 ms each.
const BOTH: Row =
    Row { client_timeout: Some(2_000), request_timeout: Some(100), deadline: Some(1_500), ..ROW };
const NEITHER: Row = Row { deadline: Some(300), ..ROW };
const DEADLINE_SHORTER_THAN_CLIENT: Row = Row { client_timeout: Some(2_000), deadline: Some(300), ..ROW };
const DEADLINE_LONGER_THAN_CLIENT: Row =
    Row { client_timeout: Some(100), deadline: Some(800), max_attempts: u32::MAX, ..ROW };
const DEADLINE_SHORTER_THAN_REQUEST: Row = Row { request_timeout: Some(2_000), deadline: Some(300), ..ROW };
const DEADLINE_LONGER_THAN_REQUEST: Row =
    Row { request_timeout: Some(100), deadline: Some(800), max_attempts: u32::MAX, ..ROW };
/// An unkeyed write with a connect timeout shorter than the total.
const CONNECT_TIMEOUT_WRITE: Row =
    Row { connect_timeout: Some(100), client_timeout: Some(300), method: "POST", ..ROW };
/// An unkeyed write with a total timeout only.
const TOTAL_TIMEOUT_WRITE: Row = Row { client_timeout: Some(100), method: "POST", ..ROW };

macro_rules! matrix {
    ($($name:ident: $row:expr => $check:ident;)*) => {
        mod never_accepts {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { $check(Server::NeverAccepts, $row).await; })*
        }
        mod silent {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { $check(Server::Silent, $row).await; })*
        }
        mod stalls {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { $check(Server::Stalls, $row).await; })*
        }
    };
}

matrix! {
    client_timeout_alone: CLIENT_TIMEOUT_ALONE => three_attempts_each_ended_by_the_users_timeout;
    request_timeout_alone: REQUEST_TIMEOUT_ALONE => three_attempts_each_ended_by_the_users_timeout;
    client_and_request_timeout: BOTH => three_attempts_each_ended_by_the_users_timeout;
    neither_timeout: NEITHER => one_attempt_ended_by_the_deadline;
    deadline_shorter_than_client_timeout: DEADLINE_SHORTER_THAN_CLIENT => one_attempt_ended_by_the_deadline;
    deadline_longer_than_client_timeout: DEADLINE_LONGER_THAN_CLIENT => attempts_of_the_users_timeout_until_the_deadline;
    deadline_shorter_than_request_timeout: DEADLINE_SHORTER_THAN_REQUEST => one_attempt_ended_by_the_deadline;
    deadline_longer_than_request_timeout: DEADLINE_LONGER_THAN_REQUEST => attempts_of_the_users_timeout_until_the_deadline;
    connect_timeout_on_a_write: CONNECT_TIMEOUT_WRITE => connect_timeout_is_never_sent;
    total_timeout_on_a_write: TOTAL_TIMEOUT_WRITE => a_total_timeout_may_have_landed;
}

/// A connect timeout is told apart: never sent, so an unkeyed write is resent after it. Once
/// connected (silent, stalls) the total timeout fires instead: it may have landed.
async fn connect_timeout_is_never_sent(server: Server, row: Row) {
    let r = run(server, row).await;
    if server == Server::NeverAccepts {
        assert_eq!(r.attempts(), 3, "{row:?}");
        assert!(r.decided().iter().all(|d| d.1 == Some(Failure::ConnectTimeout)));
        assert_eq!(r.last().1, Some(Verdict::GaveUp(GiveUp::Attempts)));
    } else {
        assert_eq!(r.attempts(), 1, "{server:?} {row:?}");
        assert_eq!(r.last(), (RT, Some(Verdict::Unknown)));
    }
}

/// A total timeout alone cannot say whether the connection was made, not even when the
/// connect was what hung: a response timeout, so an unkeyed write ends `unknown`.
async fn a_total_timeout_may_have_landed(server: Server, row: Row) {
    let r = run(server, row).await;
    assert_eq!(r.attempts(), 1, "{server:?} {row:?}");
    assert_eq!(r.last(), (RT, Some(Verdict::Unknown)));
    assert!(!r.ended_by_deadline_timer());
}

/// The program of a user who set a client timeout and a deadline, scaled down tenfold (a
/// 100 ms client timeout under a 1.2 s deadline; backoff 10 ms to 1 s): a keyed POST to a
/// server that accepts and never answers.
async fn keyed_post_under_a_deadline(client_timeout_ms: u64, scale: u64) -> Run {
    let events = Events::default();
    let fixture = serve(Server::Silent, &events).await;
    let ms = |n: u64| Ms::from_millis(n * scale);
    let policy =
        Policy::builder(Preset::Default).base(ms(10)).cap(ms(1_000)).deadline(ms(1_200)).build().unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(client_timeout_ms * scale))
        .build()
        .unwrap();
    let ledger: wary_host::call::SharedSink = Arc::new(Mutex::new(EventSink(events.clone())));
    let client = ClientBuilder::new(http)
        .with(WaryMiddleware::new(policy).ledger(ledger))
        .with(SeeAttempts(events.clone()))
        .build();
    let url = format!("http://{}/readings", fixture.addr);
    let sent = client.post(url).header("idempotency-key", "k-1").body("{}").send().await;
    let error = match sent {
        Err(reqwest_middleware::Error::Middleware(a)) => Some(a.downcast::<CallError>().unwrap()),
        other => panic!("{other:?}"),
    };
    drop(fixture);
    let run = Run { events: events.all(), error };
    check_order(Server::Silent, ROW, &run);
    let d = run.decided();
    // Every attempt timed out, and each but the last was followed by a wait.
    assert!(d.iter().all(|d| d.1 == RT), "{d:?}");
    assert_eq!(run.last().1, Some(Verdict::GaveUp(GiveUp::Deadline)));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_client_timeout_gives_many_attempts_before_the_deadline() {
    let r = keyed_post_under_a_deadline(100, 1).await;
    assert!(r.attempts() >= 5, "{} attempts", r.attempts());
    // At most one attempt per client timeout fits.
    assert!(r.attempts() <= 12, "{} attempts", r.attempts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_of_a_quarter_of_the_deadline_gives_three_or_four() {
    let r = keyed_post_under_a_deadline(300, 1).await;
    assert!((3..=4).contains(&r.attempts()), "{} attempts", r.attempts());
}

/// The same two programs at full scale: a 1 s and a 3 s client timeout under a 12 s deadline.
/// About 25 s in all: `cargo test -p wary-reqwest --test timeouts -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs for about 25 s"]
async fn the_full_scale_programs() {
    let one = keyed_post_under_a_deadline(100, 10).await;
    let three = keyed_post_under_a_deadline(300, 10).await;
    println!("client timeout 1 s: {} attempts; 3 s: {} attempts", one.attempts(), three.attempts());
    assert!(one.attempts() >= 5);
    assert!((3..=4).contains(&three.attempts()));
}
