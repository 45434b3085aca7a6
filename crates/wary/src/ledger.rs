//! The attempt ledger: one record per attempt, and attempts per call as the health signal.
//!
//! A third-attempt success is a yellow flag nobody sees when only outcomes are logged:
//! the ledger keeps every attempt. A record holds classes, numbers and the key only —
//! never payload bytes, credentials or raw error text. On the device the ring keeps the last
//! `N` records and each is logged with defmt as a device line; on a host the same records become
//! JSON lines (the `serde` feature). Both formats are defined here, with one version,
//! [`LEDGER_VERSION`], that a reader checks. Each record carries the draw and a fingerprint of
//! the policy, so a call can be replayed.
//!
//! ```
//! use wary::ledger::AttemptStats;
//! let mut s = AttemptStats::<8>::new();
//! for attempts in [1, 1, 1, 3] {
//!     s.add(attempts);
//! }
//! assert_eq!(s.calls(), 4);
//! assert_eq!(s.mean_milli(), 1500);
//! assert_eq!(s.percentile(95), 3);
//! ```

use heapless::HistoryBuf;

use crate::backoff::Draw;
pub use crate::error::LineError;
pub use crate::record::{Admission, Record};
use crate::time::Duration;

pub use crate::version::LEDGER_VERSION;

/// The tag that starts a device ledger line: `wary-ledger v` and [`LEDGER_VERSION`].
pub const DEVICE_TAG: &str = "wary-ledger v4";

/// Where records go.
pub trait Sink {
    /// Takes one record.
    fn record(&mut self, record: &Record);
}

/// No ledger.
impl Sink for () {
    fn record(&mut self, _: &Record) {}
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn record(&mut self, record: &Record) {
        (**self).record(record);
    }
}

/// A fixed-capacity ring of the last `N` records, with attempts-per-call statistics.
#[derive(Debug)]
pub struct Ledger<const N: usize, const B: usize = 16> {
    ring: HistoryBuf<Record, N>,
    stats: AttemptStats<B>,
}

#[cfg(feature = "defmt")]
impl<const N: usize, const B: usize> defmt::Format for Ledger<N, B> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "Ledger {{ kept: {=usize}, stats: {} }}", self.ring.len(), self.stats);
    }
}

impl<const N: usize, const B: usize> Default for Ledger<N, B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize, const B: usize> Ledger<N, B> {
    /// An empty ledger.
    pub const fn new() -> Self {
        Ledger { ring: HistoryBuf::new(), stats: AttemptStats::new() }
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.ring.oldest_ordered()
    }

    /// The newest record.
    pub fn last(&self) -> Option<&Record> {
        self.ring.recent()
    }

    /// Attempts-per-call statistics over every call recorded (not only those still in the ring).
    pub const fn stats(&self) -> &AttemptStats<B> {
        &self.stats
    }
}

impl<const N: usize, const B: usize> Sink for Ledger<N, B> {
    fn record(&mut self, r: &Record) {
        log_record(r);
        if r.verdict.is_some() {
            self.stats.add(r.attempt);
        }
        self.ring.write(*r);
    }
}

/// The device line's fields after the tag, in order: key (hex), attempt, op, outcome, status
/// (0: none), Retry-After ms (`-1`: none), class, draw kind (`none`, `pct`, `unit`), draw value,
/// wait ms, attempt ms, total ms, verdict (`-`: none), give-up reason (`-`), asked ms (`-1`:
/// none), policy fingerprint (decimal), Retry-After values that could not be read, and what the
/// endpoint's pace and breaker said before the attempt (`admitted`) and, on a call's last
/// record, about the retry they refused (`refused`), each as
/// `breaker:breaker_left_ms:at_ms:rate_milli:due:wait_ms` (`breaker` is `none`, `closed`, `open`
/// or `half_open`; `due` in 1/1024 ms; a first part `-`: nothing said). Numbers and names only:
/// never payload bytes, credentials or error text.
pub const DEVICE_FIELDS: [&str; 19] = [
    "key",
    "attempt",
    "op",
    "outcome",
    "status",
    "retry_after_ms",
    "class",
    "draw_kind",
    "draw",
    "wait_ms",
    "attempt_ms",
    "total_ms",
    "verdict",
    "reason",
    "asked_ms",
    "policy",
    "unreadable",
    "admitted",
    "refused",
];

