//! Fairness: a token bucket per authenticated device, in a map of bounded size.
//!
//! One device sending as fast as it can must not fill the queue that every other device
//! shares, nor spend the fleet's retry budget. Each device gets `burst` requests at once and
//! `rate` a second after that; a request over its rate is answered 429 with the whole seconds
//! until its next token as `Retry-After`, before its body is read and before the queue.
//!
//! Only a device that proved who it is gets a bucket, so the map's size is bounded by the
//! credentials file, and again by `max_devices`. A full bucket is the same as no bucket, so
//! when the map is full, buckets that have refilled are dropped; if none has, the newcomer is
//! answered 503 (`Retry-After: 1`) rather than the map growing.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use wary_gateway::admission::{Admission, Limits, Refused};
//! let mut a = Admission::new(Limits { rate_per_sec: 1, burst: 2, max_devices: 10 });
//! let t = Instant::now();
//! assert_eq!(a.admit(7, t), Ok(()));
//! assert_eq!(a.admit(7, t), Ok(()));
//! assert_eq!(a.admit(7, t), Err(Refused::Rate { retry_after_secs: 1 }));
//! assert_eq!(a.admit(7, t + Duration::from_secs(1)), Ok(()));
//! ```

use std::collections::HashMap;
use std::time::Instant;

use crate::retry_after::retry_after_secs;

/// Thousandths of a token per token.
const MILLI: u64 = 1000;

/// The per-device admission settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests a second a device may keep up (0 turns admission off).
    pub rate_per_sec: u32,
    /// Requests a device may make at once after a quiet time (at least 1).
    pub burst: u32,
    /// Devices with a bucket at once.
    pub max_devices: usize,
}

impl Default for Limits {
    /// 5 requests a second, bursts of 20, 100,000 devices.
    fn default() -> Self {
        Limits { rate_per_sec: 5, burst: 20, max_devices: 100_000 }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The device is over its rate: 429, come back in `retry_after_secs`.
    Rate {
        /// Whole seconds until a token is there, at least 1 and at most
        /// [`crate::MAX_RETRY_AFTER_SECS`] ([`crate::retry_after::retry_after_secs`]).
        retry_after_secs: u64,
    },
    /// Every bucket belongs to a device that is still busy: 503.
    Full,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Thousandths of a token.
    tokens: u64,
    at: Instant,
}

/// The buckets.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    buckets: HashMap<u64, Bucket>,
}

impl Admission {
    /// No device has a bucket yet.
    pub fn new(limits: Limits) -> Self {
        Admission { limits, buckets: HashMap::new() }
    }

    /// The settings.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Devices holding a bucket.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True if no device holds a bucket.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    fn full(&self) -> u64 {
        u64::from(self.limits.burst.max(1)).saturating_mul(MILLI)
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let ms = u64::try_from(now.saturating_duration_since(b.at).as_millis()).unwrap_or(u64::MAX);
        // rate tokens a second = rate thousandths a millisecond.
        b.tokens =
            b.tokens.saturating_add(ms.saturating_mul(u64::from(self.limits.rate_per_sec))).min(self.full());
        b.at = now;
    }

    /// Takes one token from `device`'s bucket at `now`.
    pub fn admit(&mut self, device: u64, now: Instant) -> Result<(), Refused> {
        if self.limits.rate_per_sec == 0 {
            return Ok(());
        }
        let full = self.full();
        if !self.buckets.contains_key(&device) {
            if self.buckets.len() >= self.limits.max_devices {
                self.sweep(now);
            }
            if self.buckets.len() >= self.limits.max_devices {
                return Err(Refused::Full);
            }
            self.buckets.insert(device, Bucket { tokens: full, at: now });
        }
        let mut b = *self.buckets.get(&device).ok_or(Refused::Full)?;
        self.refill(&mut b, now);
        let r = if b.tokens >= MILLI {
            b.tokens = b.tokens.saturating_sub(MILLI);
            Ok(())
        } else {
            let missing = MILLI.saturating_sub(b.tokens);
            let ms = missing.div_ceil(u64::from(self.limits.rate_per_sec));
            Err(Refused::Rate { retry_after_secs: retry_after_secs(ms) })
        };
        self.buckets.insert(device, b);
        r
    }

    /// Drops the buckets that have refilled: they are the same as none.
    fn sweep(&mut self, now: Instant) {
        let (rate, full) = (u64::from(self.limits.rate_per_sec), self.full());
        self.buckets.retain(|_, b| {
            let ms = u64::try_from(now.saturating_duration_since(b.at).as_millis()).unwrap_or(u64::MAX);
            b.tokens.saturating_add(ms.saturating_mul(rate)) < full
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_device_gets_its_burst_then_its_rate() {
        let mut a = Admission::new(Limits { rate_per_sec: 4, burst: 3, max_devices: 8 });
        let t = Instant::now();
        let first: Vec<_> = (0..5).map(|_| a.admit(1, t).is_ok()).collect();
        assert_eq!(first, [true, true, true, false, false]);
        // Another device is untouched by the first one's flood.
        assert_eq!(a.admit(2, t), Ok(()));
        // A token every 250 ms: at 249 ms none, at 250 ms one, then none again.
        assert_eq!(a.admit(1, t + Duration::from_millis(249)), Err(Refused::Rate { retry_after_secs: 1 }));
        assert_eq!(a.admit(1, t + Duration::from_millis(250)), Ok(()));
        assert!(a.admit(1, t + Duration::from_millis(250)).is_err());
        // Ten seconds of quiet refill the burst and no more.
        let later = t + Duration::from_secs(10);
        let again: Vec<_> = (0..4).map(|_| a.admit(1, later).is_ok()).collect();
        assert_eq!(again, [true, true, true, false]);
    }

    #[test]
    fn retry_after_is_the_whole_seconds_to_the_next_token() {
        // With at least one token a second the next one is never more than a second away.
        let mut a = Admission::new(Limits { rate_per_sec: 1, burst: 1, max_devices: 8 });
        let t = Instant::now();
        assert_eq!(a.admit(1, t), Ok(()));
        assert_eq!(a.admit(1, t + Duration::from_millis(100)), Err(Refused::Rate { retry_after_secs: 1 }));
    }

    #[test]
    fn the_map_is_bounded_and_refilled_buckets_make_room() {
        let mut a = Admission::new(Limits { rate_per_sec: 10, burst: 2, max_devices: 2 });
        let t = Instant::now();
        assert_eq!(a.admit(1, t), Ok(()));
        assert_eq!(a.admit(2, t), Ok(()));
        assert_eq!(a.admit(3, t), Err(Refused::Full));
        assert_eq!(a.len(), 2);
        // 100 ms later device 1 and 2 have refilled (one token back, burst 2): room again.
        assert_eq!(a.admit(3, t + Duration::from_millis(100)), Ok(()));
        assert!(a.len() <= 2);
    }

    #[test]
    fn a_zero_rate_turns_admission_off() {
        let mut a = Admission::new(Limits { rate_per_sec: 0, burst: 1, max_devices: 0 });
        let t = Instant::now();
        assert!((0..100).all(|_| a.admit(1, t).is_ok()));
        assert!(a.is_empty());
    }
}
