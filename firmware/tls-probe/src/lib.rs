//! What TLS 1.3 costs the device, measured under QEMU mps2-an386.
//!
//! Two binaries share this library and differ only in the transport: `tls-probe` sends one
//! keyed `POST /readings` over TLS 1.3 (embedded-tls, `TLS_AES_128_GCM_SHA256`, P-256), with
//! the server's certificate chain verified against a CA compiled into the firmware, and checks
//! that servers the CA does not vouch for are refused; `plain-probe` sends the same request
//! over plain HTTP. Both bring up the LAN9118 and embassy-net with a DHCP lease from QEMU's
//! user-mode network, log their timings and their peak stack, and exit 0 only if every check
//! passed. `cargo xtask tls` runs them against its test servers and prints the measurements.
//!
//! - [`exchange`]: one HTTP/1.1 `POST` over any connection, failures named by phase.
//! - [`tls`]: the handshake against the pinned CA, and the same `POST` through it.
//! - [`net`]: the network stack, as the on-target network test brings it up.
//! - [`stack`]: the stack's high-water mark.
//! - [`args`]: the host's settings from semihosting's command line.

#![no_std]
#![deny(missing_docs)]

pub mod args;
mod error;
pub mod exchange;
pub mod net;
pub mod stack;
pub mod tls;

pub use error::{Phase, ProbeError};