/// Logs one record as a device line (see [`DEVICE_FIELDS`]).
#[cfg(feature = "defmt")]
fn log_record(r: &Record) {
    use crate::classify::Failure;
    use crate::decide::{GiveUp, Verdict};

    let key = r.key.to_hex();
    let (draw_kind, draw_value) = match r.draw {
        None => ("none", 0),
        Some(Draw::Percent(p)) => ("pct", u32::from(p)),
        Some(Draw::Unit(u)) => ("unit", u),
    };
    let (verdict, reason, asked) = match r.verdict {
        None => ("-", "-", -1i64),
        Some(Verdict::GaveUp(g)) => (
            "gave_up",
            g.name(),
            match g {
                GiveUp::RetryAfterTooLong { asked } => i64::from(asked.as_millis()),
                _ => -1,
            },
        ),
        Some(v) => (v.name(), "-", -1),
    };
    let retry_after = r.outcome.retry_after().map_or(-1, |d| i64::from(d.as_millis()));
    let said = |a: Option<Admission>| match a {
        None => ("-", 0, 0, 0, 0, 0),
        Some(a) => (
            a.breaker.map_or("none", |p| p.name()),
            a.breaker_left.as_millis(),
            a.at.as_millis(),
            a.pace.rate_milli,
            a.pace.due,
            a.wait.as_millis(),
        ),
    };
    let (ab, al, aa, ar, ad, aw) = said(r.admitted);
    let (rb, rl, ra, rr, rd, rw) = said(r.refused);
    defmt::info!(
        "wary-ledger v4 {=str} {=u32} {=str} {=str} {=u16} {=i64} {=str} {=str} {=u32} {=u32} {=u32} {=u32} {=str} {=str} {=i64} {=u32} {=u8} {=str}:{=u32}:{=u32}:{=u32}:{=u64}:{=u32} {=str}:{=u32}:{=u32}:{=u32}:{=u64}:{=u32}",
        key.as_str(),
        r.attempt,
        r.op.name(),
        r.outcome.name(),
        r.outcome.code().unwrap_or(0),
        retry_after,
        r.class.name(),
        draw_kind,
        draw_value,
        r.wait.as_millis(),
        r.attempt_time.as_millis(),
        r.total_time.as_millis(),
        verdict,
        reason,
        asked,
        r.policy,
        r.outcome.failure().map_or(0, Failure::unreadable_retry_after),
        ab,
        al,
        aa,
        ar,
        ad,
        aw,
        rb,
        rl,
        ra,
        rr,
        rd,
        rw
    );
}

#[cfg(not(feature = "defmt"))]
fn log_record(_: &Record) {}

