//! Classification: what one attempt's outcome means for the operation that made it.
//!
//! A retry is a second copy of a request, so the question is what the first copy may already
//! have done. A failure refused before the server did anything (a 429, a refused connection, a
//! connect timeout) is safe to resend for any operation. A failure after which the work may have
//! landed (a 5xx, a response timeout, a reset) is safe to resend only for a read or a write that
//! carries an idempotency key; for a write without one it is [`Class::Unknown`] and is never
//! resent. Anything that will fail the same way every time (another 4xx, a TLS error, a bad body)
//! fails at once.
//!
//! Tables are data: an API whose own 503 means "not processed" can move 503 to
//! [`Rule::RetryAny`], and one that answers 409 while the same key is in flight can add it. A
//! table is a lookup (two bits per 4xx and 5xx status), not a scan.
//!
//! ```
//! use wary::{Class, Failure, Operation, Rule, Table};
//! let t = Table::DEFAULT;
//! assert_eq!(t.classify(Operation::Idempotent, &Failure::status(503).into()), Class::Retry);
//! assert_eq!(t.classify(Operation::Write, &Failure::status(503).into()), Class::Unknown);
//! assert_eq!(t.classify(Operation::Idempotent, &Failure::status(400).into()), Class::Failed);
//! let api = t.with_status(503, Rule::RetryAny).unwrap();
//! assert_eq!(api.classify(Operation::Write, &Failure::status(503).into()), Class::Retry);
//! ```

use crate::error::TableError;
use crate::fingerprint::Fnv;
use crate::names::named_enum;
use crate::retry_after::{Reading, Rules};
use crate::time::Duration;

/// What a call does, which decides what a resend may do twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Operation {
    /// Safe to repeat: a read (GET, HEAD), and under a table that allows it the idempotent
    /// methods (OPTIONS, TRACE, PUT, DELETE). Its name in plans, ledgers and configuration
    /// stays `read`, so no line format and no fingerprint changed with the variant's name.
    #[cfg_attr(feature = "serde", serde(rename = "read"))]
    Idempotent,
    /// A write carrying an idempotency key, made once before the first attempt and sent on every
    /// attempt, so the server recognises a replay.
    KeyedWrite,
    /// A write with no key: a resend may do the work twice.
    Write,
}

impl Operation {
    /// Every operation, in a fixed order.
    pub const ALL: [Operation; 3] = [Operation::Idempotent, Operation::KeyedWrite, Operation::Write];

    /// The old name of [`Operation::Idempotent`], which covers PUT and DELETE as well as reads.
    #[deprecated(note = "renamed `Operation::Idempotent`: it covers PUT and DELETE, not reads only")]
    #[allow(non_upper_case_globals)]
    pub const Read: Operation = Operation::Idempotent;

    /// The operation of an HTTP method under the strictest table ([`Table::STRICT`]): only GET
    /// and HEAD are idempotent; any other method is a keyed write when `keyed`, else a write.
    /// Method names are matched case-sensitively, as RFC 9110 defines them.
    ///
    /// A free constructor cannot know the table the operation will be classified under, so it
    /// takes the one that retries least: an operation built here is never retried where the
    /// policy's own table would not retry it. Ask the policy instead
    /// ([`Policy::operation`](crate::Policy::operation) or [`Table::operation`]), which counts
    /// PUT, DELETE, OPTIONS and TRACE as idempotent under tables that allow it.
    #[deprecated(note = "ask the policy: `policy.operation(method, keyed)` follows its table")]
    pub fn from_method(method: &str, keyed: bool) -> Self {
        Table::STRICT.operation(method, keyed)
    }

    /// The name used by `wary plan` and the ledgers.
    pub const fn name(&self) -> &'static str {
        match self {
            Operation::Idempotent => "read",
            Operation::KeyedWrite => "keyed_write",
            Operation::Write => "write",
        }
    }

    /// Parses [`Operation::name`] back.
    pub fn from_name(name: &str) -> Option<Self> {
        Operation::ALL.into_iter().find(|o| o.name() == name)
    }

    /// True if a resend cannot do the work twice.
    pub const fn is_idempotent(&self) -> bool {
        matches!(self, Operation::Idempotent | Operation::KeyedWrite)
    }
}

/// How one attempt failed: what an attempt returns in its `Err`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Failure {
    /// The server answered with a status that is not a success for this call.
    Status {
        /// The HTTP status code.
        code: u16,
        /// The wait the server asked for (Retry-After, already read under the policy's rules);
        /// `None` if absent or refused. Longer than 49 days saturates at [`Duration::MAX`].
        retry_after: Option<Duration>,
        /// Retry-After values the response carried that could not be read at all, and so were
        /// ignored (saturating at 255): kept so the ledger shows a server sending garbage.
        unreadable: u8,
    },
    /// The connection was not established in time: the request was never sent.
    ConnectTimeout,
    /// No response in time after the request was sent: it may have landed.
    ResponseTimeout,
    /// The connection was refused: the request was never sent.
    Refused,
    /// The connection was reset after the request may have been sent.
    Reset,
    /// A TLS or certificate error: fails the same way every time.
    Tls,
    /// A success status with a malformed body, wrong content type or schema failure: repeating
    /// bad data is not a repair, the same request gets the same bad answer.
    BadBody,
    /// A stream broke.
    StreamBroken {
        /// True if bytes were already forwarded to the user: a retry would start the text again,
        /// so such a stream is never retried.
        forwarded: bool,
    },
    /// The attempt was cancelled by the caller.
    Cancelled,
}

impl Failure {
    /// A status with no Retry-After.
    pub const fn status(code: u16) -> Self {
        Failure::Status { code, retry_after: None, unreadable: 0 }
    }

    /// A status with the wait its Retry-After asked for.
    pub const fn status_after(code: u16, retry_after: Duration) -> Self {
        Failure::Status { code, retry_after: Some(retry_after), unreadable: 0 }
    }

    /// Retry-After values of a failed status that could not be read at all (0 for any other
    /// failure).
    pub const fn unreadable_retry_after(&self) -> u8 {
        match self {
            Failure::Status { unreadable, .. } => *unreadable,
            _ => 0,
        }
    }

