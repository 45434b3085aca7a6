//! Fault scripts: which share of requests gets which misbehaviour, chosen deterministically.
//!
//! Each request draws one number in `[0, 1)` from `(seed, stream, ordinal)` (see
//! [`Faults::pick`]), where the stream is `k:<idempotency-key>` on `POST /readings`,
//! `r:<reading-id>` on `POST /legacy/readings` (`legacy` without `X-Reading-Id`) and
//! `g:<reading-id>` on `GET /legacy/readings/<reading-id>`, and the ordinal counts the requests
//! seen on that stream from 0, faulted ones included. The rules are walked in order with cumulative probabilities; the first whose share
//! covers the draw applies, none if the draw lands past their sum. Hashing the stream instead of
//! stepping one global generator keeps the choice for a key's `n`-th attempt independent of how
//! concurrent clients interleave.
//!
//! | name (compact) | effect | what the client gets |
//! |---|---|---|
//! | `503` | none | 503, optionally with Retry-After (`ra=`) |
//! | `429` | none | 429, optionally with Retry-After (`ra=`) |
//! | `400` | none | 400 |
//! | `status` | none | the status `code` (4xx or 5xx, 422 by default), before any effect |
//! | `500` | applied | 500 |
//! | `drop_before_effect` | none | the connection closed (FIN), no reply byte |
//! | `drop_after_effect` (`drop`) | applied | the connection closed (FIN), no reply byte |
//! | `reset_after_effect` (`reset`) | applied | the connection reset (RST, `SO_LINGER` 0), no reply byte |
//! | `slow` | applied | the reply `ms` late (sleeping before the effect with `before=true`) |
//! | `stall` | applied, or none with `effect=false` | nothing for `ms`, then the reply (504 when nothing was applied) or, with `then=close`, a close |
//! | `truncated_reply` (`truncated`) | applied | a status line and part of the header block, then a close |
//! | `garbage_status` | applied, or none with `effect=false` | a status line that is not HTTP (`form=bad_code`, `HTTP/1.1 2x0 OK`) or binary noise (`form=binary`), then a close |
//! | `huge_header` | applied | the genuine reply with an `X-Padding` header of `bytes` characters (8192 by default), so its header block is larger than a small receive buffer |
//! | `bad_body` | applied, or none with `effect=false` | 200 with a malformed body |
//! | `endless_body` | applied, or none with `effect=false` | 200 whose body never ends |
//!
//! Refusal windows are not drawn per request: `refuse_at=N:ms=M` closes the listener for `M`
//! milliseconds when the `N`-th request on an endpoint in scope arrives (counted from 1 since the
//! script was put in force), so new
//! connections are refused (RST on connect) until it is reopened on the same port; that request
//! and connections already open are served as usual. A script may hold several.
//!
//! Idle keep-alive connections are closed at random with `idle_close=P:min=A:max=B`: after
//! each reply on a connection, with probability `P`, the server closes the connection (a
//! graceful HTTP/1.1 shutdown: a FIN, or an RST if request bytes already wait unread) once it
//! has idled a time drawn uniformly in `A..=B` ms, unless the next request started before. Each
//! close is counted as the fault `idle_close`. With `race=R`, a share `R` of those closes fire
//! instead as the next request arrives, if it comes before the idle time: the connection is
//! reset with the request unread, as when a client writes just as the server's idle timer fires
//! (counted as `idle_close_race`). The draws come from `(seed, connection number, reply
//! number)`, so a run repeats.
//!
//! A capacity is not drawn either: `capacity=N` accepts at most `N` requests in each 1 s window
//! (windows counted from when the script was put in force) and answers every request above that
//! 503 at once, before any effect, as a load shedder does (counted as the fault `capacity`);
//! `capacity=N:ra=S` adds a Retry-After to those 503s (any [`RetryAfter`] spec, or `spread`: a
//! delay drawn uniformly from 1 s up to the seconds the window's excess needs at `N` per second,
//! so the refused come back spread out rather than together). `outage=A:ms=M` answers every
//! request 503 (no Retry-After) from `A` ms to `A + M` ms after the script was put in force
//! (counted as `outage`); `outage=A:ms=M:status=S` answers `S` instead (a 4xx or 5xx: an upstream
//! whose credential expired answers 401 for a while, say), never applied, counted as `outage`
//! too; a script may hold several. With either, the cloud counts each 1 s window's arrivals and
//! accepted requests ([`crate::Stats::load`]). Requests on endpoints out of scope pass untouched
//! and uncounted; each item of a batch counts as one request.
//!
//! A poisoned reading is not drawn either: `poison=N:status=S` (`S` 422 by default) answers `S`,
//! never applied, to every request on `POST /readings` (a batch's items included) whose
//! idempotency key is the `N`-th distinct key seen there since the script was put in force
//! (from 1; every arrival numbers its key, outages included), a reading that can never succeed,
//! however often it is sent (counted as the fault `poison`). An outage or a capacity's 503 comes
//! first; the drawn rules apply to the keys no poison names. A script may hold several.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A fault script: a seed, ordered rules and the endpoints they apply to.
///
/// JSON: `{"seed": 7, "rules": [{"kind": "503", "p": 0.2}, {"kind": "429", "p": 0.1,
/// "retry_after": "date+2"}], "scope": {"keyed": true, "legacy": true, "read": false}}`.
/// Compact form: see [`Faults::from_str`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Seed of the per-request choice.
    #[serde(default)]
    pub seed: u64,
    /// Rules in order; their shares must add up to at most 1.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Endpoints the rules apply to (all by default).
    #[serde(default)]
    pub scope: Scope,
    /// Refusal windows, each started by the request with its number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
    /// Idle keep-alive connections closed at random (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_close: Option<IdleClose>,
    /// At most this many requests accepted a second, 503 above (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Scheduled total outages: every request answered 503 (or the outage's own status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outages: Vec<Outage>,
    /// Poisoned readings: keys, by the order they were first seen, that are never applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poisons: Vec<Poison>,
}

/// A capacity: at most `per_second` requests accepted in each 1 s window, the rest answered 503
/// at once, before any effect.
///
/// JSON: `{"per_second": 200, "retry_after": "spread"}`; compact: `capacity=200:ra=spread`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capacity {
    /// Requests accepted in one 1 s window.
    pub per_second: u64,
    /// What the 503s above it carry (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<CapacityRetryAfter>,
}

/// The Retry-After of a capacity's 503s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRetryAfter", into = "String")]
pub enum CapacityRetryAfter {
    /// The same value on every 503.
    Fixed(RetryAfter),
    /// Whole seconds drawn uniformly from 1 up to the seconds the window's excess so far needs at
    /// the capacity (`ceil(refused / per_second)`, at least 1): the later in a busy window a
    /// request is refused, the further out it may be sent.
    Spread,
}

