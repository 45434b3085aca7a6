//! Backoff ceilings and jitter, from injected draws, in saturating 32-bit milliseconds.
//!
//! Retry `k` (1-based) starts from the ceiling `c = min(cap, base·2^(k−1))`. The jitter then
//! picks the wait from the ceiling and a draw the caller supplies, so a schedule is a pure
//! function that a test can fix and a field incident can replay.
//!
//! ```
//! use wary::{Backoff, Draw, Duration, Jitter};
//! let ms = Duration::from_millis;
//! let b = Backoff::new(ms(2), ms(60), Jitter::Equal);
//! assert_eq!(b.ceiling(1), ms(2));
//! assert_eq!(b.ceiling(6), ms(60));
//! // Equal jitter: c / 2 + (c − c / 2) · draw, rounded down.
//! assert_eq!(b.wait(6, Duration::ZERO, Draw::percent(99).unwrap()), ms(59));
//! assert_eq!(b.wait(6, Duration::ZERO, Draw::percent(0).unwrap()), ms(30));
//! ```

use crate::error::DrawError;
use crate::names::named_enum;
use crate::time::Duration;

named_enum! {
    /// How a wait is drawn below its ceiling.
    pub enum Jitter {
        /// Half fixed, half drawn: `c/2 + draw·(c − c/2)`. The fixed half means every retry spends
        /// budget, so the budget bounds the attempts. wary's default.
        Equal => "equal",
        /// Anywhere in `[0, c)`: the fewest calls under contention, but a draw
        /// near 0 spends no budget, so a policy with it needs an attempt cap.
        Full => "full",
        /// `base + draw·(min(cap, 3·previous) − base)`: each wait grows from the last one drawn.
        Decorrelated => "decorrelated",
        /// Exactly the ceiling: a synchronised herd if many clients fail together. For tests and
        /// comparisons.
        None => "none",
        /// RFC 7252's CON retransmission timeout: the first wait is drawn once, in
        /// `[base, base + base/2]` (both ends included: ACK_TIMEOUT to ACK_TIMEOUT ×
        /// ACK_RANDOM_FACTOR 1.5), and each later wait doubles the previous one while the ceiling
        /// doubles. Only the first retry's draw counts: later draws are not used, so a call's
        /// whole schedule follows from one draw. Waits lie in `[c, c + c/2]`, half as much again
        /// above the ceiling at most, as the RFC's random factor allows. Once the ceiling stops
        /// growing (the cap), the wait stays where it was; a previous wait outside the range
        /// (one a Retry-After raised) is brought back into it.
        Coap => "coap",
    }
}

/// One random draw in `[0, 1)`, supplied by the caller.
///
/// Two resolutions: a whole percentage 0..=99 (a schedule a person writes down, as `wary plan`
/// takes it), or a 32-bit fraction of 2³² (production, from a `rand_core::RngCore` seeded per
/// device — never one fixed RNG seed for a whole fleet, or every device draws the same waits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Draw {
    /// A whole percentage, 0..=99: `x · p / 100`. Build it with [`Draw::percent`].
    Percent(#[cfg_attr(feature = "serde", serde(deserialize_with = "percent_in_range"))] u8),
    /// A fraction `x / 2³²`: `x · v >> 32`.
    Unit(u32),
}

#[cfg(feature = "serde")]
fn percent_in_range<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let p = <u8 as serde::Deserialize>::deserialize(d)?;
    match Draw::percent(p) {
        Ok(_) => Ok(p),
        Err(_) => Err(serde::de::Error::custom("a percent draw is 0..=99")),
    }
}

impl Draw {
    /// The smallest draw (0).
    pub const ZERO: Draw = Draw::Unit(0);
    /// The largest draw (just under 1).
    pub const TOP: Draw = Draw::Unit(u32::MAX);

    /// A whole-percent draw; refused outside 0..=99.
    pub const fn percent(p: u8) -> Result<Draw, DrawError> {
        if p > 99 {
            return Err(DrawError::OutOfRange);
        }
        Ok(Draw::Percent(p))
    }

    /// A fraction `x / 2³²`.
    pub const fn unit(x: u32) -> Draw {
        Draw::Unit(x)
    }

    /// The next draw from a random number generator.
    pub fn from_rng<R: rand_core::RngCore + ?Sized>(rng: &mut R) -> Draw {
        Draw::Unit(rng.next_u32())
    }

