//! Typed time: a [`Duration`] of whole milliseconds in 32 bits, and an [`Instant`] on a
//! monotonic clock in milliseconds.
//!
//! A unit belongs in a type: a policy cannot be built from a bare number, and a clock that
//! counts in another unit does not compile against the runner. A call's durations (waits,
//! budgets, deadlines, a server's Retry-After) fit in 32 bits of milliseconds, about 49.7 days;
//! anything longer saturates at [`Duration::MAX`], which every stop rule reads as "longer than
//! this call can wait". Arithmetic saturates and never wraps or panics.
//!
//! ```
//! use wary::{Duration, Instant};
//! let wait = Duration::from_millis(1_500);
//! assert_eq!(wait.as_secs(), 1);
//! assert_eq!(Duration::from_secs(2) + wait, Duration::from_millis(3_500));
//! // A year does not fit: it saturates, and a policy reads it as too long.
//! assert_eq!(Duration::from_secs(365 * 86_400), Duration::MAX);
//! let start = Instant::from_millis(10_000);
//! assert_eq!(Instant::from_millis(12_500) - start, Duration::from_millis(2_500));
//! // An earlier instant minus a later one is no time, not a wrap.
//! assert_eq!(start - Instant::from_millis(12_500), Duration::ZERO);
//! ```

use core::ops::{Add, AddAssign, Sub, SubAssign};

/// A span of time in whole milliseconds, at most [`Duration::MAX`] (about 49.7 days).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Duration {
    millis: u32,
}

impl Duration {
    /// No time.
    pub const ZERO: Duration = Duration { millis: 0 };
    /// The longest duration, `u32::MAX` milliseconds: what any longer value saturates to, and
    /// longer than any call can wait.
    pub const MAX: Duration = Duration { millis: u32::MAX };

    /// Whole milliseconds, saturating at [`Duration::MAX`].
    pub const fn from_millis(millis: u64) -> Duration {
        Duration { millis: if millis > u32::MAX as u64 { u32::MAX } else { millis as u32 } }
    }

    /// Whole seconds, saturating at [`Duration::MAX`].
    pub const fn from_secs(secs: u64) -> Duration {
        Duration::from_millis(secs.saturating_mul(1000))
    }

    /// Microseconds, rounded up to whole milliseconds (a wait is never shortened), saturating.
    pub const fn from_micros_ceil(micros: u64) -> Duration {
        let ms = micros / 1000;
        Duration::from_millis(if micros.is_multiple_of(1000) { ms } else { ms.saturating_add(1) })
    }

    /// The milliseconds.
    pub const fn as_millis(self) -> u32 {
        self.millis
    }

    /// The whole seconds, rounded down.
    pub const fn as_secs(self) -> u32 {
        self.millis / 1000
    }

    /// The microseconds.
    pub const fn as_micros(self) -> u64 {
        (self.millis as u64).saturating_mul(1000)
    }

    /// True for [`Duration::MAX`]: a value that saturated, longer than wary counts.
    pub const fn is_max(self) -> bool {
        self.millis == u32::MAX
    }

    /// `self + other`, saturating at [`Duration::MAX`].
    pub const fn saturating_add(self, other: Duration) -> Duration {
        Duration { millis: self.millis.saturating_add(other.millis) }
    }

    /// `self − other`, or zero if `other` is longer.
    pub const fn saturating_sub(self, other: Duration) -> Duration {
        Duration { millis: self.millis.saturating_sub(other.millis) }
    }

    /// `self − other`, or `None` if `other` is longer.
    pub const fn checked_sub(self, other: Duration) -> Option<Duration> {
        match self.millis.checked_sub(other.millis) {
            Some(millis) => Some(Duration { millis }),
            None => None,
        }
    }

    /// `self · n`, saturating.
    pub const fn saturating_mul(self, n: u32) -> Duration {
        Duration { millis: self.millis.saturating_mul(n) }
    }

    /// The shorter of the two (`const`, unlike `Ord::min`).
    pub const fn min(self, other: Duration) -> Duration {
        if self.millis < other.millis { self } else { other }
    }