impl TryFrom<RawRetryAfter> for CapacityRetryAfter {
    type Error = String;
    fn try_from(raw: RawRetryAfter) -> Result<Self, String> {
        match raw {
            RawRetryAfter::Text(s) if s == "spread" => Ok(CapacityRetryAfter::Spread),
            other => Ok(CapacityRetryAfter::Fixed(RetryAfter::try_from(other)?)),
        }
    }
}

impl From<CapacityRetryAfter> for String {
    fn from(ra: CapacityRetryAfter) -> String {
        match ra {
            CapacityRetryAfter::Fixed(ra) => ra.to_string(),
            CapacityRetryAfter::Spread => "spread".to_owned(),
        }
    }
}

impl FromStr for CapacityRetryAfter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "spread" { Ok(CapacityRetryAfter::Spread) } else { Ok(CapacityRetryAfter::Fixed(s.parse()?)) }
    }
}

impl Capacity {
    /// The Retry-After for a request refused as the `refused`-th (from 1) over the capacity in its
    /// window, drawn from the script's seed and the window's number.
    pub fn retry_after(&self, faults: &Faults, window: u64, refused: u64) -> Option<RetryAfter> {
        match self.retry_after? {
            CapacityRetryAfter::Fixed(ra) => Some(ra),
            CapacityRetryAfter::Spread => {
                let span = refused.div_ceil(self.per_second.max(1)).max(1);
                let u = faults.draw(&format!("capacity:{window}"), refused);
                let secs = 1 + ((u * span as f64) as u64).min(span - 1);
                Some(RetryAfter::Seconds(secs))
            }
        }
    }
}

/// A scheduled total outage: from `at_ms` to `at_ms + ms` after the script was put in force,
/// every request in scope is answered 503 without Retry-After, or `status` when it is given
/// (never applied either way).
///
/// JSON: `{"at_ms": 0, "ms": 5000}` or `{"at_ms": 0, "ms": 20000, "status": 401}`; compact:
/// `outage=0:ms=5000`, `outage=0:ms=20000:status=401`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    /// Start, milliseconds after the script was put in force.
    pub at_ms: u64,
    /// Length in milliseconds.
    pub ms: u64,
    /// The status answered instead of 503 (a 4xx or 5xx), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// A poisoned reading: every request whose idempotency key is the `nth` distinct key seen on
/// `POST /readings` since the script was put in force (from 1) is answered `status`, never
/// applied.
///
/// JSON: `{"nth": 3}` or `{"nth": 3, "status": 400}`; compact: `poison=3`, `poison=3:status=400`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Poison {
    /// Which key, by the order keys were first seen, from 1.
    pub nth: u64,
    /// The status its requests get (a 4xx or 5xx; 422 by default).
    #[serde(default = "unprocessable")]
    pub status: u16,
}

impl Outage {
    /// Whether `elapsed_ms` after the script was put in force falls inside the outage.
    pub fn covers(&self, elapsed_ms: u64) -> bool {
        elapsed_ms >= self.at_ms && elapsed_ms - self.at_ms < self.ms
    }
}

/// Closing idle keep-alive connections at random: after a reply, with probability `p`, the
/// connection is closed once it has idled a time drawn uniformly in `min_ms..=max_ms`.
///
/// JSON: `{"p": 0.5, "min_ms": 20, "max_ms": 80, "race": 0.2}`; compact:
/// `idle_close=0.5:min=20:max=80:race=0.2`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleClose {
    /// Share of replies after which the connection is closed when it idles.
    pub p: f64,
    /// The shortest idle time before the close, in milliseconds.
    pub min_ms: u64,
    /// The longest idle time before the close, in milliseconds.
    pub max_ms: u64,
    /// Share of those closes that fire as the next request arrives, if it comes first: the
    /// server resets the connection with the request unread (the race of a client writing
    /// as the server's idle timer fires).
    #[serde(default)]
    pub race: f64,
}

impl IdleClose {
    /// After the `reply`-th reply (from 0) on connection number `conn`: the idle time after
    /// which the server closes the connection, or `None` to keep it.
    pub fn after(&self, faults: &Faults, conn: u64, reply: u64) -> Option<u64> {
        let stream = format!("c:{conn}");
        let ordinal = reply.saturating_mul(3);
        if faults.draw(&stream, ordinal) >= self.p {
            return None;
        }
        let span = self.max_ms.saturating_sub(self.min_ms);
        let offset = (faults.draw(&stream, ordinal.saturating_add(1)) * (span as f64 + 1.0)) as u64;
        Some(self.min_ms.saturating_add(offset.min(span)))
    }

    /// Whether the close after the `reply`-th reply on connection `conn` (when [`after`]
    /// gives one) also fires as the next request arrives.
    ///
    /// [`after`]: IdleClose::after
    pub fn races(&self, faults: &Faults, conn: u64, reply: u64) -> bool {
        faults.draw(&format!("c:{conn}"), reply.saturating_mul(3).saturating_add(2)) < self.race
    }
}

/// A refusal window: when the `at`-th request on an endpoint in scope arrives (counted from 1
/// since the script was put in force), the listener is closed for `ms` milliseconds, then
/// reopened on the same port.
///
/// JSON: `{"at": 3, "ms": 2000}`; compact: `refuse_at=3:ms=2000`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// Number of the request that starts the window, from 1.
    pub at: u64,
    /// How long new connections are refused, in milliseconds.
    #[serde(default = "one_second")]
    pub ms: u64,
}

/// One rule: a share of requests and what happens to them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Share of requests, `0.0..=1.0`.
    pub p: f64,
    /// The misbehaviour.
    #[serde(flatten)]
    pub fault: Fault,
}

/// Which endpoints a fault script touches. `/stats`, `/report` and `/admin/*` are never faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scope {
    /// `POST /readings`.
    pub keyed: bool,
    /// `POST /legacy/readings`.
    pub legacy: bool,
    /// `GET /legacy/readings/<id>`, the probe.
    pub read: bool,
}

impl Default for Scope {
    fn default() -> Self {
        Scope { keyed: true, legacy: true, read: true }
    }
}

