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

#[macro_use]
mod fmt;

mod apn;
mod cap;
mod chat;
mod config;
mod dtr;
mod line;
mod outcome;
mod stats;

pub use apn::{Apn, ApnError, MAX_APN};
pub use cap::{DialCap, DialCapError, DialWindow};
pub use chat::Chat;
pub use config::{Config, HangUp, MAX_ZERO_IO, MIN_GUARD, Timeouts};
pub use dtr::{Dtr, DtrPin};
pub use line::MAX_LINE;
pub use outcome::{Class, CmeError, Connected, DialError, Failure, Step};
pub use stats::Stats;
