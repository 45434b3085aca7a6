//! What TLS 1.3 costs the device, measured under QEMU mps2-an386.
//!
//! Two binaries share this library and differ only in the transport: `tls-probe` sends one
//! keyed `POST /readings` over TLS 1.3 (embedded-tls, `TLS_AES_128_GCM_SHA256`, P-256), with
//! the server's certificate chain verified against a CA compiled into the firmware, and checks
//! that servers the CA does not vouch for are refused; `plain-probe` sends the same request
//! over plain HTTP. Both bring up the LAN9118 and embassy-net with the board's own bring-up
//! (`mps2_an386::net`), log their timings and their peak stack, and exit 0 only if every check
//! passed. `cargo xtask tls` runs them against its test servers and prints the measurements.
//!
//! The exchanges they time are the uplink's own: `wary_uplink::http::post_timed` in plain
//! HTTP, `wary_uplink::tls::post_tls` over TLS, so the figures describe the code the
//! device ships.
//!
//! - [`stack`]: the stack's high-water mark.
//! - [`args`]: the host's settings from semihosting's command line.

#![no_std]
#![deny(missing_docs)]

pub mod args;
pub mod stack;

/// The TCP socket's buffers and the head buffer (encoded request head, then the reply's
/// status line and header block), 1 KiB each: the uplink's own, as its network test uses them.
pub type SocketBuffers = wary_uplink::http::Buffers<1024, 1024, 1024>;
