//! std adapters for wary: what a Linux gateway or a host test needs around the `no_std` core.
//!
//! - [`retry`]: the one-line entry point, `policy.retry(op, |attempt| async { … }).await`,
//!   and a tokio runner with every effect chosen.
//! - [`spec`]: a policy as serde data (TOML, JSON), the form `wary explain` and the ledgers use.
//! - [`ledger`]: the JSON-lines ledger, one flushed line per attempt, replayable.
//! - [`time`]: tokio and std sleeps as `DelayNs`, a monotonic clock, a wall clock.
//! - [`draw`]: per-process seeded draws.
//! - [`http`]: `http` responses and client errors as outcomes.
//! - [`ratelimit`]: rate-limit headers beside Retry-After (`RateLimit`, `X-RateLimit-Reset`,
//!   `retry-after-ms`), opt-in per policy.
//! - [`call`]: one call driven by another loop (the tower and reqwest adapters).
//! - [`tower`]: a `tower::retry::Policy` running a wary policy.

pub mod call;
pub mod draw;
pub mod http;
pub mod ledger;
pub mod ratelimit;
pub mod retry;
pub mod spec;
pub mod time;
pub mod tower;