    /// The longer of the two (`const`, unlike `Ord::max`).
    pub const fn max(self, other: Duration) -> Duration {
        if self.millis > other.millis { self } else { other }
    }
}

impl Add for Duration {
    type Output = Duration;
    /// Saturating.
    fn add(self, rhs: Duration) -> Duration {
        self.saturating_add(rhs)
    }
}

impl AddAssign for Duration {
    fn add_assign(&mut self, rhs: Duration) {
        *self = self.saturating_add(rhs);
    }
}

impl Sub for Duration {
    type Output = Duration;
    /// Saturating at zero.
    fn sub(self, rhs: Duration) -> Duration {
        self.saturating_sub(rhs)
    }
}

impl SubAssign for Duration {
    fn sub_assign(&mut self, rhs: Duration) {
        *self = self.saturating_sub(rhs);
    }
}

impl core::fmt::Display for Duration {
    /// `1500 ms`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ms", self.millis)
    }
}

impl From<core::time::Duration> for Duration {
    /// Rounded down to whole milliseconds, saturating.
    fn from(d: core::time::Duration) -> Duration {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl From<Duration> for core::time::Duration {
    fn from(d: Duration) -> core::time::Duration {
        core::time::Duration::from_millis(u64::from(d.millis))
    }
}

/// A point on a monotonic clock, in milliseconds since the clock's own start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Instant {
    millis: u64,
}

impl Instant {
    /// The clock's start.
    pub const ZERO: Instant = Instant { millis: 0 };

    /// Milliseconds since the clock's start.
    pub const fn from_millis(millis: u64) -> Instant {
        Instant { millis }
    }

    /// Milliseconds since the clock's start.
    pub const fn as_millis(self) -> u64 {
        self.millis
    }

    /// The time from `earlier` to `self`: zero if `earlier` is later, [`Duration::MAX`] if longer
    /// than a duration holds.
    pub const fn duration_since(self, earlier: Instant) -> Duration {
        Duration::from_millis(self.millis.saturating_sub(earlier.millis))
    }

    /// `d` later, saturating at the clock's end.
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant { millis: self.millis.saturating_add(d.millis as u64) }
    }
}

