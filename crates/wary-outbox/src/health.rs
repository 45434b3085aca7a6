//! What the outbox remembers about how the last boots went, beside the boot count: how many
//! boots in a row ended unhealthy, how far the backoff of the oldest kept reading had gone, and
//! the modem's dial window. All of it lives in the boot record, so it is written with the same
//! guarantee: a cut leaves the old value or the new one, never a mix.

use crate::entry::RecordId;

/// How far the pause between rounds had gone when a round last kept a reading: `step` rounds
/// in a row kept readings, the oldest of them `id`. After a reset, while `id` is still pending,
/// the first resend waits at least the wait of step `step + 1`, never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BackoffMark {
    /// The oldest reading the last kept round left pending.
    pub id: RecordId,
    /// Rounds in a row that kept readings (1 after the first), saturating at 255.
    pub step: u8,
}

/// The modem's dial-ups and resets inside the current window, across boots. The window is
/// counted in device uptime, because nothing else survives a reset on a device without a
/// battery-backed clock: time spent powered off or rebooting counts as none, which only makes a
/// cap stricter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DialWindow {
    /// Uptime, over the boots, since the window opened, in milliseconds (saturating).
    pub elapsed_ms: u32,
    /// Dial-ups and modem resets in the window.
    pub dials: u16,
}

/// The health part of the boot record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Health {
    /// Consecutive unhealthy boots, this one included until it is marked healthy.
    pub(crate) unhealthy: u32,
    pub(crate) backoff: Option<BackoffMark>,
    pub(crate) dial: DialWindow,
}
