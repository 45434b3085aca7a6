#![doc = include_str!("../README.md")]
//!
//! # Features
#![doc = document_features::document_features!()]
#![cfg_attr(not(test), no_std)]
#![cfg_attr(docsrs, feature(doc_cfg))]
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

mod backoff;
mod breaker;
mod classify;
mod decide;
mod error;
mod fingerprint;
mod forms;
mod key;
mod ledger;
mod pace;
mod plan;
mod policy;
mod retry_after;
#[cfg(feature = "runner")]
mod run;
mod throttle;
mod time;

pub use backoff::{Backoff, Draw, Jitter};
pub use breaker::{Breaker, BreakerSettings, BreakerState, Permit};
pub use classify::{Class, Failure, Operation, Outcome, Rule, Table, Transport};
pub use decide::{CallState, Decision, GiveUp, Verdict};
pub use error::{
    BreakerError, DrawError, FleetBudgetError, LineError, PaceError, PlanError, PolicyError, RetryAfterError,
    TableError,
};
pub use key::Key;
pub use ledger::{
    AttemptStats, DEVICE_FIELDS, DEVICE_TAG, LEDGER_VERSION, Ledger, Record, Sink, parse_device_line,
};
pub use pace::{Pace, PaceSettings, Signal};
pub use plan::{Plan, plan, plan_into, plan_static};
pub use policy::{Policy, PolicyBuilder, Preset, RetryAfterMode, StaticPolicy};
pub use retry_after::{
    Duplicates, Reading, RetryAfter, Rules, parse as parse_retry_after, parse_http_date,
    parse_lenient as parse_retry_after_lenient,
};
#[cfg(all(feature = "runner", feature = "embassy-time"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "runner", feature = "embassy-time"))))]
pub use run::EmbassyClock;
#[cfg(feature = "runner")]
#[cfg_attr(docsrs, doc(cfg(feature = "runner")))]
pub use run::{Attempt, Cancel, CancelToken, Clock, Landed, Never, NoProbe, Probe, Runner, Stopped};
pub use throttle::FleetBudget;
pub use time::{Duration, Instant};

/// The `rand_core` this crate takes draws from (0.9): implement or pass its `RngCore`.
pub use rand_core;

/// The `embedded-hal-async` (1.0) whose `DelayNs` the runner sleeps with.
#[cfg(feature = "runner")]
#[cfg_attr(docsrs, doc(cfg(feature = "runner")))]
pub use embedded_hal_async;
