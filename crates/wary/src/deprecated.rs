//! Old names, kept for one release so code written against them still compiles, with a
//! warning that names the new one. Each is a type alias, a constant or a function:
//! `#[deprecated]` on a `pub use` would not warn. The ledger, the Retry-After parsing and the
//! plans now live in the modules [`crate::ledger`], [`crate::retry_after`] and [`crate::plan`](mod@crate::plan).

use crate::backoff::Draw;
use crate::classify::{Operation, Outcome};
use crate::policy::{Policy, StaticPolicy};
use crate::{ledger, retry_after};

/// The old name of [`retry_after::Ambiguous`]: it governs more than duplicate headers.
#[deprecated(
    since = "0.1.0",
    note = "renamed `wary::retry_after::Ambiguous`: it also decides how malformed values are read"
)]
pub type Duplicates = retry_after::Ambiguous;

/// [`ledger::Record`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::Record`")]
pub type Record = ledger::Record;

/// [`ledger::Ledger`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::Ledger`")]
pub type Ledger<const N: usize, const B: usize = 16> = ledger::Ledger<N, B>;

/// [`ledger::AttemptStats`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::AttemptStats`")]
pub type AttemptStats<const B: usize> = ledger::AttemptStats<B>;

/// [`ledger::LineError`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::LineError`")]
pub type LineError = ledger::LineError;

/// [`ledger::DEVICE_FIELDS`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::DEVICE_FIELDS`")]
pub const DEVICE_FIELDS: [&str; 19] = ledger::DEVICE_FIELDS;

/// [`ledger::DEVICE_TAG`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::DEVICE_TAG`")]
pub const DEVICE_TAG: &str = ledger::DEVICE_TAG;

/// [`ledger::LEDGER_VERSION`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::LEDGER_VERSION`")]
pub const LEDGER_VERSION: u32 = ledger::LEDGER_VERSION;

/// [`ledger::parse_device_line`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::ledger::parse_device_line`")]
pub fn parse_device_line(line: &str) -> Result<ledger::Record, ledger::LineError> {
    ledger::parse_device_line(line)
}

/// [`retry_after::RetryAfter`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::RetryAfter`")]
pub type RetryAfter = retry_after::RetryAfter;

/// [`retry_after::Reading`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::Reading`")]
pub type Reading = retry_after::Reading;

/// [`retry_after::Rules`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::Rules`")]
pub type Rules = retry_after::Rules;

/// [`retry_after::RetryAfterError`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::RetryAfterError`")]
pub type RetryAfterError = retry_after::RetryAfterError;

/// [`retry_after::parse`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::parse`")]
pub fn parse_retry_after(value: &[u8]) -> Result<retry_after::RetryAfter, retry_after::RetryAfterError> {
    retry_after::parse(value)
}

/// [`retry_after::parse_lenient`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::parse_lenient`")]
pub fn parse_retry_after_lenient(
    value: &[u8],
) -> Result<retry_after::RetryAfter, retry_after::RetryAfterError> {
    retry_after::parse_lenient(value)
}

/// [`retry_after::parse_http_date`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::retry_after::parse_http_date`")]
pub fn parse_http_date(value: &[u8]) -> Result<u64, retry_after::RetryAfterError> {
    retry_after::parse_http_date(value)
}

/// [`crate::plan::Plan`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::plan::Plan`")]
pub type Plan<const N: usize> = crate::plan::Plan<N>;

/// [`crate::plan::PlanError`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::plan::PlanError`")]
pub type PlanError = crate::plan::PlanError;

/// [`crate::plan::plan`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::plan::plan`")]
pub fn plan<const N: usize>(
    policy: &Policy,
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<crate::plan::Plan<N>, crate::plan::PlanError> {
    crate::plan::plan(policy, op, outcomes, draws)
}

/// [`crate::plan::plan_into`] at its old place.
#[deprecated(since = "0.1.0", note = "moved to `wary::plan::plan_into`")]
pub fn plan_into<const N: usize>(
    plan: &mut crate::plan::Plan<N>,
    policy: &Policy,
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<(), crate::plan::PlanError> {
    crate::plan::plan_into(plan, policy, op, outcomes, draws)
}

/// [`crate::plan::plan_static`] at its old place; its capacity is still checked at compile time.
#[deprecated(since = "0.1.0", note = "moved to `wary::plan::plan_static`")]
pub fn plan_static<P: StaticPolicy, const N: usize>(
    op: Operation,
    outcomes: &[Outcome],
    draws: &[Draw],
) -> Result<crate::plan::Plan<N>, crate::plan::PlanError> {
    crate::plan::plan_static::<P, N>(op, outcomes, draws)
}