/// What a faulted request gets. "Effect" is the write the endpoint performs (for the read
/// endpoint, the lookup); pre-effect faults leave the store untouched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum Fault {
    /// 503 before any effect, optionally with a Retry-After.
    #[serde(rename = "503")]
    Unavailable {
        /// Retry-After to send, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<RetryAfter>,
    },
    /// 429 before any effect, optionally with a Retry-After.
    #[serde(rename = "429")]
    TooManyRequests {
        /// Retry-After to send, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<RetryAfter>,
    },
    /// 400 before any effect.
    #[serde(rename = "400")]
    BadRequest,
    /// This status (a 4xx or 5xx) before any effect: what an outage with a `status` and a
    /// poison answer, and a rule of its own.
    #[serde(rename = "status")]
    Status {
        /// The status code (default 422).
        #[serde(default = "unprocessable")]
        code: u16,
    },
    /// The effect is applied (and, on the keyed endpoint, the genuine result stored), then 500.
    #[serde(rename = "500")]
    ErrorAfterEffect,
    /// Connection closed without a reply, before any effect.
    #[serde(rename = "drop_before_effect")]
    DropBeforeEffect,
    /// The effect is applied, then the connection is closed without a reply (a graceful FIN).
    #[serde(rename = "drop_after_effect")]
    DropAfterEffect,
    /// The effect is applied, then the connection is reset (`SO_LINGER` 0, so the close sends
    /// RST) before any reply byte: the client's read fails with a reset, not an end of stream.
    #[serde(rename = "reset_after_effect")]
    ResetAfterEffect,
    /// Nothing is sent for `ms`, past the client's timeout, then the reply or a close. With
    /// `effect` (the default) the effect is applied and stored before the stall and the key is
    /// released, so a resend during the stall gets the stored result; without it nothing is
    /// applied and the reply after the stall is a 504.
    #[serde(rename = "stall")]
    Stall {
        /// How long nothing is sent, in milliseconds (default 10000).
        #[serde(default = "ten_seconds")]
        ms: u64,
        /// Whether the effect is applied before the stall.
        #[serde(default = "yes")]
        effect: bool,
        /// What follows the stall.
        #[serde(default)]
        then: StallEnd,
    },
    /// The effect is applied, then a status line and part of the header block are sent and the
    /// connection is closed: the client reads an end of stream in the middle of the headers.
    #[serde(rename = "truncated_reply")]
    TruncatedReply,
    /// Bytes that are not an HTTP status line, then a close; the effect is applied unless
    /// `effect` is false.
    #[serde(rename = "garbage_status")]
    GarbageStatus {
        /// Which garbage.
        #[serde(default)]
        form: GarbageForm,
        /// Whether the effect is applied first.
        #[serde(default = "yes")]
        effect: bool,
    },
    /// The genuine reply (effect applied) with an `X-Padding` header of `bytes` characters, so
    /// its header block does not fit a small device's receive buffer.
    #[serde(rename = "huge_header")]
    HugeHeader {
        /// Length of the padding header's value (default 8192).
        #[serde(default = "eight_kib")]
        bytes: usize,
    },
    /// Sleep `ms` before answering; after the effect unless `before_effect`. The key stays
    /// in flight meanwhile, so a concurrent duplicate gets 409.
    #[serde(rename = "slow")]
    Slow {
        /// Delay in milliseconds.
        ms: u64,
        /// Sleep before the effect instead of after it.
        #[serde(default)]
        before_effect: bool,
    },
    /// 200 with a malformed body; the effect is applied unless `effect` is false.
    #[serde(rename = "bad_body")]
    BadBody {
        /// Which malformation.
        #[serde(default)]
        form: BadBodyForm,
        /// Whether the effect is applied first.
        #[serde(default = "yes")]
        effect: bool,
    },
    /// 200 whose body never ends: one byte every `ms` (default 1000). The effect is applied
    /// unless `effect` is false.
    #[serde(rename = "endless_body")]
    EndlessBody {
        /// Milliseconds between bytes.
        #[serde(default = "one_second")]
        ms: u64,
        /// Whether the effect is applied first.
        #[serde(default = "yes")]
        effect: bool,
    },
}

fn yes() -> bool {
    true
}

fn one_second() -> u64 {
    1000
}

fn ten_seconds() -> u64 {
    10_000
}

fn eight_kib() -> usize {
    8 * 1024
}

fn unprocessable() -> u16 {
    422
}

/// Whether `code` may be scripted as an answer: a client or server error. A scripted 2xx would
/// tell the client the reading landed when nothing was applied.
fn scriptable(code: u16) -> bool {
    (400..=599).contains(&code)
}

/// Longest delay a script may ask for.
const MAX_DELAY_MS: u64 = 3_600_000;
/// Largest padding header [`Fault::HugeHeader`] may send.
pub const MAX_PADDING: usize = 1 << 20;

impl Fault {
    /// Short name, as in the compact form and in [`crate::Stats::faults_injected`].
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Unavailable { .. } => "503",
            Fault::TooManyRequests { .. } => "429",
            Fault::BadRequest => "400",
            Fault::Status { .. } => "status",
            Fault::ErrorAfterEffect => "500",
            Fault::DropBeforeEffect => "drop_before_effect",
            Fault::DropAfterEffect => "drop_after_effect",
            Fault::ResetAfterEffect => "reset_after_effect",
            Fault::Stall { .. } => "stall",
            Fault::TruncatedReply => "truncated_reply",
            Fault::GarbageStatus { .. } => "garbage_status",
            Fault::HugeHeader { .. } => "huge_header",
            Fault::Slow { .. } => "slow",
            Fault::BadBody { .. } => "bad_body",
            Fault::EndlessBody { .. } => "endless_body",
        }
    }
}

/// How a bad body is malformed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadBodyForm {
    /// `Content-Type: application/json` with an HTML body.
    #[default]
    NotJson,
    /// A JSON body under `Content-Type: text/html`.
    WrongType,
}

/// What follows a [`Fault::Stall`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StallEnd {
    /// The reply, late.
    #[default]
    Reply,
    /// A close (FIN) without a reply byte.
    Close,
}

impl StallEnd {
    fn as_str(self) -> &'static str {
        match self {
            StallEnd::Reply => "reply",
            StallEnd::Close => "close",
        }
    }
}

/// What a [`Fault::GarbageStatus`] sends instead of a status line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GarbageForm {
    /// `HTTP/1.1 2x0 OK` and a header block: the shape of HTTP with a status code that is not
    /// three digits.
    #[default]
    BadCode,
    /// Binary noise, NUL and high bytes included.
    Binary,
}

