//! A scripted modem on the far side of an in-memory serial pair, and a one-future executor on
//! embassy-time's mock clock.
//!
//! The modem reads the device's bytes into command lines (`\r`-terminated, or the bare `+++`
//! escape), checks each against the next exchange of its script, echoes it when its echo is
//! on, and queues the scripted reply at a virtual time. The device reads that queue through
//! `embedded_io_async::Read`; a reply in the future is waited for on the mock clock, silence is
//! a read that never completes.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use embassy_time::{Duration, Instant, MockDriver, Timer};
use embedded_io_async::{ErrorKind, ErrorType, Read, Write};

/// What the modem does when it receives a command.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Each as a V.250 response line: `\r\n<line>\r\n`.
    Lines(Vec<&'static str>),
    /// These bytes as they are.
    Raw(Vec<u8>),
    /// Nothing.
    Silence,
    /// The reply, this much later.
    After(Duration, Box<Reply>),
    /// Several replies in order.
    Seq(Vec<Reply>),
    /// A response line of this many `X`s.
    Overlong(usize),
    /// From now on every read returns `Ok(0)`.
    Close,
    /// The next read returns this error.
    ReadError(ErrorKind),
    /// Every write from now on returns this error.
    BreakWrites(ErrorKind),
    /// Every write from now on returns `Ok(0)`.
    ZeroWrites,
    /// Every write from now on never completes.
    StallWrites,
    /// Echo on (ATE1) or off (ATE0) for the commands after this one.
    Echo(bool),
    /// From now on the modem sends these bytes over and over at line rate: every read returns
    /// the next byte at once and costs 1 ms of virtual time.
    Stream(Vec<u8>),
}

/// Shorthand for `Reply::Lines`.
pub fn lines(lines: &[&'static str]) -> Reply {
    Reply::Lines(lines.to_vec())
}

/// One expected command and the modem's reply to it.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub expect: &'static str,
    pub reply: Reply,
}

pub fn on(expect: &'static str, reply: Reply) -> Exchange {
    Exchange { expect, reply }
}

