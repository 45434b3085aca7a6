//! std adapters for wary: what a Linux gateway or a host test needs around the `no_std` core.
//!
//! - [`spec`]: a policy as serde data (TOML, JSON), the form `wary explain` and the ledgers use.
//! - [`ledger`]: the JSON-lines ledger, one flushed line per attempt, replayable.
//! - [`time`]: tokio and std sleeps as `DelayNs`, a monotonic clock, a wall clock.
//! - [`draw`]: per-process seeded draws.
//! - [`http`]: `http` responses and client errors as outcomes.
//! - [`tower`]: a `tower::retry::Policy` running a wary policy.

pub mod draw;
pub mod http;
pub mod ledger;
pub mod spec;
pub mod time;
pub mod tower;
