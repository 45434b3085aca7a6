//! A Linux gateway for wary: devices post readings to it over HTTP exactly as they would post
//! them to the cloud (`POST /readings` with an `Idempotency-Key`), and it sends each upstream
//! as one wary call, answering the device only after its verdict.
//!
//! - any upstream: a 2xx means landed; a body check is opt-in, and a 2xx failing it is landed
//!   with a bad body, never resent; path, key header and static headers are configuration;
//! - keyed writes, or a legacy mode for unkeyed upstreams (an `unknown` goes to the `GET`
//!   probe, never a resend; one the probe cannot resolve is answered 409 and surfaced);
//! - one shared fleet retry budget per process; a JSON-lines ledger; attempt statistics;
//! - a bounded queue: a full queue answers 503 + Retry-After at once;
//! - an upstream answer that fails the call and that the core's table blames on the endpoint,
//!   not the reading (`wary::Table::blame`: 401, 403, 404, 406, 414, 421, 431, a 5xx it does not
//!   retry, a failed TLS handshake…: the gateway's configuration or the upstream itself) holds
//!   the devices (503 + Retry-After, `Wary-Verdict: held; upstream=<status>`) and opens the
//!   upstream's breaker at once ([`hold`]); a reading's own fault (400, 413, 415, 422, 424) is
//!   still `failed` (424);
//! - Prometheus text on `GET /metrics` (loopback), over the same HTTP/1.1 connection code as
//!   the devices' ([`h1`]);
//! - every device proves who it is on every request (a bearer token kept as its SHA-256 in a
//!   credentials file, reloaded on SIGHUP) and may touch only its own keys; TLS on the device
//!   side (rustls); a token bucket per device so that one device cannot crowd out the rest.
//!   `docs/security.md` is the threat model;
//! - each authenticated device's last `Wary-Dead-Letters` report (the readings its server
//!   refused, kept on its flash) on `/metrics`, per device ([`dead_letters`]).
//!
//! With `--mqtt` the readings come from an MQTT 5 broker instead, as one replica of a shared
//! subscription, each acknowledged after its verdict ([`mqtt`]).
//!
//! With `--coap` devices may also send confirmable CoAP `POST`s to `/r/<key>` ([`coap`]), answered
//! after their verdict like an HTTP request (no authentication yet: `--insecure-no-auth` only).
//!
//! Retry happens at exactly one layer per hop: the HTTP client does not retry on its own, and
//! the device's resend after a 503 is paced by the gateway's Retry-After and deduplicated by
//! its key upstream. See `docs/deployment.md` for running several replicas.

pub mod admission;
pub mod coap;
pub mod credentials;
pub mod dead_letters;
pub mod gateway;
pub mod h1;
pub mod hold;
pub mod ingress;
pub mod metrics;
pub mod mqtt;
pub mod retry_after;
pub mod tls;
pub mod upstream;

pub use credentials::{Credentials, Identity};
pub use gateway::{Answer, Auth, Config, Gateway, GatewayError};
pub use hold::EndpointFault;
pub use ingress::BadRequest;
pub use metrics::{Event, Metrics};
pub use retry_after::MAX_RETRY_AFTER_SECS;
pub use upstream::{BodyCheck, Delivered, Forward, StaticHeader, Upstream};
