//! A Linux gateway for wary: readings from downstream sensors arrive as length-prefixed frames
//! and go upstream to the cloud, one wary-run call each, acknowledged downstream only after
//! their verdict, so a restart loses nothing (the sensor re-sends what was not acked).
//!
//! - keyed writes (`POST /readings`, key from sensor, boot and sequence), or a legacy mode
//!   (`POST /legacy/readings` unkeyed; an `unknown` goes to the `GET` probe, never a resend;
//!   one the probe cannot resolve is acked `done` and `surfaced`: the sensor never resends it);
//! - one shared fleet retry budget; a JSON-lines ledger; attempt statistics;
//! - a bounded queue: a full queue stops reading frames (backpressure to the sensors);
//! - Prometheus text on `GET /metrics`.
//!
//! Retry happens at exactly one layer: the HTTP client does not retry on its own.

pub mod frame;
pub mod gateway;
pub mod metrics;
pub mod upstream;

pub use frame::{Ack, FrameError, MAX_FRAME, Reading};
pub use gateway::{Config, Gateway, GatewayError};
pub use metrics::{Event, Metrics, Surfaced};
pub use upstream::Upstream;
