//! The `wary` command's library: each subcommand's logic, testable without a process.

pub mod explain;
pub mod from_defmt;
pub mod plan;
pub mod replay;
