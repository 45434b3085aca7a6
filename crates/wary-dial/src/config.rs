//! What the chat needs to know before it talks to the modem: the APN, each step's time limit,
//! how many times to knock, and how the board hangs up.
//!
//! ```
//! use core::num::NonZeroU8;
//! use embassy_time::Duration;
//! use wary_dial::{Apn, Config, HangUp, Timeouts};
//!
//! let config = Config::new(Apn::new("internet").unwrap())
//!     .with_probe_tries(NonZeroU8::new(3).unwrap())
//!     .with_timeouts(Timeouts { dial: Duration::from_secs(30), ..Timeouts::DEFAULT })
//!     .with_hang_up(HangUp::Dtr);
//! // Every dial ends within this bound: 3 probes and a quiet wait, ATE0, AT&D2, CGDCONT, ATD.
//! assert_eq!(config.dial_bound(), Duration::from_secs(3 + 1 + 5 + 5 + 5 + 30));
//! ```

use core::num::NonZeroU8;

use embassy_time::Duration;

use crate::apn::Apn;

/// The shortest guard time the escape sequence uses: the usual modem default (S12 = 50, in
/// fiftieths of a second). A shorter pause would let the modem take `+++` for data.
pub const MIN_GUARD: Duration = Duration::from_secs(1);

/// How many zero-byte reads (or writes) in a row make the port count as closed. Each is
/// followed by [`Timeouts::idle_pause`], so a dead port costs a bounded, small amount of time
/// and never a busy loop.
pub const MAX_ZERO_IO: u32 = 10;

/// How long each step may take. Every wait of the chat ends by one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Timeouts {
    /// One `AT` probe, from sending it to its `OK`.
    pub probe: Duration,
    /// `ATE0`, `AT&D2`, `AT+CGDCONT` and `ATH`: local commands a modem answers at once.
    pub command: Duration,
    /// `ATD*99#` until `CONNECT`: the modem may first have to attach to the network.
    pub dial: Duration,
    /// Silence kept before and after `+++`; never less than [`MIN_GUARD`].
    pub guard: Duration,
    /// How long DTR is held off to hang up (see [`HangUp::Dtr`]).
    pub dtr_off: Duration,
    /// The pause after a read or write that moved zero bytes, before trying again.
    pub idle_pause: Duration,
}

impl Timeouts {
    /// Probe 1 s, commands 5 s, dial 60 s, guard 1.2 s (a margin over the modem's 1 s), DTR off
    /// 500 ms, idle pause 100 ms.
    pub const DEFAULT: Self = Self {
        probe: Duration::from_secs(1),
        command: Duration::from_secs(5),
        dial: Duration::from_secs(60),
        guard: Duration::from_millis(1200),
        dtr_off: Duration::from_millis(500),
        idle_pause: Duration::from_millis(100),
    };

    /// The guard time actually kept: [`Timeouts::guard`], raised to [`MIN_GUARD`].
    pub fn effective_guard(&self) -> Duration {
        if self.guard.as_ticks() < MIN_GUARD.as_ticks() { MIN_GUARD } else { self.guard }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How the board takes the modem out of data mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HangUp {
    /// Guard time, `+++`, guard time, then `ATH`: needs nothing but the UART.
    #[default]
    Escape,
    /// Drop DTR, then `ATH` to confirm: for boards that wire the modem's DTR. The dial then sends
    /// `AT&D2` (DTR off hangs up and returns to command mode) before defining the context.
    Dtr,
}

/// The chat's configuration. Built once; nothing in it is ever logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config<'a> {
    pub(crate) apn: Apn<'a>,
    pub(crate) timeouts: Timeouts,
    pub(crate) probe_tries: NonZeroU8,
    pub(crate) hang_up: HangUp,
}

impl<'a> Config<'a> {
    /// Five probes, [`Timeouts::DEFAULT`], hang-up by escape sequence.
    pub const fn new(apn: Apn<'a>) -> Self {
        Self {
            apn,
            timeouts: Timeouts::DEFAULT,
            probe_tries: match NonZeroU8::new(5) {
                Some(n) => n,
                None => NonZeroU8::MIN,
            },
            hang_up: HangUp::Escape,
        }
    }