    /// The Retry-After carried by this failure.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status, if the failure is one.
    pub const fn code(&self) -> Option<u16> {
        match self {
            Failure::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The failure's slot in a table's transport rules: its [`Transport`], in declaration
    /// order, or the slot that never retries (a stream broken after forwarding, since bytes
    /// already reached the user and a retry would start the text again; a cancel; a status,
    /// which has rules of its own).
    #[inline]
    const fn slot(&self) -> u32 {
        let kind = match self {
            Failure::ConnectTimeout => Transport::ConnectTimeout as u32,
            Failure::ResponseTimeout => Transport::ResponseTimeout as u32,
            Failure::Refused => Transport::Refused as u32,
            Failure::Reset => Transport::Reset as u32,
            Failure::Tls => Transport::Tls as u32,
            Failure::BadBody => Transport::BadBody as u32,
            Failure::StreamBroken { .. } => Transport::StreamBefore as u32,
            Failure::Status { .. } | Failure::Cancelled => NEVER,
        };
        // The slot after the stream's own (the one that never retries) is a stream that broke
        // after forwarding: added apart, so the match above stays a lookup of constants.
        kind.wrapping_add(matches!(self, Failure::StreamBroken { forwarded: true }) as u32)
    }

    /// A short stable name for the failure's kind (`status` for any status).
    pub const fn name(&self) -> &'static str {
        match self {
            Failure::Status { .. } => "status",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::ResponseTimeout => "response_timeout",
            Failure::Refused => "refused",
            Failure::Reset => "reset",
            Failure::Tls => "tls",
            Failure::BadBody => "bad_body",
            Failure::StreamBroken { forwarded: false } => "stream_broken_before",
            Failure::StreamBroken { forwarded: true } => "stream_broken_after",
            Failure::Cancelled => "cancelled",
        }
    }

    /// Parses [`Failure::name`] back, for every kind but `status`, which needs its code.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "connect_timeout" => Failure::ConnectTimeout,
            "response_timeout" | "timeout" => Failure::ResponseTimeout,
            "refused" => Failure::Refused,
            "reset" => Failure::Reset,
            "tls" => Failure::Tls,
            "bad_body" => Failure::BadBody,
            "stream_broken_before" => Failure::StreamBroken { forwarded: false },
            "stream_broken_after" => Failure::StreamBroken { forwarded: true },
            "cancelled" => Failure::Cancelled,
            _ => return None,
        })
    }
}

/// What one attempt returned: success, or how it failed. The decision and the ledger take
/// this; an attempt itself returns `Result<T, Failure>`, so a failure can never say "ok".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Outcome {
    /// The attempt succeeded.
    Ok,
    /// The attempt failed.
    Failure(Failure),
}

impl From<Failure> for Outcome {
    fn from(f: Failure) -> Outcome {
        Outcome::Failure(f)
    }
}

impl<T> From<&Result<T, Failure>> for Outcome {
    fn from(r: &Result<T, Failure>) -> Outcome {
        match r {
            Ok(_) => Outcome::Ok,
            Err(f) => Outcome::Failure(*f),
        }
    }
}

impl Outcome {
    /// A failed status with no Retry-After.
    pub const fn status(code: u16) -> Self {
        Outcome::Failure(Failure::status(code))
    }

    /// A failed status with the wait its Retry-After asked for.
    pub const fn status_after(code: u16, retry_after: Duration) -> Self {
        Outcome::Failure(Failure::status_after(code, retry_after))
    }

    /// The outcome of an HTTP response, the one way every transport turns a response into an
    /// outcome: a 2xx is [`Outcome::Ok`] whatever its body, anything else a
    /// [`Failure::Status`] with its `Retry-After` values read under `rules` (`date` is the
    /// response's `Date` header, `now` the caller's wall clock in Unix seconds, if it has one).
    /// The failure counts the Retry-After values that could not be read at all (so the ledger
    /// shows them), and the [`Reading`] gives the whole reading, for metrics.
    ///
    /// ```
    /// use wary::{Duration, Failure, Outcome, retry_after::Rules};
    /// let (o, _) = Outcome::from_response(204, [], None, None, &Rules::LENIENT);
    /// assert_eq!(o, Outcome::Ok);
    /// let (o, r) = Outcome::from_response(429, [b"1.5".as_slice(), b"soon"], None, None, &Rules::LENIENT);
    /// // 1.5 s is at least 1.5 s: wait 2, never 1. "soon" is ignored, and counted.
    /// assert_eq!(o.retry_after(), Some(Duration::from_secs(2)));
    /// assert_eq!((o.failure().map(Failure::unreadable_retry_after), r.unreadable), (Some(1), 1));
    /// ```
    pub fn from_response<'a, I>(
        status: u16,
        retry_after: I,
        date: Option<&[u8]>,
        now: Option<u64>,
        rules: &Rules,
    ) -> (Outcome, Reading)
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        if (200..300).contains(&status) {
            return (Outcome::Ok, Reading::default());
        }
        let reading = rules.read_counted(retry_after, date, now);
        let wait = reading.seconds.map(Duration::from_secs);
        let unreadable = u8::try_from(reading.unreadable).unwrap_or(u8::MAX);
        (Outcome::Failure(Failure::Status { code: status, retry_after: wait, unreadable }), reading)
    }

    /// The failure, if the attempt failed.
    pub const fn failure(&self) -> Option<&Failure> {
        match self {
            Outcome::Ok => None,
            Outcome::Failure(f) => Some(f),
        }
    }

    /// `Ok(())` or `Err(failure)`.
    pub const fn into_result(self) -> Result<(), Failure> {
        match self {
            Outcome::Ok => Ok(()),
            Outcome::Failure(f) => Err(f),
        }
    }

    /// The Retry-After carried by a failed status.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Ok => None,
            Outcome::Failure(f) => f.retry_after(),
        }
    }

    /// The HTTP status of a failed status.
    pub const fn code(&self) -> Option<u16> {
        match self {
            Outcome::Ok => None,
            Outcome::Failure(f) => f.code(),
        }
    }

    /// `ok`, or the failure's [`Failure::name`].
    pub const fn name(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failure(f) => f.name(),
        }
    }
}

named_enum! {
    /// What a table says about one kind of failure.
    #[repr(u8)]
    pub enum Rule {
        /// Refused before the server did anything: safe to resend for any operation.
        RetryAny = 0 => "retry_any",
        /// The work may have landed: resend a read or a keyed write; a write becomes
        /// [`Class::Unknown`] and is never resent.
        RetryIdempotent = 1 => "retry_idempotent",
        /// Will fail the same way every time: fail at once, with no wait.
        Fail = 2 => "fail",
    }
}

impl Rule {
    const fn from_bits(bits: u8) -> Rule {
        match bits & 3 {
            0 => Rule::RetryAny,
            1 => Rule::RetryIdempotent,
            _ => Rule::Fail,
        }
    }
}

named_enum! {
    /// The class of one attempt's outcome for one operation.
    pub enum Class {
        /// Success.
        Ok => "ok",
        /// Safe to send again, if the stop rules allow.
        Retry => "retry",
        /// May have landed and cannot be resent safely.
        Unknown => "unknown",
        /// Fails at once.
        Failed => "failed",
        /// Cancelled by the caller.
        Cancelled => "cancelled",
    }
}