    /// `x · draw`, rounded down: always below `x` unless `x` is 0.
    ///
    /// 32-bit arithmetic only, with one 32×32→64 multiply for a unit draw (a multiply and a
    /// shift, no division) and one 32-bit division by 100 for a percent draw: no 64-bit
    /// division routine is linked into a device's flash. A percent draw above 99 (only possible
    /// by building the variant directly) counts as 99.
    #[inline]
    pub const fn scale(self, x: Duration) -> Duration {
        let x = x.as_millis();
        let scaled = match self {
            // x = 100q + r: ⌊x·p/100⌋ = q·p + ⌊r·p/100⌋, and p < 100 keeps both terms below x.
            Draw::Percent(p) => {
                let p = if p > 99 { 99 } else { p as u32 };
                (x / 100).saturating_mul(p).saturating_add((x % 100).saturating_mul(p) / 100)
            }
            // The product of two 32-bit values cannot wrap 64 bits, and the shift leaves a
            // value below x.
            Draw::Unit(v) => ((x as u64).wrapping_mul(v as u64) >> 32) as u32,
        };
        Duration::from_millis(scaled as u64)
    }
}

/// The fixed part of each jitter's wait in halves of the ceiling, two bits per [`Jitter`] in
/// declaration order: equal 1, full 0, decorrelated (unused) 0, none 2.
const FIXED_HALVES: u32 = 1u32.wrapping_add(2 << ((Jitter::None as u32) << 1));

/// Exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Backoff {
    /// The first ceiling.
    pub base: Duration,
    /// The largest ceiling.
    pub cap: Duration,
    /// How the wait is drawn under the ceiling.
    pub jitter: Jitter,
}

impl Backoff {
    /// A backoff; a policy checks it when built ([`crate::PolicyBuilder::build`]).
    pub const fn new(base: Duration, cap: Duration, jitter: Jitter) -> Self {
        Backoff { base, cap, jitter }
    }

    /// `min(cap, base·2^(k−1))` for retry `k` ≥ 1, saturating; retry 0 counts as retry 1.
    #[inline]
    pub const fn ceiling(&self, k: u32) -> Duration {
        let shift = k.saturating_sub(1);
        let base = self.base.as_millis();
        // base·2^shift fits 32 bits exactly when base has at least `shift` leading zeros.
        let grown = if base == 0 {
            0
        } else if shift <= base.leading_zeros() {
            base << shift
        } else {
            u32::MAX
        };
        Duration::from_millis(grown as u64).min(self.cap)
    }

    /// The wait before retry `k`, given the previous wait (decorrelated jitter only) and a draw.
    #[inline]
    pub const fn wait(&self, k: u32, previous: Duration, draw: Draw) -> Duration {
        self.wait_under(self.ceiling(k), previous, draw)
    }

    /// The wait drawn under the ceiling `c`, given the previous wait (decorrelated jitter only).
    #[inline]
    pub(crate) const fn wait_under(&self, c: Duration, previous: Duration, draw: Draw) -> Duration {
        // Every jitter as one form, `floor + draw·span` with `floor + span` at most the ceiling
        // (or the cap), so a wait takes one scaling whatever the jitter and the sum cannot
        // overflow (no jitter is a span of 0, which every draw scales to 0).
        let (floor, span) = match self.jitter {
            Jitter::Coap => return coap_wait(c, previous, draw),
            Jitter::Decorrelated => {
                let prev = previous.max(self.base);
                let hi = prev.saturating_mul(3).min(self.cap).max(self.base).as_millis();
                (self.base.as_millis(), hi.wrapping_sub(self.base.as_millis()))
            }
            // The fixed part is half the ceiling (equal), nothing (full) or all of it (none),
            // that is `c·m/2` for m = 1, 0, 2, read from two bits per jitter: one multiply, not
            // a branch per jitter. The drawn part is the rest.
            j => {
                let c = c.as_millis();
                let m = (FIXED_HALVES >> ((j as u32) << 1)) & 3;
                let fixed = ((c as u64).wrapping_mul(m as u64) >> 1) as u32;
                (fixed, c.wrapping_sub(fixed))
            }
        };
        Duration::from_millis(
            floor.wrapping_add(draw.scale(Duration::from_millis(span as u64)).as_millis()) as u64
        )
    }

    /// The shortest wait retry `k` can draw, given the previous wait: every draw at 0, except
    /// for [`Jitter::Coap`], whose bound is its range's floor, the ceiling itself (see
    /// [`Backoff::max_wait`]).
    pub const fn min_wait(&self, k: u32, previous: Duration) -> Duration {
        match self.jitter {
            Jitter::Coap => self.ceiling(k),
            _ => self.wait(k, previous, Draw::ZERO),
        }
    }

