//! A policy: a classification table, a backoff, Retry-After handling and the stop rules.
//! Built once and checked when built, so a bad setting is refused before any call runs.
//!
//! This file holds `Policy`'s settings: the builder and its checks, the accessors, and what is
//! worked out once when a policy is built (the cap shift, the fingerprint). The decision is
//! `impl Policy` in `decide.rs`.
//!
//! ```
//! use wary::{Duration, Jitter, Policy, PolicyError, Preset};
//! let ms = Duration::from_millis;
//! // 100 ms base, 2 s cap, 5 s of waiting per call at most.
//! let p = Policy::builder(Preset::Default).base(ms(100)).cap(ms(2_000)).budget(ms(5_000)).build().unwrap();
//! assert_eq!(p.max_retries(), Some(8));
//! // Full jitter can draw waits of 0, so the budget alone does not bound the attempts.
//! let e = Policy::builder(Preset::Default).jitter(Jitter::Full).build();
//! assert_eq!(e, Err(PolicyError::Unbounded));
//! ```

use crate::backoff::{Backoff, Jitter};
use crate::classify::Table;
use crate::error::PolicyError;
use crate::fingerprint::Fnv;
use crate::names::named_enum;
use crate::retry_after::{Ambiguous, Rules};
use crate::time::Duration;
use crate::version::POLICY_ENCODING;

named_enum! {
    /// A starting point for a policy.
    pub enum Preset {
        /// wary's default: the default table, equal jitter, both Retry-After forms, callers told the
        /// same Retry-After spread past it. Base 100 ms, cap 10 s, budget 30 s.
        Default => "default",
        /// The basic table (429 for any operation; every 5xx and a timeout if idempotent, else
        /// unknown; every other status fails), equal jitter, and a Retry-After waited exactly:
        /// `max(wait, retry_after)`. `wary plan` answers under it. Base 2 s, cap 60 s, budget 120 s.
        Basic => "basic",
        /// Strict: only reads retried, integer-second Retry-After only, duplicates refused, three
        /// attempts, no jitter. Base 100 ms, cap 400 ms, budget 300 ms.
        Strict => "strict",
        /// A CoAP confirmable message's retransmission schedule (RFC 7252 section 4.8): the CoAP
        /// table ([`crate::coap::TABLE`]), the first timeout drawn once in [2, 3] s and doubled
        /// ([`Jitter::Coap`]), five transmissions (MAX_RETRANSMIT 4), MAX_TRANSMIT_SPAN (45 s)
        /// of waiting, a Max-Age waited exactly. Base 2 s, cap 16 s, budget 45 s.
        Coap => "coap",
    }
}

named_enum! {
    /// How a Retry-After combines with the backoff's own wait. Either way it raises the wait and
    /// never lowers it.
    pub enum RetryAfterMode {
        /// `max(wait, retry_after)`: exactly what the server asked, if longer than the backoff.
        Max => "max",
        /// `max(wait, retry_after + draw·ceiling)`: clients told the same value do not all come
        /// back in the same instant.
        Spread => "spread",
    }
}

/// A checked retry policy. Small and `Copy`: keep one in flash as a `const`.
///
/// With the `serde` feature it reads and writes every setting, status rules included, and a
/// policy read back is checked as [`PolicyBuilder::build`] checks it.
///
/// Held in the form the decision reads fastest: a limit that is not set is stored as the
/// largest value of its type (which [`PolicyBuilder::build`] refuses as a setting), so each stop
/// rule is one comparison, and the retry at which the backoff reaches its cap is worked out
/// once, when the policy is built.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    pub(crate) table: Table,
    pub(crate) backoff: Backoff,
    pub(crate) budget: Duration,
    /// [`Duration::MAX`]: no deadline.
    pub(crate) deadline: Duration,
    /// `u32::MAX`: no cap (a call counts no further).
    pub(crate) max_attempts: u32,
    pub(crate) min_attempt: Duration,
    /// [`Duration::MAX`]: no limit beyond the budget and the deadline.
    pub(crate) max_retry_after: Duration,
    pub(crate) retry_after_mode: RetryAfterMode,
    /// The first doubling (retry `k` doubles `k − 1` times) whose ceiling is the cap, found
    /// once by [`Policy::with_cap_shift`]; `u32::MAX` for a base of 0, which never grows.
    pub(crate) cap_shift: u32,
    pub(crate) retry_after_rules: Rules,
    /// [`Policy::fingerprint`], worked out once by [`Policy::settled`] (0 in a builder).
    pub(crate) fingerprint: u32,
}

