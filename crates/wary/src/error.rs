//! Every error the crate returns, one per fallible constructor: a bad policy is refused when it
//! is built, bad input when it is read.

/// Why [`crate::PolicyBuilder::build`] refused a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PolicyError {
    /// The backoff base is 0: every wait would be 0 and retries would spin.
    #[error("base must be at least 1 ms")]
    ZeroBase,
    /// The cap is below the base, so the first ceiling would already be clipped.
    #[error("cap must not be below base")]
    CapBelowBase,
    /// The wait budget is 0: no retry could ever wait, so none would be made.
    #[error("budget must be at least 1 ms")]
    ZeroBudget,
    /// The deadline is 0: no attempt fits.
    #[error("deadline must be at least 1 ms")]
    ZeroDeadline,
    /// The shortest attempt time is longer than the deadline: no attempt could end in time.
    #[error("the shortest attempt time is longer than the deadline")]
    AttemptPastDeadline,
    /// The attempt cap is 0: not even the first attempt would be allowed.
    #[error("attempt cap must be at least 1")]
    ZeroAttempts,
    /// A duration saturated at [`crate::Duration::MAX`] (about 49.7 days): longer than a call can
    /// count, so it cannot bound anything.
    #[error("a duration is longer than wary counts (at most 4294967294 ms)")]
    TooLarge,
    /// The jitter can draw waits of 0, so the budget does not bound the attempts, and no attempt
    /// cap was set: draws near 0 spend no budget.
    #[error("this jitter needs an attempt cap: its waits can be 0, so the budget does not bound attempts")]
    Unbounded,
}

/// Why [`crate::Table::with_status`] refused a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum TableError {
    /// Exact rules are for 4xx and 5xx statuses (400..=599); every other status follows the
    /// table's rule for other statuses.
    #[error("an exact status rule needs a status in 400..=599")]
    BadStatus,
}

/// Why [`crate::FleetBudget::new`] refused its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum FleetBudgetError {
    /// The token count is outside 1..=1000.
    #[error("a fleet budget needs 1..=1000 tokens")]
    Tokens,
    /// The token ratio is outside 1..=1000 thousandths.
    #[error("a fleet budget needs a token ratio of 1..=1000 thousandths")]
    Ratio,
}

/// Why [`crate::Draw::percent`] refused a draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DrawError {
    /// A percent draw is outside 0..=99.
    #[error("draw outside 0..=99")]
    OutOfRange,
}

/// Why [`plan`](crate::plan::plan()) could not plan a call from its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PlanError {
    /// A retry needed a draw and none was left.
    #[error("too few draws: retry {retry} has none")]
    TooFewDraws {
        /// The retry (1-based) that had no draw.
        retry: u32,
    },
    /// More waits than the plan's fixed capacity holds.
    #[error("more waits than the plan's capacity of {capacity}")]
    CapacityExceeded {
        /// The plan's capacity.
        capacity: usize,
    },
}

/// Why a Retry-After (or Date) header was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum RetryAfterError {
    /// The value is empty or only whitespace.
    #[error("empty value")]
    Empty,
    /// The value is neither delay-seconds nor an HTTP-date.
    #[error("neither delay-seconds nor an HTTP-date")]
    Malformed,
    /// The value is an HTTP-date and these rules accept integer seconds only.
    #[error("HTTP-date not accepted by this policy")]
    DateNotAccepted,
    /// The header appears more than once and these rules refuse to guess which one holds.
    #[error("duplicate Retry-After headers")]
    Duplicate,
    /// An HTTP-date arrived with neither a Date header nor a caller's clock to measure it against.
    #[error("no reference time for an HTTP-date")]
    NoReference,
}

/// Why a ledger line (a device's defmt line, or a JSON line's fields) could not be read back
/// into a [`crate::ledger::Record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum LineError {
    /// The line is not a ledger line at all (no tag).
    #[error("not a ledger line")]
    NotALedgerLine,
    /// The line was written by another version of the ledger format; the message says what
    /// that version meant ([`crate::ledger::LEDGER_VERSION`] lists them).
    #[error("ledger line version {found} ({}), this wary reads version {expected}", LineError::version_note(*found))]
    Version {
        /// The version the line carries.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// A field is missing.
    #[error("field `{0}` is missing")]
    Missing(&'static str),
    /// A field holds a value that is not one of its names or numbers.
    #[error("field `{0}` has a value that cannot be read")]
    Bad(&'static str),
    /// There are more fields than the format has.
    #[error("more fields than a ledger line has")]
    TooManyFields,
}

impl LineError {
    /// What a ledger line of `version` meant, for a refusal's message: why its fields cannot
    /// be read as this build's ([`crate::ledger::LEDGER_VERSION`] lists the versions).
    pub fn version_note(version: u32) -> &'static str {
        match version {
            0 | 1 => "times were ticks and seconds",
            2 => "keys held a 32-bit device id",
            3 => "no record of the pace and the breaker",
            v if v == crate::version::LEDGER_VERSION => "the current format",
            _ => "a newer format",
        }
    }
}

/// Why [`crate::Pace::new`] refused its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PaceError {
    /// The rates are not `0 < floor <= start <= ceiling`.
    #[error("a pace needs 0 < floor <= start <= ceiling")]
    Rates,
    /// The ceiling is above 16 777 requests a second (16 777 215 thousandths).
    #[error("a pace's ceiling is at most 16777215 thousandths of a request a second")]
    TooFast,
    /// The share a throttle keeps is outside 1..=99 percent.
    #[error("a pace keeps 1..=99 percent of its rate on a throttle")]
    Keep,
    /// The regrow time is 0 or saturated.
    #[error("a pace's regrow time must be at least 1 ms and below the longest duration")]
    Regrow,
    /// The burst is outside 1..=100 requests.
    #[error("a pace's burst is 1..=100 requests")]
    Burst,
    /// The share of throttles tolerated is outside 0..=90 percent.
    #[error("a pace tolerates 0..=90 percent of throttles")]
    Tolerate,
}

/// Why [`crate::Breaker::new`] refused its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum BreakerError {
    /// The failures that open the breaker are 0.
    #[error("a breaker opens after at least one failure")]
    Threshold,
    /// The open time is 0, saturated, or its longest is below its first.
    #[error(
        "a breaker's open time must be at least 1 ms, below the longest duration, and its cap not below it"
    )]
    OpenTime,
}

/// Why [`crate::Drain::new`] refused its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DrainError {
    /// A base is 0: rounds or probes would follow one another with no pause, and spin.
    #[error("the round pause and the hold's probe wait must each start at 1 ms or more")]
    ZeroBase,
    /// A cap is below its base.
    #[error("a cap must not be below its base")]
    CapBelowBase,
    /// The longest hold is 0 or shorter than the hold's first wait: no hold could last.
    #[error("the longest hold must be at least the hold's base")]
    LimitBelowBase,
}
