//! What the outbox remembers about how the last boots went, beside the boot count: how many
//! boots in a row ended unhealthy, how far the backoff of the oldest kept reading had gone, the
//! modem's dial window, whether the endpoint holds the outbox, and how many dead letters were
//! dropped. All of it lives in the boot record, so it is written with the same guarantee: a cut
//! leaves the old value or the new one, never a mix.

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

/// The outbox is held because the endpoint refused: `step` probes in a row have been refused,
/// the last with `reason`; after a reset the hold continues from there.
///
/// A refusal that is the endpoint's fault (it does not know the device, the credentials are
/// wrong, the path is gone, TLS is refused) would refuse every reading alike, so the whole
/// outbox waits on a slow backoff of its own instead of spending the readings. A reset does
/// not end it: only [`crate::Outbox::set_hold`] with `None`, once a probe gets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct HoldMark {
    /// Probes in a row the endpoint refused (1 after the first), saturating at 255. A step of
    /// 0 is no hold.
    pub step: u8,
    /// The status or protocol code of the last refusal.
    pub reason: u16,
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
    pub(crate) hold: Option<HoldMark>,
    /// Dead letters dropped to make room, over the device's life (saturating).
    pub(crate) dead_dropped: u32,
    /// The dead letter whose drop `dead_dropped` already counts, written before it is removed:
    /// open finishes the removal if a cut stopped it (see `outbox/dead_region.rs`).
    pub(crate) dropping: Option<RecordId>,
}
