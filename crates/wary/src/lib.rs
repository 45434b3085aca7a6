#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// The no-panic lints guard the library; tests may unwrap and index.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

pub mod backoff;
pub mod budget;
pub mod classify;
pub mod error;
pub mod key;
pub mod ledger;
pub mod plan;
pub mod policy;
pub mod retry_after;
pub mod run;

pub mod throttle;

pub use backoff::{Draw, Jitter};
pub use budget::{CallState, Decision};
pub use classify::{Class, Operation, Outcome, Rule, Table};
pub use error::{DrawError, PlanError, PolicyError};
pub use key::Key;
pub use policy::{Policy, PolicyBuilder, Preset, RetryAfterMode};
pub use throttle::FleetBudget;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Verdict {
    /// The operation succeeded.
    Ok,
    /// The operation failed in a way a resend cannot fix (a 400, a TLS error, a bad body).
    Failed,
    /// A write without an idempotency key may have landed; it was not resent. A probe or a
    /// person resolves it: never a blind resend: a payment recorded twice costs more than one left
    /// for a person to check.
    Unknown,
    /// A stop rule ended the call while it was still failing.
    GaveUp(GiveUp),
    /// The caller cancelled the call.
    Cancelled,
}

impl Verdict {
    /// The verdict's name as `wary plan` and the ledgers spell it.
    pub const fn name(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Failed => "failed",
            Verdict::Unknown => "unknown",
            Verdict::GaveUp(_) => "gave_up",
            Verdict::Cancelled => "cancelled",
        }
    }
}

/// Why a call gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GiveUp {
    /// The next wait would take the call's total waiting past its wait budget.
    Budget,
    /// The next attempt could not finish before the call's deadline.
    Deadline,
    /// The attempt cap was reached.
    Attempts,
    /// The server asked for a longer wait than the call can afford; `asked` is that wait in
    /// ticks, so the caller can reschedule the work for later.
    RetryAfterTooLong {
        /// The wait the server asked for, in ticks (saturated).
        asked: u64,
    },
    /// The fleet retry budget refused the retry.
    Throttled,
    /// The recorded outcomes ran out while the call was still failing (plans only).
    OutcomesExhausted,
}

impl GiveUp {
    /// A short stable name for logs and ledgers.
    pub const fn name(&self) -> &'static str {
        match self {
            GiveUp::Budget => "budget",
            GiveUp::Deadline => "deadline",
            GiveUp::Attempts => "attempts",
            GiveUp::RetryAfterTooLong { .. } => "retry_after_too_long",
            GiveUp::Throttled => "throttled",
            GiveUp::OutcomesExhausted => "outcomes_exhausted",
        }
    }
}