named_enum! {
    /// Whose fault a failure is that ends a call `failed`: what an outbox does with the reading.
    /// Either way the call fails at once; the blame decides only what happens next.
    pub enum Blame {
        /// This request can never succeed as it is (a 400, a 413, a 422): the reading goes to a
        /// dead letter, counted and reported, and the others go on.
        Reading => "reading",
        /// Who is asking, where, or through what (a 401, a 404, a 5xx, a TLS refusal): nothing
        /// about the reading. Every reading is kept and the outbox is held, probing slowly,
        /// until the endpoint is fixed: a rotated credential must not delete a fleet's data.
        Endpoint => "endpoint",
    }
}

named_enum! {
    /// The failures other than a status that a table has a rule for.
    pub enum Transport {
        /// [`Failure::ConnectTimeout`].
        ConnectTimeout => "connect_timeout",
        /// [`Failure::ResponseTimeout`].
        ResponseTimeout => "response_timeout",
        /// [`Failure::Refused`].
        Refused => "refused",
        /// [`Failure::Reset`].
        Reset => "reset",
        /// [`Failure::Tls`].
        Tls => "tls",
        /// [`Failure::BadBody`].
        BadBody => "bad_body",
        /// [`Failure::StreamBroken`] before anything was forwarded.
        StreamBefore => "stream_broken_before",
    }
}

/// The first status with an exact rule.
const FIRST: u16 = 400;
/// How many statuses have an exact rule: 400..=599.
const SPAN: u16 = 200;

/// A classification table: data, so an API's own semantics can be written down.
///
/// Every 4xx and 5xx status has its own rule, two bits each, looked up in one step; a status set
/// with [`Table::with_status`] is an exact rule, and the others follow the table's rule for
/// client errors (4xx) or server errors (5xx). Any other status follows the rule for other
/// statuses.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Table {
    /// Two bits per status 400..=599: its [`Rule`].
    rules: [u8; (SPAN / 4) as usize],
    /// One bit per status 400..=599: set where the rule is exact.
    exact: [u8; (SPAN / 8) as usize],
    client_error: Rule,
    server_error: Rule,
    other_status: Rule,
    /// Two bits per [`Transport`], in [`Transport::ALL`]'s order, then [`Rule::Fail`] for the
    /// failures no table retries (a stream broken after forwarding): a failure's rule is one
    /// shift, whatever its kind.
    transport: u16,
    reads_only: bool,
    /// One bit per status 400..=599: set where a failure is the endpoint's ([`Blame`]).
    endpoint: [u8; (SPAN / 8) as usize],
    /// One bit per slot of [`Table::transport`] (0..=7), then bit 8 for every status outside
    /// 400..=599: set where a failure is the endpoint's.
    endpoint_elsewhere: u16,
}

/// The slot in [`Table::transport`] of the failures no table retries.
const NEVER: u32 = 7;
/// The bit of [`Table::endpoint_elsewhere`] for statuses outside 400..=599.
const OTHER_STATUS_BIT: u32 = 8;

/// The 4xx statuses that say who is asking, where or through what, not what was sent: every
/// table blames the endpoint for them (docs/semantics.md, *Whose fault*). Unauthorized,
/// forbidden, not found, method not allowed, not acceptable, proxy authentication, gone,
/// length required, URI too long, misdirected, upgrade required, precondition required, header
/// fields too large.
// 424 is not among them: a wary gateway answers it when the upstream refused the reading as
// it is (a 400 or 422 there), and holds the device (503) when the upstream refused the gateway.
const ENDPOINT_4XX: [u16; 13] = [401, 403, 404, 405, 406, 407, 410, 411, 414, 421, 426, 428, 431];

impl core::fmt::Debug for Table {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut d = f.debug_struct("Table");
        d.field("exact", &ExactList(self));
        d.field("client_error", &self.client_error).field("server_error", &self.server_error);
        d.field("other_status", &self.other_status);
        for t in Transport::ALL {
            d.field(t.name(), &self.transport_rule(t));
        }
        d.field("reads_only", &self.reads_only).finish()
    }
}

struct ExactList<'a>(&'a Table);

impl core::fmt::Debug for ExactList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map().entries(self.0.exact_rules()).finish()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Table {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "Table {{ exact: [");
        for (code, rule) in self.exact_rules() {
            defmt::write!(f, "{=u16}: {}, ", code, rule);
        }
        defmt::write!(
            f,
            "], client_error: {}, server_error: {}, other_status: {}, reads_only: {=bool} }}",
            self.client_error,
            self.server_error,
            self.other_status,
            self.reads_only
        );
    }
}

// The bit-table helpers index arrays whose length the status range fixes: every index is
// `(code − 400) / 4` or `/ 8` for a code already checked to lie in 400..=599.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
impl Table {
    /// A table whose every 4xx and 5xx follows `client_error` and `server_error`, with the given
    /// rules for everything else and no exact rule.
    const fn uniform(client_error: Rule, server_error: Rule, other_status: Rule, reads_only: bool) -> Table {
        let mut t = Table {
            rules: [0; (SPAN / 4) as usize],
            exact: [0; (SPAN / 8) as usize],
            client_error,
            server_error,
            other_status,
            transport: 0,
            reads_only,
            endpoint: [0; (SPAN / 8) as usize],
            // Every failure that is not a status (TLS, a reply that cannot be read, a broken
            // stream) and every status outside 4xx and 5xx (a redirect) is about the endpoint.
            endpoint_elsewhere: 0x1FF,
        };
        t = t
            .with_transport(Transport::ConnectTimeout, Rule::RetryAny)
            .with_transport(Transport::ResponseTimeout, Rule::RetryIdempotent)
            .with_transport(Transport::Refused, Rule::RetryAny)
            .with_transport(Transport::Reset, Rule::RetryIdempotent)
            .with_transport(Transport::Tls, Rule::Fail)
            .with_transport(Transport::BadBody, Rule::Fail)
            .with_transport(Transport::StreamBefore, Rule::RetryIdempotent);
        t.transport |= (Rule::Fail as u16) << (2 * NEVER);
        let mut i = 0;
        while i < SPAN {
            t.put(i, if i < 100 { client_error } else { server_error });
            // A 5xx is the server's side, never the reading's.
            t.set_blame(i, if i < 100 { Blame::Reading } else { Blame::Endpoint });
            i += 1;
        }
        let mut e = 0;
        while e < ENDPOINT_4XX.len() {
            t.set_blame(ENDPOINT_4XX[e] - FIRST, Blame::Endpoint);
            e += 1;
        }
        t
    }