impl GarbageForm {
    fn as_str(self) -> &'static str {
        match self {
            GarbageForm::BadCode => "bad_code",
            GarbageForm::Binary => "binary",
        }
    }

    /// The bytes sent on the wire.
    pub fn bytes(self) -> Vec<u8> {
        match self {
            GarbageForm::BadCode => {
                b"HTTP/1.1 2x0 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec()
            }
            // Fixed noise, so a failing run can be replayed byte for byte. The first byte is
            // forced off `H` so that no prefix can pass for `HTTP/`.
            GarbageForm::Binary => (0..64u64)
                .map(|i| (splitmix64(i) >> 56) as u8)
                .enumerate()
                .map(|(i, b)| if i == 0 && b == b'H' { 0 } else { b })
                .collect(),
        }
    }
}

/// A Retry-After header to send, written as a string (JSON also takes a bare number).
///
/// `N` delta-seconds; `year` = 31536000; `date+N` / `date-N` an IMF-fixdate `N` seconds after
/// (before) the response's own `Date` header; `date+year`; `garbage` an unparseable value;
/// `garbage_date` a valid date form beside an unparseable `Date` header; `dup` two
/// Retry-After headers (`1` and `3600`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRetryAfter", into = "String")]
pub enum RetryAfter {
    /// Delta-seconds.
    Seconds(u64),
    /// HTTP-date this many seconds from the `Date` header sent with it (negative: in the past).
    Date(i64),
    /// A value no parser should accept.
    Garbage,
    /// A date-form Retry-After with an unparseable `Date` header.
    GarbageDate,
    /// Two conflicting Retry-After headers.
    Duplicate,
}

const YEAR: u64 = 365 * 24 * 3600;

#[derive(Deserialize)]
#[serde(untagged)]
enum RawRetryAfter {
    Number(u64),
    Text(String),
}

impl TryFrom<RawRetryAfter> for RetryAfter {
    type Error = String;
    fn try_from(raw: RawRetryAfter) -> Result<Self, String> {
        match raw {
            RawRetryAfter::Number(n) => Ok(RetryAfter::Seconds(n)),
            RawRetryAfter::Text(s) => s.parse(),
        }
    }
}

impl From<RetryAfter> for String {
    fn from(ra: RetryAfter) -> String {
        ra.to_string()
    }
}

impl FromStr for RetryAfter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad retry-after spec `{s}`");
        Ok(match s {
            "year" => RetryAfter::Seconds(YEAR),
            "date+year" => RetryAfter::Date(YEAR as i64),
            "garbage" => RetryAfter::Garbage,
            "garbage_date" => RetryAfter::GarbageDate,
            "dup" => RetryAfter::Duplicate,
            _ => {
                if let Some(n) = s.strip_prefix("date+") {
                    RetryAfter::Date(n.parse().map_err(|_| bad())?)
                } else if let Some(n) = s.strip_prefix("date-") {
                    let n: i64 = n.parse().map_err(|_| bad())?;
                    RetryAfter::Date(-n)
                } else {
                    RetryAfter::Seconds(s.parse().map_err(|_| bad())?)
                }
            }
        })
    }
}

