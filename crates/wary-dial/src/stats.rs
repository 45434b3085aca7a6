//! Counters of what the chat saw and skipped: the numbers worth a metric, with no byte of what
//! was said.

/// Running counts over a [`Chat`](crate::Chat)'s life. Every field saturates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct Stats {
    /// Command lines written, `+++` included.
    pub commands: u32,
    /// `AT` probes that went unanswered (or drew `ERROR`) before one got its `OK`, or before the
    /// dial gave up.
    pub probe_misses: u32,
    /// Lines equal to the command just sent: the modem's echo, still on (skipped).
    pub echoes: u32,
    /// Text lines that answer nothing here: unsolicited codes (`RING`, `+CREG: 2`), stray or
    /// late result codes (skipped).
    pub noise: u32,
    /// Lines holding bytes that are not printable ASCII (dropped).
    pub garbage: u32,
    /// Lines longer than [`MAX_LINE`](crate::MAX_LINE) (dropped as they arrived, never kept).
    pub overlong: u32,
    /// Reads that returned zero bytes (each followed by a pause).
    pub zero_reads: u32,
    /// Writes that took zero bytes (each followed by a pause).
    pub zero_writes: u32,
    /// Escapes (`+++`) that drew neither `OK` nor `NO CARRIER`: the modem was most likely in
    /// command mode already.
    pub escapes_unanswered: u32,
}

/// Adds one without ever overflowing.
pub(crate) fn bump(counter: &mut u32) {
    *counter = counter.saturating_add(1);
}

impl Stats {
    /// All zero, usable in `const` contexts.
    pub(crate) const fn default_const() -> Self {
        Self {
            commands: 0,
            probe_misses: 0,
            echoes: 0,
            noise: 0,
            garbage: 0,
            overlong: 0,
            zero_reads: 0,
            zero_writes: 0,
            escapes_unanswered: 0,
        }
    }
}