    /// Stores `blame` for status `FIRST + i`, `i < SPAN`.
    const fn set_blame(&mut self, i: u16, blame: Blame) {
        let (byte, bit) = ((i / 8) as usize, i % 8);
        self.endpoint[byte] = match blame {
            Blame::Endpoint => self.endpoint[byte] | (1 << bit),
            Blame::Reading => self.endpoint[byte] & !(1 << bit),
        };
    }

    /// Stores `rule` for status `FIRST + i`, `i < SPAN`.
    const fn put(&mut self, i: u16, rule: Rule) {
        let (byte, shift) = ((i / 4) as usize, (i % 4) * 2);
        self.rules[byte] = (self.rules[byte] & !(3 << shift)) | ((rule as u8) << shift);
    }

    /// Whether status `FIRST + i` has an exact rule, `i < SPAN`.
    const fn is_exact(&self, i: u16) -> bool {
        self.exact[(i / 8) as usize] & (1 << (i % 8)) != 0
    }

    /// [`Table::with_status`] for a status known to be in range, for the `const` tables.
    const fn exact_rule(mut self, code: u16, rule: Rule) -> Table {
        let i = code - FIRST;
        self.put(i, rule);
        self.exact[(i / 8) as usize] |= 1 << (i % 8);
        self
    }

    /// Re-applies `rule` to every status of `FIRST + from .. FIRST + to` without an exact rule.
    const fn fill(mut self, from: u16, to: u16, rule: Rule) -> Table {
        let mut i = from;
        while i < to {
            if !self.is_exact(i) {
                self.put(i, rule);
            }
            i += 1;
        }
        self
    }
}

impl Table {
    /// wary's default table: 408, 429 and connect failures retry for any operation;
    /// 500, 502, 503, 504, response timeouts, resets and streams broken before forwarding retry
    /// if idempotent; other 4xx and 5xx, TLS errors and bad bodies fail at once.
    pub const DEFAULT: Table = Table::uniform(Rule::Fail, Rule::Fail, Rule::Fail, false)
        .exact_rule(408, Rule::RetryAny)
        .exact_rule(429, Rule::RetryAny)
        .exact_rule(500, Rule::RetryIdempotent)
        .exact_rule(502, Rule::RetryIdempotent)
        .exact_rule(503, Rule::RetryIdempotent)
        .exact_rule(504, Rule::RetryIdempotent);

    /// The basic table: 429 for any operation; a timeout and every 5xx if idempotent, else
    /// unknown; every other status fails.
    pub const BASIC: Table =
        Table::uniform(Rule::Fail, Rule::RetryIdempotent, Rule::Fail, false).exact_rule(429, Rule::RetryAny);

    /// The strict table: only reads (GET, HEAD) are retried, on transport errors, timeouts,
    /// 429, 502, 503 and 504. A write is never resent: what may have landed is unknown, what was
    /// refused fails.
    pub const STRICT: Table = Table::uniform(Rule::Fail, Rule::Fail, Rule::Fail, true)
        .exact_rule(429, Rule::RetryAny)
        .exact_rule(502, Rule::RetryIdempotent)
        .exact_rule(503, Rule::RetryIdempotent)
        .exact_rule(504, Rule::RetryIdempotent);

    /// A table with no exact rule: every 4xx follows `client_errors`, every 5xx `server_errors`
    /// and any other status `other_statuses`; failures other than a status follow
    /// [`Table::DEFAULT`]'s rules, and every operation is retried as its rule allows.
    pub const fn new(client_errors: Rule, server_errors: Rule, other_statuses: Rule) -> Table {
        Table::uniform(client_errors, server_errors, other_statuses, false)
    }

    /// This table with `rule` for `code`, an exact rule that replaces any earlier one. Exact
    /// rules are for 4xx and 5xx statuses; any other status follows
    /// [`Table::with_other_statuses`].
    pub const fn with_status(self, code: u16, rule: Rule) -> Result<Table, TableError> {
        if code < FIRST || code >= FIRST + SPAN {
            return Err(TableError::BadStatus);
        }
        Ok(self.exact_rule(code, rule))
    }

    /// This table with `rule` for a failure other than a status.
    pub const fn with_transport(mut self, kind: Transport, rule: Rule) -> Table {
        // Seven kinds of two bits each: every shift is below 14.
        let shift = (kind as u32).wrapping_mul(2);
        self.transport = (self.transport & !(3u16 << shift)) | ((rule as u16) << shift);
        self
    }

    /// This table with `rule` for the 4xx statuses that have no exact rule.
    pub const fn with_client_errors(mut self, rule: Rule) -> Table {
        self.client_error = rule;
        self.fill(0, 100, rule)
    }

    /// This table with `rule` for the 5xx statuses that have no exact rule.
    pub const fn with_server_errors(mut self, rule: Rule) -> Table {
        self.server_error = rule;
        self.fill(100, SPAN, rule)
    }

    /// This table with `rule` for every status outside 4xx and 5xx (a 3xx, a 1xx).
    pub const fn with_other_statuses(mut self, rule: Rule) -> Table {
        self.other_status = rule;
        self
    }

    /// This table, retrying reads only (a keyed write is treated like a write).
    pub const fn reads_only(mut self, yes: bool) -> Table {
        self.reads_only = yes;
        self
    }

    /// This table with `blame` for status `code` (4xx and 5xx only; every other status follows
    /// [`Table::with_other_blame`]). The blame never changes a call's decision, only what an
    /// outbox does with a reading whose call failed.
    pub const fn with_blame(mut self, code: u16, blame: Blame) -> Result<Table, TableError> {
        if code < FIRST || code >= FIRST + SPAN {
            return Err(TableError::BadStatus);
        }
        // In range: the index is below SPAN.
        self.set_blame(code.wrapping_sub(FIRST), blame);
        Ok(self)
    }

    /// This table with `blame` for a failure other than a status.
    pub const fn with_transport_blame(self, kind: Transport, blame: Blame) -> Table {
        self.with_elsewhere_bit(kind as u32, blame)
    }

    /// This table with `blame` for every status outside 4xx and 5xx.
    pub const fn with_other_blame(self, blame: Blame) -> Table {
        self.with_elsewhere_bit(OTHER_STATUS_BIT, blame)
    }

    const fn with_elsewhere_bit(mut self, bit: u32, blame: Blame) -> Table {
        // Bits 0..=8 of a u16.
        let mask = 1u16.wrapping_shl(bit);
        self.endpoint_elsewhere = match blame {
            Blame::Endpoint => self.endpoint_elsewhere | mask,
            Blame::Reading => self.endpoint_elsewhere & !mask,
        };
        self
    }