impl fmt::Display for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryAfter::Seconds(n) => write!(f, "{n}"),
            RetryAfter::Date(n) if *n < 0 => write!(f, "date-{}", n.unsigned_abs()),
            RetryAfter::Date(n) => write!(f, "date+{n}"),
            RetryAfter::Garbage => f.write_str("garbage"),
            RetryAfter::GarbageDate => f.write_str("garbage_date"),
            RetryAfter::Duplicate => f.write_str("dup"),
        }
    }
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Faults::default()
    }

    /// Checks shares (each in `0..=1`, sum at most 1), delays (at most an hour), padding sizes
    /// (`1..=`[`MAX_PADDING`]) and refusal windows (from request 1, `1..=3600000` ms).
    pub fn validate(&self) -> Result<(), String> {
        let mut sum = 0.0;
        for rule in &self.rules {
            if !(0.0..=1.0).contains(&rule.p) {
                return Err(format!("share {} of `{}` is outside 0..=1", rule.p, rule.fault.name()));
            }
            sum += rule.p;
            match rule.fault {
                Fault::Slow { ms, .. } | Fault::EndlessBody { ms, .. } | Fault::Stall { ms, .. }
                    if ms > MAX_DELAY_MS =>
                {
                    return Err(format!("delay {ms} ms of `{}` exceeds an hour", rule.fault.name()));
                }
                Fault::EndlessBody { ms: 0, .. } => {
                    return Err("endless_body needs ms > 0".into());
                }
                Fault::Stall { ms: 0, .. } => {
                    return Err("stall needs ms > 0".into());
                }
                Fault::HugeHeader { bytes } if bytes == 0 || bytes > MAX_PADDING => {
                    return Err(format!("huge_header bytes {bytes} is outside 1..={MAX_PADDING}"));
                }
                Fault::Status { code } if !scriptable(code) => {
                    return Err(format!("status {code} is not a 4xx or 5xx"));
                }
                _ => {}
            }
        }
        for refusal in &self.refusals {
            if refusal.at == 0 {
                return Err("refuse_at counts requests from 1".into());
            }
            if refusal.ms == 0 || refusal.ms > MAX_DELAY_MS {
                return Err(format!("refusal of {} ms is outside 1..={MAX_DELAY_MS}", refusal.ms));
            }
        }
        if let Some(capacity) = &self.capacity
            && capacity.per_second == 0
        {
            return Err("capacity needs at least 1 request a second".into());
        }
        for outage in &self.outages {
            if outage.ms == 0 || outage.ms > MAX_DELAY_MS || outage.at_ms > MAX_DELAY_MS {
                return Err(format!(
                    "outage at {} ms for {} ms is outside 1..={MAX_DELAY_MS} ms within an hour",
                    outage.at_ms, outage.ms
                ));
            }
            if let Some(code) = outage.status.filter(|c| !scriptable(*c)) {
                return Err(format!("outage status {code} is not a 4xx or 5xx"));
            }
        }
        for poison in &self.poisons {
            if poison.nth == 0 {
                return Err("poison counts keys from 1".into());
            }
            if !scriptable(poison.status) {
                return Err(format!("poison status {} is not a 4xx or 5xx", poison.status));
            }
        }
        if let Some(idle) = &self.idle_close {
            if !(0.0..=1.0).contains(&idle.p) || !(0.0..=1.0).contains(&idle.race) {
                return Err(format!(
                    "a share of `idle_close` ({}, race {}) is outside 0..=1",
                    idle.p, idle.race
                ));
            }
            if idle.min_ms > idle.max_ms || idle.max_ms > MAX_DELAY_MS {
                return Err(format!(
                    "idle_close min {} ms and max {} ms are not ordered within an hour",
                    idle.min_ms, idle.max_ms
                ));
            }
        }
        // A little slack for decimal shares such as 0.7 + 0.2 + 0.1.
        if sum > 1.0 + 1e-9 {
            return Err(format!("shares add up to {sum}, more than 1"));
        }
        Ok(())
    }

    /// Whether the script has a capacity or an outage, so that the cloud counts its load.
    pub fn counts_load(&self) -> bool {
        self.capacity.is_some() || !self.outages.is_empty()
    }

    /// Parses either JSON (text starting with `{`) or the compact form.
    pub fn parse_any(text: &str) -> Result<Self, String> {
        let faults: Faults = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("bad faults JSON: {e}"))?
        } else {
            text.parse()?
        };
        faults.validate()?;
        Ok(faults)
    }

    /// The uniform draw in `[0, 1)` for the `ordinal`-th request (from 0) on `stream`.
    pub fn draw(&self, stream: &str, ordinal: u64) -> f64 {
        let h = splitmix64(self.seed ^ splitmix64(fnv1a(stream.as_bytes()) ^ splitmix64(ordinal)));
        (h >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The fault, if any, for the `ordinal`-th request (from 0) on `stream`.
    pub fn pick(&self, stream: &str, ordinal: u64) -> Option<&Fault> {
        if self.rules.is_empty() {
            return None;
        }
        let u = self.draw(stream, ordinal);
        let mut acc = 0.0;
        for rule in &self.rules {
            acc += rule.p;
            if u < acc {
                return Some(&rule.fault);
            }
        }
        None
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Compact form: comma-separated entries.
///
/// - `seed=N`
/// - `scope=keyed+legacy+read` (any non-empty subset, `+`-separated)
/// - `refuse_at=N[:ms=M]`: a [`Refusal`] window of `M` ms (default 1000) at request `N`
/// - `idle_close=P[:min=A][:max=B][:race=R]`: [`IdleClose`] (`A` 0 and `B` 1000 ms, `R` 0 by
///   default)
/// - `capacity=N[:ra=S]`: a [`Capacity`] of `N` requests a second, its 503s with Retry-After `S`
///   (a [`RetryAfter`] spec or `spread`)
/// - `outage=A[:ms=M][:status=S]`: an [`Outage`] from `A` ms for `M` ms (default 1000),
///   answered `S` (a 4xx or 5xx) instead of 503 when given: `outage=0:ms=20000:status=401`
/// - `poison=N[:status=S]`: a [`Poison`]: the `N`-th distinct key (from 1) on `POST /readings`
///   is answered `S` (a 4xx or 5xx, default 422) on every request, never applied
/// - `NAME=SHARE[:OPT=VAL]...` with NAME one of `503`, `429`, `400`, `status`, `500`,
///   `drop_before_effect`, `drop_after_effect` (alias `drop`), `reset_after_effect` (alias
///   `reset`), `slow`, `stall`, `truncated_reply` (alias `truncated`), `garbage_status`,
///   `huge_header`, `bad_body`, `endless_body`; options: `ra=` ([`RetryAfter`] spec, for 503
///   and 429), `code=` (status: a 4xx or 5xx, default 422), `ms=` (slow, stall, endless_body), `before=true|false` (slow),
///   `then=reply|close` (stall), `form=not_json|wrong_type` (bad_body),
///   `form=bad_code|binary` (garbage_status), `bytes=` (huge_header), `effect=true|false`
///   (stall, garbage_status, bad_body, endless_body).
///
/// Example: `503=0.2,429=0.1:ra=2,drop_after_effect=0.05,seed=7`; an upstream whose credential
/// is refused for 20 s, with its third reading poisoned: `outage=0:ms=20000:status=401,poison=3`.
impl FromStr for Faults {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut faults = Faults::default();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let mut parts = entry.split(':');
            let head = parts.next().unwrap_or_default();
            let (name, value) = head.split_once('=').ok_or_else(|| format!("entry `{entry}` lacks `=`"))?;
            let opts: Vec<(&str, &str)> = parts
                .map(|o| o.split_once('=').ok_or_else(|| format!("option `{o}` lacks `=`")))
                .collect::<Result<_, _>>()?;
            match name {
                "seed" => {
                    faults.seed = value.parse().map_err(|_| format!("bad seed `{value}`"))?;
                    no_options(name, &opts)?;
                }
                "refuse_at" => {
                    let at =
                        value.parse().map_err(|_| format!("bad request number `{value}` for `refuse_at`"))?;
                    let mut refusal = Refusal { at, ms: one_second() };
                    for &(k, v) in &opts {
                        match k {
                            "ms" => refusal.ms = v.parse().map_err(|_| format!("bad ms `{v}`"))?,
                            _ => return Err(format!("`refuse_at` takes no option `{k}`")),
                        }
                    }
                    faults.refusals.push(refusal);
                }
                "idle_close" => {
                    let p = value.parse().map_err(|_| format!("bad share `{value}` for `idle_close`"))?;
                    let mut idle = IdleClose { p, min_ms: 0, max_ms: 1000, race: 0.0 };
                    for &(k, v) in &opts {
                        match k {
                            "min" => idle.min_ms = v.parse().map_err(|_| format!("bad ms `{v}`"))?,
                            "max" => idle.max_ms = v.parse().map_err(|_| format!("bad ms `{v}`"))?,
                            "race" => idle.race = v.parse().map_err(|_| format!("bad share `{v}`"))?,
                            _ => return Err(format!("`idle_close` takes no option `{k}`")),
                        }
                    }
                    faults.idle_close = Some(idle);
                }
                "capacity" => {
                    let per_second = value
                        .parse()
                        .map_err(|_| format!("bad requests a second `{value}` for `capacity`"))?;
                    let mut capacity = Capacity { per_second, retry_after: None };
                    for &(k, v) in &opts {
                        match k {
                            "ra" => capacity.retry_after = Some(v.parse()?),
                            _ => return Err(format!("`capacity` takes no option `{k}`")),
                        }
                    }
                    faults.capacity = Some(capacity);
                }
                "outage" => {
                    let at_ms = value.parse().map_err(|_| format!("bad start `{value}` for `outage`"))?;
                    let mut outage = Outage { at_ms, ms: one_second(), status: None };
                    for &(k, v) in &opts {
                        match k {
                            "ms" => outage.ms = v.parse().map_err(|_| format!("bad ms `{v}`"))?,
                            "status" => {
                                outage.status = Some(v.parse().map_err(|_| format!("bad status `{v}`"))?);
                            }
                            _ => return Err(format!("`outage` takes no option `{k}`")),
                        }
                    }
                    faults.outages.push(outage);
                }
                "poison" => {
                    let nth = value.parse().map_err(|_| format!("bad key number `{value}` for `poison`"))?;
                    let mut poison = Poison { nth, status: unprocessable() };
                    for &(k, v) in &opts {
                        match k {
                            "status" => poison.status = v.parse().map_err(|_| format!("bad status `{v}`"))?,
                            _ => return Err(format!("`poison` takes no option `{k}`")),
                        }
                    }
                    faults.poisons.push(poison);
                }
                "scope" => {
                    let mut scope = Scope { keyed: false, legacy: false, read: false };
                    for part in value.split('+') {
                        match part {
                            "keyed" => scope.keyed = true,
                            "legacy" => scope.legacy = true,
                            "read" => scope.read = true,
                            _ => return Err(format!("unknown scope `{part}`")),
                        }
                    }
                    faults.scope = scope;
                    no_options(name, &opts)?;
                }
                _ => {
                    let p: f64 = value.parse().map_err(|_| format!("bad share `{value}` for `{name}`"))?;
                    let fault = fault_from_compact(name, &opts)?;
                    faults.rules.push(Rule { p, fault });
                }
            }
        }
        faults.validate()?;
        Ok(faults)
    }
}

fn no_options(name: &str, opts: &[(&str, &str)]) -> Result<(), String> {
    match opts.first() {
        Some((k, _)) => Err(format!("`{name}` takes no option `{k}`")),
        None => Ok(()),
    }
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("bad boolean `{v}`")),
    }
}