impl core::fmt::Debug for Policy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Policy")
            .field("table", &self.table)
            .field("backoff", &self.backoff)
            .field("budget", &self.budget)
            .field("deadline", &self.deadline())
            .field("max_attempts", &self.max_attempts())
            .field("min_attempt", &self.min_attempt)
            .field("max_retry_after", &self.max_retry_after())
            .field("retry_after_mode", &self.retry_after_mode)
            .field("retry_after_rules", &self.retry_after_rules)
            .finish()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Policy {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "Policy {{ backoff: {}, budget: {}, deadline: {}, max_attempts: {}, min_attempt: {}, max_retry_after: {}, retry_after_mode: {}, fingerprint: {=u32:#010x} }}",
            self.backoff,
            self.budget,
            self.deadline(),
            self.max_attempts(),
            self.min_attempt,
            self.max_retry_after(),
            self.retry_after_mode,
            self.fingerprint()
        )
    }
}

/// A limit that is set, or `None` for the sentinel that stands for none.
const fn set(d: Duration) -> Option<Duration> {
    if d.is_max() { None } else { Some(d) }
}

/// Builds a [`Policy`]; [`PolicyBuilder::build`] refuses bad settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use]
pub struct PolicyBuilder {
    pub(crate) p: Policy,
    /// A deadline was asked for (even the saturated one, which `build` refuses).
    deadline_set: bool,
    /// A Retry-After limit was asked for (likewise).
    max_retry_after_set: bool,
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Policy {
    /// A builder starting from `preset`.
    pub const fn builder(preset: Preset) -> PolicyBuilder {
        let p = match preset {
            Preset::Default => Policy {
                table: Table::DEFAULT,
                backoff: Backoff::new(ms(100), ms(10_000), Jitter::Equal),
                budget: ms(30_000),
                deadline: Duration::MAX,
                max_attempts: u32::MAX,
                min_attempt: Duration::ZERO,
                max_retry_after: Duration::MAX,
                retry_after_mode: RetryAfterMode::Spread,
                cap_shift: 0,
                fingerprint: 0,
                retry_after_rules: Rules::LENIENT,
            },
            Preset::Basic => Policy {
                table: Table::BASIC,
                backoff: Backoff::new(ms(2_000), ms(60_000), Jitter::Equal),
                budget: ms(120_000),
                deadline: Duration::MAX,
                max_attempts: u32::MAX,
                min_attempt: Duration::ZERO,
                max_retry_after: Duration::MAX,
                retry_after_mode: RetryAfterMode::Max,
                cap_shift: 0,
                fingerprint: 0,
                retry_after_rules: Rules::LENIENT,
            },
            Preset::Strict => Policy {
                table: Table::STRICT,
                backoff: Backoff::new(ms(100), ms(400), Jitter::None),
                budget: ms(300),
                deadline: Duration::MAX,
                max_attempts: 3,
                min_attempt: Duration::ZERO,
                max_retry_after: Duration::MAX,
                retry_after_mode: RetryAfterMode::Max,
                cap_shift: 0,
                fingerprint: 0,
                retry_after_rules: Rules::STRICT,
            },
            Preset::Coap => {
                let rfc = crate::coap::Parameters::RFC7252;
                Policy {
                    table: crate::coap::TABLE,
                    backoff: Backoff::new(rfc.ack_timeout, rfc.last_ceiling(), Jitter::Coap),
                    budget: rfc.max_transmit_span(),
                    deadline: Duration::MAX,
                    max_attempts: rfc.transmissions(),
                    min_attempt: Duration::ZERO,
                    max_retry_after: Duration::MAX,
                    retry_after_mode: RetryAfterMode::Max,
                    cap_shift: 0,
                    fingerprint: 0,
                    // Max-Age is whole seconds; an HTTP Retry-After read under this policy is too.
                    retry_after_rules: Rules::STRICT,
                }
            }
        };
        PolicyBuilder { p, deadline_set: false, max_retry_after_set: false }
    }

    /// A builder starting from this policy's settings.
    pub const fn to_builder(&self) -> PolicyBuilder {
        // A builder holds settings only: what `build` works out from them is left to it.
        PolicyBuilder {
            p: Policy { cap_shift: 0, fingerprint: 0, ..*self },
            deadline_set: !self.deadline.is_max(),
            max_retry_after_set: !self.max_retry_after.is_max(),
        }
    }

    /// The classification table.
    pub const fn table(&self) -> &Table {
        &self.table
    }

    /// The backoff.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The wait budget per call: the most the waits between attempts may add up to.
    pub const fn budget(&self) -> Duration {
        self.budget
    }

    /// The deadline per call, from the call's start, counting attempt time.
    pub const fn deadline(&self) -> Option<Duration> {
        set(self.deadline)
    }

    /// The attempt cap (the first attempt included).
    pub const fn max_attempts(&self) -> Option<u32> {
        if self.max_attempts == u32::MAX { None } else { Some(self.max_attempts) }
    }

    /// The shortest time an attempt takes: a wait is not started if an attempt after it could
    /// not finish before the deadline.
    pub const fn min_attempt(&self) -> Duration {
        self.min_attempt
    }

    /// The longest single wait the caller accepts from a server's Retry-After, if limited
    /// beyond the remaining budget.
    pub const fn max_retry_after(&self) -> Option<Duration> {
        set(self.max_retry_after)
    }

    /// How a Retry-After combines with the backoff.
    pub const fn retry_after_mode(&self) -> RetryAfterMode {
        self.retry_after_mode
    }

    /// Which Retry-After values are accepted.
    pub const fn retry_after_rules(&self) -> &Rules {
        &self.retry_after_rules
    }

    /// The most retries this policy can make on one call, whatever the draws: the attempt cap,
    /// or how many of the shortest waits fit in the budget (and the deadline), whichever is
    /// less. `None` if nothing bounds them (only possible with no floor on the waits and no
    /// cap, which [`PolicyBuilder::build`] refuses).
    pub const fn max_retries(&self) -> Option<u32> {
        let by_cap = match self.max_attempts() {
            Some(n) => Some(n.saturating_sub(1)),
            None => None,
        };
        let limit = match self.deadline() {
            Some(d) => d.min(self.budget),
            None => self.budget,
        };
        let by_time = self.retries_within(limit);
        match (by_cap, by_time) {
            (Some(a), Some(b)) => Some(if a < b { a } else { b }),
            (Some(a), None) => Some(a),
            (None, b) => b,
        }
    }

    /// How many retries of the shortest possible waits fit in `limit` of waiting (each
    /// retry also costs `min_attempt` against a deadline; counted only when it is the limit).
    const fn retries_within(&self, limit: Duration) -> Option<u32> {
        let per_attempt = match self.deadline() {
            Some(d) if d.as_millis() <= self.budget.as_millis() => self.min_attempt,
            _ => Duration::ZERO,
        };
        let mut spent = Duration::ZERO;
        let mut previous = Duration::ZERO;
        let mut k: u32 = 1;
        // While the ceiling still grows (at most 32 doublings), count one retry at a time; once
        // it is at the cap every further retry costs the same, so divide.
        loop {
            let wait = self.backoff.min_wait(k, previous);
            let cost = wait.saturating_add(per_attempt);
            let at_cap = self.backoff.ceiling(k).as_millis() >= self.backoff.cap.as_millis()
                && !matches!(self.backoff.jitter, Jitter::Decorrelated);
            if at_cap || k >= 33 {
                let more = match limit.saturating_sub(spent).as_millis().checked_div(cost.as_millis()) {
                    Some(n) => n,
                    // Waits of 0 at the cap: the budget never runs out.
                    None => return None,
                };
                return Some(k.saturating_sub(1).saturating_add(more));
            }
            if spent.saturating_add(cost).as_millis() > limit.as_millis() {
                return Some(k.saturating_sub(1));
            }
            spent = spent.saturating_add(cost);
            previous = wait;
            k = k.saturating_add(1);
        }
    }

    /// True if a plan of `capacity` waits holds every retry this policy can make.
    pub const fn fits(&self, capacity: usize) -> bool {
        match self.max_retries() {
            Some(n) => (n as usize) <= capacity,
            None => false,
        }
    }

    /// A 32-bit fingerprint of every setting, recorded in ledgers so a replay can tell that a
    /// record was made under another policy (FNV-1a over the settings in a fixed, explicit
    /// encoding, so a device and a laptop agree; not cryptographic). It starts with the version
    /// of that encoding (`POLICY_ENCODING`), which changes when a setting is added or encoded
    /// otherwise; a change of the ledger's line format that leaves the settings alone (version
    /// 3's key layout) keeps every fingerprint. Worked out once, when the policy is built:
    /// reading it costs nothing per record.
    pub const fn fingerprint(&self) -> u32 {
        self.fingerprint
    }

    /// Works out [`Policy::fingerprint`] from the settings.
    const fn fingerprint_of_settings(&self) -> u32 {
        let mut h = Fnv::new();
        h.u32(POLICY_ENCODING);
        h.u32(self.backoff.base.as_millis());
        h.u32(self.backoff.cap.as_millis());
        h.u8(self.backoff.jitter as u8);
        h.u32(self.budget.as_millis());
        h.opt_u32(match self.deadline() {
            Some(d) => Some(d.as_millis()),
            None => None,
        });
        h.opt_u32(self.max_attempts());
        h.u32(self.min_attempt.as_millis());
        h.opt_u32(match self.max_retry_after() {
            Some(d) => Some(d.as_millis()),
            None => None,
        });
        h.u8(self.retry_after_mode as u8);
        h.u8(self.retry_after_rules.accept_dates as u8);
        h.u8(match self.retry_after_rules.ambiguous {
            Ambiguous::Reject => 0,
            Ambiguous::Longest => 1,
        });
        self.table.fingerprint_into(&mut h);
        h.finish()
    }
}

impl PolicyBuilder {
    /// The first ceiling.
    pub const fn base(mut self, base: Duration) -> Self {
        self.p.backoff.base = base;
        self
    }