    /// Whose fault `failure` is, should it end a call `failed` ([`Blame`]).
    pub fn blame(&self, failure: &Failure) -> Blame {
        let endpoint = match failure {
            Failure::Status { code, .. } => {
                let i = u32::from(*code).wrapping_sub(u32::from(FIRST));
                match self.endpoint.get((i / 8) as usize) {
                    Some(byte) => u32::from(*byte).wrapping_shr(i & 7) & 1 != 0,
                    None => u32::from(self.endpoint_elsewhere).wrapping_shr(OTHER_STATUS_BIT) & 1 != 0,
                }
            }
            f => u32::from(self.endpoint_elsewhere).wrapping_shr(f.slot()) & 1 != 0,
        };
        if endpoint { Blame::Endpoint } else { Blame::Reading }
    }

    /// The rule for 4xx statuses with no exact rule.
    pub const fn client_errors(&self) -> Rule {
        self.client_error
    }

    /// The rule for 5xx statuses with no exact rule.
    pub const fn server_errors(&self) -> Rule {
        self.server_error
    }

    /// The rule for statuses outside 4xx and 5xx.
    pub const fn other_statuses(&self) -> Rule {
        self.other_status
    }

    /// True if this table retries reads only.
    pub const fn is_reads_only(&self) -> bool {
        self.reads_only
    }

    /// The exact status rules, by ascending status.
    pub fn exact_rules(&self) -> impl Iterator<Item = (u16, Rule)> + '_ {
        (0..SPAN)
            .filter(|i| self.is_exact(*i))
            .map(|i| (FIRST.saturating_add(i), self.status_rule(FIRST.saturating_add(i))))
    }

    /// The rule for a failure other than a status.
    pub const fn transport_rule(&self, kind: Transport) -> Rule {
        self.slot_rule(kind as u32)
    }

    /// The rule in slot `slot` (0..=7) of [`Table::transport`].
    #[inline]
    const fn slot_rule(&self, slot: u32) -> Rule {
        Rule::from_bits(self.slot_bits(slot) as u8)
    }

    /// The two bits of [`Table::slot_rule`].
    #[inline]
    const fn slot_bits(&self, slot: u32) -> u32 {
        self.transport.wrapping_shr(slot.wrapping_mul(2)) as u32 & 3
    }

    /// Feeds every rule to a fingerprint, in a fixed order: the exact status rules by ascending
    /// status (status, rule), a 0, then the class rules and the transport rules in
    /// [`Transport::ALL`]'s order. `const`, so a policy's fingerprint is worked out when it is
    /// built.
    pub(crate) const fn fingerprint_into(&self, h: &mut Fnv) {
        // One byte of `exact` holds eight statuses, whose rules are two bytes of `rules`.
        let (mut exact, mut rules): (&[u8], &[u8]) = (&self.exact, &self.rules);
        let mut code = FIRST;
        while let ([e, exact_rest @ ..], [r0, r1, rules_rest @ ..]) = (exact, rules) {
            let two = *r0 as u32 | (*r1 as u32).wrapping_shl(8);
            let mut bit = 0u32;
            while bit < 8 {
                if (*e as u32).wrapping_shr(bit) & 1 != 0 {
                    h.u16(code.wrapping_add(bit as u16));
                    h.u8(Rule::from_bits(two.wrapping_shr(bit.wrapping_mul(2)) as u8) as u8);
                }
                bit = bit.wrapping_add(1);
            }
            code = code.wrapping_add(8);
            (exact, rules) = (exact_rest, rules_rest);
        }
        h.u16(0);
        h.u8(self.client_error as u8);
        h.u8(self.server_error as u8);
        h.u8(self.other_status as u8);
        let mut slot = 0;
        while slot < Transport::ALL.len() as u32 {
            h.u8(self.slot_rule(slot) as u8);
            slot = slot.wrapping_add(1);
        }
        h.u8(self.reads_only as u8);
    }

    /// The operation of an HTTP method under this table (`keyed`: the request carries an
    /// idempotency key). GET and HEAD are idempotent; OPTIONS, TRACE, PUT and DELETE are too,
    /// unless the table retries reads only (the strict preset's), where they are writes like
    /// any other method, so a PUT or DELETE is not resent. Method names are matched
    /// case-sensitively, as RFC 9110 defines them.
    pub fn operation(&self, method: &str, keyed: bool) -> Operation {
        match method {
            "GET" | "HEAD" => Operation::Idempotent,
            "OPTIONS" | "TRACE" | "PUT" | "DELETE" if !self.reads_only => Operation::Idempotent,
            _ if keyed => Operation::KeyedWrite,
            _ => Operation::Write,
        }
    }

    /// The rule for a status code: one lookup for a 4xx or 5xx.
    #[inline]
    pub fn status_rule(&self, code: u16) -> Rule {
        Rule::from_bits(self.status_bits(code) as u8)
    }

    /// The two bits of [`Table::status_rule`].
    #[inline]
    fn status_bits(&self, code: u16) -> u32 {
        // The bitmap holds 400..=599 exactly: any other code (below 400 it wraps high) finds
        // no byte and takes the rule for other statuses.
        let i = u32::from(code).wrapping_sub(u32::from(FIRST));
        match self.rules.get((i / 4) as usize) {
            Some(byte) => u32::from(*byte).wrapping_shr((i & 3).wrapping_mul(2)) & 3,
            None => self.other_status as u32,
        }
    }

    /// The rule for a failure.
    #[inline]
    pub fn rule(&self, failure: &Failure) -> Rule {
        Rule::from_bits(self.rule_bits(failure) as u8)
    }

    /// The two bits of [`Table::rule`], before they are read as a [`Rule`] (3 reads as fail).
    #[inline]
    fn rule_bits(&self, failure: &Failure) -> u32 {
        match failure {
            Failure::Status { code, .. } => self.status_bits(*code),
            f => self.slot_bits(f.slot()),
        }
    }

    /// The class of `outcome` for `op`.
    #[inline]
    pub fn classify(&self, op: Operation, outcome: &Outcome) -> Class {
        let f = match outcome {
            Outcome::Ok => return Class::Ok,
            Outcome::Failure(f) => f,
        };
        // Two bits for each rule and operation: one shift, not a branch per case. A cancel's
        // rule never retries, so it is told apart off the retry path only.
        let case = (self.rule_bits(f) << 2).wrapping_add(op as u32);
        let (retries, classes) =
            if self.reads_only { (RETRIES_READS_ONLY, CLASSES_READS_ONLY) } else { (RETRIES, CLASSES) };
        if retries >> case & 1 != 0 {
            return Class::Retry;
        }
        match (classes >> (case << 1)) & 3 {
            _ if matches!(f, Failure::Cancelled) => Class::Cancelled,
            2 => Class::Unknown,
            _ => Class::Failed,
        }
    }
}

