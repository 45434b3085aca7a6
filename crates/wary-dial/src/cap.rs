//! A cap on the modem's dial-ups and resets per window, kept across boots.
//!
//! A cellular operator sees every attach and every PDP context a SIM opens. A device that
//! reconnects every few seconds (a crash loop, a bad APN retried for ever) can get its SIM
//! throttled or barred by the network, and some modems lock themselves up for a while after
//! repeated ungraceful resets in a short time. The backoff between redials spaces dials within
//! one boot; a reset starts that backoff over, so the cap counts across boots: the caller keeps
//! the [`DialWindow`] on flash (the outbox's boot record holds one) and asks [`DialCap::take`]
//! before each dial-up or modem reset.
//!
//! **Defaults** ([`DialCap::DEFAULT`]): at most 6 dial-ups or resets per 60 minutes of uptime,
//! an average of one per 10 minutes, with room for a short burst after a real outage. Modem
//! makers and IoT operators advise waiting minutes, not seconds, between reconnects after a
//! failure, growing to tens of minutes when failures repeat; the redial backoff does the
//! spacing, and this cap is the backstop that holds when the device itself keeps restarting.
//! A fleet that needs another figure sets it with [`DialCap::new`].
//!
//! **The window** is a fixed window counted in uptime: each boot adds the uptime it spent
//! since the window was last saved ([`DialCap::age`]), and once a whole window has passed the
//! count starts again. Uptime is all a device without a battery-backed clock can count across a
//! reset; time spent off or rebooting counts as none, which only makes the cap stricter. At a
//! window's edge up to twice the figure can fall within one window's length: the price of a
//! state of six bytes.
//!
//! ```
//! use embassy_time::Duration;
//! use wary_dial::{DialCap, DialWindow};
//!
//! let cap = DialCap::new(2, Duration::from_secs(600)).unwrap();
//! let w = DialWindow::default();
//! let w = cap.take(w).unwrap(); // first dial
//! let w = cap.take(w).unwrap(); // second
//! // The third must wait for the rest of the window.
//! assert_eq!(cap.take(w), Err(Duration::from_secs(600)));
//! // After a reset, 4 minutes of uptime later (saved by the caller), 6 minutes are left.
//! let w = cap.age(w, Duration::from_secs(240));
//! assert_eq!(cap.take(w), Err(Duration::from_secs(360)));
//! let w = cap.age(w, Duration::from_secs(360));
//! assert!(cap.take(w).is_ok());
//! ```

use embassy_time::Duration;

/// The count inside the current window; the caller keeps it on flash across boots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DialWindow {
    /// Uptime, summed over boots, since the window opened, in milliseconds (saturating).
    pub elapsed_ms: u32,
    /// Dial-ups and modem resets taken in the window.
    pub dials: u16,
}

/// At most `max` dial-ups or modem resets per `window` of uptime, across boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DialCap {
    max: u16,
    window_ms: u32,
}

/// Why a [`DialCap`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DialCapError {
    /// A cap of zero dials would keep the modem off for ever.
    #[error("the cap allows no dial at all")]
    NoDials,
    /// The window is shorter than a minute, or longer than the 49 days a millisecond count in
    /// 32 bits holds.
    #[error("the window is under a minute or over 49 days")]
    Window,
}

impl DialCap {
    /// 6 dial-ups or resets per 60 minutes of uptime.
    pub const DEFAULT: DialCap = DialCap { max: 6, window_ms: 60 * 60 * 1000 };

    /// A cap of `max` per `window`.
    ///
    /// # Errors
    ///
    /// [`DialCapError::NoDials`] for `max == 0`, [`DialCapError::Window`] for a window under a
    /// minute or over `u32::MAX` milliseconds.
    pub const fn new(max: u16, window: Duration) -> Result<Self, DialCapError> {
        if max == 0 {
            return Err(DialCapError::NoDials);
        }
        let ms = window.as_millis();
        if ms < 60_000 || ms > u32::MAX as u64 {
            return Err(DialCapError::Window);
        }
        Ok(DialCap { max, window_ms: ms as u32 })
    }

    /// The most dials per window.
    pub const fn max(&self) -> u16 {
        self.max
    }

    /// The window's length.
    pub const fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms as u64)
    }

    /// `window` after `up` more uptime; a new, empty window once the whole window has passed.
    pub fn age(&self, window: DialWindow, up: Duration) -> DialWindow {
        let up = u32::try_from(up.as_millis()).unwrap_or(u32::MAX);
        let elapsed = window.elapsed_ms.saturating_add(up);
        if elapsed >= self.window_ms {
            DialWindow::default()
        } else {
            DialWindow { elapsed_ms: elapsed, ..window }
        }
    }

    /// Takes one dial from `window`: the window with it counted (store it on flash *before*
    /// dialling, so a crash during the dial still counts it), or, when the window is spent, the
    /// uptime left until it ends.
    ///
    /// # Errors
    ///
    /// The uptime to wait when `max` dials were taken in this window already.
    pub fn take(&self, window: DialWindow) -> Result<DialWindow, Duration> {
        if window.dials < self.max {
            return Ok(DialWindow { dials: window.dials.saturating_add(1), ..window });
        }
        Err(Duration::from_millis(u64::from(self.window_ms.saturating_sub(window.elapsed_ms))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_six_an_hour() {
        assert_eq!(DialCap::DEFAULT.max(), 6);
        assert_eq!(DialCap::DEFAULT.window(), Duration::from_secs(3600));
        let mut w = DialWindow::default();
        for n in 1..=6 {
            w = DialCap::DEFAULT.take(w).unwrap();
            assert_eq!(w.dials, n);
        }
        assert_eq!(DialCap::DEFAULT.take(w), Err(Duration::from_secs(3600)));
    }

    #[test]
    fn a_crash_loop_cannot_reset_the_count() {
        // Every boot dials once and crashes 5 s later: uptime adds up, the count does not
        // start over, and the seventh boot inside the hour is refused.
        let cap = DialCap::DEFAULT;
        let mut w = DialWindow::default();
        let mut refused_at = None;
        for boot in 1..=10 {
            match cap.take(w) {
                Ok(next) => w = next,
                Err(wait) => {
                    refused_at.get_or_insert((boot, wait));
                }
            }
            w = cap.age(w, Duration::from_secs(5));
        }
        assert_eq!(refused_at, Some((7, Duration::from_secs(3600 - 30))));
    }

    #[test]
    fn a_whole_window_of_uptime_starts_a_new_one() {
        let cap = DialCap::new(1, Duration::from_secs(60)).unwrap();
        let w = cap.take(DialWindow::default()).unwrap();
        let w = cap.age(w, Duration::from_millis(59_999));
        assert_eq!(cap.take(w), Err(Duration::from_millis(1)));
        let w = cap.age(w, Duration::from_millis(1));
        assert_eq!(w, DialWindow::default());
        assert!(cap.take(w).is_ok());
        // Saturating: a long uptime never wraps into a young window.
        let w = cap.age(DialWindow { elapsed_ms: u32::MAX - 1, dials: 1 }, Duration::from_secs(1 << 40));
        assert_eq!(w, DialWindow::default());
    }

    #[test]
    fn a_cap_that_cannot_work_is_refused() {
        assert_eq!(DialCap::new(0, Duration::from_secs(3600)), Err(DialCapError::NoDials));
        assert_eq!(DialCap::new(3, Duration::from_secs(59)), Err(DialCapError::Window));
        assert_eq!(DialCap::new(3, Duration::from_secs(50 * 86_400)), Err(DialCapError::Window));
        assert!(DialCap::new(3, Duration::from_secs(60)).is_ok());
    }
}