    /// How many `AT` probes to send before the modem counts as unresponsive.
    pub const fn with_probe_tries(mut self, tries: NonZeroU8) -> Self {
        self.probe_tries = tries;
        self
    }

    /// Each step's time limit.
    pub const fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// How the board hangs up; [`HangUp::Dtr`] adds `AT&D2` to the dial.
    pub const fn with_hang_up(mut self, hang_up: HangUp) -> Self {
        self.hang_up = hang_up;
        self
    }

    /// The step time limits.
    pub const fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// The longest a [`Chat::dial`](crate::Chat::dial) can take, whatever the modem does:
    /// every probe, the quiet wait after a late answer (one more probe's time, only when there
    /// can be a second probe), every command and the dial each running to its limit.
    pub fn dial_bound(&self) -> Duration {
        let t = &self.timeouts;
        let tries = self.probe_tries.get();
        let probes = if tries > 1 { u32::from(tries).saturating_add(1) } else { 1 };
        let commands: u32 = match self.hang_up {
            HangUp::Escape => 2,
            HangUp::Dtr => 3,
        };
        sum(&[mul(t.probe, probes), mul(t.command, commands), t.dial])
    }

    /// The longest a [`Chat::hang_up`](crate::Chat::hang_up) can take: the guard before
    /// `+++`, writing it, the wait for the modem's `OK` (twice the guard), and two `ATH` tries.
    pub fn hang_up_bound(&self) -> Duration {
        let t = &self.timeouts;
        let guard = t.effective_guard();
        sum(&[guard, t.command, mul(guard, 2), mul(t.command, 2)])
    }

    /// The longest a [`Chat::hang_up_dtr`](crate::Chat::hang_up_dtr) can take: DTR held off,
    /// then two `ATH` tries.
    pub fn hang_up_dtr_bound(&self) -> Duration {
        let t = &self.timeouts;
        sum(&[t.dtr_off, mul(t.command, 2)])
    }
}

/// Saturating: a bound that overflows is "forever", never a panic.
pub(crate) fn sum(parts: &[Duration]) -> Duration {
    parts.iter().fold(Duration::from_ticks(0), |acc, d| acc.checked_add(*d).unwrap_or(Duration::MAX))
}

fn mul(d: Duration, n: u32) -> Duration {
    d.checked_mul(n).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_add_up_each_step() {
        let config = Config::new(Apn::new("internet").unwrap());
        // 5 probes of 1 s and a quiet wait, ATE0 and CGDCONT of 5 s each, ATD 60 s.
        assert_eq!(config.dial_bound(), Duration::from_secs(76));
        let once = config.with_probe_tries(NonZeroU8::MIN);
        assert_eq!(once.dial_bound(), Duration::from_secs(71));
        // 1.2 s guard, 5 s to write +++, 2.4 s for its OK, two ATH of 5 s.
        assert_eq!(config.hang_up_bound(), Duration::from_millis(18_600));
        assert_eq!(config.hang_up_dtr_bound(), Duration::from_millis(10_500));
    }

    #[test]
    fn guard_never_drops_below_a_second() {
        let t = Timeouts { guard: Duration::from_millis(10), ..Timeouts::DEFAULT };
        assert_eq!(t.effective_guard(), MIN_GUARD);
        let t = Timeouts { guard: Duration::from_secs(2), ..Timeouts::DEFAULT };
        assert_eq!(t.effective_guard(), Duration::from_secs(2));
    }

    #[test]
    fn bounds_saturate_instead_of_overflowing() {
        let t = Timeouts { dial: Duration::MAX, ..Timeouts::DEFAULT };
        let config = Config::new(Apn::new("").unwrap()).with_timeouts(t);
        assert_eq!(config.dial_bound(), Duration::MAX);
    }
}