/// The class of a failure under `rule` for `op`, in a table that retries reads only or not:
/// the rule itself, which [`CLASSES`] and [`CLASSES_READS_ONLY`] hold in two bits a case.
const fn class_of(rule: Rule, op: Operation, reads_only: bool) -> Class {
    let read = matches!(op, Operation::Idempotent);
    match rule {
        Rule::Fail => Class::Failed,
        Rule::RetryAny if read || !reads_only => Class::Retry,
        // Refused before anything happened, but this table never resends a write.
        Rule::RetryAny => Class::Failed,
        Rule::RetryIdempotent if read || (matches!(op, Operation::KeyedWrite) && !reads_only) => Class::Retry,
        // A payment that timed out after it was recorded, resent, is recorded twice: a write
        // with no key that may have landed is never resent.
        Rule::RetryIdempotent => Class::Unknown,
    }
}

/// [`class_of`] for every rule and operation, two bits at `rule·8 + op·2`: 1 retry, 2 unknown,
/// 3 failed (0, where a rule's unused bits would be, reads as failed too).
const fn classes(reads_only: bool) -> u32 {
    let mut all = 0u32;
    let mut rules = Rule::ALL.as_slice();
    while let [rule, rest @ ..] = rules {
        let mut ops = Operation::ALL.as_slice();
        while let [op, more @ ..] = ops {
            let bits: u32 = match class_of(*rule, *op, reads_only) {
                Class::Retry => 1,
                Class::Unknown => 2,
                _ => 3,
            };
            all = all.wrapping_add(bits.wrapping_shl(((*rule as u32) << 3).wrapping_add((*op as u32) << 1)));
            ops = more;
        }
        rules = rest;
    }
    all
}

/// One bit per case of [`classes`] (at `rule·4 + op`): set where the class is retry.
const fn retries(classes: u32) -> u16 {
    let mut bits = 0u16;
    let mut case = 0u32;
    while case < 16 {
        if classes.wrapping_shr(case.wrapping_mul(2)) & 3 == 1 {
            bits = bits.wrapping_add(1u16.wrapping_shl(case));
        }
        case = case.wrapping_add(1);
    }
    bits
}

