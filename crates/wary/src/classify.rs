//! Classification: what one attempt's outcome means for the operation that made it.
//!
//! A retry is a second copy of a request, so the question is what the first copy may already
//! have done. An outcome refused before the server did anything (a 429, a refused connection, a
//! connect timeout) is safe to resend for any operation. An outcome after which the work may have
//! landed (a 5xx, a response timeout, a reset) is safe to resend only for a read or a write that
//! carries an idempotency key; for a write without one it is [`Class::Unknown`] and is never
//! resent. Anything that will fail the same way every time (another 4xx, a TLS error, a bad body)
//! fails at once.
//!
//! Tables are data: an API whose own 503 means "not processed" can move 503 to
//! [`Rule::RetryAny`], and one that answers 409 while the same key is in flight can add it.
//!
//! ```
//! use wary::{Class, Operation, Outcome, Rule, Table};
//! let t = Table::DEFAULT;
//! assert_eq!(t.classify(Operation::Read, &Outcome::status(503)), Class::Retry);
//! assert_eq!(t.classify(Operation::Write, &Outcome::status(503)), Class::Unknown);
//! assert_eq!(t.classify(Operation::Read, &Outcome::status(400)), Class::Failed);
//! let api = t.with_status(503, Rule::RetryAny).unwrap();
//! assert_eq!(api.classify(Operation::Write, &Outcome::status(503)), Class::Retry);
//! ```

use crate::error::PolicyError;

/// What a call does, which decides what a resend may do twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Operation {
    /// Safe to repeat: GET, HEAD, OPTIONS, and the idempotent PUT and DELETE.
    Read,
    /// A write carrying an idempotency key, made once before the first attempt and sent on every
    /// attempt, so the server recognises a replay.
    KeyedWrite,
    /// A write with no key: a resend may do the work twice.
    Write,
}

impl Operation {
    /// The operation of an HTTP method; `keyed` says whether the request carries an
    /// idempotency key. Method names are matched case-sensitively, as RFC 9110 defines them.
    pub fn from_method(method: &str, keyed: bool) -> Self {
        match method {
            "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE" => Operation::Read,
            _ if keyed => Operation::KeyedWrite,
            _ => Operation::Write,
        }
    }

    /// The name used by `wary plan` and the ledgers.
    pub const fn name(&self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::KeyedWrite => "keyed_write",
            Operation::Write => "write",
        }
    }

    /// Parses [`Operation::name`] back.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "read" => Some(Operation::Read),
            "keyed_write" => Some(Operation::KeyedWrite),
            "write" => Some(Operation::Write),
            _ => None,
        }
    }

    /// True if a resend cannot do the work twice.
    pub const fn is_idempotent(&self) -> bool {
        matches!(self, Operation::Read | Operation::KeyedWrite)
    }
}

