//! Benchmarks and the fleet simulation behind `cargo xtask bench`.
//!
//! Every figure is printed next to the baseline measured in the same run: wary's decision path
//! against backon's exponential backoff with jitter (instructions, under callgrind), wary's state
//! against backon's, wary's flash against the same minimal binary without it, and each jitter
//! against the others in one simulated fleet and in the AWS backoff study's optimistic-concurrency
//! model.

pub mod decision;
pub mod iai;
pub mod recovery;
pub mod report;
pub mod sim;
pub mod sizes;
pub mod study;