const RETRIES: u16 = retries(CLASSES);
const RETRIES_READS_ONLY: u16 = retries(CLASSES_READS_ONLY);
const CLASSES: u32 = classes(false);
const CLASSES_READS_ONLY: u32 = classes(true);

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [Operation; 3] = [Operation::Idempotent, Operation::KeyedWrite, Operation::Write];

    fn row(t: &Table, o: impl Into<Outcome>) -> [Class; 3] {
        let o = o.into();
        OPS.map(|op| t.classify(op, &o))
    }

    use Class::{Failed as F, Retry as R, Unknown as U};

    #[test]
    fn the_default_blame_tells_the_readings_fault_from_the_endpoints() {
        let t = Table::DEFAULT;
        for code in [400, 402, 409, 413, 415, 422, 424, 429, 451, 499] {
            assert_eq!(t.blame(&Failure::status(code)), Blame::Reading, "{code}");
        }
        for code in [401, 403, 404, 405, 407, 410, 421, 431, 500, 501, 503, 505, 511, 599, 600, 399] {
            assert_eq!(t.blame(&Failure::status(code)), Blame::Endpoint, "{code}");
        }
        assert_eq!(t.blame(&Failure::Tls), Blame::Endpoint);
        // A row can be overridden, and only that row moves.
        let t = t.with_blame(404, Blame::Reading).unwrap().with_blame(422, Blame::Endpoint).unwrap();
        assert_eq!(t.blame(&Failure::status(404)), Blame::Reading);
        assert_eq!(t.blame(&Failure::status(422)), Blame::Endpoint);
        assert_eq!(t.blame(&Failure::status(403)), Blame::Endpoint);
        assert_eq!(t.blame(&Failure::status(400)), Blame::Reading);
        // The blame does not change what the call decides.
        let (mut a, mut b) = (Fnv::new(), Fnv::new());
        t.fingerprint_into(&mut a);
        Table::DEFAULT.fingerprint_into(&mut b);
        assert_eq!(a.finish(), b.finish());
    }

    #[test]
    fn the_default_table_retries_what_may_succeed_and_fails_what_will_not() {
        let t = Table::DEFAULT;
        // 400, 401, 403, 404, 422: the request is wrong and stays wrong; never retried; 408, 429 yes; 5xx yes if idempotent.
        for code in [400, 401, 403, 404, 422] {
            assert_eq!(row(&t, Outcome::status(code)), [F, F, F], "{code}");
        }
        for code in [408, 429] {
            assert_eq!(row(&t, Outcome::status(code)), [R, R, R], "{code}");
        }
        for code in [500, 502, 503, 504] {
            assert_eq!(row(&t, Outcome::status(code)), [R, R, U], "{code}");
        }
        assert_eq!(row(&t, Outcome::status(501)), [F, F, F]);
        assert_eq!(row(&t, Failure::ResponseTimeout), [R, R, U]);
        assert_eq!(row(&t, Failure::Reset), [R, R, U]);
        assert_eq!(row(&t, Failure::ConnectTimeout), [R, R, R]);
        assert_eq!(row(&t, Failure::Refused), [R, R, R]);
        assert_eq!(row(&t, Failure::Tls), [F, F, F]);
        // A 200 with a bad body is a validation bug, not a transport one: never retried.
        assert_eq!(row(&t, Failure::BadBody), [F, F, F]);
        assert_eq!(row(&t, Failure::StreamBroken { forwarded: false }), [R, R, U]);
        assert_eq!(row(&t, Failure::StreamBroken { forwarded: true }), [F, F, F]);
        assert_eq!(row(&t, Outcome::Ok), [Class::Ok; 3]);
        assert_eq!(row(&t, Failure::Cancelled), [Class::Cancelled; 3]);
    }

    #[test]
    fn every_rule_gives_each_operation_its_class_through_the_lookup() {
        // What each rule means, written out case by case, beside the two-bit lookup that
        // classify reads: for a status, a transport failure, and in tables that retry reads
        // only or not.
        use Operation::{Idempotent as Rd, KeyedWrite as K, Write as W};
        let expected = |rule, op, reads_only| match (rule, op, reads_only) {
            (Rule::Fail, _, _) => F,
            (Rule::RetryAny, Rd, _) | (Rule::RetryAny, _, false) => R,
            (Rule::RetryAny, _, true) => F,
            (Rule::RetryIdempotent, Rd, _) | (Rule::RetryIdempotent, K, false) => R,
            (Rule::RetryIdempotent, K | W, _) => U,
        };
        for reads_only in [false, true] {
            for rule in Rule::ALL {
                let t = Table::new(rule, rule, rule)
                    .with_transport(Transport::Reset, rule)
                    .reads_only(reads_only);
                for op in [Rd, K, W] {
                    let want = expected(rule, op, reads_only);
                    for o in [
                        Outcome::status(404),
                        Outcome::status(503),
                        Outcome::status(302),
                        Failure::Reset.into(),
                    ] {
                        assert_eq!(t.classify(op, &o), want, "{rule:?} {op:?} reads_only {reads_only} {o:?}");
                    }
                    // A cancel is a cancel, and a success a success, whatever the rules.
                    assert_eq!(t.classify(op, &Failure::Cancelled.into()), Class::Cancelled);
                    assert_eq!(t.classify(op, &Outcome::Ok), Class::Ok);
                }
            }
        }
    }

    #[test]
    fn the_basic_table_retries_429_any_op_and_5xx_or_timeouts_if_idempotent() {
        let t = Table::BASIC;
        assert_eq!(row(&t, Outcome::status(429)), [R, R, R]);
        for code in [500, 501, 503, 599] {
            assert_eq!(row(&t, Outcome::status(code)), [R, R, U]);
        }
        assert_eq!(row(&t, Failure::ResponseTimeout), [R, R, U]);
        for code in [400, 401, 408, 404, 200, 302] {
            assert_eq!(row(&t, Outcome::status(code)), [F, F, F], "{code}");
        }
    }

    #[test]
    fn strict_table_retries_reads_only() {
        let t = Table::STRICT;
        assert_eq!(row(&t, Outcome::status(503)), [R, U, U]);
        assert_eq!(row(&t, Outcome::status(429)), [R, F, F]);
        assert_eq!(row(&t, Outcome::status(500)), [F, F, F]);
        assert_eq!(row(&t, Failure::ResponseTimeout), [R, U, U]);
        assert_eq!(row(&t, Failure::Refused), [R, F, F]);
        assert_eq!(row(&t, Failure::BadBody), [F, F, F]);
    }

    #[test]
    fn tables_are_data() {
        let t = Table::DEFAULT.with_status(503, Rule::RetryAny).unwrap();
        assert_eq!(row(&t, Outcome::status(503)), [R, R, R]);
        let t = t.with_status(409, Rule::RetryIdempotent).unwrap();
        assert_eq!(row(&t, Outcome::status(409)), [R, R, U]);
        for bad in [0, 99, 200, 399, 600, 999, u16::MAX] {
            assert_eq!(Table::DEFAULT.with_status(bad, Rule::Fail), Err(TableError::BadStatus), "{bad}");
        }
        // Every 4xx and 5xx can hold an exact rule, the ends included; a later rule replaces one.
        let mut all = Table::DEFAULT;
        for code in 400..=599 {
            all = all.with_status(code, Rule::RetryAny).unwrap();
        }
        assert_eq!(row(&all, Outcome::status(400)), [R, R, R]);
        assert_eq!(row(&all, Outcome::status(599)), [R, R, R]);
        assert_eq!(all.exact_rules().count(), 200);
        let all = all.with_status(599, Rule::Fail).unwrap();
        assert_eq!(row(&all, Outcome::status(599)), [F, F, F]);
        // Exact rules survive a change of the class rule; the others follow it.
        let t = Table::DEFAULT
            .with_status(418, Rule::RetryAny)
            .unwrap()
            .with_client_errors(Rule::RetryIdempotent);
        assert_eq!(row(&t, Outcome::status(418)), [R, R, R]);
        assert_eq!(row(&t, Outcome::status(400)), [R, R, U]);
        assert_eq!(row(&t, Outcome::status(429)), [R, R, R]);
        assert_eq!(row(&t, Outcome::status(500)), [R, R, U]);
        assert_eq!(row(&t, Outcome::status(501)), [F, F, F]);
        let t = t.with_server_errors(Rule::RetryAny).with_other_statuses(Rule::RetryIdempotent);
        assert_eq!(row(&t, Outcome::status(501)), [R, R, R]);
        assert_eq!(row(&t, Outcome::status(503)), [R, R, U]);
        assert_eq!(row(&t, Outcome::status(302)), [R, R, U]);
        assert_eq!(row(&t, Outcome::status(600)), [R, R, U]);
        assert_eq!(row(&t, Outcome::status(399)), [R, R, U]);
    }

    #[test]
    fn strict_counts_only_get_and_head_as_reads() {
        assert_eq!(Table::STRICT.operation("GET", false), Operation::Idempotent);
        assert_eq!(Table::STRICT.operation("HEAD", false), Operation::Idempotent);
        assert_eq!(Table::STRICT.operation("PUT", false), Operation::Write);
        assert_eq!(Table::STRICT.operation("DELETE", true), Operation::KeyedWrite);
        assert_eq!(Table::DEFAULT.operation("PUT", false), Operation::Idempotent);
        // So a PUT that timed out under strict is not resent.
        let put = Table::STRICT.operation("PUT", false);
        assert_eq!(Table::STRICT.classify(put, &Failure::ResponseTimeout.into()), Class::Unknown);
    }

    #[test]
    #[allow(deprecated)]
    fn the_free_constructor_follows_the_strictest_table() {
        assert_eq!(Operation::from_method("GET", false), Operation::Idempotent);
        assert_eq!(Operation::from_method("HEAD", true), Operation::Idempotent);
        for m in ["OPTIONS", "TRACE", "PUT", "DELETE", "POST", "PATCH", "CONNECT", "get"] {
            assert_eq!(Operation::from_method(m, false), Operation::Write, "{m}");
            assert_eq!(Operation::from_method(m, true), Operation::KeyedWrite, "{m}");
        }
        // The old name is the new variant, usable in patterns too.
        assert!(matches!(Operation::Idempotent, Operation::Read));
        assert_eq!(Operation::Read.name(), "read");
    }
}

#[cfg(test)]
mod more_tests {
    use super::*;