fn fault_from_compact(name: &str, opts: &[(&str, &str)]) -> Result<Fault, String> {
    let mut fault = match name {
        "503" => Fault::Unavailable { retry_after: None },
        "429" => Fault::TooManyRequests { retry_after: None },
        "400" => Fault::BadRequest,
        "status" => Fault::Status { code: unprocessable() },
        "500" => Fault::ErrorAfterEffect,
        "drop_before_effect" => Fault::DropBeforeEffect,
        "drop_after_effect" | "drop" => Fault::DropAfterEffect,
        "reset_after_effect" | "reset" => Fault::ResetAfterEffect,
        "stall" => Fault::Stall { ms: ten_seconds(), effect: true, then: StallEnd::Reply },
        "truncated_reply" | "truncated" => Fault::TruncatedReply,
        "garbage_status" => Fault::GarbageStatus { form: GarbageForm::BadCode, effect: true },
        "huge_header" => Fault::HugeHeader { bytes: eight_kib() },
        "slow" => Fault::Slow { ms: 1000, before_effect: false },
        "bad_body" => Fault::BadBody { form: BadBodyForm::NotJson, effect: true },
        "endless_body" => Fault::EndlessBody { ms: 1000, effect: true },
        _ => return Err(format!("unknown fault `{name}`")),
    };
    for &(k, v) in opts {
        let unknown = || format!("`{name}` takes no option `{k}`");
        match (&mut fault, k) {
            (Fault::Unavailable { retry_after } | Fault::TooManyRequests { retry_after }, "ra") => {
                *retry_after = Some(v.parse()?)
            }
            (Fault::Status { code }, "code") => *code = v.parse().map_err(|_| format!("bad status `{v}`"))?,
            (Fault::Slow { ms, .. } | Fault::EndlessBody { ms, .. } | Fault::Stall { ms, .. }, "ms") => {
                *ms = v.parse().map_err(|_| format!("bad ms `{v}`"))?;
            }
            (Fault::Slow { before_effect, .. }, "before") => *before_effect = parse_bool(v)?,
            (Fault::Stall { then, .. }, "then") => {
                *then = match v {
                    "reply" => StallEnd::Reply,
                    "close" => StallEnd::Close,
                    _ => return Err(format!("unknown stall end `{v}`")),
                }
            }
            (Fault::GarbageStatus { form, .. }, "form") => {
                *form = match v {
                    "bad_code" => GarbageForm::BadCode,
                    "binary" => GarbageForm::Binary,
                    _ => return Err(format!("unknown garbage_status form `{v}`")),
                }
            }
            (Fault::HugeHeader { bytes }, "bytes") => {
                *bytes = v.parse().map_err(|_| format!("bad bytes `{v}`"))?;
            }
            (Fault::BadBody { form, .. }, "form") => {
                *form = match v {
                    "not_json" => BadBodyForm::NotJson,
                    "wrong_type" => BadBodyForm::WrongType,
                    _ => return Err(format!("unknown bad_body form `{v}`")),
                }
            }
            (
                Fault::BadBody { effect, .. }
                | Fault::EndlessBody { effect, .. }
                | Fault::Stall { effect, .. }
                | Fault::GarbageStatus { effect, .. },
                "effect",
            ) => {
                *effect = parse_bool(v)?;
            }
            _ => return Err(unknown()),
        }
    }
    Ok(fault)
}