    /// The longest wait retry `k` can draw, given the previous wait: every draw at the top,
    /// except for [`Jitter::Coap`], whose bound is its range's top, one and a half ceilings.
    ///
    /// A CoAP wait is the call's one draw, doubled at each retry: which draw gives the shortest
    /// or the longest retry `k` depends on where the doubling meets the cap (a larger first
    /// draw can double past the range a retry earlier and be held, then brought up to its
    /// floor), so the draws at 0 and at the top do not bound it; the range it is brought into
    /// does.
    pub const fn max_wait(&self, k: u32, previous: Duration) -> Duration {
        match self.jitter {
            Jitter::Coap => {
                let c = self.ceiling(k);
                c.saturating_add(Duration::from_millis((c.as_millis() >> 1) as u64))
            }
            _ => self.wait(k, previous, Draw::TOP),
        }
    }
}

/// A backoff in sequence: a [`Backoff`], the waits drawn from it in a row and the last of
/// them. For a loop that keeps its own pace between tries (an outbox's rounds, a reconnect, a
/// redial): [`Sequence::next`] draws the wait of the next step, [`Sequence::reset`] starts
/// again at the base once a try worked.
///
/// ```
/// use wary::{Backoff, Draw, Duration, Jitter, Sequence};
/// let ms = Duration::from_millis;
/// let mut s = Sequence::new(Backoff::new(ms(500), ms(30_000), Jitter::Equal));
/// assert_eq!(s.next(Draw::ZERO), ms(250));
/// assert_eq!(s.next(Draw::ZERO), ms(500));
/// // One doubling more, for a pause a throttled fleet must stretch.
/// assert_eq!(s.next_raised(1, Draw::ZERO), ms(2000));
/// assert_eq!(s.step(), 3);
/// s.reset();
/// assert_eq!(s.next(Draw::ZERO), ms(250));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Sequence {
    backoff: Backoff,
    step: u32,
    previous: Duration,
}

impl Sequence {
    /// A sequence at its start: the next wait is the first step's.
    pub const fn new(backoff: Backoff) -> Self {
        Sequence { backoff, step: 0, previous: Duration::ZERO }
    }

    /// The backoff it draws from.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Waits drawn in a row since the start (or the last [`Sequence::reset`]).
    pub const fn step(&self) -> u32 {
        self.step
    }

    /// The ceiling of the next wait, `extra` doublings higher.
    pub const fn ceiling(&self, extra: u32) -> Duration {
        self.backoff.ceiling(self.step.saturating_add(1).saturating_add(extra))
    }

    /// The next step's wait from `draw`.
    pub fn next(&mut self, draw: Draw) -> Duration {
        self.next_raised(0, draw)
    }

    /// The next step's wait, drawn `extra` doublings higher (still capped).
    pub fn next_raised(&mut self, extra: u32, draw: Draw) -> Duration {
        let k = self.step.saturating_add(1).saturating_add(extra);
        let wait = self.backoff.wait(k, self.previous, draw);
        self.step = self.step.saturating_add(1);
        self.previous = wait;
        wait
    }

    /// Back to the start: the try worked.
    pub fn reset(&mut self) {
        self.step = 0;
        self.previous = Duration::ZERO;
    }

    /// Picks up after `step` waits in a row (from before a reset): the next wait is the one
    /// after them.
    pub fn resume(&mut self, step: u32) {
        self.step = step;
    }
}

