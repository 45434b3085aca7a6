//! Test servers for wary's device runs under QEMU, on 127.0.0.1 (the guest reaches them as
//! 10.0.2.2 through QEMU's user-mode network).
//!
//! - [`server`]: a listener with one thread accepting and one per connection, that hands back
//!   what each connection saw when stopped.
//! - [`request`]: the one HTTP/1.1 request reader, and the checks of the device's wire format.
//! - [`faults`]: the network-fault server: one scripted reply (or reset, stall, trickle) per
//!   path, for the firmware's `nettest`.
//! - [`coap_fault`]: a CoAP server over UDP with faults (lost ACKs, 5.03 and 4.29 with Max-Age,
//!   duplicated responses, restarts that forget message IDs) that applies each key once.
//! - [`tls`]: a throwaway CA chain and TLS 1.3 servers for the TLS probe's cases.
//! - [`mosquitto`]: a mosquitto broker on loopback with device logins and a per-device topic ACL.
//! - [`mqtt_fault`]: a proxy in front of the broker that injects MQTT 5 reason codes and drops.
//!
//! `cargo xtask net` and `cargo xtask tls` start these servers, run the firmware and check what
//! the servers saw; the checks are tested here against hand-written requests over real sockets.

pub mod coap_fault;
pub mod faults;
pub mod mosquitto;
pub mod mqtt_fault;
pub mod request;
pub mod server;
pub mod tls;