impl fmt::Display for Faults {
    /// Writes the compact form; parsing it back gives an equal script.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed={}", self.seed)?;
        if self.scope != Scope::default() {
            let parts: Vec<&str> =
                [(self.scope.keyed, "keyed"), (self.scope.legacy, "legacy"), (self.scope.read, "read")]
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, n)| *n)
                    .collect();
            write!(f, ",scope={}", parts.join("+"))?;
        }
        for rule in &self.rules {
            write!(f, ",{}={}", rule.fault.name(), rule.p)?;
            match &rule.fault {
                Fault::Unavailable { retry_after: Some(ra) }
                | Fault::TooManyRequests { retry_after: Some(ra) } => write!(f, ":ra={ra}")?,
                Fault::Slow { ms, before_effect } => write!(f, ":ms={ms}:before={before_effect}")?,
                Fault::BadBody { form, effect } => {
                    let form = match form {
                        BadBodyForm::NotJson => "not_json",
                        BadBodyForm::WrongType => "wrong_type",
                    };
                    write!(f, ":form={form}:effect={effect}")?;
                }
                Fault::EndlessBody { ms, effect } => write!(f, ":ms={ms}:effect={effect}")?,
                Fault::Stall { ms, effect, then } => {
                    write!(f, ":ms={ms}:effect={effect}:then={}", then.as_str())?;
                }
                Fault::GarbageStatus { form, effect } => {
                    write!(f, ":form={}:effect={effect}", form.as_str())?;
                }
                Fault::HugeHeader { bytes } => write!(f, ":bytes={bytes}")?,
                Fault::Status { code } => write!(f, ":code={code}")?,
                _ => {}
            }
        }
        for refusal in &self.refusals {
            write!(f, ",refuse_at={}:ms={}", refusal.at, refusal.ms)?;
        }
        if let Some(capacity) = &self.capacity {
            write!(f, ",capacity={}", capacity.per_second)?;
            if let Some(ra) = capacity.retry_after {
                write!(f, ":ra={}", String::from(ra))?;
            }
        }
        for outage in &self.outages {
            write!(f, ",outage={}:ms={}", outage.at_ms, outage.ms)?;
            if let Some(status) = outage.status {
                write!(f, ":status={status}")?;
            }
        }
        for poison in &self.poisons {
            write!(f, ",poison={}:status={}", poison.nth, poison.status)?;
        }
        if let Some(idle) = &self.idle_close {
            write!(f, ",idle_close={}:min={}:max={}:race={}", idle.p, idle.min_ms, idle.max_ms, idle.race)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_example_parses() {
        let f: Faults = "503=0.2,429=0.1:ra=2,drop_after_effect=0.05,seed=7".parse().unwrap();
        assert_eq!(f.seed, 7);
        assert_eq!(f.rules.len(), 3);
        assert_eq!(f.rules[1].fault, Fault::TooManyRequests { retry_after: Some(RetryAfter::Seconds(2)) });
        assert_eq!(f.rules[2].fault, Fault::DropAfterEffect);
    }

    #[test]
    fn idle_close_draws_within_its_bounds_and_share() {
        let f: Faults = "seed=3,idle_close=0.5:min=20:max=80".parse().unwrap();
        let idle = f.idle_close.unwrap();
        let draws: Vec<Option<u64>> = (0..400).map(|reply| idle.after(&f, reply % 7, reply)).collect();
        let closes: Vec<u64> = draws.iter().flatten().copied().collect();
        assert!(closes.iter().all(|ms| (20..=80).contains(ms)), "{closes:?}");
        // About half the replies close, and the times spread over the range.
        assert!((140..=260).contains(&closes.len()), "{} of 400", closes.len());
        assert!(closes.iter().any(|ms| *ms < 35) && closes.iter().any(|ms| *ms > 65));
        // The same script gives the same draws.
        assert_eq!(draws, (0..400).map(|reply| idle.after(&f, reply % 7, reply)).collect::<Vec<_>>());
        for bad in ["idle_close=2", "idle_close=0.5:min=9:max=3", "idle_close=0.5:every=3"] {
            assert!(bad.parse::<Faults>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn compact_round_trips_through_display_and_json() {
        let text = "seed=9,scope=keyed+read,503=0.1:ra=date+3,429=0.1:ra=year,400=0.05,500=0.05,\
                    drop=0.05,drop_before_effect=0.05,slow=0.1:ms=20:before=true,\
                    bad_body=0.1:form=wrong_type:effect=false,endless_body=0.01:ms=5,\
                    429=0.01:ra=garbage,429=0.01:ra=garbage_date,429=0.01:ra=dup,503=0.01:ra=date-30,\
                    reset=0.05,stall=0.05:ms=20:effect=false:then=close,truncated=0.05,\
                    garbage_status=0.05:form=binary:effect=false,huge_header=0.05:bytes=100,\
                    refuse_at=3:ms=50,refuse_at=9,idle_close=0.5:min=20:max=80:race=0.25,\
                    status=0.01:code=401,status=0.01,outage=0:ms=20000:status=401,outage=30000:ms=5,\
                    poison=3,poison=5:status=400";
        let f: Faults = text.parse().unwrap();
        let again: Faults = f.to_string().parse().unwrap();
        assert_eq!(f, again);
        assert_eq!(f.idle_close, Some(IdleClose { p: 0.5, min_ms: 20, max_ms: 80, race: 0.25 }));
        let json = serde_json::to_string(&f).unwrap();
        let from_json = Faults::parse_any(&json).unwrap();
        assert_eq!(f, from_json);
        assert!(!f.scope.legacy);
        assert_eq!(f.refusals, vec![Refusal { at: 3, ms: 50 }, Refusal { at: 9, ms: 1000 }]);
        let names: Vec<&str> = f.rules.iter().map(|r| r.fault.name()).collect();
        for name in
            ["reset_after_effect", "stall", "truncated_reply", "garbage_status", "huge_header", "status"]
        {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        assert_eq!(f.outages.len(), 2);
        assert_eq!(f.poisons, vec![Poison { nth: 3, status: 422 }, Poison { nth: 5, status: 400 }]);
    }

    #[test]
    fn an_outage_may_answer_its_own_status_and_a_poison_names_a_key_by_its_order() {
        let f: Faults =
            "outage=0:ms=20000:status=401,outage=25000:ms=10,poison=2,poison=4:status=413".parse().unwrap();
        assert_eq!(
            f.outages,
            vec![
                Outage { at_ms: 0, ms: 20_000, status: Some(401) },
                Outage { at_ms: 25_000, ms: 10, status: None }
            ]
        );
        assert_eq!(f.poisons, vec![Poison { nth: 2, status: 422 }, Poison { nth: 4, status: 413 }]);
        // A poison alone is no load to count; an outage is.
        assert!(!"poison=1".parse::<Faults>().unwrap().counts_load());
        assert!(f.counts_load());
        // Both forms round-trip, and the JSON of an outage without a status is as before.
        assert_eq!(f, f.to_string().parse::<Faults>().unwrap());
        assert_eq!(f, Faults::parse_any(&serde_json::to_string(&f).unwrap()).unwrap());
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["outages"][0], serde_json::json!({"at_ms": 0, "ms": 20000, "status": 401}));
        assert_eq!(json["outages"][1], serde_json::json!({"at_ms": 25000, "ms": 10}));
        assert_eq!(json["poisons"][0], serde_json::json!({"nth": 2, "status": 422}));
        let from_json =
            Faults::parse_any(r#"{"poisons":[{"nth":7}],"rules":[{"kind":"status","p":0.5}]}"#).unwrap();
        assert_eq!(from_json.poisons, vec![Poison { nth: 7, status: 422 }]);
        assert_eq!(from_json.rules[0].fault, Fault::Status { code: 422 });
        let plain = serde_json::to_value("503=1".parse::<Faults>().unwrap()).unwrap();
        assert!(plain.get("poisons").is_none(), "{plain}");
        // A scripted answer is a client or a server error: a 2xx would say "landed" for nothing.
        for bad in [
            "outage=0:ms=10:status=200",
            "outage=0:ms=10:status=x",
            "outage=0:ms=10:status=600",
            "poison=0",
            "poison=x",
            "poison=1:status=201",
            "poison=1:status=99",
            "poison=1:ms=3",
            "status=0.1:code=302",
            "status=0.1:ra=3",
        ] {
            assert!(Faults::parse_any(bad).is_err(), "{bad} should be rejected");
        }
        assert!(Faults::parse_any(r#"{"poisons":[{"nth":1,"status":204}]}"#).is_err());
        assert!(Faults::parse_any(r#"{"outages":[{"at_ms":0,"ms":5,"status":100}]}"#).is_err());
    }

    #[test]
    fn new_faults_take_their_options_and_defaults() {
        let f: Faults =
            "stall=0.5,garbage_status=0.1,huge_header=0.1,reset=0.1,truncated=0.1".parse().unwrap();
        assert_eq!(f.rules[0].fault, Fault::Stall { ms: 10_000, effect: true, then: StallEnd::Reply });
        assert_eq!(f.rules[1].fault, Fault::GarbageStatus { form: GarbageForm::BadCode, effect: true });
        assert_eq!(f.rules[2].fault, Fault::HugeHeader { bytes: 8192 });
        assert_eq!(f.rules[3].fault, Fault::ResetAfterEffect);
        assert_eq!(f.rules[4].fault, Fault::TruncatedReply);
        let json = Faults::parse_any(
            r#"{"rules":[{"kind":"stall","p":1,"ms":5,"then":"close"}],"refusals":[{"at":2}]}"#,
        )
        .unwrap();
        assert_eq!(json.rules[0].fault, Fault::Stall { ms: 5, effect: true, then: StallEnd::Close });
        assert_eq!(json.refusals, vec![Refusal { at: 2, ms: 1000 }]);
        // A script without refusals serialises as before.
        let plain = serde_json::to_value("503=1".parse::<Faults>().unwrap()).unwrap();
        assert!(plain.get("refusals").is_none(), "{plain}");
    }

    #[test]
    fn capacity_and_outages_parse_round_trip_and_are_checked() {
        let f: Faults = "capacity=200:ra=spread,outage=0:ms=5000,outage=9000,seed=2".parse().unwrap();
        assert_eq!(
            f.capacity,
            Some(Capacity { per_second: 200, retry_after: Some(CapacityRetryAfter::Spread) })
        );
        assert_eq!(
            f.outages,
            vec![Outage { at_ms: 0, ms: 5000, status: None }, Outage { at_ms: 9000, ms: 1000, status: None }]
        );
        assert!(f.counts_load());
        assert_eq!(f, f.to_string().parse::<Faults>().unwrap());
        assert_eq!(f, Faults::parse_any(&serde_json::to_string(&f).unwrap()).unwrap());
        let json = Faults::parse_any(
            r#"{"capacity":{"per_second":50,"retry_after":3},"outages":[{"at_ms":10,"ms":20}]}"#,
        )
        .unwrap();
        let fixed = Some(CapacityRetryAfter::Fixed(RetryAfter::Seconds(3)));
        assert_eq!(json.capacity, Some(Capacity { per_second: 50, retry_after: fixed }));
        assert!(json.outages[0].covers(10) && json.outages[0].covers(29));
        assert!(!json.outages[0].covers(9) && !json.outages[0].covers(30));
        // Scripts without them serialise as before and count no load.
        let plain = serde_json::to_value("503=1".parse::<Faults>().unwrap()).unwrap();
        assert!(plain.get("capacity").is_none() && plain.get("outages").is_none(), "{plain}");
        assert!(!"503=1".parse::<Faults>().unwrap().counts_load());
        for bad in [
            "capacity=0",
            "capacity=x",
            "capacity=5:ra=soon",
            "capacity=5:ms=3",
            "outage=0:ms=0",
            "outage=0:ms=3600001",
            "outage=soon",
            "outage=0:ra=1",
        ] {
            assert!(Faults::parse_any(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn garbage_is_never_an_http_status_line() {
        let code = GarbageForm::BadCode.bytes();
        assert!(code.starts_with(b"HTTP/1.1 2x0 "));
        let noise = GarbageForm::Binary.bytes();
        assert_eq!(noise.len(), 64);
        assert!(!noise.starts_with(b"H"));
        assert!(noise.iter().any(|b| !b.is_ascii()), "noise has high bytes");
        assert_eq!(noise, GarbageForm::Binary.bytes(), "the same noise every time");
    }

    #[test]
    fn json_takes_numeric_retry_after_and_defaults() {
        let f = Faults::parse_any(
            r#"{"seed":1,"rules":[{"kind":"429","p":0.5,"retry_after":2},{"kind":"bad_body","p":0.5}]}"#,
        )
        .unwrap();
        assert_eq!(f.rules[0].fault, Fault::TooManyRequests { retry_after: Some(RetryAfter::Seconds(2)) });
        assert_eq!(f.rules[1].fault, Fault::BadBody { form: BadBodyForm::NotJson, effect: true });
        assert_eq!(f.scope, Scope::default());
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "503=1.5",
            "503=0.6,429=0.6",
            "nope=0.1",
            "503=0.1:ms=3",
            "seed=x",
            "429=0.1:ra=soon",
            "scope=all",
            "endless_body=0.1:ms=0",
            "503",
            "stall=0.1:ms=0",
            "stall=0.1:ms=3600001",
            "stall=0.1:then=later",
            "huge_header=0.1:bytes=0",
            "huge_header=0.1:bytes=1048577",
            "garbage_status=0.1:form=utf8",
            "reset=0.1:ms=5",
            "truncated=0.1:effect=false",
            "refuse_at=0",
            "refuse_at=2:ms=0",
            "refuse_at=2:p=1",
            "refuse_at=soon",
        ] {
            assert!(Faults::parse_any(bad).is_err(), "{bad} should be rejected");
        }
        assert!(Faults::parse_any(r#"{"seed":1,"rulez":[]}"#).is_err());
    }

    #[test]
    fn pick_follows_shares() {
        let f: Faults = "503=0.25,429=0.25,seed=3".parse().unwrap();
        let mut counts = [0u32; 3];
        for n in 0..10_000 {
            match f.pick("legacy", n) {
                Some(Fault::Unavailable { .. }) => counts[0] += 1,
                Some(Fault::TooManyRequests { .. }) => counts[1] += 1,
                None => counts[2] += 1,
                Some(other) => panic!("unexpected {other:?}"),
            }
        }
        assert!((2200..2800).contains(&counts[0]), "{counts:?}");
        assert!((2200..2800).contains(&counts[1]), "{counts:?}");
        assert!((4700..5300).contains(&counts[2]), "{counts:?}");
        // Same inputs, same choice; another seed, another sequence.
        let g: Faults = "503=0.25,429=0.25,seed=4".parse().unwrap();
        let seq = |f: &Faults| -> Vec<Option<&'static str>> {
            (0..64).map(|n| f.pick("k:a", n).map(Fault::name)).collect()
        };
        assert_eq!(seq(&f), seq(&f.clone()));
        assert_ne!(seq(&f), seq(&g));
    }
}