impl Sub for Instant {
    type Output = Duration;
    /// [`Instant::duration_since`].
    fn sub(self, rhs: Instant) -> Duration {
        self.duration_since(rhs)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating.
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

#[cfg(feature = "embassy-time")]
mod embassy {
    use super::{Duration, Instant};

    impl From<embassy_time::Duration> for Duration {
        /// Rounded down to whole milliseconds, saturating.
        fn from(d: embassy_time::Duration) -> Duration {
            Duration::from_millis(d.as_millis())
        }
    }

    impl From<Duration> for embassy_time::Duration {
        fn from(d: Duration) -> embassy_time::Duration {
            embassy_time::Duration::from_millis(u64::from(d.as_millis()))
        }
    }

    impl From<embassy_time::Instant> for Instant {
        fn from(i: embassy_time::Instant) -> Instant {
            Instant::from_millis(i.as_millis())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_saturate_at_the_32_bit_limit_and_never_wrap() {
        assert_eq!(Duration::from_millis(u64::from(u32::MAX)), Duration::MAX);
        assert_eq!(Duration::from_millis(u64::from(u32::MAX) - 1).as_millis(), u32::MAX - 1);
        assert_eq!(Duration::from_millis(u64::from(u32::MAX) + 1), Duration::MAX);
        assert_eq!(Duration::from_secs(4_294_967), Duration::from_millis(4_294_967_000));
        assert_eq!(Duration::from_secs(4_294_968), Duration::MAX);
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
        assert!(Duration::MAX.is_max() && !Duration::from_millis(7).is_max());
        assert_eq!(Duration::MAX + Duration::from_millis(1), Duration::MAX);
        assert_eq!(Duration::from_millis(1) - Duration::from_millis(2), Duration::ZERO);
        assert_eq!(Duration::from_millis(5).checked_sub(Duration::from_millis(6)), None);
        assert_eq!(Duration::from_millis(6).checked_sub(Duration::from_millis(6)), Some(Duration::ZERO));
        assert_eq!(Duration::from_millis(3).saturating_mul(u32::MAX), Duration::MAX);
        assert_eq!(Duration::from_millis(1_999).as_secs(), 1);
        assert_eq!(Duration::from_millis(999).as_secs(), 0);
        assert_eq!(Duration::from_millis(7_000).as_secs(), 7);
        assert_eq!(Duration::MAX.as_secs(), 4_294_967);
        assert_eq!(Duration::from_millis(2).as_micros(), 2_000);
    }

    #[test]
    fn operators_saturate_like_the_methods() {
        let mut d = Duration::from_millis(5);
        d += Duration::from_millis(7);
        assert_eq!(d, Duration::from_millis(12));
        d += Duration::MAX;
        assert_eq!(d, Duration::MAX);
        assert_eq!(Duration::from_millis(9) - Duration::from_millis(4), Duration::from_millis(5));
        let mut e = Duration::from_millis(9);
        e -= Duration::from_millis(4);
        assert_eq!(e, Duration::from_millis(5));
        e -= Duration::from_millis(6);
        assert_eq!(e, Duration::ZERO);
        assert_eq!(Instant::from_millis(123_456_789_012).as_millis(), 123_456_789_012);
    }

    #[cfg(feature = "embassy-time")]
    #[test]
    fn embassy_time_converts_both_ways() {
        let d: Duration = embassy_time::Duration::from_millis(1_234).into();
        assert_eq!(d, Duration::from_millis(1_234));
        let back: embassy_time::Duration = Duration::from_millis(4_321).into();
        assert_eq!(back, embassy_time::Duration::from_millis(4_321));
        let i: Instant = embassy_time::Instant::from_millis(98_765).into();
        assert_eq!(i, Instant::from_millis(98_765));
        let long: Duration = embassy_time::Duration::from_secs(365 * 86_400).into();
        assert_eq!(long, Duration::MAX);
    }

    #[test]
    fn microseconds_round_up_so_a_wait_is_never_shortened() {
        assert_eq!(Duration::from_micros_ceil(0), Duration::ZERO);
        assert_eq!(Duration::from_micros_ceil(1), Duration::from_millis(1));
        assert_eq!(Duration::from_micros_ceil(1_000), Duration::from_millis(1));
        assert_eq!(Duration::from_micros_ceil(1_001), Duration::from_millis(2));
        assert_eq!(Duration::from_micros_ceil(u64::MAX), Duration::MAX);
    }

    #[test]
    fn core_durations_round_trip_and_round_down() {
        let d: Duration = core::time::Duration::from_micros(1_999).into();
        assert_eq!(d, Duration::from_millis(1));
        let d: Duration = core::time::Duration::from_secs(u64::MAX).into();
        assert_eq!(d, Duration::MAX);
        let back: core::time::Duration = Duration::from_millis(1_234).into();
        assert_eq!(back, core::time::Duration::from_millis(1_234));
    }

    #[test]
    fn instants_subtract_to_durations_and_saturate() {
        let a = Instant::from_millis(1_000);
        assert_eq!(Instant::from_millis(3_500) - a, Duration::from_millis(2_500));
        assert_eq!(a - Instant::from_millis(3_500), Duration::ZERO);
        assert_eq!(Instant::from_millis(u64::MAX) - Instant::ZERO, Duration::MAX);
        assert_eq!(a + Duration::from_millis(5), Instant::from_millis(1_005));
        assert_eq!(Instant::from_millis(u64::MAX) + Duration::MAX, Instant::from_millis(u64::MAX));
        assert_eq!(Duration::from_millis(2).min(Duration::from_millis(3)), Duration::from_millis(2));
        assert_eq!(Duration::from_millis(2).max(Duration::from_millis(3)), Duration::from_millis(3));
        assert_eq!(format!("{}", Duration::from_millis(1_500)), "1500 ms");
    }
}