/// The happy path's script for this APN.
pub fn happy(cgdcont: &'static str) -> Vec<Exchange> {
    vec![
        on("AT", lines(&["OK"])),
        on("ATE0", lines(&["OK"])),
        on(cgdcont, lines(&["OK"])),
        on("ATD*99#", lines(&["CONNECT 150000000"])),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    Normal,
    Broken(ErrorKind),
    Zero,
    Stalled,
}

#[derive(Debug)]
pub struct ModemState {
    script: VecDeque<Exchange>,
    echo: bool,
    received: Vec<u8>,
    outbox: VecDeque<(Instant, Vec<u8>)>,
    closed: bool,
    read_error: Option<ErrorKind>,
    write_mode: WriteMode,
    stream: Option<(Vec<u8>, usize)>,
    /// Every command line the modem took, in order.
    pub commands: Vec<String>,
    /// When each command line (or `+++`) was complete.
    pub command_times: Vec<(String, Instant)>,
    /// Every write call that carried bytes: when, and what.
    pub writes: Vec<(Instant, Vec<u8>)>,
    pub reads: u64,
    pub zero_reads: u64,
    pub write_calls: u64,
    same_instant_reads: (Instant, u64),
}

/// The device's end of the serial pair; clones share the modem.
#[derive(Debug, Clone)]
pub struct Port(pub Rc<RefCell<ModemState>>);

impl Port {
    pub fn new(script: Vec<Exchange>) -> Self {
        Self(Rc::new(RefCell::new(ModemState {
            script: script.into(),
            echo: false,
            received: Vec::new(),
            outbox: VecDeque::new(),
            closed: false,
            read_error: None,
            write_mode: WriteMode::Normal,
            stream: None,
            commands: Vec::new(),
            command_times: Vec::new(),
            writes: Vec::new(),
            reads: 0,
            zero_reads: 0,
            write_calls: 0,
            same_instant_reads: (Instant::from_ticks(0), 0),
        })))
    }

    /// A modem whose echo starts on (as after a power-up with its factory profile).
    pub fn with_echo(self) -> Self {
        self.0.borrow_mut().echo = true;
        self
    }

    /// Bytes the modem sends on its own, now (unsolicited, or PPP in flight).
    pub fn push_unsolicited(&self, bytes: &[u8]) {
        let now = Instant::now();
        self.0.borrow_mut().outbox.push_back((now, bytes.to_vec()));
    }

    /// Replaces the rest of the script (a new phase of the test).
    pub fn script(&self, script: Vec<Exchange>) {
        self.0.borrow_mut().script = script.into();
    }

    pub fn commands(&self) -> Vec<String> {
        self.0.borrow().commands.clone()
    }

    pub fn script_left(&self) -> usize {
        self.0.borrow().script.len()
    }

    pub fn command_time(&self, command: &str) -> Vec<Instant> {
        self.0.borrow().command_times.iter().filter(|(c, _)| c == command).map(|(_, t)| *t).collect()
    }

    /// Whether anything the modem sent is still unread.
    pub fn unread(&self) -> Vec<u8> {
        self.0.borrow().outbox.iter().flat_map(|(_, b)| b.clone()).collect()
    }
}

impl ModemState {
    fn schedule(&mut self, at: Instant, reply: Reply) {
        match reply {
            Reply::Lines(lines) => {
                let mut bytes = Vec::new();
                for line in lines {
                    bytes.extend_from_slice(b"\r\n");
                    bytes.extend_from_slice(line.as_bytes());
                    bytes.extend_from_slice(b"\r\n");
                }
                self.outbox.push_back((at, bytes));
            }
            Reply::Raw(bytes) => self.outbox.push_back((at, bytes)),
            Reply::Silence => {}
            Reply::After(delay, reply) => self.schedule(at + delay, *reply),
            Reply::Seq(replies) => {
                for reply in replies {
                    self.schedule(at, reply);
                }
            }
            Reply::Overlong(n) => {
                let mut bytes = b"\r\n".to_vec();
                bytes.extend(std::iter::repeat_n(b'X', n));
                bytes.extend_from_slice(b"\r\n");
                self.outbox.push_back((at, bytes));
            }
            Reply::Close => self.closed = true,
            Reply::ReadError(kind) => self.read_error = Some(kind),
            Reply::BreakWrites(kind) => self.write_mode = WriteMode::Broken(kind),
            Reply::ZeroWrites => self.write_mode = WriteMode::Zero,
            Reply::StallWrites => self.write_mode = WriteMode::Stalled,
            Reply::Echo(on) => self.echo = on,
            Reply::Stream(bytes) => self.stream = Some((bytes, 0)),
        }
        // Keep the queue in time order (a delayed reply may be queued before an immediate one).
        self.outbox.make_contiguous().sort_by_key(|(t, _)| *t);
    }

    fn take_command(&mut self, line: String) {
        let now = Instant::now();
        let Some(exchange) = self.script.pop_front() else {
            panic!("the modem got {line:?} after its script ended");
        };
        assert_eq!(line, exchange.expect, "the modem got an unexpected command");
        if self.echo && line != "+++" {
            let mut echo = line.clone().into_bytes();
            echo.push(b'\r');
            self.outbox.push_back((now, echo));
        }
        self.commands.push(line.clone());
        self.command_times.push((line, now));
        self.schedule(now, exchange.reply);
    }

    fn receive(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\r' {
                let line = String::from_utf8(std::mem::take(&mut self.received)).expect("ASCII command");
                // A `+++` in command mode stays in the modem's line buffer, in front of the next
                // command, unless the script takes it as the escape.
                let line = match line.strip_prefix("+++") {
                    Some(rest) if self.script.front().is_some_and(|e| e.expect != line) => rest.to_string(),
                    _ => line,
                };
                self.take_command(line);
            } else {
                self.received.push(b);
                if self.received == b"+++" && self.script.front().is_some_and(|e| e.expect == "+++") {
                    self.received.clear();
                    self.take_command("+++".to_string());
                }
            }
        }
    }
}