/// Reads a device line back into a record: the reader of what the device's ledger logs, for
/// `wary ledger from-defmt`. Whatever precedes the tag on the line (a log level, a timestamp) is
/// skipped. A line of another version is refused with [`LineError::Version`].
///
/// ```
/// use wary::{Duration, Verdict, ledger::parse_device_line};
/// let line = "INFO  wary-ledger v4 00000001c0ffee010000000100000001 1 keyed_write status 503 -1 retry unit 7 120 35 35 - - -1 12345 0 closed:0:0:50:0:0 -:0:0:0:0:0";
/// let r = parse_device_line(line).unwrap();
/// assert_eq!((r.attempt, r.wait, r.verdict), (1, Duration::from_millis(120), None));
/// assert_eq!(r.key.device_part(), 0x0000_0001_c0ff_ee01);
/// assert_eq!(r.admitted.map(|a| a.pace.rate_milli), Some(50));
/// // A version 3 line: it does not say what the pace and the breaker did, so it is refused.
/// let old = parse_device_line("INFO  wary-ledger v3 …").unwrap_err();
/// assert_eq!(
///     old.to_string(),
///     "ledger line version 3 (no record of the pace and the breaker), this wary reads version 4"
/// );
/// ```
pub fn parse_device_line(line: &str) -> Result<Record, LineError> {
    const PREFIX: &str = "wary-ledger v";
    let at = line.find(PREFIX).ok_or(LineError::NotALedgerLine)?;
    let rest = line.get(at.saturating_add(PREFIX.len())..).ok_or(LineError::NotALedgerLine)?;
    let mut fields = rest.split_ascii_whitespace();
    let version = fields.next().ok_or(LineError::NotALedgerLine)?;
    let found: u32 = version.parse().map_err(|_| LineError::NotALedgerLine)?;
    if found != LEDGER_VERSION {
        return Err(LineError::Version { found, expected: LEDGER_VERSION });
    }
    let mut values = [""; 19];
    for (slot, name) in values.iter_mut().zip(DEVICE_FIELDS) {
        *slot = fields.next().ok_or(LineError::Missing(name))?;
    }
    if fields.next().is_some() {
        return Err(LineError::TooManyFields);
    }
    let [
        key,
        attempt,
        op,
        outcome,
        status,
        retry_after,
        class,
        draw_kind,
        draw,
        wait,
        attempt_ms,
        total,
        verdict,
        reason,
        asked,
        policy,
        unreadable,
        admitted,
        refused,
    ] = values;
    fn num<T: core::str::FromStr>(s: &str, name: &'static str) -> Result<T, LineError> {
        s.parse().map_err(|_| LineError::Bad(name))
    }
    fn opt_ms(s: &str, name: &'static str) -> Result<Option<Duration>, LineError> {
        let v: i64 = num(s, name)?;
        Ok(u64::try_from(v).ok().map(Duration::from_millis))
    }
    let retry_after = opt_ms(retry_after, "retry_after_ms")?;
    let fields = crate::forms::Fields {
        key,
        attempt: num(attempt, "attempt")?,
        op,
        outcome,
        status: Some(num::<u16>(status, "status")?).filter(|s| *s != 0),
        retry_after,
        unreadable: num(unreadable, "unreadable")?,
        class,
        draw: match draw_kind {
            "none" => None,
            "pct" => Some(Draw::percent(num(draw, "draw")?).map_err(|_| LineError::Bad("draw"))?),
            "unit" => Some(Draw::Unit(num(draw, "draw")?)),
            _ => return Err(LineError::Bad("draw_kind")),
        },
        wait: Duration::from_millis(num(wait, "wait_ms")?),
        attempt_time: Duration::from_millis(num(attempt_ms, "attempt_ms")?),
        total_time: Duration::from_millis(num(total, "total_ms")?),
        verdict: Some(verdict).filter(|v| *v != "-"),
        reason: Some(reason).filter(|r| *r != "-"),
        asked: opt_ms(asked, "asked_ms")?,
        policy: num(policy, "policy")?,
        admitted: crate::forms::admission_token(admitted, "admitted")?,
        refused: crate::forms::admission_token(refused, "refused")?,
    };
    fields.into_record()
}

/// Attempts per call over many calls, without allocation: a histogram of `B` buckets (the last
/// one holds every call with `B` or more attempts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AttemptStats<const B: usize> {
    counts: [u32; B],
    calls: u32,
    attempts: u64,
    max: u32,
}

impl<const B: usize> Default for AttemptStats<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const B: usize> AttemptStats<B> {
    /// No calls yet.
    pub const fn new() -> Self {
        AttemptStats { counts: [0; B], calls: 0, attempts: 0, max: 0 }
    }

    /// Adds one call that made `attempts` attempts.
    pub fn add(&mut self, attempts: u32) {
        let bucket =
            usize::try_from(attempts.saturating_sub(1)).unwrap_or(usize::MAX).min(B.saturating_sub(1));
        if let Some(c) = self.counts.get_mut(bucket) {
            *c = c.saturating_add(1);
        }
        self.calls = self.calls.saturating_add(1);
        self.attempts = self.attempts.saturating_add(u64::from(attempts));
        self.max = self.max.max(attempts);
    }

    /// Calls counted.
    pub const fn calls(&self) -> u32 {
        self.calls
    }

    /// Attempts counted.
    pub const fn attempts(&self) -> u64 {
        self.attempts
    }

