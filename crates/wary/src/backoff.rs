//! Backoff ceilings and jitter, from injected draws, in saturating integer ticks.
//!
//! Retry `k` (1-based) starts from the ceiling `c = min(cap, base·2^(k−1))`. The jitter then
//! picks the wait from the ceiling and a draw the caller supplies, so a schedule is a pure
//! function that a test can fix and a field incident can replay.
//!
//! ```
//! use wary::{Draw, Jitter};
//! use wary::backoff::{Backoff, ceiling};
//! assert_eq!(ceiling(2, 60, 1), 2);
//! assert_eq!(ceiling(2, 60, 6), 60);
//! let b = Backoff::new(2, 60, Jitter::Equal);
//! // Equal jitter: c / 2 + (c − c / 2) · draw, rounded down.
//! assert_eq!(b.wait(6, 0, Draw::percent(99).unwrap()), 59);
//! assert_eq!(b.wait(6, 0, Draw::percent(0).unwrap()), 30);
//! ```

use crate::error::DrawError;

/// How a wait is drawn below its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Jitter {
    /// Half fixed, half drawn: `c/2 + draw·(c − c/2)`. The fixed half means every retry spends
    /// budget, so the budget bounds the attempts. wary's default.
    Equal,
    /// Anywhere in `[0, c)`: the fewest calls under contention, but a draw
    /// near 0 spends no budget, so a policy with it needs an attempt cap.
    Full,
    /// `base + draw·(min(cap, 3·previous) − base)`: each wait grows from the last one drawn.
    Decorrelated,
    /// Exactly the ceiling: a synchronised herd if many clients fail together. For tests and
    /// comparisons.
    None,
}

impl Jitter {
    /// The name used in configuration and `wary explain`.
    pub const fn name(&self) -> &'static str {
        match self {
            Jitter::Equal => "equal",
            Jitter::Full => "full",
            Jitter::Decorrelated => "decorrelated",
            Jitter::None => "none",
        }
    }

    /// Parses [`Jitter::name`] back.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "equal" => Some(Jitter::Equal),
            "full" => Some(Jitter::Full),
            "decorrelated" => Some(Jitter::Decorrelated),
            "none" => Some(Jitter::None),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
enum DrawKind {
    Percent,
    Unit,
}

/// One random draw in `[0, 1)`, supplied by the caller.
///
/// Two forms: a whole percentage 0..=99 (the exercise preset and `wary plan`), or a 32-bit
/// fraction of 2³² (production, from a `rand_core::RngCore` seeded per device — never one fixed
/// RNG seed for a whole fleet, or every device draws the same waits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Draw {
    kind: DrawKind,
    value: u32,
}

impl Draw {
    /// The smallest draw (0).
    pub const ZERO: Draw = Draw { kind: DrawKind::Unit, value: 0 };

    /// A whole-percent draw; refused outside 0..=99.
    pub const fn percent(p: u8) -> Result<Draw, DrawError> {
        if p > 99 {
            return Err(DrawError::OutOfRange);
        }
        Ok(Draw { kind: DrawKind::Percent, value: p as u32 })
    }

    /// A fraction `x / 2³²`.
    pub const fn unit(x: u32) -> Draw {
        Draw { kind: DrawKind::Unit, value: x }
    }

    /// The next draw from a random number generator.
    pub fn from_rng<R: rand_core::RngCore + ?Sized>(rng: &mut R) -> Draw {
        Draw::unit(rng.next_u32())
    }

    /// The percentage, if this is a percent draw.
    pub const fn as_percent(&self) -> Option<u8> {
        match self.kind {
            DrawKind::Percent => Some(self.value as u8),
            DrawKind::Unit => None,
        }
    }

    /// The 32-bit fraction, if this is a unit draw.
    pub const fn as_unit(&self) -> Option<u32> {
        match self.kind {
            DrawKind::Percent => None,
            DrawKind::Unit => Some(self.value),
        }
    }