/// [`Jitter::Coap`]'s wait under the ceiling `c`: drawn in `[c, c + c/2]` when there is no
/// previous wait, else the previous one doubled (or, past the range, held and brought into it).
#[inline]
const fn coap_wait(c: Duration, previous: Duration, draw: Draw) -> Duration {
    let c = c.as_millis();
    let half = c >> 1;
    let top = c.saturating_add(half);
    let prev = previous.as_millis();
    let wait = if prev == 0 {
        // The one draw of the call. A draw is below 1, so `half + 1` lets the top draw reach
        // `c + c/2` itself, as the RFC's closed interval does.
        c.saturating_add(draw.scale(Duration::from_millis((half as u64).saturating_add(1))).as_millis())
    } else {
        let doubled = prev.saturating_mul(2);
        let next = if doubled <= top { doubled } else { prev };
        // Brought into the range: a doubled drawn wait is already in it.
        if next < c {
            c
        } else if next > top {
            top
        } else {
            next
        }
    };
    Duration::from_millis(wait as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(p: u8) -> Draw {
        Draw::percent(p).unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn b(base: u64, cap: u64, jitter: Jitter) -> Backoff {
        Backoff::new(ms(base), ms(cap), jitter)
    }

    fn waits(b: &Backoff, ks: core::ops::RangeInclusive<u32>, d: Draw) -> Vec<u32> {
        ks.map(|k| b.wait(k, Duration::ZERO, d).as_millis()).collect()
    }

    #[test]
    fn ceiling_doubles_then_caps_and_saturates() {
        let c: Vec<u32> = (1..=8).map(|k| b(2, 60, Jitter::None).ceiling(k).as_millis()).collect();
        assert_eq!(c, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b(3, u64::MAX, Jitter::None).ceiling(200), Duration::MAX);
        assert_eq!(b(u64::from(u32::MAX / 2), u64::MAX, Jitter::None).ceiling(3), Duration::MAX);
        assert_eq!(b(5, 100, Jitter::None).ceiling(0), ms(5));
        assert_eq!(b(0, 100, Jitter::None).ceiling(40), Duration::ZERO);
    }

    #[test]
    fn equal_jitter_waits_half_the_ceiling_plus_a_drawn_share_of_the_rest() {
        let e = b(2, 60, Jitter::Equal);
        assert_eq!(waits(&e, 1..=7, pct(0)), [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(waits(&e, 1..=6, pct(99)), [1, 3, 7, 15, 31, 59]);
        assert_eq!(e.wait(2, Duration::ZERO, pct(50)), ms(3));
    }

    #[test]
    fn full_jitter_stays_below_the_ceiling() {
        let f = b(100, 1000, Jitter::Full);
        assert_eq!(f.wait(1, Duration::ZERO, Draw::ZERO), ms(0));
        assert_eq!(f.wait(1, Duration::ZERO, Draw::TOP), ms(99));
        assert_eq!(f.wait(4, Duration::ZERO, Draw::unit(1 << 31)), ms(400));
    }

    #[test]
    fn decorrelated_grows_from_the_previous_wait() {
        let d = b(10, 1000, Jitter::Decorrelated);
        assert_eq!(d.wait(1, Duration::ZERO, Draw::ZERO), ms(10));
        // hi = min(1000, 3·100) = 300; 10 + (290·½) = 155
        assert_eq!(d.wait(2, ms(100), Draw::unit(1 << 31)), ms(155));
        assert!(d.wait(9, ms(900), Draw::TOP) < ms(1000));
    }

    #[test]
    fn no_jitter_is_the_ceiling() {
        assert_eq!(b(5, 2000, Jitter::None).wait(3, Duration::ZERO, pct(77)), ms(20));
    }

    #[test]
    fn draws_are_validated_and_scale_exactly() {
        assert_eq!(Draw::percent(100), Err(DrawError::OutOfRange));
        assert_eq!(pct(99), Draw::Percent(99));
        assert_eq!(Draw::unit(7), Draw::Unit(7));
        assert_eq!(pct(50).scale(Duration::MAX), ms(u64::from(u32::MAX / 2)));
        // A percent variant built out of range counts as 99, never more than the value.
        assert_eq!(Draw::Percent(200).scale(ms(1000)), ms(990));
        // The split arithmetic agrees with wide arithmetic everywhere, the edges included.
        for x in [0u64, 1, 99, 100, 101, 12_345, (1 << 31) + 7, u64::from(u32::MAX) - 1, u64::from(u32::MAX)]
        {
            for p in [0u8, 1, 37, 50, 99] {
                let want = x * u64::from(p) / 100;
                assert_eq!(pct(p).scale(ms(x)), ms(want), "{x} · {p}%");
            }
            for v in [0u32, 1, 0x8000_0000, 0xdead_beef, u32::MAX] {
                let want = (x * u64::from(v)) >> 32;
                assert_eq!(Draw::unit(v).scale(ms(x)), ms(want), "{x} · {v}/2³²");
            }
        }
    }

    #[test]
    fn the_cap_bounds_the_ceiling_from_the_retry_that_reaches_it() {
        // Base 3, cap 12: 3, 6, 12, then 12 (24 is clipped); a cap equal to a doubling is reached
        // exactly, one below it clips that retry.
        let c = |cap, n| (1..=n).map(|k| b(3, cap, Jitter::None).ceiling(k).as_millis()).collect::<Vec<_>>();
        assert_eq!(c(12, 5), [3, 6, 12, 12, 12]);
        assert_eq!(c(11, 4), [3, 6, 11, 11]);
        assert_eq!(c(13, 3), [3, 6, 12]);
        // A cap below the base: every ceiling is the cap.
        assert_eq!(b(10, 4, Jitter::None).ceiling(1), ms(4));
        assert_eq!(b(10, 4, Jitter::None).ceiling(3), ms(4));
        // Shifts of 31 and 32: the last one that fits and the first that cannot.
        let one = b(1, u64::MAX, Jitter::None);
        assert_eq!(one.ceiling(32), ms(1 << 31));
        assert_eq!(one.ceiling(33), Duration::MAX);
        assert_eq!(b(2, u64::MAX, Jitter::None).ceiling(32), Duration::MAX);
        assert_eq!(b(2, u64::MAX, Jitter::None).ceiling(31), ms(1 << 31));
        assert_eq!(b(3, u64::MAX, Jitter::None).ceiling(31), ms(3 << 30));
        assert_eq!(b(3, u64::MAX, Jitter::None).ceiling(32), Duration::MAX);
    }

    #[test]
    fn decorrelated_bounds_are_the_base_and_three_times_the_last_wait_capped() {
        let d = b(10, 1000, Jitter::Decorrelated);
        let top = Draw::TOP;
        // The previous wait below the base counts as the base: hi = 30.
        assert_eq!(d.wait(1, ms(0), top), ms(29));
        assert_eq!(d.wait(1, ms(9), top), ms(29));
        assert_eq!(d.wait(1, ms(10), top), ms(29));
        assert_eq!(d.wait(1, ms(11), top), ms(10 + 22));
        // Three times the last wait, up to the cap.
        assert_eq!(d.wait(2, ms(100), top), ms(299));
        assert_eq!(d.wait(2, ms(333), top), ms(998));
        assert_eq!(d.wait(2, ms(334), top), ms(999));
        assert_eq!(d.wait(2, ms(5_000), top), ms(999));
        // The lowest draw waits the base, whatever came before.
        assert_eq!(d.wait(7, ms(900), Draw::ZERO), ms(10));
        // A cap below the base leaves nothing to draw: exactly the base.
        let low = b(10, 4, Jitter::Decorrelated);
        assert_eq!(low.wait(1, ms(0), top), ms(10));
        assert_eq!(low.wait(3, ms(50), top), ms(10));
        // Three times a huge last wait saturates instead of wrapping.
        let big = b(1, u64::MAX, Jitter::Decorrelated);
        let half = Draw::unit(1 << 31);
        assert_eq!(big.wait(2, ms(u64::from(u32::MAX / 2)), half), ms(1 + u64::from(u32::MAX - 1) / 2));
    }

    #[test]
    fn shortest_and_longest_waits_are_the_lowest_and_highest_draws() {
        let z = Duration::ZERO;
        let e = b(2, 60, Jitter::Equal);
        assert_eq!((e.min_wait(6, z), e.max_wait(6, z)), (ms(30), ms(59)));
        assert_eq!((e.min_wait(1, z), e.max_wait(1, z)), (ms(1), ms(1)));
        let f = b(100, 1000, Jitter::Full);
        assert_eq!((f.min_wait(2, z), f.max_wait(2, z)), (ms(0), ms(199)));
        let d = b(10, 1000, Jitter::Decorrelated);
        assert_eq!((d.min_wait(2, ms(100)), d.max_wait(2, ms(100))), (ms(10), ms(299)));
        let n = b(7, 1000, Jitter::None);
        assert_eq!((n.min_wait(2, z), n.max_wait(2, z)), (ms(14), ms(14)));
    }

    /// The waits of retries 1..=n, each from the wait before it, as a call makes them.
    fn chained(b: &Backoff, n: u32, draws: &[Draw]) -> Vec<u32> {
        let mut previous = Duration::ZERO;
        (1..=n)
            .map(|k| {
                previous = b.wait(k, previous, draws[(k - 1) as usize]);
                previous.as_millis()
            })
            .collect()
    }

    #[test]
    fn coap_draws_the_first_timeout_once_and_doubles_it() {
        let c = b(2_000, 16_000, Jitter::Coap);
        // Both ends of [ACK_TIMEOUT, ACK_TIMEOUT · 1.5] are reached.
        assert_eq!(chained(&c, 4, &[Draw::ZERO; 4]), [2_000, 4_000, 8_000, 16_000]);
        assert_eq!(chained(&c, 4, &[Draw::TOP; 4]), [3_000, 6_000, 12_000, 24_000]);
        assert_eq!(chained(&c, 4, &[pct(50); 4]), [2_500, 5_000, 10_000, 20_000]);
        // Only the first draw counts: later ones change nothing.
        assert_eq!(
            chained(&c, 4, &[Draw::TOP, Draw::ZERO, pct(7), Draw::ZERO]),
            [3_000, 6_000, 12_000, 24_000]
        );
        assert_eq!(
            chained(&c, 4, &[Draw::ZERO, Draw::TOP, Draw::TOP, Draw::TOP]),
            [2_000, 4_000, 8_000, 16_000]
        );
        // At the cap the wait holds where the draw put it (no herd at either end).
        assert_eq!(chained(&c, 7, &[pct(50); 7]), [2_500, 5_000, 10_000, 20_000, 20_000, 20_000, 20_000]);
        // A previous wait raised past the range (a Retry-After) is brought back to its top, one
        // below it to its floor.
        assert_eq!(c.wait(2, ms(60_000), Draw::ZERO), ms(6_000));
        assert_eq!(c.wait(3, ms(1), Draw::TOP), ms(8_000));
        // With no previous wait any retry draws: the shortest and longest of the range.
        assert_eq!((c.min_wait(3, Duration::ZERO), c.max_wait(3, Duration::ZERO)), (ms(8_000), ms(12_000)));
    }

    #[test]
    fn coap_waits_stay_within_min_wait_and_max_wait_whatever_the_first_draw() {
        // Where the doubling meets the cap, a larger first draw doubles past the range one retry
        // sooner, is held and brought up to the floor: base 1.9 s and cap 10.537 s, a first
        // draw of 8 % gives 1,976, 3,952, 7,904 and then 10,537 ms, where a draw of 0 gives
        // 15,200 ms. The bounds must hold for every draw, not only at 0 and at the top.
        let c = b(1_900, 10_537, Jitter::Coap);
        assert_eq!(
            chained(&c, 4, &[pct(8), Draw::ZERO, Draw::ZERO, Draw::ZERO]),
            [1_976, 3_952, 7_904, 10_537]
        );
        assert_eq!(chained(&c, 4, &[Draw::ZERO; 4])[3], 15_200);
        // The bounds chained as `Policy::max_retries` and `wary explain` chain them.
        for cap in [1_900, 5_000, 10_537, 15_000, 60_000] {
            let c = b(1_900, cap, Jitter::Coap);
            let (mut lo, mut hi) = (Duration::ZERO, Duration::ZERO);
            let bounds: Vec<(Duration, Duration)> = (1..=12u32)
                .map(|k| {
                    (lo, hi) = (c.min_wait(k, lo), c.max_wait(k, hi));
                    (lo, hi)
                })
                .collect();
            for first in (0..=99).map(pct).chain([Draw::unit(0), Draw::unit(u32::MAX), Draw::TOP]) {
                let mut previous = Duration::ZERO;
                for (k, (lo, hi)) in (1..=12u32).zip(&bounds) {
                    previous = c.wait(k, previous, first);
                    assert!(
                        *lo <= previous && previous <= *hi,
                        "cap {cap}, first draw {first:?}, retry {k}: {previous:?} not in {lo:?}..={hi:?}"
                    );
                }
            }
        }
        // A base of 0 stays 0; a huge ceiling saturates instead of wrapping.
        assert_eq!(b(0, 100, Jitter::Coap).wait(1, Duration::ZERO, Draw::TOP), ms(0));
        let huge = b(u64::from(u32::MAX - 1), u64::MAX, Jitter::Coap);
        assert_eq!(huge.wait(1, Duration::ZERO, Draw::TOP), Duration::MAX);
        assert_eq!(huge.wait(2, Duration::MAX, Draw::TOP), Duration::MAX);
    }

    #[test]
    fn jitter_names_round_trip_and_nothing_else_parses() {
        for j in Jitter::ALL {
            assert_eq!(Jitter::from_name(j.name()), Some(j));
        }
        let names: Vec<&str> = Jitter::ALL.iter().map(|j| j.name()).collect();
        assert_eq!(names, ["equal", "full", "decorrelated", "none", "coap"]);
        for other in ["", "Equal", "FULL", "decorrelated ", "exponential"] {
            assert_eq!(Jitter::from_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn draws_from_a_generator_are_unit_fractions() {
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
