//! The attempt ledger: one record per attempt, and attempts per call as the health signal.
//!
//! A third-attempt success is a yellow flag nobody sees when only outcomes are logged:
//! the ledger keeps every attempt. A record holds classes, numbers and the key only —
//! never payload bytes, credentials or raw error text. On the device the ring keeps the last
//! `N` records and each is logged with defmt; on a host the same records become JSON lines.
//! Each record carries the draw and a fingerprint of the policy, so a call can be replayed.
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

use crate::Verdict;
use crate::backoff::Draw;
use crate::classify::{Class, Operation, Outcome};
use crate::key::Key;

/// One attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record {
    /// The call's idempotency key (also identifies reads' calls).
    pub key: Key,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// The call's operation.
    pub op: Operation,
    /// What the attempt returned (status and Retry-After included).
    pub outcome: Outcome,
    /// Its class.
    pub class: Class,
    /// The draw used for the wait after it, if the call retried.
    pub draw: Option<Draw>,
    /// The wait after it, in ticks (0 if the call ended).
    pub wait: u64,
    /// How long the attempt took, in ticks.
    pub attempt_ticks: u64,
    /// The call's time so far, in ticks, at the end of this attempt.
    pub total_ticks: u64,
    /// The verdict, on the call's last record.
    pub verdict: Option<Verdict>,
    /// [`crate::Policy::fingerprint`] of the policy that decided.
    pub policy: u32,
}

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

/// The tag that starts a device ledger line; `wary ledger from-defmt` looks for it.
pub const DEFMT_TAG: &str = "wary-ledger v1";

/// Logs one record as a device ledger line: the tag, then sixteen space-separated fields —
/// key (hex), attempt, op, outcome kind, status (0: none), Retry-After seconds (`-1`: none),
/// class, draw kind (`none`, `pct`, `unit`), draw value, wait, attempt ticks, total ticks,
/// verdict (`-`: none), give-up reason (`-`), asked ticks (`-1`: none), policy fingerprint.
/// Numbers and names only: never payload bytes, credentials or error text.
#[cfg(feature = "defmt")]
fn log_record(r: &Record) {
    let key = r.key.to_hex();
    let (draw_kind, draw_value) = match r.draw {
        None => ("none", 0),
        Some(d) => match (d.as_percent(), d.as_unit()) {
            (Some(p), _) => ("pct", u32::from(p)),
            (None, u) => ("unit", u.unwrap_or(0)),
        },
    };
    let (verdict, reason, asked) = match r.verdict {
        None => ("-", "-", -1i64),
        Some(crate::Verdict::GaveUp(g)) => (
            "gave_up",
            g.name(),
            match g {
                crate::GiveUp::RetryAfterTooLong { asked } => i64::try_from(asked).unwrap_or(i64::MAX),
                _ => -1,
            },
        ),
        Some(v) => (v.name(), "-", -1),
    };
    let retry_after = r.outcome.retry_after().map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX));
    defmt::info!(
        "wary-ledger v1 {=str} {=u32} {=str} {=str} {=u16} {=i64} {=str} {=str} {=u32} {=u64} {=u64} {=u64} {=str} {=str} {=i64} {=u32}",
        key.as_str(),
        r.attempt,
        r.op.name(),
        r.outcome.kind_name(),
        r.outcome.code().unwrap_or(0),
        retry_after,
        r.class.name(),
        draw_kind,
        draw_value,
        r.wait,
        r.attempt_ticks,
        r.total_ticks,
        verdict,
        reason,
        asked,
        r.policy
    );
}

#[cfg(not(feature = "defmt"))]
fn log_record(_: &Record) {}

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

    fn rec(attempt: u32, verdict: Option<Verdict>) -> Record {
        Record {
            key: Key::from_parts(1, 2, 3),
            attempt,
            op: Operation::KeyedWrite,
            outcome: Outcome::status(503),
            class: Class::Retry,
            draw: Some(Draw::ZERO),
            wait: 10,
            attempt_ticks: 5,
            total_ticks: 15,
            verdict,
            policy: 0,
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
}