/// What one attempt returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Outcome {
    /// The attempt succeeded.
    Ok,
    /// The server answered with a status that is not a success for this call.
    Status {
        /// The HTTP status code.
        code: u16,
        /// The Retry-After the server sent, already resolved to whole seconds (see
        /// [`crate::retry_after`]); `None` if absent or refused by the policy's rules.
        retry_after: Option<u64>,
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
    /// bad data is not a repair: the same request gets the same bad answer.
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

impl Outcome {
    /// A status with no Retry-After.
    pub const fn status(code: u16) -> Self {
        Outcome::Status { code, retry_after: None }
    }

    /// A status with a Retry-After in whole seconds.
    pub const fn status_after(code: u16, retry_after_secs: u64) -> Self {
        Outcome::Status { code, retry_after: Some(retry_after_secs) }
    }

    /// The Retry-After carried by this outcome, in seconds.
    pub const fn retry_after(&self) -> Option<u64> {
        match self {
            Outcome::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status, if the outcome is one.
    pub const fn code(&self) -> Option<u16> {
        match self {
            Outcome::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A short stable name for the outcome's kind (`status` for any status).
    pub const fn kind_name(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Status { .. } => "status",
            Outcome::ConnectTimeout => "connect_timeout",
            Outcome::ResponseTimeout => "response_timeout",
            Outcome::Refused => "refused",
            Outcome::Reset => "reset",
            Outcome::Tls => "tls",
            Outcome::BadBody => "bad_body",
            Outcome::StreamBroken { forwarded: false } => "stream_broken_before",
            Outcome::StreamBroken { forwarded: true } => "stream_broken_after",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// Parses [`Outcome::kind_name`] back, for every kind but `status`.
    pub fn from_kind_name(name: &str) -> Option<Self> {
        Some(match name {
            "ok" => Outcome::Ok,
            "connect_timeout" => Outcome::ConnectTimeout,
            "response_timeout" | "timeout" => Outcome::ResponseTimeout,
            "refused" => Outcome::Refused,
            "reset" => Outcome::Reset,
            "tls" => Outcome::Tls,
            "bad_body" => Outcome::BadBody,
            "stream_broken_before" => Outcome::StreamBroken { forwarded: false },
            "stream_broken_after" => Outcome::StreamBroken { forwarded: true },
            "cancelled" => Outcome::Cancelled,
            _ => return None,
        })
    }
}

/// What a table says about one kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Rule {
    /// Refused before the server did anything: safe to resend for any operation.
    RetryAny,
    /// The work may have landed: resend a read or a keyed write; a write becomes
    /// [`Class::Unknown`] and is never resent.
    RetryIdempotent,
    /// Will fail the same way every time: fail at once, with no wait.
    Fail,
}

/// The class of one attempt's outcome for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Class {
    /// Success.
    Ok,
    /// Safe to send again, if the stop rules allow.
    Retry,
    /// May have landed and cannot be resent safely.
    Unknown,
    /// Fails at once.
    Failed,
    /// Cancelled by the caller.
    Cancelled,
}

impl Class {
    /// The name used by `wary plan` and the ledgers.
    pub const fn name(&self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Retry => "retry",
            Class::Unknown => "unknown",
            Class::Failed => "failed",
            Class::Cancelled => "cancelled",
        }
    }
}

/// How many exact-status rules a table holds.
pub const TABLE_STATUSES: usize = 12;

/// A classification table: data, so an API's own semantics can be written down.
///
/// Exact status rules win over the 4xx / 5xx / other defaults. Build variants with the `const`
/// methods, which refuse bad statuses and a full table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Table {
    statuses: [Option<(u16, Rule)>; TABLE_STATUSES],
    client_error: Rule,
    server_error: Rule,
    other_status: Rule,
    connect_timeout: Rule,
    response_timeout: Rule,
    refused: Rule,
    reset: Rule,
    tls: Rule,
    bad_body: Rule,
    stream_before: Rule,
    reads_only: bool,
}

/// The non-status failures a table has a rule for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Transport {
    /// [`Outcome::ConnectTimeout`].
    ConnectTimeout,
    /// [`Outcome::ResponseTimeout`].
    ResponseTimeout,
    /// [`Outcome::Refused`].
    Refused,
    /// [`Outcome::Reset`].
    Reset,
    /// [`Outcome::Tls`].
    Tls,
    /// [`Outcome::BadBody`].
    BadBody,
    /// [`Outcome::StreamBroken`] before anything was forwarded.
    StreamBefore,
}

const fn entry(code: u16, rule: Rule) -> Option<(u16, Rule)> {
    Some((code, rule))
}

impl Table {
    /// wary's default table: 408, 429 and connect failures retry for any operation;
    /// 500, 502, 503, 504, response timeouts, resets and streams broken before forwarding retry
    /// if idempotent; other 4xx and 5xx, TLS errors and bad bodies fail at once.
    pub const DEFAULT: Table = Table {
        statuses: [
            entry(408, Rule::RetryAny),
            entry(429, Rule::RetryAny),
            entry(500, Rule::RetryIdempotent),
            entry(502, Rule::RetryIdempotent),
            entry(503, Rule::RetryIdempotent),
            entry(504, Rule::RetryIdempotent),
            None,
            None,
            None,
            None,
            None,
            None,
        ],
        client_error: Rule::Fail,
        server_error: Rule::Fail,
        other_status: Rule::Fail,
        connect_timeout: Rule::RetryAny,
        response_timeout: Rule::RetryIdempotent,
        refused: Rule::RetryAny,
        reset: Rule::RetryIdempotent,
        tls: Rule::Fail,
        bad_body: Rule::Fail,
        stream_before: Rule::RetryIdempotent,
        reads_only: false,
    };

    /// The exercise table: 429 for any operation; a timeout and every 5xx if idempotent, else
    /// unknown; every other status fails.
    pub const EXERCISE: Table = Table {
        statuses: [
            entry(429, Rule::RetryAny),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ],
        client_error: Rule::Fail,
        server_error: Rule::RetryIdempotent,
        other_status: Rule::Fail,
        ..Table::DEFAULT
    };

    /// The strict table: only reads (GET, HEAD) are retried, on transport errors, timeouts,
    /// 429, 502, 503 and 504. A write is never resent: what may have landed is unknown, what was
    /// refused fails.
    pub const STRICT: Table = Table {
        statuses: [
            entry(429, Rule::RetryAny),
            entry(502, Rule::RetryIdempotent),
            entry(503, Rule::RetryIdempotent),
            entry(504, Rule::RetryIdempotent),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ],
        reads_only: true,
        ..Table::DEFAULT
    };

    /// This table with `rule` for `code` (replacing an earlier rule for it).
    pub const fn with_status(mut self, code: u16, rule: Rule) -> Result<Table, PolicyError> {
        if code < 100 || code > 999 {
            return Err(PolicyError::BadStatus);
        }
        // Slice patterns rather than indexing: const, and no bounds check that could panic.
        let mut rest: &mut [Option<(u16, Rule)>] = &mut self.statuses;
        while let [slot, tail @ ..] = rest {
            if let Some((c, _)) = *slot {
                if c == code {
                    *slot = Some((code, rule));
                    return Ok(self);
                }
            }
            rest = tail;
        }
        let mut rest: &mut [Option<(u16, Rule)>] = &mut self.statuses;
        while let [slot, tail @ ..] = rest {
            if slot.is_none() {
                *slot = Some((code, rule));
                return Ok(self);
            }
            rest = tail;
        }
        Err(PolicyError::TableFull)
    }

    /// This table with `rule` for a non-status failure.
    pub const fn with_transport(mut self, kind: Transport, rule: Rule) -> Table {
        match kind {
            Transport::ConnectTimeout => self.connect_timeout = rule,
            Transport::ResponseTimeout => self.response_timeout = rule,
            Transport::Refused => self.refused = rule,
            Transport::Reset => self.reset = rule,
            Transport::Tls => self.tls = rule,
            Transport::BadBody => self.bad_body = rule,
            Transport::StreamBefore => self.stream_before = rule,
        }
        self
    }

    /// This table with the rule for 4xx statuses that have no exact rule.
    pub const fn with_client_errors(mut self, rule: Rule) -> Table {
        self.client_error = rule;
        self
    }

    /// This table with the rule for 5xx statuses that have no exact rule.
    pub const fn with_server_errors(mut self, rule: Rule) -> Table {
        self.server_error = rule;
        self
    }

    /// This table, retrying reads only (a keyed write is treated like a write).
    pub const fn reads_only(mut self, yes: bool) -> Table {
        self.reads_only = yes;
        self
    }

    /// Feeds every rule to a fingerprint, in a fixed order.
    pub(crate) fn fingerprint_into(&self, h: &mut crate::policy::Fnv) {
        let code = |r: Rule| match r {
            Rule::RetryAny => 0u8,
            Rule::RetryIdempotent => 1,
            Rule::Fail => 2,
        };
        for slot in &self.statuses {
            match slot {
                Some((c, r)) => {
                    h.u16(*c);
                    h.u8(code(*r));
                }
                None => h.u16(0),
            }
        }
        for r in [
            self.client_error,
            self.server_error,
            self.other_status,
            self.connect_timeout,
            self.response_timeout,
            self.refused,
            self.reset,
            self.tls,
            self.bad_body,
            self.stream_before,
        ] {
            h.u8(code(r));
        }
        h.u8(u8::from(self.reads_only));
    }

    /// The operation of an HTTP method under this table: a table that retries reads only
    /// (the strict preset's) counts only GET and HEAD as reads, so a PUT or DELETE is not
    /// resent; otherwise [`Operation::from_method`].
    pub fn operation(&self, method: &str, keyed: bool) -> Operation {
        match method {
            "GET" | "HEAD" => Operation::Read,
            _ if self.reads_only => {
                if keyed {
                    Operation::KeyedWrite
                } else {
                    Operation::Write
                }
            }
            _ => Operation::from_method(method, keyed),
        }
    }

    /// The rule for a status code.
    #[inline]
    pub const fn status_rule(&self, code: u16) -> Rule {
        let mut rest: &[Option<(u16, Rule)>] = &self.statuses;
        while let [slot, tail @ ..] = rest {
            if let Some((c, rule)) = *slot {
                if c == code {
                    return rule;
                }
            }
            rest = tail;
        }
        match code {
            400..=499 => self.client_error,
            500..=599 => self.server_error,
            _ => self.other_status,
        }
    }

    /// The rule for an outcome; `None` for success and cancellation, which no table changes.
    #[inline]
    pub const fn rule(&self, outcome: &Outcome) -> Option<Rule> {
        Some(match outcome {
            Outcome::Ok | Outcome::Cancelled => return None,
            Outcome::Status { code, .. } => self.status_rule(*code),
            Outcome::ConnectTimeout => self.connect_timeout,
            Outcome::ResponseTimeout => self.response_timeout,
            Outcome::Refused => self.refused,
            Outcome::Reset => self.reset,
            Outcome::Tls => self.tls,
            Outcome::BadBody => self.bad_body,
            Outcome::StreamBroken { forwarded: false } => self.stream_before,
            // Bytes already reached the user: a retry would start the text again.
            Outcome::StreamBroken { forwarded: true } => Rule::Fail,
        })
    }

    /// The class of `outcome` for `op`.
    #[inline]
    pub const fn classify(&self, op: Operation, outcome: &Outcome) -> Class {
        let rule = match outcome {
            Outcome::Ok => return Class::Ok,
            Outcome::Cancelled => return Class::Cancelled,
            _ => match self.rule(outcome) {
                Some(rule) => rule,
                None => Rule::Fail,
            },
        };
        let resendable = match op {
            Operation::Read => true,
            Operation::KeyedWrite => !self.reads_only,
            Operation::Write => false,
        };
        match rule {
            Rule::Fail => Class::Failed,
            Rule::RetryAny if matches!(op, Operation::Read) || !self.reads_only => Class::Retry,
            // Refused before anything happened, but this table never resends a write.
            Rule::RetryAny => Class::Failed,
            Rule::RetryIdempotent if resendable => Class::Retry,
            // The $4,200: a timeout after the payment was recorded, resent, recorded twice.
            Rule::RetryIdempotent => Class::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [Operation; 3] = [Operation::Read, Operation::KeyedWrite, Operation::Write];

    fn row(t: &Table, o: Outcome) -> [Class; 3] {
        OPS.map(|op| t.classify(op, &o))
    }

    use Class::{Failed as F, Retry as R, Unknown as U};

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
        assert_eq!(row(&t, Outcome::ResponseTimeout), [R, R, U]);
        assert_eq!(row(&t, Outcome::Reset), [R, R, U]);
        assert_eq!(row(&t, Outcome::ConnectTimeout), [R, R, R]);
        assert_eq!(row(&t, Outcome::Refused), [R, R, R]);
        assert_eq!(row(&t, Outcome::Tls), [F, F, F]);
        // A 200 with a bad body is a validation bug, not a transport one: never retried.
        assert_eq!(row(&t, Outcome::BadBody), [F, F, F]);
        assert_eq!(row(&t, Outcome::StreamBroken { forwarded: false }), [R, R, U]);
        assert_eq!(row(&t, Outcome::StreamBroken { forwarded: true }), [F, F, F]);
        assert_eq!(row(&t, Outcome::Ok), [Class::Ok; 3]);
        assert_eq!(row(&t, Outcome::Cancelled), [Class::Cancelled; 3]);
    }

    #[test]
    fn the_exercise_table_retries_429_any_op_and_5xx_or_timeouts_if_idempotent() {
        let t = Table::EXERCISE;
        assert_eq!(row(&t, Outcome::status(429)), [R, R, R]);
        for code in [500, 501, 503, 599] {
            assert_eq!(row(&t, Outcome::status(code)), [R, R, U]);
        }
        assert_eq!(row(&t, Outcome::ResponseTimeout), [R, R, U]);
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
        assert_eq!(row(&t, Outcome::ResponseTimeout), [R, U, U]);
        assert_eq!(row(&t, Outcome::Refused), [R, F, F]);
        assert_eq!(row(&t, Outcome::BadBody), [F, F, F]);
    }

    #[test]
    fn tables_are_data() {
        let t = Table::DEFAULT.with_status(503, Rule::RetryAny).unwrap();
        assert_eq!(row(&t, Outcome::status(503)), [R, R, R]);
        let t = t.with_status(409, Rule::RetryIdempotent).unwrap();
        assert_eq!(row(&t, Outcome::status(409)), [R, R, U]);
        assert_eq!(Table::DEFAULT.with_status(99, Rule::Fail), Err(PolicyError::BadStatus));
        let mut full = Table::DEFAULT;
        for code in 600..606 {
            full = full.with_status(code, Rule::Fail).unwrap();
        }
        assert_eq!(full.with_status(700, Rule::Fail), Err(PolicyError::TableFull));
        // Replacing an existing rule needs no free slot.
        assert!(full.with_status(600, Rule::RetryAny).is_ok());
    }

    #[test]
    fn strict_counts_only_get_and_head_as_reads() {
        assert_eq!(Table::STRICT.operation("GET", false), Operation::Read);
        assert_eq!(Table::STRICT.operation("HEAD", false), Operation::Read);
        assert_eq!(Table::STRICT.operation("PUT", false), Operation::Write);
        assert_eq!(Table::STRICT.operation("DELETE", true), Operation::KeyedWrite);
        assert_eq!(Table::DEFAULT.operation("PUT", false), Operation::Read);
        // So a PUT that timed out under strict is not resent.
        let put = Table::STRICT.operation("PUT", false);
        assert_eq!(Table::STRICT.classify(put, &Outcome::ResponseTimeout), Class::Unknown);
    }

    #[test]
    fn methods_map_to_operations() {
        assert_eq!(Operation::from_method("GET", false), Operation::Read);
        assert_eq!(Operation::from_method("PUT", false), Operation::Read);
        assert_eq!(Operation::from_method("DELETE", true), Operation::Read);
        assert_eq!(Operation::from_method("POST", true), Operation::KeyedWrite);
        assert_eq!(Operation::from_method("POST", false), Operation::Write);
        assert_eq!(Operation::from_method("PATCH", false), Operation::Write);
    }
}
