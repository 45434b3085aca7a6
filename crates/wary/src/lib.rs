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
pub mod coap;
mod decide;
pub mod drain;
mod error;
mod fingerprint;
mod forms;
mod key;
pub mod ledger;
mod names;
mod pace;
pub mod plan;
mod policy;
mod record;
pub mod retry_after;
#[cfg(feature = "runner")]
mod run;
mod step;
mod throttle;
mod time;
mod version;

pub use backoff::{Backoff, Draw, Jitter, Sequence};
pub use breaker::{Breaker, BreakerSettings, BreakerState, Permit, Phase};
pub use classify::{Blame, Class, Failure, Operation, Outcome, Rule, Table, Transport};
pub use decide::{CallState, Decision, GiveUp, Verdict};
pub use drain::{Drain, DrainSettings, Fate};
pub use error::{BreakerError, DrainError, DrawError, FleetBudgetError, PaceError, PolicyError, TableError};
pub use key::Key;
/// Where the runner writes its records ([`ledger::Sink`]).
pub use ledger::Sink;
pub use pace::{Pace, PaceSettings, PaceView, Signal, TOLERANCE_SAMPLE};
pub use policy::{Policy, PolicyBuilder, Preset, RetryAfterMode, StaticPolicy};
#[cfg(all(feature = "runner", feature = "embassy-time"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "runner", feature = "embassy-time"))))]
pub use run::EmbassyClock;
#[cfg(feature = "runner")]
#[cfg_attr(docsrs, doc(cfg(feature = "runner")))]
pub use run::{Attempt, Cancel, CancelToken, Clock, Landed, Never, NoProbe, Probe, Runner, Stopped};
pub use step::{Attempts, Endpoint, Gate, Guards};
pub use throttle::FleetBudget;
pub use time::{Duration, Instant};

/// The `rand_core` this crate takes draws from (0.9): implement or pass its `RngCore`.
pub use rand_core;

/// The `embedded-hal-async` (1.0) whose `DelayNs` the runner sleeps with.
#[cfg(feature = "runner")]
#[cfg_attr(docsrs, doc(cfg(feature = "runner")))]
pub use embedded_hal_async;
