//! Time for the runner on a host: sleeps as `DelayNs`, a monotonic clock in milliseconds, and a
//! wall clock in Unix seconds for HTTP-dates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use embedded_hal_async::delay::DelayNs;
use wary::run::Clock;

/// `DelayNs` over `tokio::time::sleep`: for runners on a tokio runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioDelay;

impl DelayNs for TokioDelay {
    async fn delay_ns(&mut self, ns: u32) {
        tokio::time::sleep(Duration::from_nanos(u64::from(ns))).await;
    }
    async fn delay_us(&mut self, us: u32) {
        tokio::time::sleep(Duration::from_micros(u64::from(us))).await;
    }
    async fn delay_ms(&mut self, ms: u32) {
        tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
    }
}

/// `DelayNs` over `std::thread::sleep`: blocks the thread, for runners driven by a blocking
/// executor (`embassy_futures::block_on`, a CLI). Never use it on an async runtime's worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdDelay;

impl DelayNs for StdDelay {
    async fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(Duration::from_nanos(u64::from(ns)));
    }
    async fn delay_us(&mut self, us: u32) {
        std::thread::sleep(Duration::from_micros(u64::from(us)));
    }
    async fn delay_ms(&mut self, ms: u32) {
        std::thread::sleep(Duration::from_millis(u64::from(ms)));
    }
}

/// Milliseconds since the clock was made, from `tokio::time::Instant` (which is
/// `std::time::Instant` unless a tokio test pauses time), so it agrees with [`TokioDelay`].
///
/// **Its [`Clock::now`] is always milliseconds**, whatever the policy's tick rate: give it to a
/// runner only with a policy whose `tick_hz()` is 1000 (the default), or the deadline and the
/// ledger's times are off by the ratio. The gateway and the [`crate::tower`] adapter refuse
/// other rates; for a policy counting other ticks, read [`MonotonicClock::ticks`] instead.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock reading 0 now.
    pub fn new() -> Self {
        MonotonicClock { start: tokio::time::Instant::now() }
    }

    /// Milliseconds since creation.
    pub fn millis(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Ticks since creation at `hz` ticks per second (a policy's `tick_hz`).
    pub fn ticks(&self, hz: u32) -> u64 {
        let ticks = self.start.elapsed().as_micros().saturating_mul(u128::from(hz)) / 1_000_000;
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    /// Milliseconds (not the policy's ticks: see the type's docs).
    fn now(&self) -> u64 {
        self.millis()
    }
}

/// A monotonic clock in a policy's own ticks (`tick_hz` ticks per second), from the same
/// `tokio::time::Instant` as [`MonotonicClock`]: the clock the one-line entry points give the
/// runner, right for any tick rate.
#[derive(Debug, Clone, Copy)]
pub struct TickClock {
    clock: MonotonicClock,
    hz: u32,
}

impl TickClock {
    /// A clock reading 0 now, counting `hz` ticks per second.
    pub fn new(hz: u32) -> Self {
        TickClock { clock: MonotonicClock::new(), hz }
    }

    /// The clock for `policy`'s tick rate.
    pub fn for_policy(policy: &wary::Policy) -> Self {
        Self::new(policy.tick_hz())
    }
}

impl Clock for TickClock {
    fn now(&self) -> u64 {
        self.clock.ticks(self.hz)
    }
}

/// The wall clock in Unix seconds, for HTTP-date Retry-After values.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl WallClock {
    /// Seconds since the Unix epoch, or `None` if the system clock is before it (then a date
    /// is measured against the response's own `Date` header only).
    pub fn unix_secs(&self) -> Option<u64> {
        SystemTime::now().duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn tokio_delay_sleeps_and_the_clock_sees_it() {
        let clock = MonotonicClock::new();
        let mut d = TokioDelay;
        d.delay_ms(30).await;
        d.delay_us(20_000).await;
        let t = clock.now();
        assert!((50..2_000).contains(&t), "{t}");
        assert!(clock.ticks(1) < 3);
        let tenths = TickClock::new(10);
        d.delay_ms(250).await;
        assert!((2..20).contains(&tenths.now()), "{}", tenths.now());
    }

    #[test]
    fn std_delay_blocks_and_wall_clock_is_after_2020() {
        let clock = MonotonicClock::new();
        embassy_block(StdDelay.delay_ms(20));
        assert!(clock.now() >= 20);
        assert!(WallClock.unix_secs().unwrap() > 1_577_836_800);
    }

    fn embassy_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
    }
}
