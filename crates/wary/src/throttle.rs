//! The fleet retry budget: gRPC's A6 token bucket, in fixed point, lock-free.
//!
//! Per-call budgets bound one call; they do not stop a fleet of calls from tripling the load on
//! a server that is already down (three layers of four attempts each make 4³ = 64 calls). The
//! bucket starts full at `max_tokens`. Every failed attempt costs one token, every success
//! returns `token_ratio`, and no retry is allowed while the tokens are at or below half the
//! maximum. A retry's cost is taken when its attempt fails, before the backoff, so a retry
//! waiting in backoff already holds it. No clock is needed.
//!
//! Shared by reference across tasks; on targets without compare-and-swap (thumbv6m) the atomic
//! comes from `portable-atomic` over a critical section.
//!
//! ```
//! use wary::FleetBudget;
//! static FLEET: FleetBudget = match FleetBudget::new(10, 100) { Ok(b) => b, Err(_) => panic!() };
//! // 10 tokens, 0.1 back per success: five failures in a row leave 5, and retries stop.
//! let allowed: Vec<bool> = (0..6).map(|_| FLEET.on_failure()).collect();
//! assert_eq!(allowed, [true, true, true, true, false, false]);
//! ```

use portable_atomic::{AtomicU32, Ordering};

use crate::error::FleetBudgetError;

/// Thousandths of a token per token.
const MILLI: u32 = 1000;

/// A token bucket shared by every call of a device or gateway.
#[derive(Debug)]
pub struct FleetBudget {
    /// Tokens, in thousandths.
    tokens: AtomicU32,
    max: u32,
    ratio: u32,
}

#[cfg(feature = "defmt")]
impl defmt::Format for FleetBudget {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "FleetBudget {{ tokens_milli: {=u32}, max_milli: {=u32} }}",
            self.tokens_milli(),
            self.max
        );
    }
}

impl FleetBudget {
    /// A full bucket of `max_tokens` (1..=1000) that gains `ratio_milli` thousandths of a token
    /// (1..=1000) per success: gRPC A6's `maxTokens` and `tokenRatio`.
    pub const fn new(max_tokens: u32, ratio_milli: u32) -> Result<Self, FleetBudgetError> {
        if max_tokens == 0 || max_tokens > 1000 {
            return Err(FleetBudgetError::Tokens);
        }
        if ratio_milli == 0 || ratio_milli > MILLI {
            return Err(FleetBudgetError::Ratio);
        }
        let max = max_tokens.saturating_mul(MILLI);
        Ok(FleetBudget { tokens: AtomicU32::new(max), max, ratio: ratio_milli })
    }

    /// Records a failed attempt (one token) and says whether a retry is allowed after it.
    pub fn on_failure(&self) -> bool {
        let before = self.update(|t| t.saturating_sub(MILLI));
        before.saturating_sub(MILLI) > self.max / 2
    }

    /// Records a success (`ratio` back, up to the maximum).
    pub fn on_success(&self) {
        let max = self.max;
        self.update(|t| t.saturating_add(self.ratio).min(max));
    }

    /// True if a retry would be allowed now (tokens above half the maximum).
    pub fn allows_retry(&self) -> bool {
        self.tokens.load(Ordering::Acquire) > self.max / 2
    }

    /// The tokens now, in thousandths.
    pub fn tokens_milli(&self) -> u32 {
        self.tokens.load(Ordering::Acquire)
    }

    /// The maximum, in thousandths.
    pub const fn max_milli(&self) -> u32 {
        self.max
    }

    /// Atomically applies `f` and returns the value before.
    fn update(&self, f: impl Fn(u32) -> u32) -> u32 {
        match self.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(f(t))) {
            Ok(prev) | Err(prev) => prev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_settings() {
        assert_eq!(FleetBudget::new(0, 100).err(), Some(FleetBudgetError::Tokens));
        assert_eq!(FleetBudget::new(1001, 100).err(), Some(FleetBudgetError::Tokens));
        assert_eq!(FleetBudget::new(10, 0).err(), Some(FleetBudgetError::Ratio));
        assert_eq!(FleetBudget::new(10, 1001).err(), Some(FleetBudgetError::Ratio));
    }

    #[test]
    fn successes_refill_up_to_the_max() {
        let b = FleetBudget::new(4, 500).unwrap();
        assert!(b.on_failure()); // 3 > 2
        assert!(!b.on_failure()); // 2, not above 2
        assert!(!b.allows_retry());
        b.on_success(); // 2.5
        assert!(b.allows_retry());
        for _ in 0..10 {
            b.on_success();
        }
        assert_eq!(b.tokens_milli(), 4000);
        for _ in 0..10 {
            b.on_failure();
        }
        assert_eq!(b.tokens_milli(), 0);
    }

    #[test]
    fn shared_across_threads_without_losing_updates() {
        let b = FleetBudget::new(1000, 1).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        b.on_failure();
                    }
                });
            }
        });
        assert_eq!(b.tokens_milli(), 600_000);
    }

    #[test]
    fn the_limits_are_inclusive_and_half_the_tokens_stops_retries() {
        assert!(FleetBudget::new(1, 1).is_ok());
        assert!(FleetBudget::new(1000, 1000).is_ok());
        let b = FleetBudget::new(1000, 1000).unwrap();
        assert_eq!((b.max_milli(), b.tokens_milli()), (1_000_000, 1_000_000));
        assert!(b.allows_retry());
        // 3 tokens: the first failure leaves 2, above 1.5; the second leaves 1.
        let b = FleetBudget::new(3, 250).unwrap();
        assert_eq!(b.max_milli(), 3000);
        assert!(b.on_failure());
        assert!(!b.on_failure());
        // 1.25 after one success, 1.5 after two: at half, still no retry; 1.75 allows one.
        b.on_success();
        assert!(!b.allows_retry());
        b.on_success();
        assert_eq!(b.tokens_milli(), 1500);
        assert!(!b.allows_retry());
        b.on_success();
        assert!(b.allows_retry());
        // Refills stop exactly at the maximum.
        for _ in 0..5 {
            b.on_success();
        }
        assert_eq!(b.tokens_milli(), 3000);
    }
}
