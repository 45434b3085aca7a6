//! Time for the runner on a host: sleeps as `DelayNs`, a monotonic clock giving the core's
//! [`Instant`], and a wall clock in Unix seconds for HTTP-dates.

use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use embedded_hal_async::delay::DelayNs;
use wary::{Clock, Duration, Instant};

/// `DelayNs` over `tokio::time::sleep`: for runners on a tokio runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioDelay;

impl DelayNs for TokioDelay {
    async fn delay_ns(&mut self, ns: u32) {
        tokio::time::sleep(StdDuration::from_nanos(u64::from(ns))).await;
    }
    async fn delay_us(&mut self, us: u32) {
        tokio::time::sleep(StdDuration::from_micros(u64::from(us))).await;
    }
    async fn delay_ms(&mut self, ms: u32) {
        tokio::time::sleep(StdDuration::from_millis(u64::from(ms))).await;
    }
}

/// `DelayNs` over `std::thread::sleep`: blocks the thread, for runners driven by a blocking
/// executor (`embassy_futures::block_on`, a CLI). Never use it on an async runtime's worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdDelay;

impl DelayNs for StdDelay {
    async fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(StdDuration::from_nanos(u64::from(ns)));
    }
    async fn delay_us(&mut self, us: u32) {
        std::thread::sleep(StdDuration::from_micros(u64::from(us)));
    }
    async fn delay_ms(&mut self, ms: u32) {
        std::thread::sleep(StdDuration::from_millis(u64::from(ms)));
    }
}

/// A monotonic clock counting from its creation, from `tokio::time::Instant` (which is
/// `std::time::Instant` unless a tokio test pauses time), so it agrees with [`TokioDelay`].
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock reading [`Instant`] 0 now.
    pub fn new() -> Self {
        MonotonicClock { start: tokio::time::Instant::now() }
    }

    /// The time now, as the core counts it.
    pub fn now(&self) -> Instant {
        Instant::from_millis(u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX))
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        MonotonicClock::now(self)
    }
}

/// Sleeps for a core [`Duration`] on tokio.
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d.into()).await;
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
        let t = clock.now().as_millis();
        assert!((50..2_000).contains(&t), "{t}");
        // The core's sleep and the clock agree: a 250 ms sleep reads as at least 250 ms.
        let before = clock.now();
        sleep(Duration::from_millis(250)).await;
        let slept = clock.now() - before;
        assert!(slept >= Duration::from_millis(250) && slept < Duration::from_secs(5), "{slept}");
    }

    #[test]
    fn std_delay_blocks_and_wall_clock_is_after_2020() {
        let clock = MonotonicClock::new();
        embassy_block(StdDelay.delay_ms(20));
        assert!(clock.now() >= Instant::from_millis(20));
        assert!(WallClock.unix_secs().unwrap() > 1_577_836_800);
    }

    fn embassy_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
    }
}
