//! std adapters for wary: what a Linux gateway or a host test needs around the `no_std` core.
//!
//! - [`retry`]: the one-line entry point, `policy.retry(op, |attempt| async { … }).await`,
//!   and a tokio runner with every effect chosen.
//! - [`spec`]: a policy as configuration (TOML, JSON), the form `wary explain` and the gateway
//!   read, built through the core's builder.
//! - [`ledger`]: the JSON-lines ledger, one flushed line per attempt, replayable: the core's
//!   `Record` and `Policy` in their serde forms, one [`ledger::Line`] type to write and read.
//! - [`time`]: tokio and std sleeps as `DelayNs`, a monotonic clock giving `wary::Instant`, a
//!   wall clock.
//! - [`draw`]: per-process seeded draws: the one generator of the host crates.
//! - [`http`]: `http` responses as outcomes (through `wary::Outcome::from_response`), client
//!   errors as failures.
//! - [`ratelimit`]: rate-limit headers beside Retry-After (`RateLimit`, `X-RateLimit-Reset`,
//!   `retry-after-ms`), opt-in per policy.
//! - [`call`]: one call driven by another loop (the tower and reqwest adapters).
//! - [`tower`]: a `tower::retry::Policy` running a wary policy.

pub mod batch;
pub mod call;
pub mod draw;
pub mod http;
pub mod ledger;
pub mod ratelimit;
pub mod retry;
pub mod spec;
pub mod time;
pub mod tower;
