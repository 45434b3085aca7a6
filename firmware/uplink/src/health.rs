//! A reset loop must not become a storm: the wait before a boot's first network attempt grows
//! with the boots in a row that ended unhealthy, and a boot is marked healthy once it has shown
//! that it works.
//!
//! - **Unhealthy boot.** A boot that ended (a reset, a brown-out, the watchdog) before it was
//!   marked healthy. It is marked healthy at the first reading that lands once the device has
//!   been up [`Config::healthy_after`] (60 s by default): a boot that lands nothing, or resets
//!   within that time, stays unhealthy. The outbox keeps the count on flash
//!   (`wary_outbox::OpenReport::unhealthy_boots`) and a healthy boot sets it back to 0.
//! - **Boot k.** After `k − 1` unhealthy boots in a row, the first network attempt of the boot
//!   (bringing the link up included) waits the core's equal-jitter backoff of retry `k`: between
//!   `base·2^(k−2)` and `base·2^(k−1)`, capped at [`Config::boot_cap`] (15 minutes by default;
//!   base [`Config::boot_base`], 10 s). A boot after a healthy one (k = 1) does not wait.
//!   The same `Backoff` and `Draw` as every other wait of the device: one formula.
//! - **Why.** A device that crashes shortly after it connects would otherwise reconnect at the
//!   speed of its boot, for ever; a fleet of them after a bad update is a storm at the
//!   server, and a cellular operator may bar a SIM that attaches and connects that often.

use wary::{Backoff, Draw, Duration, Jitter};

use crate::Config;

/// The wait before a boot's first network attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub struct BootWait {
    /// This boot's place in the run of unhealthy boots: 1 after a healthy boot.
    pub k: u32,
    /// The wait chosen.
    pub wait: Duration,
    /// The least the jitter could have chosen (`base·2^(k−2)`, capped): the wait is never
    /// below it.
    pub floor: Duration,
    /// The most it could have chosen.
    pub ceiling: Duration,
}

impl BootWait {
    /// The wait after `unhealthy_boots` unhealthy boots in a row, drawn from `draw`.
    pub const fn after(config: &Config, unhealthy_boots: u32, draw: Draw) -> BootWait {
        let k = unhealthy_boots.saturating_add(1);
        if unhealthy_boots == 0 {
            return BootWait { k, wait: Duration::ZERO, floor: Duration::ZERO, ceiling: Duration::ZERO };
        }
        let backoff = Backoff::new(config.boot_base, config.boot_cap, Jitter::Equal);
        BootWait {
            k,
            wait: backoff.wait(k, Duration::ZERO, draw),
            floor: backoff.min_wait(k, Duration::ZERO),
            ceiling: backoff.max_wait(k, Duration::ZERO),
        }
    }

    /// Logs the `FIRST_WAIT` line the crash-loop scenario reads.
    pub fn log(&self, unhealthy_boots: u32) {
        defmt::info!(
            "FIRST_WAIT k={=u32} unhealthy={=u32} wait_ms={=u32} floor_ms={=u32} ceiling_ms={=u32}",
            self.k,
            unhealthy_boots,
            self.wait.as_millis(),
            self.floor.as_millis(),
            self.ceiling.as_millis()
        );
    }
}