    /// The largest ceiling.
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.p.backoff.cap = cap;
        self
    }

    /// The jitter.
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.p.backoff.jitter = jitter;
        self
    }

    /// The wait budget per call.
    pub const fn budget(mut self, budget: Duration) -> Self {
        self.p.budget = budget;
        self
    }

    /// A deadline per call from its start, counting the time attempts take.
    pub const fn deadline(mut self, deadline: Duration) -> Self {
        self.p.deadline = deadline;
        self.deadline_set = true;
        self
    }

    /// No deadline.
    pub const fn no_deadline(mut self) -> Self {
        self.p.deadline = Duration::MAX;
        self.deadline_set = false;
        self
    }

    /// The attempt cap, the first attempt included. `u32::MAX`, the most attempts a call
    /// counts, is the same as no cap.
    pub const fn max_attempts(mut self, n: u32) -> Self {
        self.p.max_attempts = n;
        self
    }

    /// No attempt cap.
    pub const fn unlimited_attempts(mut self) -> Self {
        self.p.max_attempts = u32::MAX;
        self
    }

    /// The shortest time an attempt takes, for the deadline check.
    pub const fn min_attempt(mut self, d: Duration) -> Self {
        self.p.min_attempt = d;
        self
    }

    /// The longest single Retry-After wait accepted; a longer one gives up at once even if the
    /// budget could hold it: the server wants longer than the caller will wait.
    pub const fn max_retry_after(mut self, d: Duration) -> Self {
        self.p.max_retry_after = d;
        self.max_retry_after_set = true;
        self
    }

    /// No limit on a single Retry-After beyond the budget and the deadline.
    pub const fn no_max_retry_after(mut self) -> Self {
        self.p.max_retry_after = Duration::MAX;
        self.max_retry_after_set = false;
        self
    }

    /// How a Retry-After combines with the backoff.
    pub const fn retry_after_mode(mut self, mode: RetryAfterMode) -> Self {
        self.p.retry_after_mode = mode;
        self
    }

    /// Which Retry-After values are accepted.
    pub const fn retry_after_rules(mut self, rules: Rules) -> Self {
        self.p.retry_after_rules = rules;
        self
    }

    /// The classification table.
    pub const fn table(mut self, table: Table) -> Self {
        self.p.table = table;
        self
    }

    /// Checks every setting and returns the policy.
    pub const fn build(self) -> Result<Policy, PolicyError> {
        let p = self.p;
        if p.backoff.base.as_millis() == 0 {
            return Err(PolicyError::ZeroBase);
        }
        if p.backoff.cap.as_millis() < p.backoff.base.as_millis() {
            return Err(PolicyError::CapBelowBase);
        }
        if p.budget.as_millis() == 0 {
            return Err(PolicyError::ZeroBudget);
        }
        if self.deadline_set {
            let d = p.deadline;
            if d.as_millis() == 0 {
                return Err(PolicyError::ZeroDeadline);
            }
            if p.min_attempt.as_millis() > d.as_millis() {
                return Err(PolicyError::AttemptPastDeadline);
            }
            // The saturated value is the sentinel for no deadline: it cannot be one.
            if d.is_max() {
                return Err(PolicyError::TooLarge);
            }
        }
        if p.max_attempts == 0 {
            return Err(PolicyError::ZeroAttempts);
        }
        if self.max_retry_after_set && p.max_retry_after.is_max() {
            return Err(PolicyError::TooLarge);
        }
        // A saturated duration stands for "longer than wary counts": it cannot bound a call.
        if p.backoff.cap.is_max() || p.budget.is_max() || p.min_attempt.is_max() {
            return Err(PolicyError::TooLarge);
        }
        if p.max_retries().is_none() {
            return Err(PolicyError::Unbounded);
        }
        Ok(p.settled())
    }
}