impl ErrorType for Port {
    type Error = ErrorKind;
}

impl Read for Port {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, ErrorKind> {
        loop {
            let next = {
                let mut guard = self.0.borrow_mut();
                let st = &mut *guard;
                let now = Instant::now();
                st.reads += 1;
                // A reader that never awaits would call us forever at one instant.
                if st.same_instant_reads.0 == now {
                    st.same_instant_reads.1 += 1;
                    assert!(st.same_instant_reads.1 < 100_000, "the chat spins on the port");
                } else {
                    st.same_instant_reads = (now, 1);
                }
                if let Some(kind) = st.read_error.take() {
                    return Err(kind);
                }
                if let Some((bytes, next)) = st.stream.as_mut()
                    && !buf.is_empty()
                    && !bytes.is_empty()
                {
                    buf[0] = bytes[*next % bytes.len()];
                    *next += 1;
                    assert!(now < Instant::from_ticks(0) + HANG, "the chat reads a stream forever");
                    MockDriver::get().advance(Duration::from_millis(1));
                    return Ok(1);
                }
                let closed = st.closed;
                match st.outbox.front_mut() {
                    Some((at, bytes)) if *at <= now => {
                        let n = buf.len().min(bytes.len());
                        buf[..n].copy_from_slice(&bytes[..n]);
                        bytes.drain(..n);
                        if bytes.is_empty() {
                            st.outbox.pop_front();
                        }
                        return Ok(n);
                    }
                    Some((at, _)) => Some(*at),
                    None if closed => {
                        st.zero_reads += 1;
                        return Ok(0);
                    }
                    None => None,
                }
            };
            match next {
                Some(at) => Timer::at(at).await,
                None => std::future::pending::<()>().await,
            }
        }
    }
}

impl Write for Port {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, ErrorKind> {
        let mode = {
            let mut st = self.0.borrow_mut();
            st.write_calls += 1;
            assert!(st.write_calls < 100_000, "the chat spins on writes");
            st.write_mode
        };
        match mode {
            WriteMode::Normal => {
                let mut st = self.0.borrow_mut();
                st.writes.push((Instant::now(), buf.to_vec()));
                st.receive(buf);
                Ok(buf.len())
            }
            WriteMode::Broken(kind) => Err(kind),
            WriteMode::Zero => Ok(0),
            WriteMode::Stalled => std::future::pending().await,
        }
    }

    async fn flush(&mut self) -> Result<(), ErrorKind> {
        Ok(())
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The mock clock is one per process: one test at a time.
static CLOCK: Mutex<()> = Mutex::new(());

/// Nothing here should wait this long; a future still pending then is a hang.
const HANG: Duration = Duration::from_secs(3600);

/// Runs `make`'s future to completion on virtual time, starting at zero: polls it when woken,
/// otherwise advances the mock clock by 1 ms. Returns the output and the virtual time taken.
pub fn run<F: Future>(make: impl FnOnce() -> F) -> (F::Output, Duration) {
    let _one_at_a_time = CLOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let driver = MockDriver::get();
    driver.reset();
    let start = Instant::now();
    let mut fut = pin!(make());
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if flag.0.swap(false, Ordering::SeqCst) {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return (out, Instant::now() - start);
            }
        } else {
            assert!(Instant::now() - start < HANG, "still waiting after an hour of virtual time");
            driver.advance(Duration::from_millis(1));
        }
    }
}

/// A DTR pin that records its levels with the time.
#[derive(Debug, Default)]
pub struct RecordingDtr {
    pub changes: Vec<(Instant, bool)>,
    pub fail: bool,
}

impl wary_dial::Dtr for RecordingDtr {
    type Error = ();

    fn set_ready(&mut self, ready: bool) -> Result<(), ()> {
        if self.fail {
            return Err(());
        }
        self.changes.push((Instant::now(), ready));
        Ok(())
    }
}
