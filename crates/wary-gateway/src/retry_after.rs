//! The `Retry-After` the gateway tells a device: whole seconds, at least 1, at most an hour.
//!
//! Every wait the gateway passes on goes through [`retry_after_secs`]: a give-up's (the wait the
//! upstream asked for, or the policy's largest backoff ceiling), a hold's (the upstream
//! breaker's open time left) and a device over its rate (the time to its next token).
//!
//! ```
//! use wary_gateway::retry_after::{MAX_RETRY_AFTER_SECS, retry_after_secs};
//! assert_eq!(retry_after_secs(0), 1);
//! assert_eq!(retry_after_secs(1_200), 2);
//! assert_eq!(retry_after_secs(u64::MAX), MAX_RETRY_AFTER_SECS);
//! ```

/// The longest `Retry-After` the gateway passes on to a device, seconds (one hour), whatever
/// the upstream asked for or the breaker's open time says: a give-up's and a hold's alike. An
/// upstream that asks for days does not park a fleet for days; the device comes back within the
/// hour and asks again.
pub const MAX_RETRY_AFTER_SECS: u64 = 3_600;

/// Whole seconds for a wait of `ms` milliseconds as a device hears it: rounded up, at least 1,
/// at most [`MAX_RETRY_AFTER_SECS`].
pub fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).clamp(1, MAX_RETRY_AFTER_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_rounded_up_to_whole_seconds_between_one_and_the_cap() {
        assert_eq!(retry_after_secs(0), 1, "never 0: a device would come back at once");
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(3_600_000), MAX_RETRY_AFTER_SECS);
        // Too long a wait is capped at an hour, however long.
        assert_eq!(retry_after_secs(3_600_001), MAX_RETRY_AFTER_SECS);
        assert_eq!(retry_after_secs(86_400_000), MAX_RETRY_AFTER_SECS);
        assert_eq!(retry_after_secs(u64::MAX), MAX_RETRY_AFTER_SECS);
    }
}