    /// `x · draw`, rounded down: always below `x` unless `x` is 0.
    ///
    /// Exact in 64-bit arithmetic, splitting `x` so that no product can wrap: a 128-bit division
    /// would link a kilobyte-sized runtime routine into a device's flash.
    #[inline]
    pub const fn scale(&self, x: u64) -> u64 {
        let v = self.value as u64;
        match self.kind {
            // x = 100q + r: ⌊x·p/100⌋ = q·p + ⌊r·p/100⌋, and p < 100 keeps both terms below x.
            DrawKind::Percent => {
                (x / 100).saturating_mul(v).saturating_add((x % 100).saturating_mul(v) / 100)
            }
            // x = hi·2³² + lo: ⌊x·v/2³²⌋ = hi·v + ⌊lo·v/2³²⌋, each product below 2⁶⁴.
            DrawKind::Unit => {
                (x >> 32).saturating_mul(v).saturating_add(((x & 0xffff_ffff).saturating_mul(v)) >> 32)
            }
        }
    }
}

/// The smaller of two durations, in a `const fn` (`Ord::min` is not one). Kept in one place:
/// at equality either operand is the answer, so `<` and `<=` here cannot be told apart by any
/// input, and `cargo xtask mutants` excludes that one equivalent mutant by this function's name.
#[inline]
pub(crate) const fn at_most(x: u64, limit: u64) -> u64 {
    if x < limit { x } else { limit }
}

/// The larger of two durations, in a `const fn`; see [`at_most`].
#[inline]
pub(crate) const fn at_least(x: u64, floor: u64) -> u64 {
    if x > floor { x } else { floor }
}

/// `min(cap, base·2^(k−1))` for retry `k` ≥ 1, saturating; retry 0 is treated as retry 1.
#[inline]
pub const fn ceiling(base: u64, cap: u64, k: u32) -> u64 {
    let shift = k.saturating_sub(1);
    let grown = if shift >= 64 {
        u64::MAX
    } else {
        match base.checked_mul(1u64 << shift) {
            Some(v) => v,
            None => u64::MAX,
        }
    };
    at_most(grown, cap)
}

/// Exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Backoff {
    /// The first ceiling, in ticks.
    pub base: u64,
    /// The largest ceiling, in ticks.
    pub cap: u64,
    /// How the wait is drawn under the ceiling.
    pub jitter: Jitter,
}

impl Backoff {
    /// A backoff; validation happens in [`crate::PolicyBuilder::build`].
    pub const fn new(base: u64, cap: u64, jitter: Jitter) -> Self {
        Backoff { base, cap, jitter }
    }

    /// The ceiling of retry `k`.
    #[inline]
    pub const fn ceiling(&self, k: u32) -> u64 {
        ceiling(self.base, self.cap, k)
    }

    /// The wait before retry `k`, given the previous wait (decorrelated jitter only) and a draw.
    #[inline]
    pub const fn wait(&self, k: u32, previous: u64, draw: Draw) -> u64 {
        let c = self.ceiling(k);
        match self.jitter {
            Jitter::Equal => {
                let fixed = c / 2;
                fixed.saturating_add(draw.scale(c.saturating_sub(fixed)))
            }
            Jitter::Full => draw.scale(c),
            Jitter::Decorrelated => {
                let prev = at_least(previous, self.base);
                let hi = at_least(at_most(prev.saturating_mul(3), self.cap), self.base);
                self.base.saturating_add(draw.scale(hi.saturating_sub(self.base)))
            }
            Jitter::None => c,
        }
    }

    /// The shortest wait retry `k` can draw (every draw at 0), given the previous wait.
    pub const fn min_wait(&self, k: u32, previous: u64) -> u64 {
        self.wait(k, previous, Draw::ZERO)
    }

