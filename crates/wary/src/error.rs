//! The typed errors: a bad policy is refused when it is built, bad input when it is read.

/// Why a policy (or a fleet budget) was refused when it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PolicyError {
    /// The backoff base is 0 ticks: every wait would be 0 and retries would spin.
    #[error("base must be at least 1 tick")]
    ZeroBase,
    /// The cap is below the base, so the first ceiling would already be clipped.
    #[error("cap must not be below base")]
    CapBelowBase,
    /// The wait budget is 0: no retry could ever wait, so none would be made.
    #[error("budget must be at least 1 tick")]
    ZeroBudget,
    /// The deadline is 0: no attempt fits.
    #[error("deadline must be at least 1 tick")]
    ZeroDeadline,
    /// The shortest attempt time is longer than the deadline: no attempt could end in time.
    #[error("the shortest attempt time is longer than the deadline")]
    AttemptPastDeadline,
    /// The attempt cap is 0: not even the first attempt would be allowed.
    #[error("attempt cap must be at least 1")]
    ZeroAttempts,
    /// The tick rate is 0 ticks per second, so Retry-After seconds cannot be converted.
    #[error("tick rate must be at least 1 tick per second")]
    ZeroTickRate,
    /// A duration is larger than [`crate::policy::MAX_TICKS`]; sums of such values could wrap.
    #[error("a duration exceeds the largest supported tick count")]
    TooLarge,
    /// The jitter can draw waits of 0, so the budget does not bound the attempts, and no attempt
    /// cap was set: draws near 0 spend no budget.
    #[error("this jitter needs an attempt cap: its waits can be 0, so the budget does not bound attempts")]
    Unbounded,
    /// A status in a classification table is outside 100..=999.
    #[error("status code outside 100..=999")]
    BadStatus,
    /// A classification table has no room for another status rule.
    #[error("classification table is full")]
    TableFull,
    /// A fleet budget's token count is outside 1..=1000 or its ratio outside 1..=1000 (thousandths).
    #[error("fleet budget needs 1..=1000 tokens and a token ratio of 1..=1000 thousandths")]
    BadFleetBudget,
}

/// Why a random draw was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DrawError {
    /// A percent draw is outside 0..=99.
    #[error("draw outside 0..=99")]
    OutOfRange,
}

/// Why a plan could not be computed from its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
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
    /// The settings do not define a plan at all (a tick rate of 0).
    #[error("invalid policy: {0}")]
    InvalidPolicy(PolicyError),
}