    /// The most attempts any call made.
    pub const fn max(&self) -> u32 {
        self.max
    }

    /// Mean attempts per call, in thousandths (1400 is 1.4: failing a third of the time and
    /// hiding it). 0 with no calls.
    pub fn mean_milli(&self) -> u64 {
        self.attempts.saturating_mul(1000).checked_div(u64::from(self.calls)).unwrap_or(0)
    }

    /// The `p`th percentile of attempts per call (nearest rank); `B` stands for "`B` or more".
    pub fn percentile(&self, p: u8) -> u32 {
        let p = u64::from(p.min(100));
        // Nearest rank: the smallest value with at least ⌈p·n/100⌉ calls at or below it.
        let rank = u64::from(self.calls).saturating_mul(p).saturating_add(99) / 100;
        let mut seen: u64 = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(u64::from(*c));
            if seen >= rank.max(1) {
                return u32::try_from(i).unwrap_or(u32::MAX).saturating_add(1);
            }
        }
        0
    }

    /// Calls with exactly `attempts` attempts (the last bucket: that many or more).
    pub fn count(&self, attempts: u32) -> u32 {
        usize::try_from(attempts.saturating_sub(1))
            .ok()
            .and_then(|i| self.counts.get(i))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Class, Failure, Key, Operation, Outcome, Verdict};

    fn rec(attempt: u32, verdict: Option<Verdict>) -> Record {
        Record {
            key: Key::from_parts(1, 2, 3),
            attempt,
            op: Operation::KeyedWrite,
            outcome: Outcome::status(503),
            class: Class::Retry,
            draw: Some(Draw::ZERO),
            wait: Duration::from_millis(10),
            attempt_time: Duration::from_millis(5),
            total_time: Duration::from_millis(15),
            verdict,
            policy: 0,
            admitted: None,
            refused: None,
        }
    }

    #[test]
    fn ring_keeps_the_last_n_and_stats_count_every_call() {
        let mut l = Ledger::<3>::new();
        for call in 0..4 {
            l.record(&rec(1, None));
            l.record(&rec(2, Some(if call == 3 { Verdict::Failed } else { Verdict::Ok })));
        }
        assert_eq!(l.records().count(), 3);
        assert_eq!(l.last().unwrap().verdict, Some(Verdict::Failed));
        assert_eq!(l.stats().calls(), 4);
        assert_eq!(l.stats().mean_milli(), 2000);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut s = AttemptStats::<4>::new();
        assert_eq!(s.percentile(95), 0);
        for _ in 0..95 {
            s.add(1);
        }
        for _ in 0..5 {
            s.add(9);
        }
        assert_eq!(s.percentile(95), 1);
        assert_eq!(s.percentile(96), 4); // the overflow bucket: 4 or more
        assert_eq!(s.max(), 9);
        assert_eq!(s.count(4), 5);
        assert_eq!(s.percentile(50), 1);
        assert_eq!(s.mean_milli(), 1400);
    }

    #[test]
    fn the_device_tag_carries_the_version_and_the_logged_line_starts_with_it() {
        assert_eq!(DEVICE_TAG, format!("wary-ledger v{LEDGER_VERSION}"));
        // The defmt format string is a literal; it must begin with the same tag.
        let src = include_str!("ledger.rs");
        assert!(src.contains(&format!("\"{DEVICE_TAG} {{=str}}")));
    }

    #[test]
    fn device_lines_read_back_every_field_and_refuse_what_is_not_one() {
        let line = "0.1 INFO wary-ledger v4 f00d00010a3860010000000100000002 3 keyed_write status 429 2000 retry pct 50 0 12 900 gave_up retry_after_too_long 2000 305419896 2 half_open:0:880:50:2048:2 -:0:0:0:0:0";
        let r = parse_device_line(line).unwrap();
        assert_eq!(r.key, Key::from_parts(0xf00d_0001_0a38_6001, 1, 2));
        assert_eq!((r.attempt, r.op, r.class), (3, Operation::KeyedWrite, Class::Retry));
        let asked = Some(Duration::from_millis(2000));
        assert_eq!(
            r.outcome,
            Outcome::Failure(Failure::Status { code: 429, retry_after: asked, unreadable: 2 })
        );
        assert_eq!(r.draw, Some(Draw::Percent(50)));
        assert_eq!(
            (r.wait, r.attempt_time, r.total_time),
            (Duration::ZERO, Duration::from_millis(12), Duration::from_millis(900))
        );
        assert_eq!(
            r.verdict,
            Some(Verdict::GaveUp(crate::GiveUp::RetryAfterTooLong { asked: Duration::from_millis(2000) }))
        );
        assert_eq!(r.policy, 0x1234_5678);
        let admitted = crate::ledger::Admission {
            at: Duration::from_millis(880),
            pace: crate::PaceView { rate_milli: 50, due: 2048 },
            wait: Duration::from_millis(2),
            breaker: Some(crate::Phase::HalfOpen),
            breaker_left: Duration::ZERO,
        };
        assert_eq!((r.admitted, r.refused), (Some(admitted), None));
        let refused = line.replace("-:0:0:0:0:0", "open:1500:902:0:0:0");
        let r = parse_device_line(&refused).unwrap();
        assert_eq!(
            r.refused.map(|a| (a.breaker, a.breaker_left, a.at)),
            Some((Some(crate::Phase::Open), Duration::from_millis(1_500), Duration::from_millis(902)))
        );
        let no_breaker = parse_device_line(&line.replace("half_open:", "none:")).unwrap();
        assert_eq!(no_breaker.admitted.map(|a| a.breaker), Some(None));
        for bad in ["ajar:0:0:0:0:0", "closed:0:0:0:0", "closed:0:0:0:0:0:0", "closed:x:0:0:0:0"] {
            assert_eq!(
                parse_device_line(&line.replace("half_open:0:880:50:2048:2", bad)),
                Err(LineError::Bad("admitted")),
                "{bad}"
            );
        }
        let ok = "wary-ledger v4 000000000a3860010000000100000002 1 read reset 0 -1 retry none 0 0 1 1 - - -1 7 0 - -";
        assert!(parse_device_line(ok).is_ok());
        assert_eq!(parse_device_line("hello"), Err(LineError::NotALedgerLine));
        // Older and newer lines are refused by their version, with the reason.
        for (found, why) in [
            (1, "ledger line version 1 (times were ticks and seconds), this wary reads version 4"),
            (2, "ledger line version 2 (keys held a 32-bit device id), this wary reads version 4"),
            (3, "ledger line version 3 (no record of the pace and the breaker), this wary reads version 4"),
            (5, "ledger line version 5 (a newer format), this wary reads version 4"),
        ] {
            let e = parse_device_line(&ok.replace("v4", &format!("v{found}"))).unwrap_err();
            assert_eq!(e, LineError::Version { found, expected: LEDGER_VERSION });
            assert_eq!(e.to_string(), why);
        }
        assert_eq!(parse_device_line(&ok.replace(" 7 0 - -", "")), Err(LineError::Missing("policy")));
        assert_eq!(parse_device_line(&ok.replace(" 7 0 - -", " 7")), Err(LineError::Missing("unreadable")));
        assert_eq!(parse_device_line(&ok.replace(" 7 0 - -", " 7 0 -")), Err(LineError::Missing("refused")));
        assert_eq!(parse_device_line(&ok.replace(" 7 0", " 7 256")), Err(LineError::Bad("unreadable")));
        assert_eq!(parse_device_line(&format!("{ok} 8")), Err(LineError::TooManyFields));
        assert_eq!(parse_device_line(&ok.replace("read", "peek")), Err(LineError::Bad("op")));
        assert_eq!(parse_device_line(&ok.replace("reset", "boom")), Err(LineError::Bad("outcome")));
        assert_eq!(parse_device_line(&ok.replace("none 0", "pct 100")), Err(LineError::Bad("draw")));
        assert_eq!(parse_device_line(&ok.replace(" 1 read", " x read")), Err(LineError::Bad("attempt")));
        // A status outcome needs its status.
        let no_status = ok.replace("reset 0", "status 0");
        assert_eq!(parse_device_line(&no_status), Err(LineError::Missing("status")));
    }
}