impl Policy {
    /// This policy with what the decision and the ledger read worked out from its settings:
    /// the cap shift ([`Policy::with_cap_shift`]) and the fingerprint.
    pub(crate) const fn settled(self) -> Policy {
        let mut p = self.with_cap_shift();
        p.fingerprint = p.fingerprint_of_settings();
        p
    }

    /// This policy with its cap shift worked out from its base and cap: the fewest
    /// doublings of the base that reach the cap or pass 32 bits (at most 32), after which every
    /// ceiling is the cap; a base of 0 (only in a plan of unchecked settings) never grows.
    pub(crate) const fn with_cap_shift(mut self) -> Policy {
        let (base, cap) = (self.backoff.base.as_millis() as u64, self.backoff.cap.as_millis() as u64);
        self.cap_shift = if base == 0 {
            u32::MAX
        } else {
            // A base of at least 1 doubled 32 times passes any 32-bit cap: the loop ends by then.
            let mut shift = 0u32;
            while (base << shift) < cap {
                shift = shift.wrapping_add(1);
            }
            shift
        };
        self
    }
}

/// A policy known at compile time, for plans whose capacity is checked by the compiler.
///
/// ```
/// use wary::{Duration, Policy, Preset, StaticPolicy};
/// struct Basic;
/// impl StaticPolicy for Basic {
///     const POLICY: Policy = match Policy::builder(Preset::Basic)
///         .base(Duration::from_millis(2))
///         .cap(Duration::from_millis(60))
///         .budget(Duration::from_millis(120))
///         .build()
///     {
///         Ok(p) => p,
///         Err(_) => panic!("invalid policy"),
///     };
/// }
/// // Seven retries at most: 1 + 2 + 4 + 8 + 16 + 30 + 30 = 91, and another 30 passes 120.
/// assert_eq!(Basic::MAX_RETRIES, 7);
/// ```
pub trait StaticPolicy {
    /// The policy.
    const POLICY: Policy;
    /// The most retries the policy can make; a compile error if nothing bounds them.
    const MAX_RETRIES: usize = match Self::POLICY.max_retries() {
        Some(n) => n as usize,
        None => panic!("this policy does not bound its retries"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rule, Transport};

    /// The fingerprint of [`basic`]'s policy in this encoding; a change here breaks replays of
    /// ledgers made before it.
    const FINGERPRINT_BASIC: u32 = 0xe6a2_674b;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The largest duration a policy accepts: one below the saturated [`Duration::MAX`].
    const LONGEST: u64 = u32::MAX as u64 - 1;

    fn basic() -> PolicyBuilder {
        Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120))
    }

    #[test]
    fn the_budget_bounds_the_attempts_seven_retries_of_base_2_cap_60_in_120() {
        // Draws of 0: 1, 2, 4, 8, 16, 30, 30 = 91; the next 30 would pass 120.
        assert_eq!(basic().build().unwrap().max_retries(), Some(7));
        assert_eq!(basic().budget(ms(91)).build().unwrap().max_retries(), Some(7));
        assert_eq!(basic().budget(ms(90)).build().unwrap().max_retries(), Some(6));
        assert_eq!(basic().budget(ms(121)).build().unwrap().max_retries(), Some(8));
        assert_eq!(basic().max_attempts(4).build().unwrap().max_retries(), Some(3));
        // Once at the cap, the count is a division, not a loop over a million retries.
        let big = basic().budget(ms(30_000_031)).build().unwrap();
        assert_eq!(big.max_retries(), Some(5 + 1_000_000));
        // The longest budget: 31 ms for the first five, then (4294967294 − 31) / 30 at the cap.
        let huge = basic().budget(ms(LONGEST)).build().unwrap();
        assert_eq!(huge.max_retries(), Some(5 + 143_165_575));
    }

    #[test]
    fn coap_jitter_near_the_cap_still_bounds_the_retries() {
        // With a first draw of 8 % the waits are 1,976, 3,952, 7,904 and 10,537 ms (24.4 s in
        // all, within the 28.4 s budget): four retries. Bounded by the draws at 0 (1.9, 3.8, 7.6
        // and 15.2 s), the budget seemed to hold three.
        let p = Policy::builder(Preset::Default)
            .base(ms(1_900))
            .cap(ms(10_537))
            .budget(ms(28_384))
            .jitter(Jitter::Coap)
            .build()
            .unwrap();
        assert_eq!(p.max_retries(), Some(4));
    }

    #[test]
    fn deadline_with_attempt_time_bounds_too() {
        let p = basic().deadline(ms(20)).min_attempt(ms(2)).build().unwrap();
        // Costs 1+2, 2+2, 4+2, 8+2 = 21 > 20: three retries.
        assert_eq!(p.max_retries(), Some(3));
    }

    #[test]
    fn bad_policies_are_refused_when_built() {
        assert_eq!(basic().base(ms(0)).build(), Err(PolicyError::ZeroBase));
        assert_eq!(basic().cap(ms(1)).build(), Err(PolicyError::CapBelowBase));
        assert_eq!(basic().budget(ms(0)).build(), Err(PolicyError::ZeroBudget));
        assert_eq!(basic().deadline(ms(0)).build(), Err(PolicyError::ZeroDeadline));
        assert_eq!(basic().max_attempts(0).build(), Err(PolicyError::ZeroAttempts));
        assert_eq!(basic().deadline(ms(5)).min_attempt(ms(6)).build(), Err(PolicyError::AttemptPastDeadline));
        assert_eq!(basic().budget(ms(LONGEST + 1)).build(), Err(PolicyError::TooLarge));
        assert_eq!(basic().cap(ms(u64::MAX)).build(), Err(PolicyError::TooLarge));
        assert_eq!(basic().jitter(Jitter::Full).build(), Err(PolicyError::Unbounded));
        // Equal jitter with a cap of 1 ms: every wait can be 0.
        assert_eq!(basic().base(ms(1)).cap(ms(1)).build(), Err(PolicyError::Unbounded));
        assert!(basic().jitter(Jitter::Full).max_attempts(5).build().is_ok());
        assert!(basic().jitter(Jitter::Decorrelated).build().is_ok());
    }

    #[test]
    fn fingerprint_changes_with_any_setting() {
        let a = basic().build().unwrap();
        assert_eq!(a.fingerprint(), basic().build().unwrap().fingerprint());
        assert_ne!(a.fingerprint(), basic().budget(ms(121)).build().unwrap().fingerprint());
        assert_ne!(a.fingerprint(), basic().jitter(Jitter::None).build().unwrap().fingerprint());
        let t = Table::BASIC.with_status(503, Rule::RetryAny).unwrap();
        assert_ne!(a.fingerprint(), basic().table(t).build().unwrap().fingerprint());
        // Pinned: the encoding is fixed, so a device's ledger replays on any host.
        assert_eq!(a.fingerprint(), FINGERPRINT_BASIC);
    }

    #[test]
    fn presets_build() {
        for preset in Preset::ALL {
            let p = Policy::builder(preset).build().unwrap();
            assert!(p.max_retries().is_some(), "{preset:?}");
            assert_eq!(Preset::from_name(preset.name()), Some(preset));
        }
        // Strict: .1 + .2 fit a .3 s budget, .4 would not; and three attempts at most.
        assert_eq!(Policy::builder(Preset::Strict).build().unwrap().max_retries(), Some(2));
    }

    #[test]
    fn a_deadline_bounds_the_retries_when_it_is_nearer_than_the_budget() {
        // Shortest waits 1, 2, 4, 8, 16: sums 1, 3, 7, 15, 31.
        assert_eq!(basic().budget(ms(20)).deadline(ms(15)).build().unwrap().max_retries(), Some(4));
        assert_eq!(basic().budget(ms(20)).deadline(ms(14)).build().unwrap().max_retries(), Some(3));
        assert_eq!(basic().budget(ms(20)).deadline(ms(19)).build().unwrap().max_retries(), Some(4));
        // Attempt time counts against a deadline no farther than the budget…
        assert_eq!(
            basic().budget(ms(20)).deadline(ms(20)).min_attempt(ms(2)).build().unwrap().max_retries(),
            Some(3)
        );
        // …and not when the budget is the nearer limit.
        assert_eq!(
            basic().budget(ms(20)).deadline(ms(21)).min_attempt(ms(2)).build().unwrap().max_retries(),
            Some(4)
        );
        // At the cap the count is a division: (211 − 91) / 30 = 4 more after the first seven.
        assert_eq!(basic().budget(ms(211)).build().unwrap().max_retries(), Some(11));
        assert_eq!(basic().budget(ms(210)).build().unwrap().max_retries(), Some(10));
        // Decorrelated jitter's shortest wait is the base every time: no division at the cap.
        let d = basic().jitter(Jitter::Decorrelated).budget(ms(10)).build().unwrap();
        assert_eq!(d.max_retries(), Some(5));
        // The attempt cap and the budget: whichever is less.
        assert_eq!(basic().max_attempts(20).build().unwrap().max_retries(), Some(7));
        assert_eq!(basic().max_attempts(8).build().unwrap().max_retries(), Some(7));
        assert_eq!(basic().max_attempts(7).build().unwrap().max_retries(), Some(6));
        // A cap reached only at retry 33: 0 + 1 + … + 2³⁰ = 2³¹ − 1 before it, then one 2³¹ − 1.
        let slow = basic().base(ms(1)).cap(ms(LONGEST)).budget(ms(LONGEST)).build().unwrap();
        assert_eq!(slow.max_retries(), Some(33));
        // Decorrelated waits of the base each time, counted past 33 retries.
        let many =
            basic().jitter(Jitter::Decorrelated).base(ms(1)).cap(ms(100)).budget(ms(1_000)).build().unwrap();
        assert_eq!(many.max_retries(), Some(1_000));
        // …and divided, not walked, however large the budget: one retry per millisecond.
        let huge = basic()
            .jitter(Jitter::Decorrelated)
            .base(ms(1))
            .cap(ms(100))
            .budget(ms(LONGEST))
            .build()
            .unwrap();
        assert_eq!(huge.max_retries(), Some(u32::MAX - 1));
    }

    #[test]
    fn each_limit_of_the_builder_is_inclusive_and_each_duration_is_checked_on_its_own() {
        // An attempt as long as the whole deadline still fits.
        assert!(basic().deadline(ms(10)).min_attempt(ms(10)).build().is_ok());
        assert_eq!(
            basic().deadline(ms(10)).min_attempt(ms(11)).build(),
            Err(PolicyError::AttemptPastDeadline)
        );
        assert!(
            basic()
                .cap(ms(LONGEST))
                .budget(ms(LONGEST))
                .deadline(ms(LONGEST))
                .min_attempt(ms(LONGEST))
                .max_retry_after(ms(LONGEST))
                .build()
                .is_ok()
        );
        for too_large in [
            basic().cap(ms(LONGEST + 1)),
            basic().budget(ms(LONGEST + 1)),
            basic().deadline(ms(LONGEST + 1)),
            basic().min_attempt(ms(LONGEST + 1)),
            basic().max_retry_after(ms(LONGEST + 1)),
        ] {
            assert_eq!(too_large.build(), Err(PolicyError::TooLarge));
        }
        assert!(basic().max_attempts(1).build().is_ok());
        assert!(basic().base(ms(60)).cap(ms(60)).build().is_ok());
    }

    #[test]
    fn an_unset_limit_reads_back_as_none_and_a_cap_of_u32_max_is_no_cap() {
        let p = basic().deadline(ms(9)).max_retry_after(ms(8)).max_attempts(7).build().unwrap();
        let unset = p.to_builder().no_deadline().no_max_retry_after().unlimited_attempts().build().unwrap();
        assert_eq!((unset.deadline(), unset.max_retry_after(), unset.max_attempts()), (None, None, None));
        assert_eq!(unset, basic().build().unwrap());
        assert_eq!(unset.fingerprint(), basic().build().unwrap().fingerprint());
        // The most attempts a call counts is no cap at all, by every reading.
        let most = basic().max_attempts(u32::MAX).build().unwrap();
        assert_eq!((most.max_attempts(), most), (None, unset));
        // A policy read back into a builder builds to itself.
        assert_eq!(p.to_builder().build(), Ok(p));
        assert_eq!(p.to_builder(), basic().deadline(ms(9)).max_retry_after(ms(8)).max_attempts(7));
        // Debug shows the settings, not how they are held.
        let debug = format!("{unset:?}");
        assert!(debug.contains("deadline: None") && debug.contains("max_attempts: None"), "{debug}");
        assert!(format!("{p:?}").contains("max_retry_after: Some(Duration { millis: 8 })"), "{p:?}");
    }

    #[test]
    fn a_plan_fits_a_capacity_that_holds_every_retry() {
        let p = basic().build().unwrap();
        assert!(p.fits(7) && p.fits(8) && !p.fits(6));
    }

    #[test]
    fn accessors_return_what_was_set() {
        let p = basic()
            .deadline(ms(500))
            .min_attempt(ms(3))
            .max_attempts(9)
            .max_retry_after(ms(40))
            .retry_after_mode(RetryAfterMode::Spread)
            .retry_after_rules(Rules::STRICT)
            .build()
            .unwrap();
        assert_eq!((p.backoff().base, p.backoff().cap, p.budget()), (ms(2), ms(60), ms(120)));
        assert_eq!((p.deadline(), p.min_attempt(), p.max_attempts()), (Some(ms(500)), ms(3), Some(9)));
        assert_eq!((p.max_retry_after(), p.retry_after_mode()), (Some(ms(40)), RetryAfterMode::Spread));
        assert_eq!(*p.retry_after_rules(), Rules::STRICT);
        assert_eq!(*p.table(), Table::BASIC);
        assert_eq!(p.to_builder().build(), Ok(p));
        let p = p.to_builder().unlimited_attempts().no_deadline().no_max_retry_after().build().unwrap();
        assert_eq!((p.max_attempts(), p.deadline(), p.max_retry_after()), (None, None, None));
        for mode in RetryAfterMode::ALL {
            assert_eq!(RetryAfterMode::from_name(mode.name()), Some(mode));
        }
        assert_eq!(RetryAfterMode::Max.name(), "max");
        assert_eq!(RetryAfterMode::Spread.name(), "spread");
        for preset in ["", "Default", "exercise", "basics"] {
            assert_eq!(Preset::from_name(preset), None);
            assert_eq!(RetryAfterMode::from_name(preset), None);
        }
    }

    #[test]
    fn existing_fingerprints_are_pinned_and_the_coap_jitter_has_its_own_code() {
        // Ledgers made under these policies must keep matching: a new preset or jitter adds
        // codes, it changes no existing one.
        let print = |p: Preset| Policy::builder(p).build().unwrap().fingerprint();
        assert_eq!(print(Preset::Default), 0xc9bb_14b3);
        assert_eq!(print(Preset::Basic), 0xa7b1_3755);
        assert_eq!(print(Preset::Strict), 0xf434_c351);
        assert_eq!(
            Policy::builder(Preset::Basic).jitter(Jitter::Decorrelated).build().unwrap().fingerprint(),
            0xa665_921b
        );
        assert_eq!(Jitter::Coap as u8, 4);
        let coap = basic().jitter(Jitter::Coap).build().unwrap().fingerprint();
        let others: Vec<u32> = [Jitter::Equal, Jitter::Full, Jitter::Decorrelated, Jitter::None]
            .into_iter()
            .map(|j| basic().jitter(j).max_attempts(3).build().unwrap().fingerprint())
            .collect();
        assert!(
            !others.contains(&basic().jitter(Jitter::Coap).max_attempts(3).build().unwrap().fingerprint())
        );
        assert_ne!(coap, print(Preset::Basic));
        assert!(
            ![print(Preset::Default), print(Preset::Basic), print(Preset::Strict)]
                .contains(&print(Preset::Coap))
        );
    }

    #[test]
    fn every_setting_changes_the_fingerprint() {
        use crate::retry_after::Ambiguous;
        let variants = [
            basic(),
            basic().table(Table::BASIC.with_transport(Transport::Tls, Rule::RetryAny)),
            basic().table(Table::BASIC.with_other_statuses(Rule::RetryIdempotent)),
            basic().table(Table::BASIC.reads_only(true)),
            basic().table(Table::BASIC.with_client_errors(Rule::RetryIdempotent)),
            basic().base(ms(3)),
            basic().cap(ms(61)),
            basic().jitter(Jitter::None),
            basic().jitter(Jitter::Decorrelated),
            basic().jitter(Jitter::Coap),
            basic().jitter(Jitter::Full).max_attempts(3),
            basic().budget(ms(121)),
            basic().deadline(ms(120)),
            basic().deadline(ms(121)),
            basic().max_attempts(3),
            basic().max_attempts(4),
            basic().min_attempt(ms(1)),
            basic().max_retry_after(ms(30)),
            basic().max_retry_after(ms(31)),
            basic().retry_after_mode(RetryAfterMode::Spread),
            basic().retry_after_rules(Rules { accept_dates: false, ..Rules::LENIENT }),
            basic().retry_after_rules(Rules { ambiguous: Ambiguous::Reject, ..Rules::LENIENT }),
            basic().table(Table::DEFAULT),
            basic().table(Table::BASIC.with_status(409, Rule::RetryAny).unwrap()),
            basic().table(Table::BASIC.with_status(409, Rule::Fail).unwrap()),
            basic().table(Table::BASIC.with_status(410, Rule::Fail).unwrap()),
        ];
        let prints: Vec<u32> = variants.iter().map(|b| b.build().unwrap().fingerprint()).collect();
        let distinct: std::collections::HashSet<u32> = prints.iter().copied().collect();
        assert_eq!(distinct.len(), prints.len(), "{prints:x?}");
    }
}
