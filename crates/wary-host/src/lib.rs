//! std adapters for wary: what a Linux gateway or a host test needs around the `no_std` core.
//!
//! - [`spec`]: a policy as serde data (TOML, JSON), the form `wary explain` and the ledgers use.
//! - [`ledger`]: the JSON-lines ledger, one flushed line per attempt, replayable.

pub mod ledger;
pub mod spec;