    /// The longest wait retry `k` can draw, given the previous wait.
    pub const fn max_wait(&self, k: u32, previous: u64) -> u64 {
        self.wait(k, previous, Draw::unit(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(p: u8) -> Draw {
        Draw::percent(p).unwrap()
    }

    #[test]
    fn ceiling_doubles_then_caps_and_saturates() {
        let c: Vec<u64> = (1..=8).map(|k| ceiling(2, 60, k)).collect();
        assert_eq!(c, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(ceiling(3, u64::MAX, 200), u64::MAX);
        assert_eq!(ceiling(u64::MAX / 2, u64::MAX, 3), u64::MAX);
        assert_eq!(ceiling(5, 100, 0), 5);
    }

    #[test]
    fn equal_jitter_waits_half_the_ceiling_plus_a_drawn_share_of_the_rest() {
        let b = Backoff::new(2, 60, Jitter::Equal);
        let waits: Vec<u64> = (1..=7).map(|k| b.wait(k, 0, pct(0))).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        let waits: Vec<u64> = (1..=6).map(|k| b.wait(k, 0, pct(99))).collect();
        assert_eq!(waits, [1, 3, 7, 15, 31, 59]);
        assert_eq!(b.wait(2, 0, pct(50)), 3);
    }

    #[test]
    fn full_jitter_stays_below_the_ceiling() {
        let b = Backoff::new(100, 1000, Jitter::Full);
        assert_eq!(b.wait(1, 0, Draw::ZERO), 0);
        assert_eq!(b.wait(1, 0, Draw::unit(u32::MAX)), 99);
        assert_eq!(b.wait(4, 0, Draw::unit(1 << 31)), 400);
    }

    #[test]
    fn decorrelated_grows_from_the_previous_wait() {
        let b = Backoff::new(10, 1000, Jitter::Decorrelated);
        assert_eq!(b.wait(1, 0, Draw::ZERO), 10);
        // hi = min(1000, 3·100) = 300; 10 + (290·½) = 155
        assert_eq!(b.wait(2, 100, Draw::unit(1 << 31)), 155);
        assert!(b.wait(9, 900, Draw::unit(u32::MAX)) < 1000);
    }

    #[test]
    fn no_jitter_is_the_ceiling() {
        let b = Backoff::new(5, 2000, Jitter::None);
        assert_eq!(b.wait(3, 0, pct(77)), 20);
    }

    #[test]
    fn draws_are_validated() {
        assert_eq!(Draw::percent(100), Err(DrawError::OutOfRange));
        assert_eq!(pct(99).as_percent(), Some(99));
        assert_eq!(Draw::unit(7).as_unit(), Some(7));
        assert_eq!(pct(50).scale(u64::MAX), u64::MAX / 2);
        // The split arithmetic agrees with 128-bit arithmetic everywhere, the edges included.
        for x in [0, 1, 99, 100, 101, 12_345, (1 << 32) - 1, 1 << 32, (1 << 48) + 7, u64::MAX - 1, u64::MAX] {
            for p in [0u8, 1, 37, 50, 99] {
                let want = (u128::from(x) * u128::from(p) / 100) as u64;
                assert_eq!(pct(p).scale(x), want, "{x} · {p}%");
            }
            for v in [0u32, 1, 0x8000_0000, 0xdead_beef, u32::MAX] {
                let want = ((u128::from(x) * u128::from(v)) >> 32) as u64;
                assert_eq!(Draw::unit(v).scale(x), want, "{x} · {v}/2³²");
            }
        }
    }

    #[test]
    fn the_cap_bounds_the_ceiling_from_the_retry_that_reaches_it() {
        // Base 3, cap 12: 3, 6, 12, then 12 (24 is clipped); a cap equal to a doubling is reached
        // exactly, one below it clips that retry.
        let c: Vec<u64> = (1..=5).map(|k| ceiling(3, 12, k)).collect();
        assert_eq!(c, [3, 6, 12, 12, 12]);
        let c: Vec<u64> = (1..=4).map(|k| ceiling(3, 11, k)).collect();
        assert_eq!(c, [3, 6, 11, 11]);
        let c: Vec<u64> = (1..=3).map(|k| ceiling(3, 13, k)).collect();
        assert_eq!(c, [3, 6, 12]);
        // A cap below the base: every ceiling is the cap.
        assert_eq!(ceiling(10, 4, 1), 4);
        assert_eq!(Backoff::new(10, 4, Jitter::None).ceiling(3), 4);
        // Shifts of 63 and 64: the last one that fits and the first that cannot.
        assert_eq!(ceiling(1, u64::MAX, 64), 1 << 63);
        assert_eq!(ceiling(1, u64::MAX, 65), u64::MAX);
        assert_eq!(ceiling(2, u64::MAX, 64), u64::MAX);
    }

    #[test]
    fn decorrelated_bounds_are_the_base_and_three_times_the_last_wait_capped() {
        let b = Backoff::new(10, 1000, Jitter::Decorrelated);
        let top = Draw::unit(u32::MAX);
        // The previous wait below the base counts as the base: hi = 30.
        assert_eq!(b.wait(1, 0, top), 29);
        assert_eq!(b.wait(1, 9, top), 29);
        assert_eq!(b.wait(1, 10, top), 29);
        assert_eq!(b.wait(1, 11, top), 10 + 22);
        // Three times the last wait, up to the cap.
        assert_eq!(b.wait(2, 100, top), 299);
        assert_eq!(b.wait(2, 333, top), 998);
        assert_eq!(b.wait(2, 334, top), 999);
        assert_eq!(b.wait(2, 5_000, top), 999);
        // The lowest draw waits the base, whatever came before.
        assert_eq!(b.wait(7, 900, Draw::ZERO), 10);
        // A cap below the base leaves nothing to draw: exactly the base.
        let low = Backoff::new(10, 4, Jitter::Decorrelated);
        assert_eq!(low.wait(1, 0, top), 10);
        assert_eq!(low.wait(3, 50, top), 10);
        // Three times a huge last wait saturates instead of wrapping.
        let big = Backoff::new(1, u64::MAX, Jitter::Decorrelated);
        assert_eq!(big.wait(2, u64::MAX / 2, Draw::unit(1 << 31)), 1 + (u64::MAX - 1) / 2);
    }

    #[test]
    fn shortest_and_longest_waits_are_the_lowest_and_highest_draws() {
        let b = Backoff::new(2, 60, Jitter::Equal);
        assert_eq!((b.min_wait(6, 0), b.max_wait(6, 0)), (30, 59));
        assert_eq!((b.min_wait(1, 0), b.max_wait(1, 0)), (1, 1));
        let b = Backoff::new(100, 1000, Jitter::Full);
        assert_eq!((b.min_wait(2, 0), b.max_wait(2, 0)), (0, 199));
        let b = Backoff::new(10, 1000, Jitter::Decorrelated);
        assert_eq!((b.min_wait(2, 100), b.max_wait(2, 100)), (10, 299));
        let b = Backoff::new(7, 1000, Jitter::None);
        assert_eq!((b.min_wait(2, 0), b.max_wait(2, 0)), (14, 14));
    }

    #[test]
    fn jitter_names_round_trip_and_nothing_else_parses() {
        for j in [Jitter::Equal, Jitter::Full, Jitter::Decorrelated, Jitter::None] {
            assert_eq!(Jitter::from_name(j.name()), Some(j));
        }
        let names: Vec<&str> = [Jitter::Equal, Jitter::Full, Jitter::Decorrelated, Jitter::None]
            .iter()
            .map(|j| j.name())
            .collect();
        assert_eq!(names, ["equal", "full", "decorrelated", "none"]);
        for other in ["", "Equal", "FULL", "decorrelated ", "exponential"] {
            assert_eq!(Jitter::from_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn draws_keep_their_kind() {
        assert_eq!(Draw::unit(7).as_percent(), None);
        assert_eq!(pct(7).as_unit(), None);
        assert_eq!(Draw::ZERO.as_unit(), Some(0));
        assert_eq!(Draw::percent(0).unwrap().as_percent(), Some(0));
        struct Fixed(u32);
        impl rand_core::RngCore for Fixed {
            fn next_u32(&mut self) -> u32 {
                self.0
            }
            fn next_u64(&mut self) -> u64 {
                u64::from(self.0)
            }
            fn fill_bytes(&mut self, dst: &mut [u8]) {
                dst.fill(0);
            }
        }
        assert_eq!(Draw::from_rng(&mut Fixed(0xdead_beef)), Draw::unit(0xdead_beef));
    }
}