    #[test]
    fn names_round_trip_for_every_enum() {
        for o in Operation::ALL {
            assert_eq!(Operation::from_name(o.name()), Some(o));
        }
        for r in Rule::ALL {
            assert_eq!(Rule::from_name(r.name()), Some(r));
        }
        for c in Class::ALL {
            assert_eq!(Class::from_name(c.name()), Some(c));
        }
        for t in Transport::ALL {
            assert_eq!(Transport::from_name(t.name()), Some(t));
        }
        for f in [
            Failure::ConnectTimeout,
            Failure::ResponseTimeout,
            Failure::Refused,
            Failure::Reset,
            Failure::Tls,
            Failure::BadBody,
            Failure::StreamBroken { forwarded: false },
            Failure::StreamBroken { forwarded: true },
            Failure::Cancelled,
        ] {
            assert_eq!(Failure::from_name(f.name()), Some(f));
        }
        assert_eq!(Failure::from_name("status"), None);
        assert_eq!(Failure::from_name("ok"), None);
        for bad in ["", "Read", "READ", "retry-any"] {
            assert_eq!(Operation::from_name(bad), None);
            assert_eq!(Rule::from_name(bad), None);
        }
    }

    #[test]
    fn a_response_is_ok_exactly_when_its_status_is_2xx() {
        let r = &Rules::LENIENT;
        for code in [200, 201, 204, 299] {
            assert_eq!(Outcome::from_response(code, [b"5".as_slice()], None, None, r).0, Outcome::Ok);
        }
        for code in [100, 199, 300, 304, 400, 503] {
            let (o, _) = Outcome::from_response(code, [b"5".as_slice()], None, None, r);
            assert_eq!(o, Outcome::status_after(code, Duration::from_secs(5)), "{code}");
        }
        // The response's Date measures an HTTP-date.
        let (o, _) = Outcome::from_response(
            503,
            [b"Sun, 06 Nov 1994 08:49:40 GMT".as_slice()],
            Some(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            None,
            r,
        );
        assert_eq!(o.retry_after(), Some(Duration::from_secs(3)));
        // A year-long Retry-After saturates: longer than any call can wait.
        let (o, _) = Outcome::from_response(429, [b"31536000".as_slice()], None, None, r);
        assert_eq!(o.retry_after(), Some(Duration::MAX));
        // Values that cannot be read at all are counted on the failure itself.
        let (o, reading) = Outcome::from_response(503, [b"soon".as_slice(), b"-1", b"7"], None, None, r);
        assert_eq!(o.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!((o.failure().unwrap().unreadable_retry_after(), reading.unreadable), (2, 2));
        assert_eq!(Failure::Reset.unreadable_retry_after(), 0);
        let garbage = [b"x".as_slice(); 300];
        let (o, _) = Outcome::from_response(503, garbage, None, None, r);
        assert_eq!(o.failure().unwrap().unreadable_retry_after(), 255);
        // Strict rules refuse a date; the status stays, with no wait.
        let (o, reading) = Outcome::from_response(
            503,
            [b"Sun, 06 Nov 1994 08:49:40 GMT".as_slice()],
            None,
            Some(0),
            &Rules::STRICT,
        );
        assert_eq!((o, reading.unreadable), (Outcome::status(503), 0));
        assert_eq!(Outcome::Ok.into_result(), Ok(()));
        assert_eq!(Outcome::status(500).into_result(), Err(Failure::status(500)));
        assert_eq!(Outcome::from(&Err::<(), _>(Failure::Reset)), Outcome::Failure(Failure::Reset));
        assert_eq!(Outcome::from(&Ok::<u8, Failure>(1)), Outcome::Ok);
        assert_eq!(
            (Outcome::Ok.name(), Outcome::status(1).name(), Outcome::status(404).code()),
            ("ok", "status", Some(404))
        );
    }

    #[test]
    fn reads_and_keyed_writes_are_idempotent_writes_are_not() {
        assert!(Operation::Idempotent.is_idempotent());
        assert!(Operation::KeyedWrite.is_idempotent());
        assert!(!Operation::Write.is_idempotent());
    }

    #[test]
    fn a_table_debugs_as_its_exact_rules_and_its_defaults() {
        let t = Table::BASIC.with_status(409, Rule::RetryIdempotent).unwrap();
        let text = format!("{t:?}");
        assert!(text.contains("exact: {409: RetryIdempotent, 429: RetryAny}"), "{text}");
        assert!(text.contains("server_error: RetryIdempotent"), "{text}");
        assert!(text.contains("tls: Fail") && text.contains("reads_only: false"), "{text}");
    }

    #[test]
    fn the_statuses_next_to_the_bitmap_take_the_other_rule() {
        let t = Table::new(Rule::RetryAny, Rule::RetryAny, Rule::Fail);
        for code in [0, 100, 399, 600, 601, 603, 604, 999, u16::MAX] {
            assert_eq!(t.status_rule(code), Rule::Fail, "{code}");
        }
        assert_eq!((t.status_rule(400), t.status_rule(599)), (Rule::RetryAny, Rule::RetryAny));
    }

    #[test]
    fn the_fingerprint_feeds_exact_rules_by_status_then_class_and_transport_rules() {
        // The encoding as a loop over the public accessors: the const walk over the bitmaps
        // must feed the same bytes, the first and last status of the range included.
        fn by_accessors(t: &Table) -> u32 {
            let mut h = Fnv::new();
            for (code, rule) in t.exact_rules() {
                h.u16(code);
                h.u8(rule as u8);
            }
            h.u16(0);
            for r in [t.client_errors(), t.server_errors(), t.other_statuses()] {
                h.u8(r as u8);
            }
            for k in Transport::ALL {
                h.u8(t.transport_rule(k) as u8);
            }
            h.u8(u8::from(t.is_reads_only()));
            h.finish()
        }
        let mut t = Table::DEFAULT.with_status(400, Rule::RetryAny).unwrap();
        for (code, rule) in [(407, Rule::Fail), (431, Rule::RetryIdempotent), (599, Rule::RetryIdempotent)] {
            t = t.with_status(code, rule).unwrap();
        }
        let t = t.with_transport(Transport::Tls, Rule::RetryAny).reads_only(true);
        for table in [Table::DEFAULT, Table::BASIC, Table::STRICT, t] {
            let mut h = Fnv::new();
            table.fingerprint_into(&mut h);
            assert_eq!(h.finish(), by_accessors(&table));
        }
        let (mut a, mut b) = (Fnv::new(), Fnv::new());
        Table::DEFAULT.fingerprint_into(&mut a);
        t.fingerprint_into(&mut b);
        assert_ne!(a.finish(), b.finish());
    }

    #[test]
    fn transport_rules_are_data_too() {
        let t = Table::DEFAULT.with_transport(Transport::Tls, Rule::RetryAny);
        assert_eq!(t.classify(Operation::Write, &Failure::Tls.into()), Class::Retry);
        for kind in Transport::ALL {
            let t = Table::DEFAULT.with_transport(kind, Rule::RetryIdempotent);
            assert_eq!(t.transport_rule(kind), Rule::RetryIdempotent);
        }
    }
}
